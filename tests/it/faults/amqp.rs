//! Scenarios 6 and 8 on the real RabbitMQ: one bad publish fails alone, and
//! late confirmations are answered at once without holding up good ones.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use lapin::{options::QueueDeclareOptions, types::FieldTable};
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, Outcome, Status, WorkerConfig,
    confirm::ConfirmOutcome,
    def::{Channel, DefSpec, store},
};

use super::{fast, start};
use crate::{
    amqp::{Rabbit, broker_shared},
    db_test,
    support::{Recorder, TestDb, eventually},
};

db_test!(a_bad_publish_fails_alone, |db: Arc<TestDb>| async move {
    let _shared = broker_shared().await;
    let rabbit = Rabbit::new(&db).await;
    rabbit
        .def(&db, "good", "rk", |s| s.retry_interval = "1h".into())
        .await;
    let mut bad = DefSpec::new(
        "bad",
        Channel::Amqp,
        json!({"exchange": format!("{}_missing", rabbit.exchange), "routing_key": "rk"}),
    );
    bad.retry_interval = "1h".into();
    store::sync(&db.db, &[bad]).await.unwrap();
    let notifier = db
        .notifier()
        .config(Config {
            max_background_attempts: 512,
            ..rabbit.config()
        })
        .build()
        .unwrap();
    // 200 good notices and 4 to a missing exchange, all published at once
    // on the shared channel by after-commit attempts.
    let tx = notifier.begin().await.unwrap();
    let mut bad_ids = Vec::new();
    for i in 0..204 {
        let def = if i % 51 == 50 { "bad" } else { "good" };
        let id = tx.add_notice(def, &json!({ "i": i }), "").await.unwrap();
        if def == "bad" {
            bad_ids.push(id);
        }
    }
    tx.commit().await.unwrap();
    eventually(60, "every publish settled", || async {
        let (live, done) = db.counts().await;
        (live == 4 && done == 200 && db.live().await.iter().all(|r| r.retry_times == 1))
            .then_some(())
    })
    .await;
    for done in db.history().await {
        assert_eq!(
            (done.status, done.retry_times),
            (Status::Succeeded, 0),
            "a good notice was charged: {}",
            done.errors
        );
    }
    let live = db.live().await;
    assert_eq!(live.iter().map(|r| r.id).collect::<Vec<_>>(), bad_ids);
    for row in live {
        assert_eq!(row.status, Status::Failed);
        assert!(row.errors.contains("does not exist"), "{}", row.errors);
    }
    assert_eq!(rabbit.queued().await, 200, "one message per good notice");
    notifier.shutdown(Duration::from_secs(5)).await.unwrap();
});

db_test!(late_confirmations_are_answered_at_once, |db: Arc<
    TestDb,
>| async move {
    let _shared = broker_shared().await;
    let rabbit = Rabbit::new(&db).await;
    db.def("confirmed", "h", |s| {
        s.need_confirm = true;
        s.max_confirm_delay = 1;
        s.retry_interval = "1h".into();
    })
    .await;
    let notifier = db
        .notifier()
        .config(rabbit.config())
        .handler("h", Recorder::default().handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let mut stale = Vec::new();
    for i in 0..4 {
        stale.push(
            tx.add_notice("confirmed", &json!({ "i": i }), "")
                .await
                .unwrap(),
        );
    }
    let reports = tx.commit_and_wait().await.unwrap();
    assert!(
        reports
            .iter()
            .all(|r| r.result == AttemptResult::AwaitingConfirm)
    );
    // The deadline passes; a sweep records the missing confirmations.
    eventually(10, "deadlines passed", || async {
        (db.due_now().await == 4).then_some(())
    })
    .await;
    let swept = notifier.sweep_once(10).await.unwrap();
    assert!(
        swept.iter().all(|r| matches!(&r.result, AttemptResult::WillRetry { reason, .. } if reason.contains("not confirmed"))),
        "{swept:?}"
    );
    // Late verdicts through the API are answered at once.
    let asked = Instant::now();
    assert_eq!(
        notifier.confirm(stale[0]).await.unwrap(),
        ConfirmOutcome::NotAwaiting {
            status: Status::Failed
        }
    );
    assert_eq!(
        notifier.reject(stale[1], "too late").await.unwrap(),
        ConfirmOutcome::NotAwaiting {
            status: Status::Failed
        }
    );
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );

    // A fresh notice awaits confirmation; its confirmation is queued behind
    // four stale ones.
    let tx = notifier.begin().await.unwrap();
    let fresh = tx
        .add_notice("confirmed", &json!({"fresh": true}), "")
        .await
        .unwrap();
    tx.commit_and_wait().await.unwrap();
    let listening = WorkerConfig {
        confirm_listener: true,
        ..fast(WorkerConfig::default())
    };
    let running = start(notifier.clone(), listening);
    // The queue exists before anyone answers (as the publisher's declare
    // ensures in production).
    rabbit
        .ch
        .queue_declare(
            rabbit.confirm_queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    for id in &stale {
        rabbit
            .reply(&rabbit.confirm_queue, json!({"id": id, "ok": true}))
            .await;
    }
    let sent = Instant::now();
    rabbit
        .reply(&rabbit.confirm_queue, json!({"id": fresh, "ok": true}))
        .await;
    let done = eventually(10, "the fresh confirmation applied", || async {
        db.history_of(fresh).await
    })
    .await;
    let waited = sent.elapsed();
    assert_eq!(done.status, Status::Succeeded);
    assert!(
        waited < Duration::from_millis(1500),
        "applied after {waited:?}"
    );
    eventually(
        10,
        "the stale confirmations acked, not requeued",
        || async {
            let left = rabbit
                .ch
                .queue_declare(
                    rabbit.confirm_queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap()
                .message_count();
            (left == 0).then_some(())
        },
    )
    .await;
    running.stop().await;
    for row in db.live().await {
        assert_eq!(
            (row.status, row.retry_times),
            (Status::Failed, 1),
            "stale ones unchanged"
        );
    }
});
