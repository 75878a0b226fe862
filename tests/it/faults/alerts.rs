//! Scenarios 2 and 10: an alert is never lost, whatever the alert
//! definition's row looks like, and whichever filters the workers have.

use std::sync::Arc;

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{AttemptResult, Config, Outcome, WorkerConfig, alert::ALERT_DEF};

use super::{fast, start};
use crate::{
    db_test,
    mail::mail_config,
    smtp::SmtpServer,
    support::{Recorder, TestDb, eventually},
};

/// A definition that fails for good at once and alerts ops@example.com.
async fn doomed_def(db: &TestDb) {
    db.def("crm", "crm", |s| {
        s.max_retry_times = 0;
        s.email = "ops@example.com".into();
    })
    .await;
}

async fn fail_one(db: &TestDb, config: Config) -> i64 {
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .config(config)
        .handler("crm", rec.handler(|_| Outcome::retry("CRM down")))
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let id = tx
        .add_notice("crm", &json!({"customer": 7}), "")
        .await
        .unwrap();
    let report = tx.commit_and_wait().await.unwrap();
    assert!(
        matches!(report[0].result, AttemptResult::FinalFailure { .. }),
        "{report:?}"
    );
    notifier
        .shutdown(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    id
}

db_test!(an_invalid_alert_definition_still_alerts, |db: Arc<
    TestDb,
>| async move {
    let smtp = SmtpServer::start().await;
    doomed_def(&db).await;
    // An operator breaks the reserved row (the README invites editing it).
    db.db
        .execute_unprepared(&format!(
            "UPDATE notify_def SET retry_interval = '30 s' WHERE name = '{ALERT_DEF}'"
        ))
        .await
        .unwrap();
    let id = fail_one(&db, mail_config(Some(&smtp), None)).await;
    let mail = eventually(20, "the alert e-mail", || async {
        smtp.to("ops@example.com").pop()
    })
    .await;
    assert!(
        mail.subject
            .contains(&format!("notice {id} failed for good")),
        "{}",
        mail.subject
    );
});

db_test!(a_deleted_alert_definition_is_recreated, |db: Arc<
    TestDb,
>| async move {
    let smtp = SmtpServer::start().await;
    doomed_def(&db).await;
    db.db
        .execute_unprepared(&format!(
            "DELETE FROM notify_def WHERE name = '{ALERT_DEF}'"
        ))
        .await
        .unwrap();
    let id = fail_one(&db, mail_config(Some(&smtp), None)).await;
    let mail = eventually(20, "the alert e-mail", || async {
        smtp.to("ops@example.com").pop()
    })
    .await;
    assert!(
        mail.subject.contains(&format!("notice {id}")),
        "{}",
        mail.subject
    );
    let recreated = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM notify_def WHERE name = '{ALERT_DEF}'"
        ))
        .await;
    assert_eq!(recreated, 1);
});

db_test!(
    filtered_workers_still_retry_alerts,
    |db: Arc<TestDb>| async move {
        let mut smtp = SmtpServer::start().await;
        doomed_def(&db).await;
        db.def("other", "other", |_| {}).await;
        db.db
            .execute_unprepared(&format!(
                "UPDATE notify_def SET retry_interval = '1s' WHERE name = '{ALERT_DEF}'"
            ))
            .await
            .unwrap();
        // The mail server is down when the failure happens: the alert's own
        // after-commit attempt fails and waits for its retry.
        smtp.stop();
        fail_one(&db, mail_config(Some(&smtp), None)).await;
        assert_eq!(db.counts().await.0, 1, "the alert notice waits for a retry");
        smtp.resume().await;
        // The only worker is filtered to another definition and partition.
        let notifier = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..mail_config(Some(&smtp), None)
            })
            .handler("other", Recorder::default().handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let config = fast(WorkerConfig {
            defs: vec!["other".into()],
            partitions: vec![5],
            ..WorkerConfig::default()
        });
        let running = start(notifier, config);
        eventually(20, "the alert retried by the filtered worker", || async {
            smtp.to("ops@example.com").pop()
        })
        .await;
        running.stop().await;
        assert_eq!(db.counts().await.0, 0);
    }
);
