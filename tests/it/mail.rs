//! E-mail channel and alert e-mails against a real SMTP server.

use std::sync::Arc;

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, Notifier, Outcome, Status,
    alert::ALERT_DEF,
    channel::mail::MailConfig,
    def::{Channel, DefSpec, store},
};

use crate::{
    db_test,
    smtp::SmtpServer,
    support::{Recorder, TestDb, eventually, test_config},
};

pub fn mail_config(smtp: Option<&SmtpServer>, dir: Option<std::path::PathBuf>) -> Config {
    Config {
        mail: MailConfig {
            smtp_url: smtp.map(SmtpServer::url),
            from: "solid-notify <notify@example.com>".into(),
            file_dir: dir.unwrap_or_else(std::env::temp_dir),
        },
        ..test_config()
    }
}

/// Sweeps until nothing is left in flight (alerts included).
async fn drain(db: &TestDb, notifier: &Notifier, secs: u64) {
    eventually(secs, "every notice and alert finished", || async {
        notifier.sweep_once(100).await.unwrap();
        (db.counts().await.0 == 0).then_some(())
    })
    .await;
}

db_test!(email_notices_are_delivered, |db: Arc<TestDb>| async move {
    let smtp = SmtpServer::start().await;
    let fixed = json!({"recipients": ["ops@example.com"], "subject": "Order shipped"});
    store::sync(
        &db.db,
        &[
            DefSpec::new("shipped_mail", Channel::Email, fixed),
            DefSpec::new("free_mail", Channel::Email, json!({})),
        ],
    )
    .await
    .unwrap();
    let notifier = db
        .notifier()
        .config(mail_config(Some(&smtp), None))
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    tx.add_notice(
        "shipped_mail",
        &json!({"body": "Order 42 left the warehouse"}),
        "",
    )
    .await
    .unwrap();
    tx.add_notice(
        "free_mail",
        &json!({"to": ["a@example.com", "b@example.com"], "subject": "Hi", "body": "there"}),
        "",
    )
    .await
    .unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert!(
        reports.iter().all(|r| r.result == AttemptResult::Succeeded),
        "{reports:?}"
    );
    let shipped = smtp.to("ops@example.com");
    assert_eq!(shipped.len(), 1);
    assert_eq!(shipped[0].subject, "Order shipped");
    assert_eq!(shipped[0].body.trim(), "Order 42 left the warehouse");
    let free = smtp.to("b@example.com");
    assert_eq!(free.len(), 1);
    assert!(free[0].to.contains("a@example.com"));
    assert_eq!(
        (free[0].subject.as_str(), free[0].body.trim()),
        ("Hi", "there")
    );
});

