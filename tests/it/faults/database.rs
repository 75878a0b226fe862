//! Scenario 5: the database goes away in the middle of a sweep. Deliveries
//! already running end normally, delivered successes wait until they can be
//! written (never sent twice), and the worker goes on once the database is
//! back. Injected two ways: `pg_terminate_backend` of every worker session,
//! and a real outage (a proxy in front of the server cuts every connection
//! and refuses new ones for a few seconds).

use std::{sync::Arc, time::Duration};

use solid_notify::{Notifier, Status, WorkerConfig};

use super::{fast, http_def, quiet, start};
use crate::{
    pg_test,
    proxy::Proxy,
    receiver::{Receiver, Reply},
    server_test,
    support::{TestDb, eventually},
};

const NOTICES: usize = 600;

async fn check_all_delivered_once(db: &TestDb, receiver: &Receiver) {
    eventually(120, "every notice in history", || async {
        (db.counts().await == (0, NOTICES as u64)).then_some(())
    })
    .await;
    assert_eq!(
        receiver.overlaps(),
        Vec::<i64>::new(),
        "two requests at once"
    );
    assert_eq!(receiver.delivered().len(), NOTICES, "lost notices");
    assert_eq!(
        receiver.duplicates(),
        0,
        "a delivered success was sent again"
    );
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
}

fn worker_config() -> WorkerConfig {
    fast(WorkerConfig {
        concurrency: 8,
        batch_size: 100,
        ..WorkerConfig::default()
    })
}

pg_test!(
    terminated_backends_lose_nothing,
    |db: Arc<TestDb>| async move {
        let receiver = Receiver::start(|_| Reply::ok().after(Duration::from_millis(2))).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        db.insert_due("hook", NOTICES, |_| 0).await;
        let notifier = db.notifier().config(quiet()).build().unwrap();
        let running = start(notifier, worker_config());
        let mut terminated = 0;
        for _ in 0..15 {
            eventually(30, "progress between terminations", || async {
                (!receiver.seen().is_empty()).then_some(())
            })
            .await;
            terminated += db.terminate_backends().await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert!(terminated > 0, "the worker's sessions were terminated");
        check_all_delivered_once(&db, &receiver).await;
        running.stop().await;
    }
);

server_test!(
    an_outage_mid_sweep_loses_nothing,
    |db: Arc<TestDb>| async move {
        let receiver = Receiver::start(|_| Reply::ok().after(Duration::from_millis(2))).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        db.insert_due("hook", NOTICES, |_| 0).await;
        let proxy = Proxy::start(db.server_addr()).await;
        let pool = TestDb::connect_to(&db.url_via(proxy.port)).await;
        let notifier = Notifier::builder(pool).config(quiet()).build().unwrap();
        let running = start(notifier, worker_config());
        eventually(30, "the sweep under way", || async {
            (receiver.delivered().len() >= 100).then_some(())
        })
        .await;
        proxy.cut();
        let before = receiver.seen().len();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let during = receiver.seen().len() - before;
        proxy.restore();
        check_all_delivered_once(&db, &receiver).await;
        running.stop().await;
        eprintln!("requests sent while the database was away: {during}");
    }
);
