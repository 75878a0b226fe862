//! Producer: atomic with the business transaction, attempted after commit.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{AttemptResult, NewNotice, Outcome, Status};

use crate::{
    db_test,
    support::{Recorder, TestDb, eventually},
};

async fn notifier_with(db: &TestDb, rec: &Recorder) -> solid_notify::Notifier {
    db.def("ship", "ship", |_| {}).await;
    db.notifier()
        .handler("ship", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap()
}

db_test!(rollback_and_drop_store_and_send_nothing, |db: Arc<
    TestDb,
>| async move {
    let rec = Recorder::default();
    let notifier = notifier_with(&db, &rec).await;

    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 1).await;
    tx.add_notice("ship", &json!({"order": 1}), "rolled back")
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    {
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 2).await;
        tx.add_notice("ship", &json!({"order": 2}), "dropped")
            .await
            .unwrap();
        // dropped without commit
    }

    // A committed sentinel: once it is delivered, any earlier attempt would have been too.
    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 3).await;
    let sentinel = tx
        .add_notice("ship", &json!({"order": 3}), "sentinel")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    eventually(10, "sentinel delivered", || async {
        db.history_of(sentinel)
            .await
            .filter(|h| h.status == Status::Succeeded)
    })
    .await;

    assert_eq!(
        db.count_orders().await,
        1,
        "only the committed order exists"
    );
    assert_eq!(db.counts().await, (0, 1), "only the sentinel was stored");
    let calls = rec.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].param, json!({"order": 3}));
});

db_test!(commit_sends_exactly_once, |db: Arc<TestDb>| async move {
    let rec = Recorder::default();
    let notifier = notifier_with(&db, &rec).await;

    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 10).await;
    let id = tx
        .add(
            NewNotice::new("ship", &json!({"order": 10}))
                .description("checkout")
                .load_balance_num(3)
                .idempotency_key("order-10"),
        )
        .await
        .unwrap();
    // Not visible to others before the commit, and not attempted.
    assert_eq!(db.counts().await, (0, 0));
    let ids = tx.commit().await.unwrap();
    assert_eq!(ids, [id]);

    let done = eventually(10, "notice in history", || async {
        db.history_of(id).await
    })
    .await;
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(done.retry_times, 0);
    assert!(done.errors.is_empty());
    assert_eq!(done.load_balance_num, 3);
    assert_eq!(db.counts().await, (0, 1));
    assert_eq!(db.count_orders().await, 1);

    // Sweeping afterwards finds nothing: the single attempt was the only one.
    assert_eq!(db.attempt_due(&notifier).await, 0);
    let calls = rec.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!((call.id, call.attempt, call.def.as_str()), (id, 1, "ship"));
    assert_eq!(call.idempotency_key, "order-10");
    assert_eq!(call.description, "checkout");
    assert_eq!(call.load_balance_num, 3);
});

db_test!(
    commit_and_wait_reports_each_outcome,
    |db: Arc<TestDb>| async move {
        let rec = Recorder::default();
        db.def("ship", "ship", |_| {}).await;
        db.def("flaky", "flaky", |s| s.retry_interval = "1m".into())
            .await;
        let notifier = db
            .notifier()
            .handler("ship", rec.handler(|_| Outcome::success()))
            .handler("flaky", rec.handler(|_| Outcome::retry("receiver busy")))
            .build()
            .unwrap();

        let tx = notifier.begin().await.unwrap();
        let ok = tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        let bad = tx.add_notice("flaky", &json!({"n": 2}), "").await.unwrap();
        let started = chrono::Utc::now().naive_utc();
        let reports = tx.commit_and_wait().await.unwrap();

        assert_eq!(reports.len(), 2);
        assert_eq!(reports[0].notice_id, ok);
        assert_eq!(reports[0].result, AttemptResult::Succeeded);
        assert_eq!(reports[1].notice_id, bad);
        let AttemptResult::WillRetry {
            attempt,
            at,
            reason,
        } = &reports[1].result
        else {
            panic!("expected a retry, got {:?}", reports[1].result);
        };
        assert_eq!((*attempt, reason.as_str()), (1, "receiver busy"));
        let wait = (*at - started).to_std().unwrap();
        assert!(
            wait >= Duration::from_secs(59) && wait < Duration::from_secs(70),
            "{wait:?}"
        );

        let live = db.live().await;
        assert_eq!(live.len(), 1);
        assert_eq!(
            (live[0].id, live[0].status, live[0].retry_times),
            (bad, Status::Failed, 1)
        );
        assert!(
            live[0].errors.ends_with("attempt 1: receiver busy"),
            "{}",
            live[0].errors
        );
        assert_eq!(db.history_of(ok).await.unwrap().status, Status::Succeeded);
    }
);

