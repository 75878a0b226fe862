//! Scenarios 3 and 4: never two sends of one notice at the same time, when
//! a process shuts down mid-attempt, when alert hooks are slow, when the
//! receiver is slower than the attempt timeout.

use solid_notify::ops::Audit;
use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{AlertHook, AttemptResult, Config, FailureEvent, Status, WorkerConfig};

use super::{fast, http_def, quiet, start};
use crate::{
    db_test,
    receiver::{Receiver, Reply},
    support::{TestDb, eventually},
};

db_test!(shutdown_during_commit_and_wait_never_overlaps, |db: Arc<
    TestDb,
>| async move {
    // The first request hangs for 3 s; later ones answer at once.
    let receiver = Receiver::first_slow(Duration::from_secs(3)).await;
    http_def(&db, "hook", &receiver.url, |_| {}).await;
    let producer = db.notifier().build().unwrap();
    let tx = producer.begin().await.unwrap();
    let id = tx.add_notice("hook", &json!({}), "").await.unwrap();
    let waiting = tokio::spawn(async move { tx.commit_and_wait().await.unwrap() });
    eventually(10, "the first request running", || async {
        (receiver.running() == 1).then_some(())
    })
    .await;
    // Another worker stands by while the producer shuts down.
    let worker = start(
        db.notifier().config(quiet()).build().unwrap(),
        fast(WorkerConfig::default()),
    );
    let released = producer.shutdown(Duration::from_millis(200)).await.unwrap();
    assert_eq!(released, 1);
    let report = waiting.await.unwrap();
    assert!(
        matches!(report[0].result, AttemptResult::Released { .. }),
        "{report:?}"
    );
    let done = eventually(10, "delivered by the other worker", || async {
        db.history_of(id).await
    })
    .await;
    worker.stop().await;
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(
        receiver.overlaps(),
        Vec::<i64>::new(),
        "two requests at once"
    );
    assert_eq!(
        receiver.count_for(id),
        2,
        "the abandoned request and the resend"
    );
});

/// An alert hook that takes 4 s (under the 5 s hook timeout).
#[derive(Clone)]
struct SlowHook;

#[async_trait::async_trait]
impl AlertHook for SlowHook {
    async fn alert(&self, _: FailureEvent) {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
}

db_test!(
    slow_receivers_and_hooks_never_overlap,
    |db: Arc<TestDb>| async move {
        // Lease 4 s, attempt timeout 2 s. Each notice's first two requests hang
        // for 10 s (well past the timeout and the lease); the third answers at once.
        let receiver = Receiver::start(|r| {
            if r.attempt <= 2 {
                Reply::ok().after(Duration::from_secs(10))
            } else {
                Reply::ok()
            }
        })
        .await;
        http_def(&db, "slow", &receiver.url, |s| {
            s.retry_interval = "1s".into();
            s.alert_trigger_type = 1; // every failure alerts: the slow hook runs often
        })
        .await;
        let config = Config {
            lease: Duration::from_secs(4),
            attempt_timeout: Duration::from_secs(2),
            ..quiet()
        };
        let notices = 12;
        db.insert_due("slow", notices, |_| 0).await;
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let notifier = db
                    .notifier()
                    .config(config.clone())
                    .alert_hook(SlowHook)
                    .build()
                    .unwrap();
                start(
                    notifier,
                    fast(WorkerConfig {
                        concurrency: 4,
                        ..WorkerConfig::default()
                    }),
                )
            })
            .collect();
        eventually(90, "every notice delivered", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        for w in workers {
            w.stop().await;
        }
        assert_eq!(
            receiver.overlaps(),
            Vec::<i64>::new(),
            "two requests at once"
        );
        assert_eq!(receiver.delivered().len(), notices);
        for done in db.history().await {
            assert_eq!(done.status, Status::Succeeded);
            assert_eq!(
                done.retry_times, 2,
                "two timeouts, then success: {}",
                done.errors
            );
        }
    }
);

db_test!(
    attempt_never_takes_a_live_lease,
    |db: Arc<TestDb>| async move {
        // Every first request hangs for 3 s (under the 4 s attempt timeout).
        let receiver = Receiver::first_slow(Duration::from_secs(3)).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        // One notice held by its producer's after-commit attempt, one by a
        // worker's claim.
        let producer = db.notifier().build().unwrap();
        let tx = producer.begin().await.unwrap();
        let reserved = tx.add_notice("hook", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        db.insert_due("hook", 1, |_| 0).await;
        let worker = start(
            db.notifier().config(quiet()).build().unwrap(),
            fast(WorkerConfig::default()),
        );
        eventually(10, "both first requests running", || async {
            (receiver.running() == 2).then_some(())
        })
        .await;
        // A third process reads both rows as they stand and attempts them.
        let other = db.notifier().config(quiet()).build().unwrap();
        let rows = db.live().await;
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.leased), "{rows:?}");
        for row in rows {
            let id = row.id;
            let report = other.attempt(row).await;
            assert_eq!(
                report.result,
                AttemptResult::LostClaim,
                "notice {id} (reserved: {})",
                id == reserved
            );
        }
        eventually(20, "both delivered", || async {
            (db.counts().await == (0, 2)).then_some(())
        })
        .await;
        worker.stop().await;
        assert_eq!(
            receiver.overlaps(),
            Vec::<i64>::new(),
            "two requests at once"
        );
        assert_eq!(receiver.seen().len(), 2, "one request per notice");
    }
);

db_test!(
    cancel_then_requeue_never_overlaps_the_running_attempt,
    |db: Arc<TestDb>| async move {
        // The first request hangs for 3 s (under the 4 s attempt timeout).
        let receiver = Receiver::first_slow(Duration::from_secs(3)).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        let config = Config {
            lease: Duration::from_secs(8),
            attempt_timeout: Duration::from_secs(4),
            ..crate::support::test_config()
        };
        let producer = db.notifier().config(config.clone()).build().unwrap();
        let tx = producer.begin().await.unwrap();
        let id = tx.add_notice("hook", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        eventually(10, "the first request running", || async {
            (receiver.running() == 1).then_some(())
        })
        .await;
        let worker = start(
            db.notifier()
                .config(Config {
                    immediate_attempt: false,
                    ..config
                })
                .build()
                .unwrap(),
            fast(WorkerConfig::default()),
        );
        // An operator cancels the notice and, at once, requeues it.
        let operator = db.notifier().config(quiet()).build().unwrap();
        operator.cancel(id, &Audit::operator()).await.unwrap();
        operator.requeue(id, &Audit::operator()).await.unwrap();
        let requeued = db.live().await.pop().expect("back in flight");
        assert!(requeued.leased, "still held by the running attempt's lease");
        eventually(20, "delivered after the first attempt's lease", || async {
            db.history_of(id).await
        })
        .await;
        worker.stop().await;
        assert_eq!(
            receiver.overlaps(),
            Vec::<i64>::new(),
            "two requests at once"
        );
        assert_eq!(receiver.count_for(id), 2);
    }
);
