//! Operations without SQL: status, find, bulk requeue and cancel with audit
//! lines, purge with archive, pause and resume, metrics, connect timeout.

use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, NewNotice, Outcome, Status, WorkerConfig,
    ops::{Audit, BulkAction, NoticeFilter, Page, PauseEnd, Place, Purge, find, purge::purge},
};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{Recorder, TestDb, eventually, test_config},
};

fn filter_def(def: &str) -> NoticeFilter {
    NoticeFilter {
        def: Some(def.into()),
        ..NoticeFilter::default()
    }
}

/// `n` notices of `def`, moved to history as cancelled by a bulk cancel.
async fn cancelled(db: &TestDb, notifier: &solid_notify::Notifier, def: &str, n: usize) {
    db.insert_due(def, n, |_| 0).await;
    let report = notifier
        .cancel_where(&BulkAction::new(
            filter_def(def),
            Audit::new("setup", "seed"),
        ))
        .await
        .unwrap();
    assert_eq!(report.changed, n as u64);
}

db_test!(status_by_id_and_key_in_flight_and_history, |db: Arc<
    TestDb,
>| async move {
    let (notifier, _rec) = db.shipping().await;
    let held = db.notifier().config(quiet()).build().unwrap();
    let tx = held.begin().await.unwrap();
    let waiting = tx
        .add(NewNotice::new("ship", &json!({"order": 1})).idempotency_key("order-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let tx = notifier.begin().await.unwrap();
    let sent = tx
        .add(NewNotice::new("ship", &json!({"order": 2})).idempotency_key("order-2"))
        .await
        .unwrap();
    tx.commit_and_wait().await.unwrap();

    let view = notifier.status(waiting).await.unwrap();
    assert_eq!(
        (view.place, view.status, view.def.as_deref()),
        (Place::InFlight, Status::NotSent, Some("ship"))
    );
    assert_eq!(view.param, json!({"order": 1}));
    assert!(!view.claim_live);
    let view = notifier.status(sent).await.unwrap();
    assert_eq!(
        (view.place, view.status),
        (Place::History, Status::Succeeded)
    );

    let by_key = notifier.status_by_key("ship", "order-2").await.unwrap();
    assert_eq!(
        by_key.map(|v| (v.id, v.place)),
        Some((sent, Place::History))
    );
    let by_key = notifier.status_by_key("ship", "order-1").await.unwrap();
    assert_eq!(by_key.map(|v| v.id), Some(waiting));
    assert!(
        notifier
            .status_by_key("ship", "nope")
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        notifier.status(9_999_999).await,
        Err(solid_notify::Error::NoticeNotFound(9_999_999))
    ));
    assert!(matches!(
        notifier.status_by_key("no_such_def", "order-1").await,
        Err(solid_notify::Error::UnknownDef(_))
    ));

    // Listing: filters and keyset pages, newest first.
    db.insert_due("ship", 5, |i| i as i32 % 2).await;
    let all = find::list(
        &db.db,
        Place::InFlight,
        &filter_def("ship"),
        Page::default(),
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].id > w[1].id));
    let page = Page {
        before_id: Some(all[2].id),
        limit: 2,
    };
    let next = find::list(&db.db, Place::InFlight, &filter_def("ship"), page)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|v| v.id).collect::<Vec<_>>(),
        [all[3].id, all[4].id]
    );
    let odd = NoticeFilter {
        partition: Some(1),
        ..filter_def("ship")
    };
    assert_eq!(
        find::list(&db.db, Place::InFlight, &odd, Page::default())
            .await
            .unwrap()
            .len(),
        2
    );
    let text = NoticeFilter {
        param_contains: Some("\"order\":1".into()),
        ..NoticeFilter::default()
    };
    let found = find::list(&db.db, Place::InFlight, &text, Page::default())
        .await
        .unwrap();
    assert_eq!(found.iter().map(|v| v.id).collect::<Vec<_>>(), [waiting]);
    let wildcard = NoticeFilter {
        param_contains: Some("%".into()),
        ..NoticeFilter::default()
    };
    assert!(
        find::list(&db.db, Place::InFlight, &wildcard, Page::default())
            .await
            .unwrap()
            .is_empty(),
        "% is matched literally"
    );
    let done = NoticeFilter {
        since: Some(chrono::Utc::now().naive_utc() - chrono::Duration::hours(1)),
        ..NoticeFilter::default()
    };
    let finished = find::list(&db.db, Place::History, &done, Page::default())
        .await
        .unwrap();
    assert_eq!(finished.iter().map(|v| v.id).collect::<Vec<_>>(), [sent]);
});

