//! Worker and sweeps: many workers, filters, crashes, shutdown, timing.

use std::{
    collections::{HashMap, HashSet},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use serde_json::json;
use solid_notify::{
    Config, LoadBalance, NewNotice, Notice, Notifier, Outcome, Status, Worker, WorkerConfig,
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

use crate::{
    db_test,
    support::{KillOnDrop, Recorder, TestDb, eventually, test_config},
};

fn quiet() -> Config {
    Config {
        immediate_attempt: false,
        ..test_config()
    }
}

fn fast_worker() -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(20),
        ..WorkerConfig::default()
    }
}

/// Starts `worker` on its own task; returns the stop token and the task.
fn spawn(worker: Arc<Worker>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        worker
            .run(token)
            .await
            .expect("the worker refused to start")
    });
    (stop, task)
}

async fn stop_all(workers: Vec<(CancellationToken, tokio::task::JoinHandle<()>)>) {
    for (stop, _) in &workers {
        stop.cancel();
    }
    for (_, task) in workers {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("worker stops")
            .unwrap();
    }
}

db_test!(
    four_workers_drain_ten_thousand,
    |db: Arc<TestDb>| async move {
        db.def("bulk", "bulk", |_| {}).await;
        let total = 10_000;
        db.insert_due("bulk", total, |_| 0).await;
        let calls: Arc<Mutex<Vec<(i64, i32)>>> = Arc::default();
        let workers: Vec<Arc<Worker>> = (0..4)
            .map(|_| {
                let calls = calls.clone();
                let notifier = db
                    .notifier()
                    .config(quiet())
                    .handler("bulk", move |n: Notice| {
                        let calls = calls.clone();
                        async move {
                            calls.lock().unwrap().push((n.id, n.version));
                            Ok(Outcome::success())
                        }
                    })
                    .build()
                    .unwrap();
                let config = WorkerConfig {
                    batch_size: 250,
                    concurrency: 8,
                    ..fast_worker()
                };
                Arc::new(Worker::new(notifier, config).unwrap())
            })
            .collect();
        let running: Vec<_> = workers.iter().cloned().map(spawn).collect();
        eventually(180, "all notices in history", || async {
            (db.counts().await == (0, total as u64)).then_some(())
        })
        .await;
        stop_all(running).await;

        let calls = calls.lock().unwrap().clone();
        let attempts: HashSet<(i64, i32)> = calls.iter().copied().collect();
        assert_eq!(
            attempts.len(),
            calls.len(),
            "an attempt was delivered twice"
        );
        let ids: HashSet<i64> = calls.iter().map(|c| c.0).collect();
        assert_eq!(ids.len(), total, "every notice delivered");
        assert_eq!(calls.len(), total, "each exactly once");
        let stats: Vec<_> = workers.iter().map(|w| w.stats().snapshot()).collect();
        assert_eq!(
            stats.iter().map(|s| s.succeeded).sum::<u64>(),
            total as u64,
            "{stats:?}"
        );
        assert_eq!(
            stats.iter().map(|s| s.claimed).sum::<u64>(),
            total as u64,
            "{stats:?}"
        );
        assert!(
            db.history()
                .await
                .iter()
                .all(|h| h.status == Status::Succeeded)
        );
    }
);

db_test!(
    filters_route_work_to_matching_workers,
    |db: Arc<TestDb>| async move {
        db.def("a", "ha", |_| {}).await;
        db.def("b", "hb", |_| {}).await;
        db.insert_due("a", 10, |i| (i % 2) as i32).await; // partitions 0 and 1
        db.insert_due("b", 6, |i| (i % 2) as i32).await;
        type Seen = Vec<(&'static str, String, i32)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let worker = |name: &'static str, config: WorkerConfig| {
            let seen = seen.clone();
            let record = move |n: Notice| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .push((name, n.def.clone(), n.load_balance_num));
                    Ok(Outcome::success())
                }
            };
            let notifier = db
                .notifier()
                .config(quiet())
                .handler("ha", record.clone())
                .handler("hb", record)
                .build()
                .unwrap();
            Arc::new(Worker::new(notifier, WorkerConfig { ..config }).unwrap())
        };
        let only_b = worker(
            "only_b",
            WorkerConfig {
                defs: vec!["b".into()],
                ..fast_worker()
            },
        );
        let ha_p1 = worker(
            "ha_p1",
            WorkerConfig {
                handlers: vec!["ha".into()],
                partitions: vec![1],
                ..fast_worker()
            },
        );
        let a_p0 = worker(
            "a_p0",
            WorkerConfig {
                defs: vec!["a".into()],
                partitions: vec![0],
                ..fast_worker()
            },
        );
        let running = vec![spawn(only_b), spawn(ha_p1), spawn(a_p0)];
        eventually(30, "all delivered", || async {
            (db.counts().await == (0, 16)).then_some(())
        })
        .await;
        stop_all(running).await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 16);
        for (worker, def, partition) in seen {
            let expected = match (def.as_str(), partition) {
                ("b", _) => "only_b",
                ("a", 1) => "ha_p1",
                ("a", 0) => "a_p0",
                other => panic!("unexpected notice {other:?}"),
            };
            assert_eq!(worker, expected, "{def} partition {partition}");
        }
    }
);

