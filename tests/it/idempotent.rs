//! Idempotent add: one notice per definition and idempotency key, whether the
//! key's notice is in flight, in history, or being added concurrently.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};
use serde_json::json;
use solid_notify::{AttemptResult, NewNotice, Outcome, Status};

use crate::{
    db_test, pg_test,
    support::{Recorder, TestDb, eventually},
};

/// Rows of `def` with `key`, in flight and in history.
async fn rows_with_key(db: &TestDb, key: &str) -> (i64, i64) {
    let count =
        |table: &str| format!("SELECT COUNT(*) FROM {table} WHERE idempotency_key = '{key}'");
    (
        db.scalar(&count("notify_msg")).await,
        db.scalar(&count("notify_msg_history")).await,
    )
}

db_test!(
    a_key_already_added_returns_the_existing_notice,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        db.def("bill", "ship", |_| {}).await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .handler(
                "ship",
                rec.handler(|n| {
                    if n.param["hold"] == true {
                        Outcome::retry("held")
                    } else {
                        Outcome::success()
                    }
                }),
            )
            .build()
            .unwrap();
        let keyed = |def: &str, key: &str, hold: bool| {
            NewNotice::new(def, &json!({ "hold": hold })).idempotency_key(key)
        };

        // In flight (held by a retry): a second add, in another
        // transaction, returns it and writes nothing.
        let tx = notifier.begin().await.unwrap();
        let first = tx.add(keyed("ship", "order-1", true)).await.unwrap();
        // The same key twice in one transaction: one notice.
        let again = tx.add(keyed("ship", "order-1", true)).await.unwrap();
        assert_eq!(again, first);
        let reports = tx.commit_and_wait().await.unwrap();
        assert!(
            matches!(reports[0].result, AttemptResult::WillRetry { .. }),
            "{reports:?}"
        );
        assert_eq!(
            reports[1],
            solid_notify::AttemptReport {
                notice_id: first,
                result: AttemptResult::AlreadyAdded
            }
        );
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        let found = tx.add(keyed("ship", "order-1", false)).await.unwrap();
        // Another definition's key space is its own.
        let billed = tx.add(keyed("bill", "order-1", false)).await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(found, first);
        assert_ne!(billed, first);
        assert_eq!(reports[0].result, AttemptResult::AlreadyAdded);
        assert_eq!(reports[1].result, AttemptResult::Succeeded);
        assert_eq!(
            db.count_orders().await,
            1,
            "the business data commits either way"
        );
        assert_eq!(rows_with_key(&db, "order-1").await, (1, 1));
        assert_eq!(
            rec.count_for(first),
            1,
            "held once, not attempted again by the add"
        );

        // In history (delivered): still found, through Notifier::add too.
        let tx = notifier.begin().await.unwrap();
        let done = tx.add(keyed("ship", "order-2", false)).await.unwrap();
        tx.commit_and_wait().await.unwrap();
        assert_eq!(db.history_of(done).await.unwrap().status, Status::Succeeded);
        let txn = db.db.begin().await.unwrap();
        let pending = notifier
            .add(&txn, keyed("ship", "order-2", false))
            .await
            .unwrap();
        txn.commit().await.unwrap();
        assert_eq!(pending.id(), done);
        assert!(!pending.is_new());
        let reports = notifier.dispatch(vec![pending], true).await;
        assert_eq!(reports[0].result, AttemptResult::AlreadyAdded);
        assert_eq!(rows_with_key(&db, "order-2").await, (0, 1));
        assert_eq!(rec.count_for(done), 1);

        // Without a key every add is a notice.
        let tx = notifier.begin().await.unwrap();
        let a = tx.add_notice("ship", &json!({}), "").await.unwrap();
        let b = tx.add_notice("ship", &json!({}), "").await.unwrap();
        tx.commit_and_wait().await.unwrap();
        assert_ne!(a, b);
    }
);

db_test!(concurrent_adds_of_one_key_make_one_notice, |db: Arc<
    TestDb,
>| async move {
    db.def("ship", "ship", |_| {}).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler("ship", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    const N: usize = 6;
    for round in 0..3 {
        let key = format!("race-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(N));
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (notifier, db, key, barrier) =
                    (notifier.clone(), db.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let tx = notifier.begin().await.unwrap();
                    db.insert_order(&tx, (round * 100 + i) as i64).await;
                    let id = tx
                        .add(NewNotice::new("ship", &json!({ "from": i })).idempotency_key(&key))
                        .await
                        .unwrap();
                    // Hold the transaction open so the others' adds
                    // meet it uncommitted.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    tx.commit().await.unwrap();
                    id
                })
            })
            .collect();
        let mut ids = Vec::new();
        for task in tasks {
            ids.push(task.await.unwrap());
        }
        assert!(ids.iter().all(|id| *id == ids[0]), "{key}: {ids:?}");
        let id = ids[0];
        eventually(10, "the one notice delivered", || async {
            db.history_of(id)
                .await
                .filter(|h| h.status == Status::Succeeded)
        })
        .await;
        assert_eq!(rows_with_key(&db, &key).await, (0, 1), "{key}");
        assert_eq!(rec.count_for(id), 1, "{key}");
    }
    assert_eq!(
        db.count_orders().await,
        3 * N as i64,
        "every business row committed"
    );
});