db_test!(business_code_runs_unchanged_on_the_wrapper, |db: Arc<
    TestDb,
>| async move {
    use sea_orm::{EntityTrait, PaginatorTrait};
    let rec = Recorder::default();
    let notifier = notifier_with(&db, &rec).await;
    // Ordinary sea-orm calls take the wrapper as their connection.
    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 7).await;
    let in_tx = solid_notify::entity::notify_def::Entity::find()
        .count(&tx)
        .await
        .unwrap();
    assert_eq!(in_tx, 2, "`ship` and the reserved alert definition");
    // A transaction begun by the caller can be wrapped too.
    tx.commit().await.unwrap();
    let own = sea_orm::TransactionTrait::begin(&db.db).await.unwrap();
    let wrapped = notifier.wrap(own);
    db.insert_order(&wrapped, 8).await;
    wrapped.commit().await.unwrap();
    assert_eq!(db.count_orders().await, 2);
});

db_test!(shutdown_releases_after_commit_attempts, |db: Arc<
    TestDb,
>| async move {
    db.def("stuck", "stuck", |_| {}).await;
    let started = Recorder::default();
    let seen = started.clone();
    let notifier = db
        .notifier()
        .handler("stuck", move |n: solid_notify::Notice| {
            let seen = seen.clone();
            async move {
                let _ = seen.handler(|_| Outcome::success())(n).await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Outcome::success())
            }
        })
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let id = tx.add_notice("stuck", &json!({}), "").await.unwrap();
    tx.commit().await.unwrap();
    eventually(10, "after-commit attempt running", || async {
        (started.count() == 1).then_some(())
    })
    .await;
    let released = notifier.shutdown(Duration::from_millis(200)).await.unwrap();
    assert_eq!(released, 1);
    let row = db.live().await.pop().unwrap();
    // Reserved at version 0 (the after-commit attempt's claim), released at 1.
    assert_eq!((row.id, row.version, row.status), (id, 1, Status::NotSent));
    assert!(!row.leased);
    assert!(
        row.next_call_time <= chrono::Utc::now().naive_utc(),
        "due again at once"
    );
});

db_test!(
    notices_travel_with_the_commit_intact,
    |db: Arc<TestDb>| async move {
        use sea_orm::EntityTrait;
        db.def(
            "ship",
            "ship",
            |s| s.target = serde_json::json!({"handler": "ship", "overridable": ["handler"]}),
        )
        .await;
        let notifier = db
            .notifier()
            .config(solid_notify::Config {
                immediate_attempt: false,
                ..crate::support::test_config()
            })
            .build()
            .unwrap();
        // Text that quoting could get wrong survives exactly.
        let awkward = "it's \\ $sn$ $$ $sn1$ \"quoted\" \u{1a} é 😀\nnext line";
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        let mut ids = Vec::new();
        for i in 0..50 {
            let notice = NewNotice::new("ship", &json!({ "i": i, "text": awkward }))
                .description(awkward)
                .idempotency_key(format!("{awkward}-{i}"))
                .target_override(json!({"handler": "ship"}));
            ids.push(tx.add(notice).await.unwrap());
        }
        assert_eq!(
            db.counts().await,
            (0, 0),
            "nothing visible before the commit"
        );
        assert_eq!(tx.commit().await.unwrap(), ids);
        let live = db.live().await;
        assert_eq!(live.iter().map(|r| r.id).collect::<Vec<_>>(), {
            let mut sorted = ids.clone();
            sorted.sort();
            sorted
        });
        for row in &live {
            assert_eq!(row.description, awkward);
            assert!(row.idempotency_key.as_deref().unwrap().starts_with(awkward));
            let param: serde_json::Value = serde_json::from_str(&row.param).unwrap();
            assert_eq!(param["text"], awkward);
            assert_eq!(
                row.target_override.as_deref(),
                Some(r#"{"handler":"ship"}"#)
            );
            assert_eq!(
                (row.status, row.version, row.leased),
                (Status::NotSent, 0, false)
            );
        }
        assert_eq!(db.count_orders().await, 1);

        // Rolled back, or dropped unfinished: nothing stored, and the pool's
        // connections are fine afterwards.
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 2).await;
        tx.add_notice("ship", &json!({}), "").await.unwrap();
        tx.rollback().await.unwrap();
        {
            let tx = notifier.begin().await.unwrap();
            db.insert_order(&tx, 3).await;
            tx.add_notice("ship", &json!({}), "").await.unwrap();
        }
        for _ in 0..20 {
            let tx = notifier.begin().await.unwrap();
            let n = solid_notify::entity::notify_msg::Entity::find()
                .all(&tx)
                .await
                .unwrap()
                .len();
            assert_eq!(n, 50);
            tx.commit().await.unwrap();
        }
        assert_eq!(db.count_orders().await, 1);
        assert_eq!(db.counts().await, (50, 0));
        // A notice-only transaction.
        let tx = notifier.begin().await.unwrap();
        let alone = tx.add_notice("ship", &json!({}), "alone").await.unwrap();
        tx.commit().await.unwrap();
        assert!(db.live().await.iter().any(|r| r.id == alone));
    }
);
