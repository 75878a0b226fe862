//! PostgreSQL behind PgBouncer (Debian's 1.18, started by `.ci/pgbouncer`):
//! in session mode everything works, sessions ended under it included; in
//! transaction mode, which keeps neither sessions nor sqlx's named
//! statements, workers, producers and the CLI refuse to start and say what
//! to change; a `listen_url` through it is found out, and the worker polls:
//! its due checks find what its LISTEN cannot hear of.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{Error, NewNotice, Outcome, Worker, WorkerConfig, worker::Mode};
use tokio_util::sync::CancellationToken;

use crate::{
    faults::start,
    pg_test,
    support::{Recorder, TestDb, eventually, metrics_worker_at, test_config},
};

/// PgBouncer in session mode.
const SESSION: u16 = 6432;
/// PgBouncer in transaction mode.
const TRANSACTION: u16 = 6433;

fn fast() -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(50),
        confirm_listener: false,
        batch_size: 20,
        ..WorkerConfig::default()
    }
}

/// A pool on `db` through PgBouncer at `port`, refusing to run without it.
async fn through(db: &TestDb, port: u16) -> sea_orm::DatabaseConnection {
    let url = db.url_via(port);
    let mut options = sea_orm::ConnectOptions::new(url.clone());
    options
        .max_connections(6)
        .sqlx_logging(false)
        .acquire_timeout(Duration::from_secs(10));
    sea_orm::Database::connect(options)
        .await
        .unwrap_or_else(|e| {
            panic!("PgBouncer does not answer on {port} ({e}): .ci/run starts it (.ci/pgbouncer)")
        })
}

pg_test!(
    behind_pgbouncer_in_session_mode_nothing_is_lost_and_nothing_rolled_back_is_sent,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |s| s.retry_interval = "1s".into())
            .await;
        let rec = Recorder::default();
        let pooled = through(&db, SESSION).await;
        let notifier = solid_notify::Notifier::builder(pooled)
            .config(test_config())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let check = notifier.check_database().await.unwrap();
        assert!(!check.transaction_pooled, "session mode keeps sessions");
        let workers = [
            start(notifier.clone(), fast()),
            start(notifier.clone(), fast()),
        ];
        let (mut committed, mut rolled_back) = (BTreeSet::new(), BTreeSet::new());
        for round in 0..30 {
            let tx = notifier.begin().await.unwrap();
            let mut ids = Vec::new();
            for i in 0..10 {
                let notice = NewNotice::new("ship", &json!({"round": round, "i": i}));
                ids.push(tx.add(notice).await.unwrap());
            }
            if round % 3 == 2 {
                tx.rollback().await.unwrap();
                rolled_back.extend(ids);
            } else {
                tx.commit().await.unwrap();
                committed.extend(ids);
            }
            if round == 15 {
                // Every server session ends under the pooler: the pool's
                // connections to PgBouncer stay, their sessions do not.
                assert!(db.terminate_backends().await > 0);
            }
        }
        let sent = || rec.calls().iter().map(|n| n.id).collect::<BTreeSet<i64>>();
        eventually(60, "every committed notice sent and recorded", || async {
            (committed.is_subset(&sent()) && db.live().await.is_empty()).then_some(())
        })
        .await;
        for w in workers {
            w.stop().await;
        }
        assert!(
            sent().is_disjoint(&rolled_back),
            "a rolled-back notice was sent"
        );
        assert_eq!(sent(), committed);
        assert_eq!(db.history().await.len(), committed.len());
    }
);

