//! A network partition: the proxy between a worker (or a producer) and the
//! server stops forwarding but keeps every socket open, so statements hang
//! instead of failing. Shutdown stays bounded, a producer's commit answers
//! in time, and the frozen side's late writes change nothing that another
//! worker has claimed since. Counted at a real HTTP receiver: lost = 0,
//! overlaps = 0.

use std::{
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;
use solid_notify::{Config, Error, Notice, Notifier, Outcome, Status, WorkerConfig};

use super::{fast, http_def, quiet, start};
use crate::{
    proxy::Proxy,
    receiver::{Receiver, Reply},
    server_test,
    support::{KillOnDrop, TestDb, eventually, test_config},
};

const NOTICES: usize = 400;

/// Waits (polling, at most `secs`) for `child` to exit; how long it took.
fn exits_within(child: &mut std::process::Child, secs: u64) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        if let Ok(Some(_)) = child.try_wait() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Every notice in history as succeeded, each delivered, none twice at once.
async fn all_delivered(db: &TestDb, receiver: &Receiver, n: usize) {
    eventually(90, "every notice in history", || async {
        (db.counts().await == (0, n as u64)).then_some(())
    })
    .await;
    assert_eq!(
        receiver.overlaps(),
        Vec::<i64>::new(),
        "two requests at once"
    );
    assert_eq!(receiver.delivered().len(), n, "lost notices");
    assert!(
        db.history()
            .await
            .iter()
            .all(|h| h.status == Status::Succeeded)
    );
}

server_test!(
    a_frozen_worker_stops_in_time_and_another_drains_everything,
    |db: Arc<TestDb>| async move {
        let receiver = Receiver::start(|_| Reply::ok().after(Duration::from_millis(30))).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        db.insert_due("hook", NOTICES, |_| 0).await;
        let proxy = Proxy::start(db.server_addr()).await;
        let shutdown_timeout = 2;
        let mut worker = KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_solid-notify"))
                .args([
                    "worker",
                    "--allow-private-network",
                    "--mode",
                    "fixed-delay",
                    "--delay",
                    "20ms",
                    "--concurrency",
                    "8",
                    "--batch-size",
                    "50",
                    "--lease",
                    "6s",
                    "--attempt-timeout",
                    "2s",
                    "--shutdown-timeout",
                    &format!("{shutdown_timeout}s"),
                    "--db-timeout",
                    "3s",
                ])
                .env("DATABASE_URL", db.url_via(proxy.port))
                .env("RUST_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        eventually(30, "the drain under way", || async {
            (receiver.delivered().len() >= 50).then_some(())
        })
        .await;
        // Mid-drain, with deliveries running and outcomes to write.
        proxy.freeze();
        let pid = worker.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let took = tokio::task::spawn_blocking(move || {
            let took = exits_within(&mut worker.0, shutdown_timeout + 5);
            (took, worker)
        })
        .await
        .unwrap();
        let took = took.0.unwrap_or_else(|| {
            panic!(
                "the frozen worker did not exit within shutdown_timeout + 5 s ({} s)",
                shutdown_timeout + 5
            )
        });
        eprintln!(
            "the frozen worker exited {:.1} s after SIGTERM",
            took.as_secs_f64()
        );
        proxy.thaw();
        let notifier = db.notifier().config(quiet()).build().unwrap();
        let worker = start(notifier, fast(WorkerConfig::default()));
        all_delivered(&db, &receiver, NOTICES).await;
        worker.stop().await;
    }
);

