//! Promote: the oldest waiting notice of a key becomes due once its turn
//! comes, without a new version; a notice held by a claim, or not yet in
//! turn, is not made due.

use super::{Fixture, conformance};
use crate::state::order;

/// Sets notice `id` aside: due in a minute, as a claim that met it out of
/// its turn leaves it.
async fn set_aside(f: &Fixture, id: i64) {
    let later = match f.backend() {
        super::Backend::Postgres => {
            "next_call_time = (now() AT TIME ZONE 'UTC') + interval '1 minute', \
             due_at = (now() AT TIME ZONE 'UTC') + interval '1 minute'"
        }
        super::Backend::MySql => "next_call_time = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE",
        super::Backend::Sqlite => {
            "next_call_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '+60 seconds')"
        }
    };
    f.exec(&format!("UPDATE notify_msg SET {later} WHERE id = {id}"))
        .await;
}

/// Ordered `c`; notices `first` and `second` of key `k`, `second` set
/// aside.
async fn waiting(f: &Fixture) -> (i64, i64) {
    f.exec("UPDATE notify_def SET ordering = 'per_key'").await;
    let first = f.keyed("k").await;
    let second = f.keyed("k").await;
    set_aside(f, second).await;
    (first, second)
}

/// Whether notice `id` is due now by the database's clock.
async fn due_now(f: &Fixture, id: i64) -> bool {
    let now = crate::state::clock::now_sql(f.store.backend());
    f.scalar(&format!(
        "SELECT COUNT(*) FROM notify_msg WHERE id = {id} AND next_call_time <= {now}"
    ))
    .await
        == 1
}

conformance!(
    promotes_the_next_once_its_turn_comes,
    |f: Fixture| async move {
        let (first, second) = waiting(&f).await;
        let keys = [(f.def_id, "k".to_string())];
        // Not its turn while the first is in flight: unchanged.
        let before = f.live(second).await.unwrap();
        assert_eq!(order::promote(&f.store.db, &keys).await.unwrap(), 0);
        f.unchanged(second, &before).await;
        // The first's success promotes it, without a new version.
        let lease = f.claim(first).await;
        lease.succeed(None, &[]).await.unwrap().unwrap();
        assert!(due_now(&f, second).await);
        assert_eq!(f.live(second).await.unwrap().version, before.version);
        // Set aside again (a claim raced the finish): a promotion finds it.
        set_aside(&f, second).await;
        assert_eq!(order::promote(&f.store.db, &keys).await.unwrap(), 1);
        assert!(due_now(&f, second).await);
        assert_eq!(f.live(second).await.unwrap().version, before.version);
        f
    }
);

conformance!(never_moves_a_claimed_notice, |f: Fixture| async move {
    let (first, second) = waiting(&f).await;
    let lease = f.claim(first).await;
    lease.succeed(None, &[]).await.unwrap().unwrap();
    // The second is claimed (by a sweeper) before the promotion runs.
    f.expire(second).await;
    let claimed = f.claim(second).await;
    let before = f.live(second).await.unwrap();
    let keys = [(f.def_id, "k".to_string())];
    assert_eq!(order::promote(&f.store.db, &keys).await.unwrap(), 0);
    f.unchanged(second, &before).await;
    claimed.forget();
    f
});