pg_test!(
    behind_pgbouncer_in_transaction_mode_workers_producers_and_the_cli_refuse_saying_what_to_change,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        // A notice due, added directly.
        db.insert_due("ship", 1, |_| 0).await;
        let rec = Recorder::default();
        let notifier = solid_notify::Notifier::builder(through(&db, TRANSACTION).await)
            .config(test_config())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let said = |e: &Error| {
            let text = e.to_string();
            assert!(matches!(e, Error::Pooler(_)), "{e:?}");
            for what in [
                "transaction mode",
                "pool_mode = session",
                "max_prepared_statements",
            ] {
                assert!(text.contains(what), "{text} does not say {what}");
            }
        };
        said(&notifier.check_database().await.unwrap_err());
        let worker = Worker::new(notifier.clone(), fast()).unwrap();
        let ran = tokio::time::timeout(
            Duration::from_secs(30),
            worker.run(CancellationToken::new()),
        )
        .await
        .expect("a refused worker returns at once");
        said(&ran.unwrap_err());
        match notifier.begin().await {
            Err(e) => said(&e),
            Ok(_) => panic!("a transaction began behind a transaction pooler"),
        }
        let (status, stderr) = crate::support::worker_until_exit(&db.url_via(TRANSACTION)).await;
        assert!(!status.success(), "{stderr}");
        assert!(stderr.contains("pool_mode = session"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        // Nothing was claimed or sent.
        assert_eq!(rec.count(), 0);
        let live = db.live().await;
        assert_eq!((live.len(), live[0].version), (1, 0));
    }
);

/// The value of `gauge` in the Prometheus text at `metrics`, once there.
async fn gauge(metrics: &str, gauge: &str) -> f64 {
    eventually(30, gauge, || async {
        let text = reqwest::get(metrics).await.ok()?.text().await.ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(gauge)?.trim().parse::<f64>().ok())
    })
    .await
}

pg_test!(
    a_listen_url_through_a_transaction_pooler_is_found_out_and_the_worker_polls,
    |db: Arc<TestDb>| async move {
        let through_pooler = db.url_via(TRANSACTION);
        let (_worker, metrics) =
            metrics_worker_at(&db.url, &["--listen-url", &through_pooler]).await;
        assert_eq!(gauge(&metrics, "solid_notify_wake_listening").await, 0.0);
        // Listening on the server itself, it hears.
        let (_worker, metrics) = metrics_worker_at(&db.url, &["--listen-url", &db.url]).await;
        assert_eq!(gauge(&metrics, "solid_notify_wake_listening").await, 1.0);
    }
);

pg_test!(
    a_worker_whose_listen_goes_through_a_transaction_pooler_delivers_by_polling,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let rec = Recorder::default();
        let notifier = solid_notify::Notifier::builder(db.db.clone())
            .config(test_config())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        // Its schedule sweeps once an hour: only a wake-up or a due check
        // finds a notice added meanwhile, and its LISTEN cannot hear.
        let worker = Arc::new(
            Worker::new(
                notifier.clone(),
                WorkerConfig {
                    mode: Mode::FixedRate,
                    cron: "0 0 * * * *".into(),
                    due_check_every: Duration::from_millis(200),
                    listen_url: Some(solid_notify::worker::ListenUrl(db.url_via(TRANSACTION))),
                    ..fast()
                },
            )
            .unwrap(),
        );
        let stop = CancellationToken::new();
        let run = tokio::spawn({
            let (worker, stop) = (worker.clone(), stop.clone());
            async move { worker.run(stop).await }
        });
        // Its startup sweep has begun before the notices come (its listener
        // tells it to plan its due checks once it finds it cannot hear:
        // src/worker/wake.rs tests that, whose race with the startup this
        // test cannot pin).
        eventually(30, "the first sweep", || async {
            (worker.stats().snapshot().sweeps >= 1).then_some(())
        })
        .await;
        // Added by another process (plain SQL: no hint in this one).
        db.insert_due("ship", 3, |_| 0).await;
        eventually(30, "the notices delivered by its polls", || async {
            (rec.count() == 3).then_some(())
        })
        .await;
        // Successes reach history in batches, just after their delivery.
        eventually(30, "the three in history", || async {
            (db.history().await.len() == 3).then_some(())
        })
        .await;
        assert_eq!(rec.count(), 3, "each delivered once");
        stop.cancel();
        run.await.unwrap().unwrap();
    }
);
