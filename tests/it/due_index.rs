//! PostgreSQL's due index (migration 16): `due_at` follows `next_call_time`
//! except ahead of a lease, so a claim rewrites no index entry (a HOT
//! update), and the due scan still finds every row whose lease ended.

use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;

use crate::{
    pg_test,
    support::{Recorder, TestDb, eventually},
};

/// `(due_at = next_call_time, due_at <= next_call_time)` of notice `id`.
async fn due_at_of(db: &TestDb, id: i64) -> (i64, i64) {
    (
        db.scalar(&format!(
            "SELECT (due_at = next_call_time)::int FROM notify_msg WHERE id = {id}"
        ))
        .await,
        db.scalar(&format!(
            "SELECT (due_at <= next_call_time)::int FROM notify_msg WHERE id = {id}"
        ))
        .await,
    )
}

async fn exec(db: &TestDb, sql: &str) {
    db.db
        .execute_unprepared(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pg_test!(
    due_at_follows_next_call_time_except_ahead_of_a_lease,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        // A plain-SQL insert scheduled an hour ahead.
        let id = db
            .scalar(
                "INSERT INTO notify_msg (def_id, param, next_call_time) SELECT id, '{}', \
                 (now() AT TIME ZONE 'UTC') + interval '1 hour' FROM notify_def \
                 WHERE name = 'ship' RETURNING id",
            )
            .await;
        assert_eq!(due_at_of(&db, id).await, (1, 1), "insert");
        // A claim pushes next_call_time a lease ahead: due_at stays.
        exec(
            &db,
            &format!(
                "UPDATE notify_msg SET leased = true, version = version + 1, \
                 next_call_time = next_call_time + interval '1 hour' WHERE id = {id}"
            ),
        )
        .await;
        assert_eq!(due_at_of(&db, id).await, (0, 1), "claim");
        // A claim that ends before the row was due brings due_at back to
        // its end, so the due scan finds the row when the lease ends.
        exec(
            &db,
            &format!(
                "UPDATE notify_msg SET next_call_time = (now() AT TIME ZONE 'UTC') \
                 - interval '1 second' WHERE id = {id}"
            ),
        )
        .await;
        assert_eq!(due_at_of(&db, id).await, (1, 1), "lease ending early");
        // An outcome that reschedules (leased cleared) moves due_at too.
        exec(
            &db,
            &format!(
                "UPDATE notify_msg SET leased = false, \
                 next_call_time = (now() AT TIME ZONE 'UTC') + interval '3 hours' WHERE id = {id}"
            ),
        )
        .await;
        assert_eq!(due_at_of(&db, id).await, (1, 1), "retry");
        // Written with triggers off: the default, never later than due.
        let id = db.insert_with_triggers_off("ship").await;
        assert_eq!(due_at_of(&db, id).await, (0, 1), "insert with triggers off");
    }
);

pg_test!(claims_are_heap_only_updates, |db: Arc<TestDb>| async move {
    const N: i64 = 400;
    db.def("ship", "ship", |_| {}).await;
    db.insert_due("ship", N as usize, |_| 0).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler("ship", rec.handler(|_| solid_notify::Outcome::success()))
        .build()
        .unwrap();
    let mut sent = 0;
    while sent < N as usize {
        sent += db.attempt_due(&notifier).await;
    }
    eventually(5, "all delivered", || async {
        (db.history().await.len() == N as usize).then_some(())
    })
    .await;
    assert_eq!(rec.count(), N as usize);
    // Statistics reach the shared counters within a second or so.
    let stats = "FROM pg_stat_user_tables WHERE relname = 'notify_msg'";
    let updated = eventually(10, "claims counted", || async {
        let n = db.scalar(&format!("SELECT n_tup_upd {stats}")).await;
        (n >= N).then_some(n)
    })
    .await;
    let hot = db.scalar(&format!("SELECT n_tup_hot_upd {stats}")).await;
    assert!(
        hot * 4 >= updated * 3,
        "{hot} of {updated} updates heap-only: a claim wrote index entries"
    );
});

pg_test!(
    a_held_notice_is_not_claimed_again_and_a_held_key_leaves_the_scan,
    |db: Arc<TestDb>| async move {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        use serde_json::json;
        use solid_notify::{Config, NewNotice, Notice, Outcome};

        db.def("ship", "ship", |_| {}).await;
        db.def("ordered", "ship", |s| s.ordering = "per_key".into())
            .await;
        let gate = Arc::new(tokio::sync::Notify::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let notifier = {
            let (gate, calls) = (gate.clone(), calls.clone());
            db.notifier()
                .config(Config {
                    immediate_attempt: false,
                    ..crate::support::test_config()
                })
                .handler("ship", move |_: Notice| {
                    let (gate, calls) = (gate.clone(), calls.clone());
                    async move {
                        calls.fetch_add(1, SeqCst);
                        gate.notified().await;
                        Ok(Outcome::success())
                    }
                })
                .build()
                .unwrap()
        };
        let tx = notifier.begin().await.unwrap();
        let plain = tx.add_notice("ship", &json!({}), "").await.unwrap();
        let keyed = tx
            .add(NewNotice::new("ordered", &json!({})).ordering_key("k"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let running = crate::faults::start(
            notifier.clone(),
            solid_notify::WorkerConfig {
                mode: solid_notify::worker::Mode::FixedDelay,
                delay: Duration::from_millis(20),
                ..solid_notify::WorkerConfig::default()
            },
        );
        eventually(5, "both attempts running", || async {
            (calls.load(SeqCst) == 2).then_some(())
        })
        .await;
        // The plain claim left due_at where it was (its update rewrote no
        // index entry); the keyed one moved it to the lease's end.
        assert_eq!(due_at_of(&db, plain).await, (0, 1), "plain notice held");
        assert_eq!(due_at_of(&db, keyed).await, (1, 1), "keyed notice held");
        // The plain one is in the due index's range, but neither is due.
        let again = tokio::time::timeout(Duration::from_secs(5), notifier.sweep_once(100))
            .await
            .expect("a second sweep claims nothing, so it does not wait on the gate")
            .unwrap();
        assert!(again.is_empty(), "claimed again: {again:?}");
        assert_eq!(calls.load(SeqCst), 2);
        gate.notify_waiters();
        eventually(5, "both delivered", || async {
            (db.history().await.len() == 2).then_some(())
        })
        .await;
        running.stop().await;
        assert_eq!(calls.load(SeqCst), 2);
    }
);
