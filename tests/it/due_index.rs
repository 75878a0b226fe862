//! PostgreSQL's due index (migration 16): `due_at` follows `next_call_time`
//! except ahead of a lease, so a claim rewrites no index entry (a HOT
//! update), and the due scan still finds every row whose lease ended.

use std::sync::Arc;

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
        let due = db
            .scalar(&format!(
                "SELECT COUNT(*) FROM notify_msg WHERE id = {id} \
                 AND due_at <= (now() AT TIME ZONE 'UTC')"
            ))
            .await;
        assert_eq!(due, 1, "an ended lease is due by the index");
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
        let other = TestDb::connect_to(&db.url).await;
        other
            .execute_unprepared(
                "SET session_replication_role = replica; \
                 INSERT INTO notify_msg (def_id, param, next_call_time) SELECT id, '{}', \
                 (now() AT TIME ZONE 'UTC') + interval '1 hour' FROM notify_def WHERE name = 'ship'",
            )
            .await
            .unwrap();
        let id = db.scalar("SELECT MAX(id) FROM notify_msg").await;
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
