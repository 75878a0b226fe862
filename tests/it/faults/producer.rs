//! Scenario 1: bad input and database errors inside `add_notice` never cost
//! the caller its business data, and `commit` never reports `Ok` for a
//! transaction the database rolled back.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;
use solid_notify::{AttemptResult, Error, NewNotice, Outcome};

use crate::{
    db_test, pg_test,
    support::{Backend, Recorder, TestDb, eventually},
};

db_test!(bad_input_keeps_the_business_transaction, |db: Arc<
    TestDb,
>| async move {
    let (notifier, rec) = db.shipping().await;
    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 1).await;
    let invalid = |e: Error| assert!(matches!(e, Error::InvalidNotice { .. }), "{e}");
    invalid(
        tx.add(NewNotice::new("ship", &json!({})).description("before\0after"))
            .await
            .unwrap_err(),
    );
    invalid(
        tx.add(NewNotice::new("ship", &json!({})).idempotency_key("key\0"))
            .await
            .unwrap_err(),
    );
    // 20 MiB: over the 1 MiB default limit (and MariaDB's max_allowed_packet).
    let blob = "x".repeat(20 << 20);
    invalid(
        tx.add(NewNotice::new("ship", &json!({ "blob": blob })))
            .await
            .unwrap_err(),
    );
    invalid(
        tx.add(NewNotice::new("ship", &json!({})).idempotency_key("é".repeat(256)))
            .await
            .unwrap_err(),
    );
    // The limit is in characters: 255 two-byte characters are fine.
    let keyed = tx
        .add(NewNotice::new("ship", &json!({"n": 1})).idempotency_key("é".repeat(255)))
        .await
        .unwrap();
    db.insert_order(&tx, 2).await;
    let plain = tx.add_notice("ship", &json!({"n": 2}), "ok").await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();

    assert_eq!(db.count_orders().await, 2, "the business data committed");
    assert_eq!(
        reports
            .iter()
            .map(|r| (r.notice_id, r.result.clone()))
            .collect::<Vec<_>>(),
        [
            (keyed, AttemptResult::Succeeded),
            (plain, AttemptResult::Succeeded)
        ]
    );
    assert_eq!(db.counts().await, (0, 2));
    assert_eq!(rec.count(), 2);
});

/// A trigger that makes the database refuse notices described `reject me`.
async fn refuse_some_notices(db: &TestDb) {
    let sql: &[&str] = match db.backend {
        Backend::Postgres => &[
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN \
             IF NEW.description = 'reject me' THEN RAISE EXCEPTION 'refused by trigger'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse BEFORE INSERT ON notify_msg FOR EACH ROW EXECUTE FUNCTION refuse()",
        ],
        Backend::MySql => &[
            "CREATE TRIGGER refuse BEFORE INSERT ON notify_msg FOR EACH ROW \
             BEGIN IF NEW.description = 'reject me' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by trigger'; END IF; END",
        ],
        Backend::Sqlite => &["CREATE TRIGGER refuse BEFORE INSERT ON notify_msg \
             WHEN NEW.description = 'reject me' BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END"],
    };
    for statement in sql {
        db.db.execute_unprepared(statement).await.unwrap();
    }
}

db_test!(a_database_error_rolls_back_only_the_notice, |db: Arc<
    TestDb,
>| async move {
    db.def("ship", "ship", |_| {}).await;
    refuse_some_notices(&db).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler("ship", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    // A transaction the caller began: each notice is inserted when added
    // (in a savepoint on PostgreSQL).
    let own = sea_orm::TransactionTrait::begin(&db.db).await.unwrap();
    let tx = notifier.wrap(own);
    db.insert_order(&tx, 1).await;
    let refused = tx
        .add_notice("ship", &json!({}), "reject me")
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Db(_)), "{refused}");
    // The transaction is still usable: more business data, another notice.
    db.insert_order(&tx, 2).await;
    let kept = tx.add_notice("ship", &json!({}), "keep me").await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        (reports[0].notice_id, &reports[0].result),
        (kept, &AttemptResult::Succeeded)
    );
    assert_eq!(db.count_orders().await, 2);
    assert_eq!(db.counts().await, (0, 1));

    // `Notifier::begin` on PostgreSQL sends notices with the commit: the
    // refusal fails the commit, and nothing (business data included) is
    // committed. Elsewhere it behaves as above.
    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 3).await;
    let added = tx.add_notice("ship", &json!({}), "reject me").await;
    if db.backend == Backend::Postgres {
        added.unwrap();
        let committed = tx.commit().await;
        assert!(
            matches!(committed, Err(Error::TransactionAborted(_))),
            "{committed:?}"
        );
        assert_eq!(db.count_orders().await, 2, "order 3 was not committed");
        assert_eq!(db.counts().await, (0, 1));
    } else {
        assert!(matches!(added, Err(Error::Db(_))));
        tx.commit().await.unwrap();
        assert_eq!(db.count_orders().await, 3);
    }
});