/// Child side of `sigkill_mid_batch_loses_nothing`: a worker process whose
/// handler is slow. Does nothing unless started by that test.
#[test]
fn child_worker_process() {
    let Ok(url) = std::env::var("SN_CHILD_WORKER_DB") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let db = sea_orm::Database::connect(&url).await.unwrap();
        let notifier = Notifier::builder(db)
            .config(Config {
                lease: Duration::from_secs(3),
                attempt_timeout: Duration::from_secs(1),
                ..quiet()
            })
            .handler("slow", |_n: Notice| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(Outcome::success())
            })
            .build()
            .unwrap();
        let config = WorkerConfig {
            batch_size: 20,
            concurrency: 4,
            ..fast_worker()
        };
        Worker::new(notifier, config)
            .unwrap()
            .run(CancellationToken::new())
            .await
            .unwrap();
    });
}

db_test!(
    sigkill_mid_batch_loses_nothing,
    |db: Arc<TestDb>| async move {
        db.def("killed", "slow", |_| {}).await;
        db.insert_due("killed", 40, |_| 0).await;
        let mut child = KillOnDrop(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "worker::child_worker_process",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env("SN_CHILD_WORKER_DB", &db.url)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Kill it mid-batch: some notices done, others claimed and in flight.
        eventually(60, "child delivered some", || async {
            let (_, done) = db.counts().await;
            (done >= 4).then_some(())
        })
        .await;
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        let (left, done) = db.counts().await;
        assert!(
            left > 0,
            "the child finished everything before it was killed"
        );
        let now = Utc::now().naive_utc();
        let leased = db
            .live()
            .await
            .iter()
            .filter(|r| r.next_call_time > now)
            .count();
        assert!(leased > 0, "no row was claimed when the child died");

        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("slow", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let survivor = spawn(Arc::new(Worker::new(notifier, fast_worker()).unwrap()));
        eventually(60, "every notice in history", || async {
            (db.counts().await == (0, 40)).then_some(())
        })
        .await;
        stop_all(vec![survivor]).await;
        assert_eq!(
            rec.count() as u64,
            40 - done,
            "the survivor sent only what was not done"
        );
        assert!(
            db.history()
                .await
                .iter()
                .all(|h| h.status == Status::Succeeded)
        );
    }
);

db_test!(
    graceful_shutdown_releases_unfinished,
    |db: Arc<TestDb>| async move {
        db.def("stuck", "stuck", |_| {}).await;
        db.insert_due("stuck", 5, |_| 0).await;
        let rec = Recorder::default();
        let started = rec.clone();
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("stuck", move |n: Notice| {
                let started = started.clone();
                async move {
                    let _ = started.handler(|_| Outcome::success())(n).await;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(Outcome::success())
                }
            })
            .build()
            .unwrap();
        let config = WorkerConfig {
            batch_size: 5,
            concurrency: 2,
            shutdown_timeout: Duration::from_millis(200),
            ..fast_worker()
        };
        let worker = Arc::new(Worker::new(notifier, config).unwrap());
        let (stop, task) = spawn(worker.clone());
        eventually(10, "two deliveries in flight", || async {
            (rec.count() == 2).then_some(())
        })
        .await;
        let asked = Instant::now();
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "shutdown waited {:?}",
            asked.elapsed()
        );

        let now = Utc::now().naive_utc();
        let rows = db.live().await;
        assert_eq!(rows.len(), 5, "nothing finished, nothing lost");
        for row in &rows {
            assert!(row.next_call_time <= now, "row {} is not due again", row.id);
            assert_eq!(
                (row.version, row.retry_times, row.status),
                (2, 0, Status::NotSent)
            );
        }
        assert_eq!(worker.stats().snapshot().released, 5);

        // Another worker takes them at once.
        let fresh = Recorder::default();
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("stuck", fresh.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let other = spawn(Arc::new(Worker::new(notifier, fast_worker()).unwrap()));
        eventually(10, "released rows delivered", || async {
            (db.counts().await == (0, 5)).then_some(())
        })
        .await;
        stop_all(vec![other]).await;
        assert_eq!(fresh.count(), 5);
    }
);

fn gaps(starts: &[DateTime<Utc>]) -> Vec<Duration> {
    starts
        .windows(2)
        .map(|w| (w[1] - w[0]).to_std().unwrap())
        .collect()
}

db_test!(
    fixed_rate_and_fixed_delay_timing,
    |db: Arc<TestDb>| async move {
        db.def("slow_once", "slow_once", |_| {}).await;
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("slow_once", |_n: Notice| async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Ok(Outcome::success())
            })
            .build()
            .unwrap();

        // Fixed delay: each sweep starts `delay` after the previous one ended
        // (wake-ups off: only the schedule is measured here).
        let delay = Worker::new(
            notifier.clone(),
            WorkerConfig {
                mode: Mode::FixedDelay,
                delay: Duration::from_millis(300),
                wake: false,
                ..WorkerConfig::default()
            },
        )
        .unwrap();
        let delay = Arc::new(delay);
        let running = spawn(delay.clone());
        eventually(10, "five fixed-delay sweeps", || async {
            (delay.stats().recent_sweeps().len() >= 5).then_some(())
        })
        .await;
        stop_all(vec![running]).await;
        for gap in gaps(&delay.stats().recent_sweeps()) {
            assert!(
                gap >= Duration::from_millis(300) && gap < Duration::from_millis(1000),
                "{gap:?}"
            );
        }

        // Fixed rate: sweeps start on the cron ticks (whole seconds) ...
        let schedule_only = WorkerConfig {
            wake: false,
            ..WorkerConfig::default()
        };
        let rate = Arc::new(Worker::new(notifier, schedule_only).unwrap());
        let running = spawn(rate.clone());
        eventually(10, "two fixed-rate sweeps", || async {
            (rate.stats().recent_sweeps().len() >= 2).then_some(())
        })
        .await;
        // ... and a tick that comes while a sweep runs is skipped.
        db.insert_due("slow_once", 1, |_| 0).await;
        eventually(15, "slow sweep and one after it", || async {
            let starts = rate.stats().recent_sweeps();
            let slow = gaps(&starts)
                .into_iter()
                .any(|g| g >= Duration::from_millis(1900));
            (slow && db.counts().await == (0, 1)).then_some(())
        })
        .await;
        stop_all(vec![running]).await;
        let starts = rate.stats().recent_sweeps();
        for start in &starts {
            assert!(
                start.timestamp_subsec_millis() < 400,
                "{start} is not on a tick"
            );
        }
        // Never two sweeps in one tick (a tick missed during the slow
        // sweep is skipped, not run at once after it); every start on a
        // tick (above), so a gap is whole ticks: one, or more after the
        // slow sweep (two or three on a loaded machine).
        for gap in gaps(&starts) {
            assert!(gap >= Duration::from_millis(700), "{gap:?}");
        }
    }
);

db_test!(
    flaky_handler_keeps_its_interval_with_four_workers,
    |db: Arc<TestDb>| async move {
        db.def("flaky", "flaky", |s| {
            s.retry_interval = "1s".into();
            s.max_retry_times = -1;
        })
        .await;
        db.insert_due("flaky", 1, |_| 0).await;
        let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let running: Vec<_> = (0..4)
            .map(|_| {
                let times = times.clone();
                let notifier = db
                    .notifier()
                    .config(quiet())
                    .handler("flaky", move |_n: Notice| {
                        let times = times.clone();
                        async move {
                            times.lock().unwrap().push(Instant::now());
                            Ok(Outcome::retry("still down"))
                        }
                    })
                    .build()
                    .unwrap();
                spawn(Arc::new(Worker::new(notifier, fast_worker()).unwrap()))
            })
            .collect();
        eventually(15, "four attempts", || async {
            (times.lock().unwrap().len() >= 4).then_some(())
        })
        .await;
        stop_all(running).await;
        let times = times.lock().unwrap().clone();
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_millis(950),
                "retried after {gap:?}, not the 1s interval"
            );
        }
        let row = db.live().await.pop().unwrap();
        assert_eq!(row.retry_times as usize, times.len());
    }
);