db_test!(
    bulk_requeue_and_cancel_count_audit_and_skip_changed_rows,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.def("other", "ship", |_| {}).await;
        db.insert_due("ship", 30, |_| 0).await;
        db.insert_due("other", 4, |_| 0).await;

        // Dry run: counted and listed, nothing changed.
        let mut action = BulkAction::new(filter_def("ship"), Audit::new("alice", "receiver down"));
        action.dry_run = true;
        action.batch_size = 7;
        let dry = notifier.cancel_where(&action).await.unwrap();
        assert_eq!((dry.matched, dry.changed, dry.skipped), (30, 0, 0));
        assert_eq!(dry.first_ids.len(), 10);
        assert_eq!(db.counts().await, (34, 0));

        action.dry_run = false;
        let done = notifier.cancel_where(&action).await.unwrap();
        assert_eq!((done.matched, done.changed, done.skipped), (30, 30, 0));
        assert_eq!(db.counts().await, (4, 30));
        for row in db.history().await {
            assert_eq!(row.status, Status::Cancelled);
            assert!(
                row.errors.ends_with("cancelled by alice: receiver down"),
                "{}",
                row.errors
            );
        }

        // Requeue, in batches; then the worker path delivers each exactly once.
        let mut requeue = BulkAction::new(
            NoticeFilter {
                status: Some(Status::Cancelled),
                ..filter_def("ship")
            },
            Audit::new("bob", "fixed"),
        );
        requeue.batch_size = 8;
        requeue.dry_run = true;
        assert_eq!(notifier.requeue_where(&requeue).await.unwrap().matched, 30);
        requeue.dry_run = false;
        let back = notifier.requeue_where(&requeue).await.unwrap();
        assert_eq!((back.matched, back.changed, back.skipped), (30, 30, 0));
        for row in db
            .live()
            .await
            .iter()
            .filter(|r| r.errors.contains("alice"))
        {
            assert_eq!((row.status, row.retry_times), (Status::NotSent, 0));
            assert!(
                row.errors.ends_with("requeued by bob: fixed"),
                "{}",
                row.errors
            );
        }
        db.attempt_due(&notifier).await;
        assert_eq!(rec.count(), 34);
        assert_eq!(db.counts().await, (0, 34));

        // Version check: rows seen, then changed by someone else, are skipped.
        let other = db.notifier().config(quiet()).build().unwrap();
        db.insert_due("other", 3, |_| 0).await;
        let seen = find::list(
            &db.db,
            Place::InFlight,
            &filter_def("other"),
            Page::default(),
        )
        .await
        .unwrap();
        assert_eq!(seen.len(), 3);
        other.cancel(seen[0].id).await.unwrap();
        let stale = notifier
            .cancel_seen(&seen, &Audit::new("carol", "stale view"))
            .await
            .unwrap();
        assert_eq!((stale.matched, stale.changed, stale.skipped), (3, 2, 1));
        let history = find::list(
            &db.db,
            Place::History,
            &filter_def("other"),
            Page::default(),
        )
        .await
        .unwrap();
        let cancelled: Vec<_> = history
            .iter()
            .filter(|v| v.status == Status::Cancelled)
            .collect();
        assert_eq!(cancelled.len(), 3);
        assert_eq!(
            history
                .iter()
                .filter(|v| v.errors.iter().any(|l| l.contains("carol")))
                .count(),
            2
        );
        let requeued = notifier
            .requeue_seen(&history, &Audit::new("dave", "again"))
            .await
            .unwrap();
        // 4 delivered (not requeueable) and 3 cancelled: only these go back.
        assert_eq!((requeued.matched, requeued.changed), (7, 3));
        let again = notifier
            .requeue_seen(&history, &Audit::new("dave", "twice"))
            .await
            .unwrap();
        assert_eq!((again.changed, again.skipped), (0, 7));

        // Refusals.
        let wrong = BulkAction::new(
            NoticeFilter {
                status: Some(Status::Succeeded),
                ..NoticeFilter::default()
            },
            Audit::new("x", "y"),
        );
        // A filter that can match nothing requeueable: a client error
        // naming the status (never "notice 0 is succeeded").
        let refused = notifier.requeue_where(&wrong).await.map_err(|e| e.error);
        assert!(
            matches!(&refused, Err(solid_notify::Error::Config(m)) if m.contains("succeeded")),
            "{refused:?}"
        );
        let unknown = BulkAction::new(filter_def("nope"), Audit::new("x", "y"));
        assert!(matches!(
            notifier.cancel_where(&unknown).await.map_err(|e| e.error),
            Err(solid_notify::Error::UnknownDef(_))
        ));
    }
);

