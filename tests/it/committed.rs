//! Only what committed is sent: a notice added inside a savepoint or a
//! nested transaction that is rolled back is neither stored nor sent, and an
//! add into a transaction the database has aborted already fails and writes
//! nothing. Each test counts orders, notice rows and calls of the handler.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, TransactionError, TransactionSession, TransactionTrait};
use serde_json::json;
use solid_notify::{AttemptResult, Error, NewNotice};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    server_test,
    support::{Backend, Recorder, TestDb, eventually},
};

/// How the handler was called: the `n` of each notice's param, sorted.
fn sent(rec: &Recorder) -> Vec<i64> {
    let mut sent: Vec<i64> = rec
        .calls()
        .iter()
        .map(|n| n.param["n"].as_i64().unwrap())
        .collect();
    sent.sort();
    sent
}

/// The `n` of every notice stored, in flight or in history, sorted.
async fn stored(db: &TestDb) -> Vec<i64> {
    let mut stored: Vec<i64> = db
        .live()
        .await
        .iter()
        .map(|r| r.param.clone())
        .chain(db.history().await.iter().map(|r| r.param.clone()))
        .map(|p| {
            serde_json::from_str::<serde_json::Value>(&p).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    stored.sort();
    stored
}

/// Runs a worker until every notice stored has finished, so that a notice
/// stored by mistake would be sent too.
async fn drain(db: &TestDb, rec: &Recorder) {
    let notifier = db
        .notifier()
        .config(quiet())
        .handler("ship", rec.handler(|_| solid_notify::Outcome::success()))
        .build()
        .unwrap();
    let worker = start(notifier, fast(solid_notify::WorkerConfig::default()));
    eventually(20, "nothing left in flight", || async {
        (db.counts().await.0 == 0).then_some(())
    })
    .await;
    worker.stop().await;
}

db_test!(
    a_nested_transaction_rolled_back_takes_its_notice_with_it,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        // sea-orm's nested transaction: a savepoint.
        let nested = tx.begin().await.unwrap();
        db.insert_order(&nested, 2).await;
        nested
            .add_notice("ship", &json!({"n": 2}), "")
            .await
            .unwrap();
        nested.rollback().await.unwrap();
        // One that is committed (released) goes with the outer one.
        let kept = tx.begin().await.unwrap();
        db.insert_order(&kept, 3).await;
        kept.add_notice("ship", &json!({"n": 3}), "").await.unwrap();
        TransactionSession::commit(kept).await.unwrap();
        // One dropped unfinished is rolled back, as sea-orm's are.
        {
            let dropped = tx.begin().await.unwrap();
            db.insert_order(&dropped, 4).await;
            dropped
                .add_notice("ship", &json!({"n": 4}), "")
                .await
                .unwrap();
        }
        // And the closure form, whose Err rolls back.
        let failed = tx
            .transaction::<_, (), String>(|t| {
                Box::pin(async move {
                    t.add_notice("ship", &json!({"n": 5}), "").await.unwrap();
                    Err("the business step failed".into())
                })
            })
            .await;
        assert!(matches!(failed, Err(TransactionError::Transaction(_))));
        let reports = tx.commit_and_wait().await.unwrap();
        assert!(
            reports.iter().all(|r| r.result == AttemptResult::Succeeded),
            "{reports:?}"
        );
        assert_eq!(reports.len(), 2, "{reports:?}");
        drain(&db, &rec).await;
        assert_eq!(db.count_orders().await, 2, "orders 1 and 3 committed");
        assert_eq!(stored(&db).await, [1, 3]);
        assert_eq!(sent(&rec), [1, 3]);
    }
);

db_test!(
    a_savepoint_rolled_back_by_sql_takes_its_notice_with_it,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        tx.execute_unprepared("SAVEPOINT sp").await.unwrap();
        db.insert_order(&tx, 1).await;
        let id = tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        tx.execute_unprepared("ROLLBACK TO SAVEPOINT sp")
            .await
            .unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        // Not attempted (SQLite drops it before the commit), or its claim
        // finds nothing.
        assert!(
            reports
                .iter()
                .all(|r| r.notice_id == id && r.result == AttemptResult::LostClaim),
            "{reports:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(db.count_orders().await, 0);
        assert_eq!(stored(&db).await, Vec::<i64>::new());
        assert_eq!(rec.count(), 0, "a notice that never committed was sent");
    }
);

db_test!(
    a_savepoint_released_keeps_its_notice,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        tx.execute_unprepared("SAVEPOINT sp").await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        tx.execute_unprepared("RELEASE SAVEPOINT sp").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(reports[0].result, AttemptResult::Succeeded, "{reports:?}");
        assert_eq!(db.count_orders().await, 1);
        assert_eq!(stored(&db).await, [1]);
        assert_eq!(sent(&rec), [1]);
    }
);