db_test!(
    plain_sql_producers_are_kept_to_one_notice_by_the_index,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        // The forms the README documents.
        let sql = match db.db.get_database_backend() {
            DbBackend::MySql => {
                "INSERT INTO notify_msg (def_id, param, description, idempotency_key) \
                 SELECT id, '{}', 'from billing', 'inv-7' FROM notify_def WHERE name = 'ship' \
                 ON DUPLICATE KEY UPDATE notify_msg.id = notify_msg.id"
            }
            _ => {
                "INSERT INTO notify_msg (def_id, param, description, idempotency_key) \
                 SELECT id, '{}', 'from billing', 'inv-7' FROM notify_def WHERE name = 'ship' \
                 ON CONFLICT (def_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
            }
        };
        for _ in 0..3 {
            db.db.execute_unprepared(sql).await.unwrap();
        }
        assert_eq!(rows_with_key(&db, "inv-7").await, (1, 0));
        // A plain INSERT of a taken key is refused, naming the index.
        let plain = "INSERT INTO notify_msg (def_id, param, description, idempotency_key) \
                     SELECT id, '{}', '', 'inv-7' FROM notify_def WHERE name = 'ship'";
        let err = db.db.execute_unprepared(plain).await.unwrap_err();
        assert!(
            err.to_string().contains("idx_notify_msg_def_key")
                || err.to_string().contains("UNIQUE"),
            "{err}"
        );
        // The library finds the plain-SQL notice.
        let (notifier, _rec) = (db.notifier().build().unwrap(), ());
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add(NewNotice::new("ship", &json!({})).idempotency_key("inv-7"))
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(id, db.live().await[0].id);
    }
);

db_test!(
    keys_compare_byte_for_byte_and_requeue_skips_a_taken_key,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |s| s.max_retry_times = 0).await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .handler("ship", rec.handler(|_| Outcome::retry("down")))
            .build()
            .unwrap();
        // Case, accents and a trailing space make different keys on every
        // backend (MariaDB's default collation would merge them).
        let tx = notifier.begin().await.unwrap();
        let mut ids = Vec::new();
        for key in ["Order-1", "order-1", "ordér-1", "order-1 "] {
            ids.push(
                tx.add(NewNotice::new("ship", &json!({})).idempotency_key(key))
                    .await
                    .unwrap(),
            );
        }
        let reports = tx.commit_and_wait().await.unwrap();
        let distinct: std::collections::HashSet<i64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), 4, "{ids:?}");
        assert!(
            reports
                .iter()
                .all(|r| matches!(r.result, AttemptResult::FinalFailure { .. }))
        );

        // "Order-1" failed for good; a plain-SQL producer adds the key again
        // (the index covers notices in flight only). Requeueing the failed
        // one would make two: it stays in history, the others go.
        db.db
            .execute_unprepared(
                "INSERT INTO notify_msg (def_id, param, description, idempotency_key) \
                 SELECT id, '{}', '', 'Order-1' FROM notify_def WHERE name = 'ship'",
            )
            .await
            .unwrap();
        let action = solid_notify::ops::BulkAction::new(
            solid_notify::ops::NoticeFilter {
                def: Some("ship".into()),
                ..Default::default()
            },
            solid_notify::ops::Audit::new("ops", "replay"),
        );
        let report = notifier.requeue_where(&action).await.unwrap();
        assert_eq!(report.changed, 3, "{report:?}");
        assert_eq!(rows_with_key(&db, "Order-1").await, (1, 1));
        assert!(db.history_of(ids[0]).await.is_some(), "left in history");
    }
);

pg_test!(
    a_keyed_notice_rolled_back_to_a_savepoint_is_never_sent,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.execute_unprepared("SAVEPOINT mine").await.unwrap();
        let gone = tx
            .add(NewNotice::new("ship", &json!({})).idempotency_key("k1"))
            .await
            .unwrap();
        tx.execute_unprepared("ROLLBACK TO SAVEPOINT mine")
            .await
            .unwrap();
        let kept = tx
            .add(NewNotice::new("ship", &json!({})).idempotency_key("k1"))
            .await
            .unwrap();
        assert_ne!(gone, kept, "the rolled-back notice does not hold the key");
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(reports[0].result, AttemptResult::LostClaim, "{reports:?}");
        assert_eq!(reports[1].result, AttemptResult::Succeeded);
        assert_eq!(rec.count_for(gone), 0);
        assert_eq!(rec.count_for(kept), 1);
        assert_eq!(rows_with_key(&db, "k1").await, (0, 1));
    }
);