db_test!(
    bulk_requeue_of_ten_thousand_while_a_worker_drains,
    |db: Arc<TestDb>| async move {
        const N: usize = 10_000;
        let (notifier, rec) = db.shipping().await;
        cancelled(&db, &notifier, "ship", N).await;
        let running = start(
            notifier.clone(),
            fast(WorkerConfig {
                ..WorkerConfig::default()
            }),
        );
        let mut action = BulkAction::new(filter_def("ship"), Audit::new("ops", "replay"));
        action.batch_size = 500;
        let report = notifier.requeue_where(&action).await.unwrap();
        assert_eq!(report.matched, N as u64);
        assert_eq!(report.changed + report.skipped, N as u64);
        assert_eq!(report.changed, N as u64, "nothing else touched these rows");
        eventually(120, "every requeued notice delivered", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        running.stop().await;
        let calls = rec.calls();
        let unique: std::collections::HashSet<i64> = calls.iter().map(|n| n.id).collect();
        assert_eq!((calls.len(), unique.len()), (N, N), "each delivered once");
        let history = db.history().await;
        assert!(
            history
                .iter()
                .all(|r| r.status == Status::Succeeded
                    && r.errors.contains("requeued by ops: replay"))
        );
    }
);

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
        notifier.cancel(newest[0].id).await.unwrap();
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

db_test!(
    a_paused_definition_is_not_claimed_nor_charged_then_goes_on_resume,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.def("free", "ship", |_| {}).await;
        notifier
            .pause(
                "ship",
                PauseEnd::OnResume,
                &Audit::new("erin", "receiver maintenance"),
            )
            .await
            .unwrap();
        // The after-commit attempt leaves it to a sweeper.
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        let free = tx.add_notice("free", &json!({"n": 2}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let of = |id: i64| {
            reports
                .iter()
                .find(|r| r.notice_id == id)
                .unwrap()
                .result
                .clone()
        };
        assert!(
            matches!(of(id), AttemptResult::Skipped { .. }),
            "{:?}",
            of(id)
        );
        assert_eq!(of(free), AttemptResult::Succeeded);
        // Released for the sweepers, without a charge.
        eventually(10, "the reservation released", || async {
            let row = db.live().await.into_iter().find(|r| r.id == id)?;
            (!row.leased && row.retry_times == 0).then_some(())
        })
        .await;
        db.insert_due("ship", 3, |_| 0).await;
        // Sweeps (and workers of other processes) do not claim it.
        let other = db
            .notifier()
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        for n in [&notifier, &other] {
            assert!(n.sweep_once(100).await.unwrap().is_empty());
        }
        assert_eq!(rec.count_for(id), 0);
        let live = db.live().await;
        assert_eq!(live.len(), 4);
        assert!(
            live.iter()
                .all(|r| r.retry_times == 0 && r.status == Status::NotSent)
        );
        let listed = solid_notify::def::store::list(&db.db).await.unwrap();
        let ship = listed.iter().find(|(r, _)| r.name == "ship").unwrap();
        assert_eq!(
            ship.0.pause_reason.as_deref(),
            Some("paused by erin: receiver maintenance")
        );

        // Resumed from another process: this one sees it within its
        // def_cache_ttl (5 s); until then what it claims it releases.
        other.resume("ship").await.unwrap();
        eventually(20, "all delivered after the resume", || async {
            notifier.sweep_once(100).await.unwrap();
            (db.counts().await == (0, 5)).then_some(())
        })
        .await;
        assert_eq!(rec.count_for(id), 1);
        assert_eq!(rec.count(), 5);
        assert!(db.history().await.iter().all(|r| r.retry_times == 0));

        // A pause with an end lifts by itself.
        notifier
            .pause(
                "ship",
                PauseEnd::After(Duration::from_secs(2)),
                &Audit::new("f", "g"),
            )
            .await
            .unwrap();
        db.insert_due("ship", 1, |_| 0).await;
        assert!(notifier.sweep_once(100).await.unwrap().is_empty());
        eventually(10, "the pause ended", || async {
            (notifier.sweep_once(100).await.unwrap().len() == 1).then_some(())
        })
        .await;
    }
);

pub fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sn-ops-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn cli(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("USER", "cli-user")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

db_test!(
    cli_shows_lists_and_acts_in_bulk,
    |db: Arc<TestDb>| async move {
        let (notifier, _rec) = db.shipping().await;
        db.insert_due("ship", 6, |_| 0).await;
        let (ok, out, err) = cli(&db, &["list", "--def", "ship", "--json"]);
        assert!(ok, "{err}");
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(listed.len(), 6);
        let id = listed[0]["id"].as_i64().unwrap();

        let (ok, _, err) = cli(&db, &["cancel", "--def", "ship"]);
        assert!(!ok && err.contains("--reason is required"), "{err}");
        let (ok, _, err) = cli(&db, &["cancel", "--reason", "everything?"]);
        assert!(!ok && err.contains("at least one filter"), "{err}");
        let (ok, out, err) = cli(
            &db,
            &[
                "cancel",
                "--def",
                "ship",
                "--reason",
                "bad batch",
                "--dry-run",
                "--json",
            ],
        );
        assert!(ok, "{err}");
        let dry: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (dry["matched"].as_i64(), dry["changed"].as_i64()),
            (Some(6), Some(0))
        );
        assert_eq!(db.counts().await, (6, 0));
        let (ok, out, err) = cli(&db, &["cancel", "--def", "ship", "--reason", "bad batch"]);
        assert!(ok, "{err}");
        assert!(out.contains("6 matched, 6 changed, 0 skipped"), "{out}");

        let (ok, out, err) = cli(&db, &["show", &id.to_string(), "--json"]);
        assert!(ok, "{err}");
        let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(shown["status"], json!("cancelled"));
        assert_eq!(shown["place"], json!("history"));
        assert!(
            shown["errors"][0]
                .as_str()
                .unwrap()
                .ends_with("cancelled by cli-user: bad batch")
        );
        let (ok, out, _) = cli(
            &db,
            &["history", "list", "--status", "cancelled", "--since", "1h"],
        );
        assert!(ok && out.lines().count() == 7, "{out}");

        let ids = tempdir().join("ids.txt");
        std::fs::write(&ids, format!("# replay\n{id}\n")).unwrap();
        let (ok, out, err) = cli(
            &db,
            &[
                "requeue",
                "--ids",
                ids.to_str().unwrap(),
                "--reason",
                "one more time",
                "--actor",
                "zoe",
            ],
        );
        assert!(ok, "{err}");
        assert!(out.contains("1 matched, 1 changed"), "{out}");
        let view = notifier.status(id).await.unwrap();
        assert_eq!(view.place, Place::InFlight);
        assert!(
            view.errors
                .last()
                .unwrap()
                .ends_with("requeued by zoe: one more time")
        );
        let (ok, _, err) = cli(&db, &["requeue", &id.to_string()]);
        assert!(!ok && err.contains("not_sent"), "{err}");

        let (ok, _, err) = cli(
            &db,
            &["pause", "ship", "--until", "1h", "--reason", "deploy"],
        );
        assert!(ok, "{err}");
        let (_, out, _) = cli(&db, &["defs", "list"]);
        assert!(out.contains("PAUSED until"), "{out}");
        let (ok, _, err) = cli(&db, &["resume", "ship"]);
        assert!(ok, "{err}");
        let (ok, out, err) = cli(&db, &["purge", "--older-than", "30d", "--dry-run"]);
        assert!(ok && out.contains("0 would be deleted"), "{out}{err}");
    }
);

#[test]
fn an_unreachable_database_fails_within_the_timeout() {
    // Accepts connections (the kernel completes the handshake) and never
    // answers: the hang a firewalled or stuck server gives.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for url in [
        format!("postgres://u:secret@127.0.0.1:{port}/db"),
        format!("mysql://u:secret@127.0.0.1:{port}/db"),
    ] {
        let started = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(["list", "--connect-timeout", "1s"])
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(
            err.contains(&format!(
                "cannot reach the database at 127.0.0.1:{port}/db within 1s"
            )),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
    }
    drop(silent);
}

db_test!(
    metrics_are_served_with_the_outcomes_of_a_known_run,
    |db: Arc<TestDb>| async move {
        use wiremock::{
            Mock, MockServer, ResponseTemplate,
            matchers::{method, path},
        };
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/ok"))
            .respond_with(ResponseTemplate::new(200))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/bad"))
            .respond_with(ResponseTemplate::new(500))
            .mount(&server)
            .await;
        let http = |name: &str, url: String, retries: i64| {
            let mut spec = solid_notify::def::DefSpec::new(
                name,
                solid_notify::def::Channel::Http,
                json!({ "url": url }),
            );
            spec.max_retry_times = retries;
            spec.alert_trigger_type = 2;
            spec
        };
        solid_notify::def::store::sync(
            &db.db,
            &[
                http("m_ok", format!("{}/ok", server.uri()), 3),
                http("m_bad", format!("{}/bad", server.uri()), 0),
                http("m_held", format!("{}/ok", server.uri()), 3),
            ],
        )
        .await
        .unwrap();
        db.insert_due("m_ok", 3, |_| 0).await;
        db.insert_due("m_bad", 2, |_| 0).await;
        db.insert_due("m_held", 4, |_| 0).await;
        let ops = db.notifier().build().unwrap();
        ops.pause(
            "m_held",
            PauseEnd::OnResume,
            &Audit::new("t", "metrics test"),
        )
        .await
        .unwrap();
        let (mut child, addr) = crate::support::metrics_worker(&db, &[]).await;
        let series = |text: &str, name: &str, labels: &str| -> Option<f64> {
            let prefix = format!("{name}{{{labels}}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
        };
        let text = eventually(30, "the run's series", || {
            let addr = addr.clone();
            async move {
                let text = reqwest::get(&addr).await.ok()?.text().await.ok()?;
                let ok = series(
                    &text,
                    "solid_notify_attempts_total",
                    r#"def="m_ok",outcome="succeeded""#,
                );
                let bad = series(
                    &text,
                    "solid_notify_attempts_total",
                    r#"def="m_bad",outcome="final_failure""#,
                );
                let held = series(
                    &text,
                    "solid_notify_notices",
                    r#"def="m_held",status="not_sent""#,
                );
                let gone = series(
                    &text,
                    "solid_notify_notices",
                    r#"def="m_ok",status="not_sent""#,
                );
                // m_ok's not_sent series is 0 once seen, absent if never seen.
                (ok == Some(3.0)
                    && bad == Some(2.0)
                    && held == Some(4.0)
                    && gone.unwrap_or(0.0) == 0.0)
                    .then_some(text)
            }
        })
        .await;
        assert_eq!(
            series(&text, "solid_notify_paused", r#"def="m_held""#),
            Some(1.0)
        );
        // Only paused definitions have a series at 1; the others none, or 0.
        assert_eq!(
            series(&text, "solid_notify_paused", r#"def="m_ok""#).unwrap_or(0.0),
            0.0
        );
        assert!(series(&text, "solid_notify_oldest_due_seconds", r#"def="m_held""#).unwrap() > 0.0);
        assert_eq!(
            series(&text, "solid_notify_awaiting_confirmation", r#"def="m_ok""#).unwrap_or(0.0),
            0.0
        );
        let claims: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("solid_notify_claims_total "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(claims >= 5.0, "{claims}");
        assert!(text.contains("solid_notify_attempt_duration_seconds_bucket{def=\"m_ok\""));
        assert!(text.contains("solid_notify_sweep_duration_seconds_count"));
        assert_eq!(
            series(
                &text,
                "solid_notify_attempts_total",
                r#"def="m_ok",outcome="lost_claim""#
            ),
            Some(0.0),
            "no lost claims in a one-worker run"
        );
        // A page of another site whose name points here (DNS rebinding)
        // is refused; an IP address or localhost is answered.
        let http = reqwest::Client::new();
        for (host, answered) in [
            ("evil.example:9464", false),
            ("localhost.evil.example", false),
            ("127.0.0.1:9464", true),
            ("localhost:9464", true),
            ("[::1]:9464", true),
        ] {
            let status = http
                .get(&addr)
                .header(reqwest::header::HOST, host)
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status.is_success(), answered, "{host}: {status}");
        }
        let _ = child.0.kill();
    }
);

db_test!(a_circuit_opens_alerts_once_probes_and_closes, |db: Arc<
    TestDb,
>| async move {
    use std::sync::atomic::{AtomicBool, Ordering};
    // The TOML form of the policy.
    let specs = solid_notify::def::file::parse(
        "[flaky]\nchannel = \"handler\"\ntarget = { handler = \"flaky\" }\n\
         retry_interval = \"1h\"\nalert_trigger_type = 2\nemail = \"oncall@example.com\"\n\
         circuit = { failures = 5, window = \"1m\", cool_down = \"2s\" }\n",
        "flaky.toml",
    )
    .unwrap();
    assert_eq!(
        (
            specs[0].circuit_failures,
            specs[0].circuit_window,
            specs[0].circuit_cool_down
        ),
        (5, 60, 2)
    );
    solid_notify::def::store::sync(&db.db, &specs)
        .await
        .unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let rec = Recorder::default();
    let flag = failing.clone();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "flaky",
            rec.handler(move |_| {
                if flag.load(Ordering::SeqCst) {
                    Outcome::retry("receiver down")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    db.insert_due("flaky", 20, |_| 0).await;
    let running = start(
        notifier.clone(),
        fast(WorkerConfig {
            concurrency: 1,
            ..WorkerConfig::default()
        }),
    );
    let paused = || async {
        let rows = solid_notify::def::store::list(&db.db).await.unwrap();
        let (row, _) = rows.into_iter().find(|(r, _)| r.name == "flaky").unwrap();
        let now = chrono::Utc::now().naive_utc();
        row.paused_until
            .filter(|u| *u > now)
            .map(|_| row.pause_reason.clone().unwrap_or_default())
    };
    let reason = eventually(20, "the circuit opened", || async { paused().await }).await;
    assert_eq!(reason, "circuit open: paused after 5 consecutive failures");
    assert_eq!(rec.count(), 5, "nothing attempted once it opened");

    // One probe after the cool-down; it fails: open again, no second alert.
    eventually(20, "the first probe", || async {
        (rec.count() == 6).then_some(())
    })
    .await;
    failing.store(false, Ordering::SeqCst);
    let reason = eventually(5, "re-opened", || async {
        paused().await.filter(|r| r.contains("probe failed"))
    })
    .await;
    assert_eq!(reason, "circuit open: the probe failed");
    assert_eq!(rec.count(), 6, "one probe per cool-down");

    // The next probe succeeds: closed, and the rest go (the six failed
    // notices wait for their retry, an hour away).
    let conn = &db.db;
    let flaky = |place| async move {
        find::list(conn, place, &filter_def("flaky"), Page::default())
            .await
            .unwrap()
            .len()
    };
    eventually(30, "closed and drained", || async {
        (paused().await.is_none()
            && flaky(Place::InFlight).await == 6
            && flaky(Place::History).await == 14)
            .then_some(())
    })
    .await;
    running.stop().await;
    // 5 failures, a failed probe, a good probe, the other 13 once each.
    assert_eq!(rec.count(), 5 + 1 + 1 + 13);
    let history = db.history().await;
    assert!(
        history
            .iter()
            .all(|r| r.status == Status::Succeeded && r.retry_times <= 1),
        "released attempts were not charged"
    );
    let alerts: Vec<String> = db
        .live()
        .await
        .into_iter()
        .map(|r| r.param)
        .chain(history.into_iter().map(|r| r.param))
        .filter(|p| p.contains("consecutive failures"))
        .collect();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert!(alerts[0].contains("oncall@example.com"));
});

db_test!(an_operator_resume_beats_an_open_circuit, |db: Arc<
    TestDb,
>| async move {
    use std::sync::atomic::{AtomicBool, Ordering};
    db.def("flaky", "flaky", |s| {
        s.retry_interval = "1h".into();
        s.alert_trigger_type = 2;
        s.circuit_failures = 3;
        s.circuit_cool_down = 3_600;
    })
    .await;
    let rec = Recorder::default();
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "flaky",
            rec.handler(move |_| {
                if flag.load(Ordering::SeqCst) {
                    Outcome::retry("down")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    db.insert_due("flaky", 10, |_| 0).await;
    let running = start(
        notifier.clone(),
        fast(WorkerConfig {
            concurrency: 1,
            ..WorkerConfig::default()
        }),
    );
    eventually(20, "the circuit opened", || async {
        let rows = solid_notify::def::store::list(&db.db).await.unwrap();
        rows.iter()
            .any(|(r, _)| r.name == "flaky" && r.pause_reason.is_some())
            .then_some(())
    })
    .await;
    assert_eq!(rec.count(), 3);
    // The receiver is fixed; an operator in another process resumes at
    // once instead of waiting an hour for the probe.
    failing.store(false, Ordering::SeqCst);
    db.notifier()
        .build()
        .unwrap()
        .resume("flaky")
        .await
        .unwrap();
    eventually(
        30,
        "the other seven delivered by the opening process",
        || async {
            let done = find::list(
                &db.db,
                Place::History,
                &filter_def("flaky"),
                Page::default(),
            )
            .await
            .unwrap();
            (done.len() == 7).then_some(())
        },
    )
    .await;
    running.stop().await;
    assert_eq!(rec.count(), 3 + 7);
});

db_test!(
    a_bulk_cancel_then_requeue_never_overlaps_the_running_attempts,
    |db: Arc<TestDb>| async move {
        use std::{sync::Mutex, time::Instant};
        db.def("slow", "slow", |_| {}).await;
        // (id, start, end) of every delivery.
        let spans: Arc<Mutex<Vec<(i64, Instant, Instant)>>> = Arc::default();
        let seen = spans.clone();
        let notifier = db
            .notifier()
            .config(Config {
                lease: Duration::from_secs(4),
                attempt_timeout: Duration::from_secs(2),
                ..quiet()
            })
            .handler("slow", move |n: solid_notify::Notice| {
                let seen = seen.clone();
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    seen.lock().unwrap().push((n.id, start, Instant::now()));
                    Ok(Outcome::success())
                }
            })
            .build()
            .unwrap();
        db.insert_due("slow", 4, |_| 0).await;
        let running = start(
            notifier.clone(),
            fast(WorkerConfig {
                ..WorkerConfig::default()
            }),
        );
        eventually(10, "four attempts running", || async {
            let live = db.live().await;
            (live.len() == 4 && live.iter().all(|r| r.leased)).then_some(())
        })
        .await;
        // Mid-attempt: cancel all four, then requeue all four, in bulk.
        let ops = db.notifier().config(quiet()).build().unwrap();
        let cancel = ops
            .cancel_where(&BulkAction::new(
                filter_def("slow"),
                Audit::new("op", "oops"),
            ))
            .await
            .unwrap();
        assert_eq!(cancel.changed, 4);
        let requeue = ops
            .requeue_where(&BulkAction::new(
                filter_def("slow"),
                Audit::new("op", "undo"),
            ))
            .await
            .unwrap();
        assert_eq!(requeue.changed, 4);
        // Back in flight but still held by the running attempts' leases.
        let live = db.live().await;
        assert_eq!(live.len(), 4);
        assert!(
            live.iter().all(|r| r.leased && r.retry_times == 0),
            "{live:?}"
        );
        eventually(30, "all four delivered again and finished", || async {
            let (live, done) = db.counts().await;
            (live == 0 && done == 4).then_some(())
        })
        .await;
        running.stop().await;
        let spans = spans.lock().unwrap().clone();
        for id in db.history().await.iter().map(|r| r.id) {
            let mut mine: Vec<_> = spans.iter().filter(|s| s.0 == id).collect();
            assert_eq!(mine.len(), 2, "the lost first attempt and the requeued one");
            mine.sort_by_key(|s| s.1);
            assert!(mine[0].2 <= mine[1].1, "overlap on notice {id}");
        }
    }
);