db_test!(
    commit_never_reports_ok_for_an_aborted_transaction,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({}), "").await.unwrap();
        // A business statement fails: PostgreSQL aborts the whole transaction.
        assert!(
            tx.execute_unprepared("SELECT * FROM no_such_table")
                .await
                .is_err()
        );
        let committed = tx.commit().await;
        if db.backend == Backend::Postgres {
            assert!(
                matches!(committed, Err(Error::TransactionAborted(_))),
                "{committed:?}"
            );
            assert_eq!(db.count_orders().await, 0);
            assert_eq!(db.counts().await, (0, 0));
            assert_eq!(rec.count(), 0, "nothing sent for a rolled-back notice");
        } else {
            // MySQL and SQLite roll back only the failed statement.
            committed.unwrap();
            assert_eq!(db.count_orders().await, 1);
        }
    }
);

db_test!(
    a_savepoint_the_caller_rolled_back_to_still_commits,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        let id = tx.add_notice("ship", &json!({}), "").await.unwrap();
        // The caller's own recovery: a failed statement inside a savepoint.
        tx.execute_unprepared("SAVEPOINT mine").await.unwrap();
        assert!(
            tx.execute_unprepared("SELECT * FROM no_such_table")
                .await
                .is_err()
        );
        tx.execute_unprepared("ROLLBACK TO SAVEPOINT mine")
            .await
            .unwrap();
        db.insert_order(&tx, 2).await;
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(reports[0].notice_id, id);
        assert_eq!(reports[0].result, AttemptResult::Succeeded);
        assert_eq!(db.count_orders().await, 2);
        assert_eq!(db.counts().await, (0, 1));
        assert_eq!(rec.count(), 1);
    }
);

pg_test!(
    a_cancelled_statement_fails_the_commit,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        tx.add_notice("ship", &json!({}), "").await.unwrap();
        // The caller gives up on a statement mid-way (a timeout around it).
        let slow = tx.execute_unprepared("SELECT pg_sleep(5)");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), slow)
                .await
                .is_err()
        );
        let committed = tx.commit().await;
        assert!(
            matches!(committed, Err(Error::TransactionAborted(_))),
            "{committed:?}"
        );
        assert_eq!(db.count_orders().await, 0);
        assert_eq!(db.counts().await, (0, 0));
        assert_eq!(rec.count(), 0);
        // No connection is left open inside that transaction.
        eventually(10, "no session idle in a transaction", || async {
            let n = db
                .scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND state LIKE 'idle in transaction%'",
                )
                .await;
            (n == 0).then_some(())
        })
        .await;
    }
);

db_test!(
    a_notice_whose_transaction_did_not_commit_is_never_sent,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        // `add` in the caller's transaction, which rolls back; the caller
        // dispatches anyway.
        let txn = db.db.begin().await.unwrap();
        let pending = notifier
            .add(&txn, NewNotice::new("ship", &json!({"n": 1})))
            .await
            .unwrap();
        txn.rollback().await.unwrap();
        let reports = notifier.dispatch(vec![pending], true).await;
        assert_eq!(reports[0].result, AttemptResult::LostClaim);

        // A wrapped transaction nested in an outer one: its commit is only a
        // savepoint's release, and the outer transaction rolls back.
        let outer = db.db.begin().await.unwrap();
        let tx = notifier.wrap(outer.begin().await.unwrap());
        tx.add_notice("ship", &json!({"n": 2}), "").await.unwrap();
        let waiting = tokio::spawn(tx.commit_and_wait());
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        outer.rollback().await.unwrap();
        let reports = waiting.await.unwrap().unwrap();
        assert_eq!(reports[0].result, AttemptResult::LostClaim);

        // The same, committed: sent once.
        let txn = db.db.begin().await.unwrap();
        let pending = notifier
            .add(&txn, NewNotice::new("ship", &json!({"n": 3})))
            .await
            .unwrap();
        txn.commit().await.unwrap();
        let reports = notifier.dispatch(vec![pending], true).await;
        assert_eq!(reports[0].result, AttemptResult::Succeeded);
        assert_eq!(rec.count(), 1, "only the committed notice was sent");
        assert_eq!(db.counts().await, (0, 1));
    }
);

db_test!(
    a_success_note_the_database_would_refuse_is_cleaned,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let rec = Recorder::default();
        let note = format!("shipped\0{}", "x".repeat(100_000));
        let notifier = db
            .notifier()
            .handler(
                "ship",
                rec.handler(move |_| Outcome::Success {
                    note: Some(note.clone()),
                    result: None,
                }),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("ship", &json!({}), "order 1").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(reports[0].result, AttemptResult::Succeeded);
        let done = db.history_of(id).await.expect("recorded once, in history");
        assert!(done.description.starts_with("order 1\nshippedxxx"));
        assert!(!done.description.contains('\0'));
        assert!(done.description.len() < 10_000, "the note is cut");
        assert_eq!(rec.count(), 1);
    }
);