db_test!(
    only_the_notices_outside_a_rolled_back_savepoint_are_sent,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ship'")
            .await;
        let leased = if db.backend == Backend::Postgres {
            "false"
        } else {
            "0"
        };
        let plain_sql = |n: i64| {
            format!(
                "INSERT INTO notify_msg (def_id, param, description, errors, status, retry_times, \
                 next_call_time, create_time, version, load_balance_num, leased) \
                 VALUES ({def_id}, '{{\"n\":{n}}}', '', '', 0, 0, {now}, {now}, 0, 0, {leased})",
                now = db.now_sql()
            )
        };
        let tx = notifier.begin().await.unwrap();
        tx.add_notice("ship", &json!({"n": 1}), "before")
            .await
            .unwrap();
        tx.add(NewNotice::new("ship", &json!({"n": 2})).idempotency_key("k2"))
            .await
            .unwrap();
        tx.execute_unprepared("savepoint inner_one").await.unwrap();
        tx.add_notice("ship", &json!({"n": 3}), "inside")
            .await
            .unwrap();
        tx.add(NewNotice::new("ship", &json!({"n": 4})).idempotency_key("k4"))
            .await
            .unwrap();
        // A plain-SQL producer's row through the same transaction.
        tx.execute_unprepared(&plain_sql(5)).await.unwrap();
        tx.execute_unprepared("rollback to savepoint inner_one")
            .await
            .unwrap();
        tx.add_notice("ship", &json!({"n": 6}), "after")
            .await
            .unwrap();
        tx.execute_unprepared(&plain_sql(7)).await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        // Notices 1, 2 and 6 are sent after the commit; 3 and 4 are not
        // (on SQLite notice 6 reuses the id 3 had, so 3 is not reported).
        let succeeded = reports
            .iter()
            .filter(|r| r.result == AttemptResult::Succeeded)
            .count();
        assert_eq!(succeeded, 3, "{reports:?}");
        assert!(
            reports.iter().all(|r| matches!(
                r.result,
                AttemptResult::Succeeded | AttemptResult::LostClaim
            )),
            "{reports:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(stored(&db).await, [1, 2, 6, 7]);
        assert_eq!(sent(&rec), [1, 2, 6, 7]);
    }
);

db_test!(
    a_wrapped_transaction_keeps_only_what_committed,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.wrap(db.db.begin().await.unwrap());
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        tx.execute_unprepared("SAVEPOINT sp").await.unwrap();
        tx.add_notice("ship", &json!({"n": 2}), "").await.unwrap();
        tx.execute_unprepared("ROLLBACK TO SAVEPOINT sp")
            .await
            .unwrap();
        let nested = tx.begin().await.unwrap();
        nested
            .add_notice("ship", &json!({"n": 3}), "")
            .await
            .unwrap();
        nested.rollback().await.unwrap();
        tx.commit_and_wait().await.unwrap();
        drain(&db, &rec).await;
        assert_eq!(stored(&db).await, [1]);
        assert_eq!(sent(&rec), [1]);
    }
);

