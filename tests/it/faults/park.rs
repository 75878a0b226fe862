//! Scenario 10: notices of a deleted or invalid definition are parked with
//! the reason, alerted once to the alert definition's recipients, visible in
//! history, and requeueable once the definition is fixed.

use solid_notify::ops::Audit;
use std::sync::Arc;

use sea_orm::ConnectionTrait;
use solid_notify::{
    Config, Outcome, Status, WorkerConfig,
    alert::ALERT_DEF,
    ops::{NoticeFilter, Page, Place, find},
};

use super::{fast, start};
use crate::{
    db_test,
    mail::mail_config,
    smtp::SmtpServer,
    support::{Recorder, TestDb, eventually},
};

db_test!(unusable_definitions_park_their_notices, |db: Arc<
    TestDb,
>| async move {
    let smtp = SmtpServer::start().await;
    db.def("gone", "h", |_| {}).await;
    db.def("broken", "h", |_| {}).await;
    db.insert_due("gone", 3, |_| 0).await;
    db.insert_due("broken", 2, |_| 0).await;
    let exec = |sql: String| {
        let db = db.clone();
        async move { db.db.execute_unprepared(&sql).await.unwrap() }
    };
    exec(format!(
        "UPDATE notify_def SET email = 'oncall@example.com' WHERE name = '{ALERT_DEF}'"
    ))
    .await;
    exec("DELETE FROM notify_def WHERE name = 'gone'".into()).await;
    exec("UPDATE notify_def SET retry_interval = 'soon' WHERE name = 'broken'".into()).await;

    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .config(Config {
            immediate_attempt: false,
            ..mail_config(Some(&smtp), None)
        })
        .handler("h", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let running = start(notifier.clone(), fast(WorkerConfig::default()));
    let parked = eventually(20, "five notices parked", || async {
        let filter = NoticeFilter {
            status: Some(Status::Parked),
            ..NoticeFilter::default()
        };
        let parked = find::list(&db.db, Place::History, &filter, Page::default())
            .await
            .unwrap();
        (parked.len() == 5).then_some(parked)
    })
    .await;
    for row in &parked {
        assert!(
            row.errors.join("\n").contains("parked:"),
            "{:?}",
            row.errors
        );
    }
    assert!(
        parked
            .iter()
            .any(|r| r.errors.join("\n").contains("does not exist"))
    );
    assert!(
        parked
            .iter()
            .any(|r| r.errors.join("\n").contains("retry_interval"))
    );
    let mails = eventually(20, "one alert per definition", || async {
        let mails = smtp.to("oncall@example.com");
        (mails.len() == 2).then_some(mails)
    })
    .await;
    assert!(
        mails.iter().all(|m| m.subject.contains("parked")),
        "{mails:?}"
    );
    assert_eq!(rec.count(), 0, "nothing sent");

    // The broken definition is fixed; its notices are requeued and delivered.
    exec("UPDATE notify_def SET retry_interval = '5s' WHERE name = 'broken'".into()).await;
    notifier.reload_defs();
    let broken: Vec<i64> = parked
        .iter()
        .filter(|r| r.errors.join("\n").contains("retry_interval"))
        .map(|r| r.id)
        .collect();
    for id in &broken {
        notifier.requeue(*id, &Audit::operator()).await.unwrap();
    }
    eventually(20, "requeued notices delivered", || async {
        let mut done = Vec::new();
        for id in &broken {
            done.push(
                db.history_of(*id)
                    .await
                    .filter(|h| h.status == Status::Succeeded)?,
            );
        }
        Some(done)
    })
    .await;
    running.stop().await;
    assert_eq!(rec.count(), 2);
});
