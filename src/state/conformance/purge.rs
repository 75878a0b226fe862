//! Purge: a finished notice, as archived (its version), is deleted; one
//! that changed since, or whose lease is still live (cancelled while an
//! attempt held it: the lease holds its ordering key), is not.

use super::{Fixture, conformance};
use crate::state::{
    operator::{self, Seen},
    retention,
};

fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

/// Cancels notice `id` while `lease` holds it: in history, lease kept.
async fn cancelled_mid_send(f: &Fixture, id: i64) -> crate::entity::notify_msg_history::Model {
    let row = f.live(id).await.unwrap();
    let seen = Seen {
        id,
        version: row.version,
        errors: row.errors,
    };
    operator::cancel(&f.store, &[seen], "cancelled", now())
        .await
        .unwrap();
    f.history(id).await.unwrap()
}

conformance!(
    never_deletes_a_row_whose_lease_is_live,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        let row = cancelled_mid_send(&f, id).await;
        assert!(row.leased);
        let deleted = retention::delete_history(&f.store.db, &[(id, row.version)])
            .await
            .unwrap();
        assert_eq!(deleted, 0);
        assert_eq!(f.history(id).await.unwrap(), row);
        // Once the lease has ended it goes.
        f.expire(id).await;
        let deleted = retention::delete_history(&f.store.db, &[(id, row.version)])
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        lease.forget();
        f
    }
);

conformance!(never_deletes_a_row_that_changed, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    lease.succeed(None, &[]).await.unwrap().unwrap();
    let row = f.history(id).await.unwrap();
    let deleted = retention::delete_history(&f.store.db, &[(id, row.version - 1)])
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    assert_eq!(f.history(id).await.unwrap(), row);
    let deleted = retention::delete_history(&f.store.db, &[(id, row.version)])
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    f
});
