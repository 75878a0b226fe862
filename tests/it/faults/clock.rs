//! Scenario 7: the database's clock decides what is due and when a lease
//! ends. A host whose clock lags still sees plain-SQL rows as due at once,
//! and hosts (producers and workers) whose clocks are minutes apart never
//! overlap.

use std::{sync::Arc, time::Duration};

use chrono::TimeDelta;
use serde_json::json;
use solid_notify::{Config, Status, WorkerConfig};

use super::{fast, http_def, quiet, start};
use crate::{
    db_test,
    receiver::{Receiver, Reply},
    support::{TestDb, eventually},
};

fn skewed(offset: TimeDelta) -> Config {
    Config {
        lease: Duration::from_secs(6),
        attempt_timeout: Duration::from_secs(3),
        app_clock_offset: offset,
        ..quiet()
    }
}

db_test!(skewed_clocks_never_overlap, |db: Arc<TestDb>| async move {
    // Every first request takes 1.5 s, a quarter of the 6 s lease.
    let receiver = Receiver::start(|r| {
        if r.attempt == 1 {
            Reply::ok().after(Duration::from_millis(1500))
        } else {
            Reply::ok()
        }
    })
    .await;
    http_def(&db, "hook", &receiver.url, |_| {}).await;
    let behind = TimeDelta::minutes(-5);
    let ahead = TimeDelta::minutes(5);

    // A host five minutes behind, alone, delivers rows inserted with plain
    // SQL (due by the database's clock) at once.
    db.insert_due("hook", 4, |_| 0).await;
    let lagging = db.notifier().config(skewed(behind)).build().unwrap();
    let alone = start(lagging.clone(), fast(WorkerConfig::default()));
    eventually(10, "the lagging host delivers due rows", || async {
        (db.counts().await == (0, 4)).then_some(())
    })
    .await;
    alone.stop().await;

    // A producer five minutes behind adds notices; hosts five minutes behind
    // and ahead sweep them together.
    let notices = 16;
    let tx = lagging.begin().await.unwrap();
    for i in 0..notices {
        tx.add_notice("hook", &json!({ "i": i }), "").await.unwrap();
    }
    tx.commit().await.unwrap();
    let workers: Vec<_> = [behind, ahead]
        .into_iter()
        .map(|offset| {
            let notifier = db.notifier().config(skewed(offset)).build().unwrap();
            start(
                notifier,
                fast(WorkerConfig {
                    concurrency: 4,
                    ..WorkerConfig::default()
                }),
            )
        })
        .collect();
    eventually(60, "every notice delivered", || async {
        (db.counts().await == (0, 4 + notices as u64)).then_some(())
    })
    .await;
    for w in workers {
        w.stop().await;
    }
    assert_eq!(receiver.overlaps(), Vec::<i64>::new());
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(receiver.delivered().len(), 4 + notices);
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
});