server_test!(
    shutdown_returns_in_time_with_the_database_frozen,
    |db: Arc<TestDb>| async move {
        db.def("slow", "slow", |_| {}).await;
        let proxy = Proxy::start(db.server_addr()).await;
        let pool = TestDb::connect_to(&db.url_via(proxy.port)).await;
        let sending = Arc::new(AtomicBool::new(false));
        let notifier = Notifier::builder(pool)
            .config(Config {
                db_timeout: Duration::from_secs(2),
                ..test_config()
            })
            .handler("slow", {
                let sending = sending.clone();
                move |_: Notice| {
                    let sending = sending.clone();
                    async move {
                        sending.store(true, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        Ok(Outcome::success())
                    }
                }
            })
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("slow", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        eventually(10, "the after-commit attempt sending", || async {
            sending.load(Ordering::SeqCst).then_some(())
        })
        .await;
        proxy.freeze();
        let started = Instant::now();
        notifier.shutdown(Duration::from_secs(2)).await.unwrap();
        let took = started.elapsed();
        let bound =
            Duration::from_secs(2) + solid_notify::RELEASE_GRACE + solid_notify::HARD_STOP_MARGIN;
        assert!(
            took <= bound + Duration::from_millis(500),
            "shutdown(2s) took {took:?} with the database frozen (bound {bound:?})"
        );
        // Nothing lost: once thawed, the notice is finished by a worker.
        proxy.thaw();
        let rec = crate::support::Recorder::default();
        let worker = start(
            db.notifier()
                .config(quiet())
                .handler("slow", rec.handler(|_| Outcome::success()))
                .build()
                .unwrap(),
            fast(WorkerConfig::default()),
        );
        eventually(60, "the notice succeeded", || async {
            let done = db.history_of(id).await?;
            (done.status == Status::Succeeded).then_some(())
        })
        .await;
        worker.stop().await;
    }
);

/// A producer's commit into a frozen database; `heal` thaws the partition
/// (the held `COMMIT` goes through: `lands`) or cuts it (it never
/// arrives).
async fn commit_frozen(db: &TestDb, heal: fn(&Proxy), lands: bool) {
    db.def("ship", "ship", |_| {}).await;
    let proxy = Proxy::start(db.server_addr()).await;
    let pool = TestDb::connect_to(&db.url_via(proxy.port)).await;
    let bound = Duration::from_secs(2);
    let producer = Notifier::builder(pool)
        .config(Config {
            db_timeout: bound,
            immediate_attempt: false,
            ..test_config()
        })
        .build()
        .unwrap();
    let tx = producer.begin().await.unwrap();
    db.insert_order(&tx, 1).await;
    let id = tx.add_notice("ship", &json!({}), "").await.unwrap();
    proxy.freeze();
    let started = Instant::now();
    let committed = tx.commit().await;
    let took = started.elapsed();
    assert!(
        matches!(committed, Err(Error::CommitOutcomeUnknown(_))),
        "{committed:?}"
    );
    assert!(
        took <= bound + Duration::from_secs(1),
        "commit took {took:?} (bound {bound:?})"
    );
    heal(&proxy);
    // Whatever happened, the order and its notice went together, and a
    // committed notice is delivered.
    let rec = crate::support::Recorder::default();
    let worker = start(
        db.notifier()
            .config(quiet())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap(),
        fast(WorkerConfig::default()),
    );
    // Nothing of it is seen until the held COMMIT has reached the server
    // (after the thaw, the proxy forwards it when it is scheduled): the
    // outcome `heal` makes is waited for, never the first state seen.
    let committed = eventually(30, "the commit's fate known", || async {
        let orders = db.count_orders().await;
        let notice = db.history_of(id).await.map(|h| h.status);
        let live = db.live().await.len();
        match (orders, notice, live) {
            (1, Some(Status::Succeeded), 0) if lands => Some(true),
            (0, None, 0) if !lands => Some(false),
            // (Three reads, not one snapshot: a notice delivered between
            // them is seen in neither table once.)
            _ => None,
        }
    })
    .await;
    worker.stop().await;
    assert_eq!(rec.count(), usize::from(committed));
    eprintln!(
        "the commit was {}",
        if committed {
            "applied after the thaw"
        } else {
            "never applied"
        }
    );
}

server_test!(
    a_commit_into_a_frozen_database_answers_in_time_then_lands,
    |db: Arc<TestDb>| async move {
        commit_frozen(&db, Proxy::thaw, true).await;
        assert_eq!(db.count_orders().await, 1, "the held COMMIT went through");
    }
);

server_test!(
    a_commit_into_a_frozen_database_answers_in_time_then_vanishes,
    |db: Arc<TestDb>| async move {
        commit_frozen(
            &db,
            |proxy| {
                proxy.cut();
                proxy.thaw();
                proxy.restore();
            },
            false,
        )
        .await;
        assert_eq!(db.count_orders().await, 0, "the COMMIT never arrived");
    }
);

server_test!(
    late_writes_after_a_freeze_longer_than_the_lease_change_nothing,
    |db: Arc<TestDb>| async move {
        const N: usize = 60;
        let receiver = Receiver::start(|_| Reply::ok().after(Duration::from_millis(20))).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        db.insert_due("hook", N, |_| 0).await;
        let proxy = Proxy::start(db.server_addr()).await;
        // A worker's pool: a transaction the freeze leaves open (a claim
        // between its statements, holding its rows' locks) is ended by the
        // server after IDLE_TRANSACTION_TIMEOUT, so B can take its rows.
        let pool =
            sea_orm::Database::connect(solid_notify::worker::pool_options(db.url_via(proxy.port)))
                .await
                .unwrap();
        // Worker A: its writes wait for the database longer than the
        // freeze, so they arrive after the thaw.
        let frozen_side = Notifier::builder(pool)
            .config(Config {
                lease: Duration::from_secs(4),
                attempt_timeout: Duration::from_secs(2),
                db_timeout: Duration::from_secs(30),
                ..quiet()
            })
            .build()
            .unwrap();
        let a = start(
            frozen_side,
            fast(WorkerConfig {
                concurrency: 4,
                batch_size: 20,
                ..WorkerConfig::default()
            }),
        );
        eventually(30, "worker A delivering", || async {
            (receiver.delivered().len() >= 5).then_some(())
        })
        .await;
        proxy.freeze();
        // Worker B takes over once A's leases run out.
        let b_side = db
            .notifier()
            .config(Config {
                lease: Duration::from_secs(4),
                attempt_timeout: Duration::from_secs(2),
                ..quiet()
            })
            .build()
            .unwrap();
        let b = start(b_side, fast(WorkerConfig::default()));
        eventually(60, "B finished everything", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        let history_before = db.history().await;
        // The partition heals: A's held writes arrive, stale.
        proxy.thaw();
        eventually(30, "A's late writes answered", || async {
            let s = a.stats().snapshot();
            (s.lost_claims > 0 || s.given_up > 0 || s.errors > 0).then_some(())
        })
        .await;
        b.stop().await;
        a.stop().await;
        assert_eq!(
            db.history().await,
            history_before,
            "a late write changed history"
        );
        assert_eq!(db.counts().await, (0, N as u64));
        assert_eq!(
            receiver.overlaps(),
            Vec::<i64>::new(),
            "two requests at once"
        );
        assert_eq!(receiver.delivered().len(), N, "lost notices");
    }
);

server_test!(
    a_worker_recovers_by_itself_from_connections_stranded_by_a_partition,
    |db: Arc<TestDb>| async move {
        // Every connection the worker has (its pool, and on PostgreSQL its
        // LISTEN connection) goes silent for good, as after a partition
        // during which the server restarted; new connections go through.
        // On PostgreSQL it polls only every minute: a notice is delivered
        // sooner only if its listener came back. (MariaDB has no listener:
        // its pool must come back, and it polls every 3 s.)
        let receiver = Receiver::start(|_| Reply::ok()).await;
        http_def(&db, "hook", &receiver.url, |_| {}).await;
        let proxy = Proxy::start(db.server_addr()).await;
        let pool =
            sea_orm::Database::connect(solid_notify::worker::pool_options(db.url_via(proxy.port)))
                .await
                .unwrap();
        let notifier = Notifier::builder(pool)
            .config(Config {
                db_timeout: Duration::from_secs(1),
                ..quiet()
            })
            .build()
            .unwrap();
        let worker = start(
            notifier,
            WorkerConfig {
                mode: solid_notify::worker::Mode::FixedDelay,
                delay: if db.backend == crate::support::Backend::Postgres {
                    Duration::from_secs(60)
                } else {
                    Duration::from_secs(3)
                },
                confirm_listener: false,
                ..WorkerConfig::default()
            },
        );
        db.insert_due("hook", 20, |_| 0).await;
        eventually(30, "the first notices delivered", || async {
            (receiver.delivered().len() == 20).then_some(())
        })
        .await;
        proxy.strand();
        let stranded = Instant::now();
        db.insert_due("hook", 20, |_| 0).await;
        all_delivered(&db, &receiver, 40).await;
        eprintln!(
            "delivered {:.1} s after the worker's connections were stranded",
            stranded.elapsed().as_secs_f64()
        );
        if db.backend == crate::support::Backend::Postgres {
            assert!(
                stranded.elapsed() < Duration::from_secs(55),
                "not woken before its next poll: the listener did not come back"
            );
        }
        worker.stop().await;
    }
);