db_test!(
    load_balance_strategies_at_insert,
    |db: Arc<TestDb>| async move {
        db.def("lb", "lb", |_| {}).await;
        let add = |strategy: LoadBalance| {
            let db = db.clone();
            async move {
                let notifier = db
                    .notifier()
                    .config(Config {
                        load_balance: strategy,
                        ..quiet()
                    })
                    .build()
                    .unwrap();
                let tx = notifier.begin().await.unwrap();
                let mut ids = Vec::new();
                for key in ["k1", "k2", "k1", "k3", "k1", "k2"] {
                    ids.push(
                        tx.add(NewNotice::new("lb", &json!({})).load_balance_key(key))
                            .await
                            .unwrap(),
                    );
                }
                ids.push(
                    tx.add(NewNotice::new("lb", &json!({})).load_balance_num(42))
                        .await
                        .unwrap(),
                );
                tx.commit().await.unwrap();
                let parts: HashMap<i64, i32> = db
                    .live()
                    .await
                    .into_iter()
                    .map(|r| (r.id, r.load_balance_num))
                    .collect();
                ids.iter().map(|id| parts[id]).collect::<Vec<i32>>()
            }
        };
        assert_eq!(
            add(LoadBalance::RoundRobin { partitions: 4 }).await,
            [0, 1, 2, 3, 0, 1, 42]
        );
        let hashed = add(LoadBalance::Hash { partitions: 8 }).await;
        let k = |key: &str| solid_notify::load_balance::hash_partition(key, 8);
        assert_eq!(
            hashed,
            [k("k1"), k("k2"), k("k1"), k("k3"), k("k1"), k("k2"), 42]
        );
        assert!(
            add(LoadBalance::Random { partitions: 3 }).await[..6]
                .iter()
                .all(|p| (0..3).contains(p))
        );
        assert_eq!(add(LoadBalance::default()).await, [0, 0, 0, 0, 0, 0, 42]);
    }
);
