//! Purge: old history deleted in batches, failures kept unless asked,
//! archived before deleting.

use solid_notify::ops::Audit;
use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    Outcome, Status,
    ops::{Page, Place, Purge, find, purge::purge},
};

use super::{cancelled, filter_def, tempdir};
use crate::{
    db_test,
    support::{Recorder, TestDb, test_config},
};

db_test!(
    purge_keeps_failures_and_archives_before_deleting,
    |db: Arc<TestDb>| async move {
        db.def("crm", "crm", |s| s.max_retry_times = 0).await;
        let notifier = db
            .notifier()
            .config(test_config())
            .handler(
                "crm",
                Recorder::default().handler(|n| {
                    if n.param["i"].as_i64().unwrap_or(0) % 3 == 0 {
                        Outcome::retry("down")
                    } else {
                        Outcome::success()
                    }
                }),
            )
            .build()
            .unwrap();
        db.insert_due("crm", 12, |_| 0).await;
        db.attempt_due(&notifier).await;
        cancelled(&db, &notifier, "crm", 3).await;
        // 12: 4 final failures (i = 0, 3, 6, 9), 8 succeeded; plus 3 cancelled.
        let old = match db.backend {
            crate::support::Backend::Postgres => "now() - interval '40 days'",
            crate::support::Backend::MySql => "UTC_TIMESTAMP(6) - INTERVAL 40 DAY",
            crate::support::Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-40 days')",
        };
        db.db
            .execute_unprepared(&format!(
                "UPDATE notify_msg_history SET last_call_time = {old}, create_time = {old}"
            ))
            .await
            .unwrap();
        // One recent success stays whatever the flags.
        db.insert_due("crm", 2, |_| 1).await;
        db.attempt_due(&notifier).await;
        let count = |status: Status| {
            let db = db.clone();
            async move {
                db.history()
                    .await
                    .iter()
                    .filter(|r| r.status == status)
                    .count()
            }
        };
        assert_eq!(count(Status::Succeeded).await, 9);
        assert_eq!(count(Status::FinalFailure).await, 5);
        let dir = tempdir();
        let archive = dir.join("purged.jsonl");
        let mut p = Purge::older_than(Duration::from_secs(30 * 86_400));
        p.dry_run = true;
        p.archive = Some(archive.clone());
        let dry = purge(&db.db, &p).await.unwrap();
        assert_eq!((dry.matched, dry.deleted), (11, 0));
        assert!(!archive.exists(), "a dry run writes no archive");

        p.dry_run = false;
        p.batch_size = 4;
        let report = purge(&db.db, &p).await.unwrap();
        assert_eq!(
            (
                report.matched,
                report.archived,
                report.deleted,
                report.skipped
            ),
            (11, 11, 11, 0)
        );
        assert_eq!(count(Status::FinalFailure).await, 5, "failures stay");
        assert_eq!(count(Status::Succeeded).await, 1, "the recent one stays");
        assert_eq!(count(Status::Cancelled).await, 0);
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&archive)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 11);
        assert!(lines.iter().all(|l| l["status"] != json!("final_failure")));

        // With --include-failures the old failures go too; the recent one stays.
        p.include_failures = true;
        let report = purge(&db.db, &p).await.unwrap();
        assert_eq!(report.deleted, 4);
        assert_eq!(count(Status::FinalFailure).await, 1);
        assert_eq!(
            std::fs::read_to_string(&archive).unwrap().lines().count(),
            15
        );

        // A notice created long ago and cancelled just now is recent history.
        db.insert_due("crm", 1, |_| 2).await;
        db.db
            .execute_unprepared(&format!("UPDATE notify_msg SET create_time = {old}"))
            .await
            .unwrap();
        let newest = find::list(&db.db, Place::InFlight, &filter_def("crm"), Page::default())
            .await
            .unwrap();
        notifier
            .cancel(newest[0].id, &Audit::operator())
            .await
            .unwrap();
        let report = purge(&db.db, &p).await.unwrap();
        assert_eq!(report.deleted, 0, "cancelled a moment ago");

        // An archive that cannot be written: nothing is deleted.
        db.db
            .execute_unprepared(&format!(
                "UPDATE notify_msg_history SET last_call_time = {old}, create_time = {old}"
            ))
            .await
            .unwrap();
        p.archive = Some(dir.join("no_such_dir").join("x.jsonl"));
        let failed = purge(&db.db, &p).await.unwrap_err();
        assert!(matches!(failed.error, solid_notify::Error::Archive { .. }));
        assert_eq!(failed.done.deleted, 0);
        assert_eq!(db.history().await.len(), 3);
    }
);
