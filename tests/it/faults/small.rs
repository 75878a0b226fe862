//! Scenario 11: the smaller faults.

use solid_notify::ops::Audit;
use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, Error, Notice, Outcome, Status, Worker, WorkerConfig,
    channel::amqp::AmqpConfig,
};
use tokio_util::sync::CancellationToken;

use crate::{
    amqp::broker_url,
    db_test,
    support::{Backend, Recorder, TestDb, eventually, test_config},
};

db_test!(a_requeue_race_requeues_once, |db: Arc<TestDb>| async move {
    db.def("crm", "crm", |s| s.max_retry_times = 0).await;
    let notifier = db
        .notifier()
        .handler(
            "crm",
            Recorder::default().handler(|_| Outcome::retry("down")),
        )
        .build()
        .unwrap();
    for round in 0..5 {
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add_notice("crm", &json!({ "round": round }), "")
            .await
            .unwrap();
        let report = tx.commit_and_wait().await.unwrap();
        assert!(matches!(
            report[0].result,
            AttemptResult::FinalFailure { .. }
        ));
        // Eight operators requeue the same notice at once.
        let operators: Vec<_> = (0..8)
            .map(|_| {
                let notifier = notifier.clone();
                tokio::spawn(async move { notifier.requeue(id, &Audit::operator()).await })
            })
            .collect();
        let mut ok = 0;
        for op in operators {
            match op.await.unwrap() {
                Ok(()) => ok += 1,
                Err(Error::NoticeNotFound(_) | Error::Conflict(_) | Error::WrongState { .. }) => {}
                Err(e) => panic!("unexpected: {e}"),
            }
        }
        assert_eq!(ok, 1, "exactly one requeue");
        let live: Vec<_> = db.live().await.into_iter().filter(|r| r.id == id).collect();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].errors.matches("requeued by an operator").count(), 1);
        assert!(db.history_of(id).await.is_none());
        notifier.cancel(id, &Audit::operator()).await.unwrap();
    }
});

db_test!(
    business_transactions_keep_the_default_isolation,
    |db: Arc<TestDb>| async move {
        if db.backend != Backend::MySql {
            return; // PostgreSQL's and SQLite's defaults were never changed
        }
        db.insert_order(&db.db, 1).await;
        let notifier = db.notifier().build().unwrap();
        let tx = notifier.begin().await.unwrap();
        let read = || async {
            let stmt = sea_orm::Statement::from_string(
                sea_orm::DbBackend::MySql,
                "SELECT item FROM orders WHERE id = 1",
            );
            let row = tx.query_one_raw(stmt).await.unwrap().unwrap();
            row.try_get_by_index::<String>(0).unwrap()
        };
        assert_eq!(read().await, "book");
        db.db
            .execute_unprepared("UPDATE orders SET item = 'pen' WHERE id = 1")
            .await
            .unwrap();
        // MariaDB's default, REPEATABLE READ: the transaction keeps its snapshot.
        assert_eq!(
            read().await,
            "book",
            "the business transaction runs at READ COMMITTED"
        );
        tx.rollback().await.unwrap();
    }
);

db_test!(a_worker_never_cancels_the_callers_token, |db: Arc<
    TestDb,
>| async move {
    // A schedule with no future tick ends the loop at once; the worker also
    // runs its confirmation listener (a broker is configured).
    let config = WorkerConfig {
        cron: "0 0 0 1 1 * 2001".into(),
        confirm_listener: true,
        ..WorkerConfig::default()
    };
    let with_broker = Config {
        amqp: AmqpConfig {
            url: Some(broker_url()),
            ..AmqpConfig::default()
        },
        ..test_config()
    };
    let notifier = db.notifier().config(with_broker).build().unwrap();
    let worker = Worker::new(notifier, config).unwrap();
    let token = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(10), worker.run(token.clone()))
        .await
        .unwrap()
        .unwrap();
    assert!(!token.is_cancelled());
});

db_test!(
    a_dropped_attempt_releases_its_claim,
    |db: Arc<TestDb>| async move {
        db.def("stuck", "stuck", |_| {}).await;
        let notifier = db
            .notifier()
            .handler("stuck", |_: Notice| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Outcome::success())
            })
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("stuck", &json!({}), "").await.unwrap();
        // The caller gives up waiting: the attempt's future is dropped.
        let waited = tokio::time::timeout(Duration::from_millis(300), tx.commit_and_wait()).await;
        assert!(waited.is_err());
        let row = eventually(3, "released at once, not after the 10 s lease", || async {
            db.live()
                .await
                .into_iter()
                .find(|r| r.id == id && !r.leased && r.version == 1)
        })
        .await;
        assert_eq!(row.status, Status::NotSent);
        assert_eq!(db.due_now().await, 1);
    }
);
