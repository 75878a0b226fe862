//! Scenario 7: the database's clock decides what is due and when a lease
//! ends, so application hosts whose clocks are minutes apart never overlap,
//! and a host whose clock lags still sees plain-SQL rows as due at once.

use std::{sync::Arc, time::Duration};

use chrono::TimeDelta;
use solid_notify::{Config, Status, WorkerConfig};

use super::{fast, http_def, quiet, start};
use crate::{
    db_test,
    receiver::{Receiver, Reply},
    support::{TestDb, eventually},
};

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
    let notices = 16;
    db.insert_due("hook", notices, |_| 0).await;
    let config = |offset: TimeDelta| Config {
        lease: Duration::from_secs(6),
        attempt_timeout: Duration::from_secs(3),
        app_clock_offset: offset,
        ..quiet()
    };
    // One host runs five minutes ahead, the other five minutes behind.
    let started = std::time::Instant::now();
    let workers: Vec<_> = [TimeDelta::minutes(5), TimeDelta::minutes(-5)]
        .into_iter()
        .map(|offset| {
            let notifier = db.notifier().config(config(offset)).build().unwrap();
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
        (db.counts().await.0 == 0).then_some(())
    })
    .await;
    for w in workers {
        w.stop().await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "plain-SQL rows were due at once for the lagging host too"
    );
    assert_eq!(receiver.overlaps(), Vec::<i64>::new());
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(receiver.delivered().len(), notices);
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
});
