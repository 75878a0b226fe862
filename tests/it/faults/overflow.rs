//! Scenario 9: a committed notice that will not be attempted after commit
//! (no free background slot, or shutdown under way) is due at once for a
//! sweeper, never a whole lease later.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{Config, Notice, Outcome, Status, WorkerConfig};

use super::{fast, quiet, start};
use crate::{
    db_test,
    support::{TestDb, eventually, test_config},
};

db_test!(overflow_and_shutdown_notices_are_due_at_once, |db: Arc<
    TestDb,
>| async move {
    db.def("ship", "ship", |_| {}).await;
    let slow = |_: Notice| async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(Outcome::success())
    };
    let notifier = db
        .notifier()
        .config(Config {
            max_background_attempts: 1,
            ..test_config()
        })
        .handler("ship", slow)
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    for i in 0..5 {
        tx.add_notice("ship", &json!({ "i": i }), "").await.unwrap();
    }
    tx.commit().await.unwrap();
    // One notice has the only slot; the other four are due now (the lease is 10 s).
    eventually(2, "overflow due at once", || async {
        (db.due_now().await == 4).then_some(())
    })
    .await;

    // A notice committed while the notifier shuts down is due at once too.
    let tx = notifier.begin().await.unwrap();
    let late = tx
        .add_notice("ship", &json!({"late": true}), "")
        .await
        .unwrap();
    let mut shutdown = Box::pin(notifier.shutdown(Duration::from_secs(10)));
    assert!(
        futures::poll!(&mut shutdown).is_pending(),
        "shutdown waits for the running attempt"
    );
    tx.commit().await.unwrap();
    eventually(2, "the late notice due at once", || async {
        (db.due_now().await == 5).then_some(())
    })
    .await;
    shutdown.await.unwrap();

    // A sweeper delivers them well before any lease would have run out.
    let worker = db
        .notifier()
        .config(quiet())
        .handler("ship", |_: Notice| async { Ok(Outcome::success()) })
        .build()
        .unwrap();
    let running = start(worker, fast(WorkerConfig::default()));
    eventually(5, "all delivered", || async {
        (db.counts().await == (0, 6)).then_some(())
    })
    .await;
    running.stop().await;
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
    assert_eq!(db.history_of(late).await.unwrap().retry_times, 0);
});

db_test!(
    an_alert_without_a_slot_is_due_at_once,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |s| {
            s.max_retry_times = 0;
            s.alert_trigger_type = 0;
            s.email = "ops@example.com".into();
        })
        .await;
        let handler = |n: Notice| async move {
            if n.param["slow"] == true {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok(Outcome::success())
            } else {
                Ok(Outcome::permanent("refused"))
            }
        };
        let notifier = db
            .notifier()
            .config(Config {
                max_background_attempts: 1,
                ..test_config()
            })
            .handler("ship", handler)
            .build()
            .unwrap();
        // A slow notice holds the only background slot.
        let tx = notifier.begin().await.unwrap();
        tx.add_notice("ship", &json!({"slow": true}), "")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // Another fails for good in the foreground: its alert finds no slot.
        let tx = notifier.begin().await.unwrap();
        let failed = tx.add_notice("ship", &json!({}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert!(
            matches!(
                reports[0].result,
                solid_notify::AttemptResult::FinalFailure { .. }
            ),
            "{reports:?}"
        );
        assert_eq!(
            db.history_of(failed).await.unwrap().status,
            Status::FinalFailure
        );
        // The alert is due now for a sweeper (the lease is 10 s), not reserved.
        let alert = eventually(2, "the alert due at once", || async {
            let rows = db.live().await;
            let alert = rows.into_iter().find(|r| r.description == "alert e-mail")?;
            (!alert.leased && db.due_now().await == 1).then_some(alert)
        })
        .await;
        assert!(alert.param.contains("ops@example.com"), "{}", alert.param);
        notifier.shutdown(Duration::from_secs(10)).await.unwrap();
    }
);