db_test!(each_alert_type_sends_the_expected_mails, |db: Arc<
    TestDb,
>| async move {
    let smtp = SmtpServer::start().await;
    for (ty, n) in [(0, 0), (1, 0), (2, 0), (3, 2)] {
        db.def(&format!("type{ty}"), "down", |s| {
            s.retry_interval = "1s".into();
            s.max_retry_times = 4; // five attempts
            s.alert_trigger_type = ty;
            s.alert_trigger_fail_times = n;
            s.email = format!("t{ty}@example.com");
        })
        .await;
    }
    let notifier = db
        .notifier()
        .config(mail_config(Some(&smtp), None))
        .handler(
            "down",
            Recorder::default()
                .handler(|n| Outcome::retry(format!("receiver down ({})", n.attempt))),
        )
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let mut ids = Vec::new();
    for ty in 0..4 {
        ids.push(
            tx.add_notice(&format!("type{ty}"), &json!({"order": ty}), "")
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    drain(&db, &notifier, 30).await;
    for id in &ids {
        assert_eq!(
            db.history_of(*id).await.unwrap().status,
            Status::FinalFailure
        );
    }
    let counts: Vec<usize> = (0..4)
        .map(|ty| smtp.to(&format!("t{ty}@example.com")).len())
        .collect();
    // 0: the final failure; 1: failures 1, 2, 4 and the final 5th; 2: none; 3: the 2nd failure.
    assert_eq!(counts, [1, 4, 0, 1]);
    let final_alert = &smtp.to("t0@example.com")[0];
    assert_eq!(
        final_alert.subject,
        format!(
            "[solid-notify] type0: notice {} failed for good after 5 attempts",
            ids[0]
        )
    );
    for needle in [
        "definition `type0`",
        "attempt 5: receiver down (5)",
        "attempt 1: receiver down (1)",
        "{\"order\":0}",
        &format!("solid-notify requeue {}", ids[0]),
    ] {
        assert!(
            final_alert.body.contains(needle),
            "alert lacks {needle:?}:\n{}",
            final_alert.body
        );
    }
    let third = &smtp.to("t3@example.com")[0];
    assert!(
        third.subject.contains("failing (2 failures)"),
        "{}",
        third.subject
    );
    // Alert notices themselves finished as successes.
    let alerts: Vec<_> = db
        .history()
        .await
        .into_iter()
        .filter(|h| !ids.contains(&h.id))
        .collect();
    assert_eq!(alerts.len(), 6);
    assert!(alerts.iter().all(|a| a.status == Status::Succeeded));
});

db_test!(
    alerts_survive_an_smtp_outage,
    |db: Arc<TestDb>| async move {
        let mut smtp = SmtpServer::start().await;
        smtp.stop();
        db.def("fragile", "reject", |s| {
            s.email = "oncall@example.com".into()
        })
        .await;
        // Operators may tune the alert definition like any other: retry every second.
        db.db
            .execute_unprepared(&format!(
                "UPDATE notify_def SET retry_interval = '1s' WHERE name = '{ALERT_DEF}'"
            ))
            .await
            .unwrap();
        let notifier = db
            .notifier()
            .config(mail_config(Some(&smtp), None))
            .handler(
                "reject",
                Recorder::default().handler(|_| Outcome::permanent("410 gone")),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("fragile", &json!({}), "").await.unwrap();
        let report = tx.commit_and_wait().await.unwrap();
        assert!(matches!(
            report[0].result,
            AttemptResult::FinalFailure { .. }
        ));
        // The notice's own state is recorded whatever the mail server does.
        assert_eq!(
            db.history_of(id).await.unwrap().status,
            Status::FinalFailure
        );
        let alert = eventually(10, "alert attempt failed", || async {
            db.live().await.into_iter().find(|r| r.retry_times >= 1)
        })
        .await;
        assert_eq!(alert.status, Status::Failed);
        assert!(alert.errors.contains("SMTP"), "{}", alert.errors);
        assert!(smtp.messages().is_empty());

        smtp.resume().await;
        drain(&db, &notifier, 20).await;
        let mails = smtp.to("oncall@example.com");
        assert_eq!(mails.len(), 1, "the alert arrives once, after the outage");
        assert!(
            mails[0]
                .subject
                .contains(&format!("notice {id} failed for good"))
        );
    }
);

db_test!(
    without_smtp_alerts_go_to_files,
    |db: Arc<TestDb>| async move {
        let dir = std::env::temp_dir().join(format!(
            "sn_mail_files_{}_{}",
            std::process::id(),
            fastrand_suffix()
        ));
        db.def("to_files", "reject", |s| s.email = "ops@example.com".into())
            .await;
        let notifier = db
            .notifier()
            .config(mail_config(None, Some(dir.clone())))
            .handler(
                "reject",
                Recorder::default().handler(|_| Outcome::permanent("nope")),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("to_files", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        let file = eventually(10, "alert file written", || async {
            std::fs::read_dir(&dir)
                .ok()?
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "eml"))
        })
        .await;
        let mail = crate::smtp::parse(&std::fs::read(&file).unwrap());
        assert!(
            mail.subject
                .contains(&format!("notice {id} failed for good")),
            "{}",
            mail.subject
        );
        assert!(mail.to.contains("ops@example.com"));
        std::fs::remove_dir_all(&dir).ok();
    }
);

fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mail_folder_is_private_and_never_a_link() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    crate::support::run(crate::support::Backend::Sqlite, |db| async move {
        let base = std::env::temp_dir().join(format!("sn_mail_modes_{}", fastrand_suffix()));
        let dir = base.join("mail");
        store::sync(
            &db.db,
            &[DefSpec::new(
                "memo",
                Channel::Email,
                json!({"recipients": ["ops@example.com"]}),
            )],
        )
        .await
        .unwrap();
        let send = async |dir: std::path::PathBuf| {
            let notifier = db
                .notifier()
                .config(mail_config(None, Some(dir)))
                .build()
                .unwrap();
            let tx = notifier.begin().await.unwrap();
            tx.add_notice("memo", &json!({"body": "private"}), "").await.unwrap();
            tx.commit_and_wait().await.unwrap().pop().unwrap().result
        };
        // Created 0700, the mail 0600.
        let result = send(dir.clone()).await;
        assert!(matches!(result, AttemptResult::Succeeded), "{result:?}");
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, 0o600);
        // A link planted at the folder's path: refused, nothing written
        // where it points.
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let result = send(link).await;
        assert!(
            matches!(&result, AttemptResult::WillRetry { reason, .. } | AttemptResult::FinalFailure { reason, .. } if reason.contains("symbolic link")),
            "{result:?}"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // A folder of another user: refused.
        if rustix_euid() == 0 {
            let theirs = base.join("theirs");
            std::fs::create_dir_all(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let result = send(theirs.clone()).await;
            assert!(
                matches!(&result, AttemptResult::WillRetry { reason, .. } | AttemptResult::FinalFailure { reason, .. } if reason.contains("belongs to user 65534")),
                "{result:?}"
            );
            assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
        }
        // An empty folder name is a configuration error.
        let built = db
            .notifier()
            .config(mail_config(None, Some(std::path::PathBuf::new())))
            .build();
        assert!(
            matches!(&built, Err(solid_notify::Error::Config(m)) if m.contains("SOLID_NOTIFY_MAIL_DIR")),
            "{:?}",
            built.err()
        );
        std::fs::remove_dir_all(&base).ok();
    })
    .await
}

/// This process's user id (the owner of what it creates).
fn rustix_euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let probe = std::env::temp_dir().join(format!("sn_uid_{}", fastrand_suffix()));
    std::fs::write(&probe, b"").unwrap();
    let uid = std::fs::metadata(&probe).unwrap().uid();
    std::fs::remove_file(&probe).ok();
    uid
}