/// Makes `victim`'s statement (an update of order 2, from a transaction
/// that holds order 1) a deadlock victim on MariaDB: another transaction,
/// heavier (it inserts orders `from..from + 50`, so InnoDB rolls the victim
/// back), holds order 2 and then asks for order 1. Returns the victim's
/// error, once it has failed.
async fn deadlock<F, Fut>(db: &TestDb, from: i64, victim: F) -> sea_orm::DbErr
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<sea_orm::ExecResult, sea_orm::DbErr>> + Send + 'static,
{
    let other = db.db.begin().await.unwrap();
    // Heavier: many rows changed, so InnoDB rolls the other one back.
    for id in from..from + 50 {
        db.insert_order(&other, id).await;
    }
    other
        .execute_unprepared("UPDATE orders SET item = 'b' WHERE id = 2")
        .await
        .unwrap();
    let waiting = tokio::spawn(victim());
    // The victim waits for order 2 (held by `other`); now `other` waits for
    // order 1 (held by the victim): a deadlock.
    // 30 s: under a full test run the server may be busy with others.
    // Seen in the process list (`other` is idle: an `UPDATE` running in
    // this database is the victim's, which only a lock holds), not in
    // `innodb_trx`: InnoDB refreshes that only once no one has read it for
    // 100 ms, so polling it (here, or any other test) can keep it stale.
    eventually(30, "the victim waiting for its lock", || async {
        let n = db
            .scalar(
                "SELECT COUNT(*) FROM information_schema.processlist \
                 WHERE db = DATABASE() AND command = 'Query' AND info LIKE 'UPDATE orders%'",
            )
            .await;
        (n > 0).then_some(())
    })
    .await;
    other
        .execute_unprepared("UPDATE orders SET item = 'b' WHERE id = 1")
        .await
        .unwrap();
    other.commit().await.unwrap();
    waiting.await.unwrap().unwrap_err()
}

server_test!(
    an_add_after_the_database_aborted_the_transaction_fails,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.insert_order(&db.db, 1).await;
        db.insert_order(&db.db, 2).await;

        // Seen by the library: the failed statement ran through the wrapper.
        let tx = Arc::new(notifier.begin().await.unwrap());
        tx.execute_unprepared("UPDATE orders SET item = 'a' WHERE id = 1")
            .await
            .unwrap();
        let failed = if db.backend == Backend::MySql {
            let aborting = tx.clone();
            deadlock(&db, 100, move || async move {
                aborting
                    .execute_unprepared("UPDATE orders SET item = 'a' WHERE id = 2")
                    .await
            })
            .await
        } else {
            tx.execute_unprepared("SELECT * FROM no_such_table")
                .await
                .unwrap_err()
        };
        eprintln!("the transaction's statement failed: {failed}");
        // The caller tolerates the error and goes on.
        let added = tx.add_notice("ship", &json!({"n": 1}), "").await;
        assert!(
            matches!(added, Err(Error::TransactionAborted(_))),
            "{added:?}"
        );
        let tx = Arc::try_unwrap(tx).ok().unwrap();
        let committed = tx.commit().await;
        assert!(
            matches!(committed, Err(Error::TransactionAborted(_))),
            "{committed:?}"
        );

        // Seen only by the server: the caller's own transaction, given to
        // `Notifier::add`.
        let txn = Arc::new(db.db.begin().await.unwrap());
        txn.execute_unprepared("UPDATE orders SET item = 'c' WHERE id = 1")
            .await
            .unwrap();
        if db.backend == Backend::MySql {
            let aborting = txn.clone();
            deadlock(&db, 200, move || async move {
                aborting
                    .execute_unprepared("UPDATE orders SET item = 'c' WHERE id = 2")
                    .await
            })
            .await;
        } else {
            txn.execute_unprepared("SELECT * FROM no_such_table")
                .await
                .unwrap_err();
        }
        let added = notifier
            .add(&*txn, NewNotice::new("ship", &json!({"n": 2})))
            .await;
        assert!(
            matches!(added, Err(Error::TransactionAborted(_))),
            "{added:?}"
        );
        let txn = Arc::try_unwrap(txn).ok().unwrap();
        txn.commit().await.ok();

        drain(&db, &rec).await;
        assert_eq!(stored(&db).await, Vec::<i64>::new(), "nothing written");
        assert_eq!(rec.count(), 0, "nothing sent");
        assert_eq!(
            db.scalar("SELECT COUNT(*) FROM orders WHERE item IN ('a', 'c')")
                .await,
            0,
            "neither business transaction committed"
        );
    }
);

db_test!(
    an_add_after_the_caller_rolled_the_transaction_back_by_sql_fails,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        tx.execute_unprepared("ROLLBACK").await.ok();
        let added = tx.add_notice("ship", &json!({"n": 2}), "").await;
        assert!(
            matches!(added, Err(Error::TransactionAborted(_))),
            "{added:?}"
        );
        let committed = tx.commit().await;
        assert!(
            matches!(committed, Err(Error::TransactionAborted(_))),
            "{committed:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(db.count_orders().await, 0);
        assert_eq!(stored(&db).await, Vec::<i64>::new());
        assert_eq!(rec.count(), 0);
    }
);

db_test!(
    a_commit_after_the_caller_rolled_back_by_sql_fails,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        tx.execute_unprepared("ROLLBACK").await.ok();
        // No add in between: the commit itself must find out.
        let committed = tx.commit().await;
        assert!(
            matches!(committed, Err(Error::TransactionAborted(_))),
            "{committed:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(db.count_orders().await, 0);
        assert_eq!(stored(&db).await, Vec::<i64>::new());
        assert_eq!(rec.count(), 0);
    }
);

db_test!(
    nested_transactions_ended_out_of_order_keep_the_outer_one,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        let outer = tx.begin().await.unwrap();
        outer
            .add_notice("ship", &json!({"n": 2}), "")
            .await
            .unwrap();
        {
            // Rolled back with `outer` (its savepoint goes with it), then
            // dropped: nothing is left for the drop to undo.
            let inner = outer.begin().await.unwrap();
            inner
                .add_notice("ship", &json!({"n": 3}), "")
                .await
                .unwrap();
            outer.rollback().await.unwrap();
            drop(inner);
        }
        tx.add_notice("ship", &json!({"n": 4}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert!(
            reports.iter().all(|r| r.result == AttemptResult::Succeeded),
            "{reports:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(stored(&db).await, [1, 4]);
        assert_eq!(sent(&rec), [1, 4]);
    }
);

db_test!(
    a_notice_that_reuses_a_rolled_back_id_is_sent_at_once,
    |db: Arc<TestDb>| async move {
        // SQLite gives a row taken back by a savepoint's rollback id to the
        // next insert: here the nested transaction's rolled-back notice
        // and the outer one's later notice share an id.
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        let nested = tx.begin().await.unwrap();
        nested.execute_unprepared("SAVEPOINT inside").await.unwrap();
        nested
            .add_notice("ship", &json!({"n": 1}), "")
            .await
            .unwrap();
        nested
            .execute_unprepared("ROLLBACK TO SAVEPOINT inside")
            .await
            .unwrap();
        let kept = tx.add_notice("ship", &json!({"n": 2}), "").await.unwrap();
        TransactionSession::commit(nested).await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let mine: Vec<_> = reports.iter().filter(|r| r.notice_id == kept).collect();
        assert!(
            mine.iter().any(|r| r.result == AttemptResult::Succeeded),
            "the kept notice was not sent after its commit: {reports:?}"
        );
        drain(&db, &rec).await;
        assert_eq!(stored(&db).await, [2]);
        assert_eq!(sent(&rec), [2]);
    }
);

db_test!(concurrent_adds_on_one_transaction_all_commit, |db: Arc<
    TestDb,
>| async move {
    let (notifier, rec) = db.shipping().await;
    let tx = notifier.begin().await.unwrap();
    let adds = (0..12).map(|n| {
        let tx = &tx;
        async move {
            let notice = NewNotice::new("ship", &json!({ "n": n }));
            let notice = if n % 2 == 0 {
                notice.idempotency_key(format!("k{n}"))
            } else {
                notice
            };
            tx.add(notice).await
        }
    });
    let orders = (100..106).map(|id| {
        let (tx, db) = (&tx, &db);
        async move { db.insert_order(tx, id).await }
    });
    let (added, _) = futures::future::join(
        futures::future::join_all(adds),
        futures::future::join_all(orders),
    )
    .await;
    assert!(added.iter().all(Result::is_ok), "{added:?}");
    tx.commit_and_wait().await.unwrap();
    drain(&db, &rec).await;
    assert_eq!(db.count_orders().await, 6);
    assert_eq!(stored(&db).await, (0..12).collect::<Vec<i64>>());
    assert_eq!(sent(&rec), (0..12).collect::<Vec<i64>>());
});
