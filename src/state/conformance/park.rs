//! Park: a claimed notice of an unknown or invalid definition moves to
//! history as parked, with one alert; a stale lease parks nothing and
//! queues no alert.

use super::{Fixture, conformance};
use crate::{
    state::{batch, clock::Due},
    status::Status,
};

fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

conformance!(parks_what_it_holds, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    let alert = f.row(None, Due::Now);
    let parked = batch::park_many(
        &f.store,
        vec![lease],
        "unknown definition",
        now(),
        Some(&alert),
    )
    .await
    .ok()
    .unwrap();
    assert_eq!(parked, [id]);
    let row = f.history(id).await.unwrap();
    assert_eq!(row.status, Status::Parked);
    assert!(row.errors.contains("parked: unknown definition"));
    assert_eq!(f.counts().await, (1, 1), "one alert notice");
    f
});

conformance!(a_stale_lease_parks_nothing, |f: Fixture| async move {
    let id = f.notice().await;
    let (stale, current) = f.stale_and_current(id).await;
    let before = f.live(id).await.unwrap();
    let alert = f.row(None, Due::Now);
    let parked = batch::park_many(
        &f.store,
        vec![stale],
        "unknown definition",
        now(),
        Some(&alert),
    )
    .await
    .ok()
    .unwrap();
    assert!(parked.is_empty());
    f.unchanged(id, &before).await;
    assert_eq!(f.counts().await, (1, 0), "an alert was queued");
    current.forget();
    f
});

// An unreadable row is parked by a statement whose text other parks
// share, guarded by its version: PostgreSQL caches prepared statements by
// their text, so the version must be bound as they bind it (INT4), or a
// connection that prepared theirs first refuses this one ("incorrect
// binary data format in bind parameter").
conformance!(
    an_unreadable_row_parks_after_a_guarded_park_on_the_connection,
    |f: Fixture| async move {
        use sea_orm::{TransactionTrait, sea_query::Expr};

        use crate::{
            entity::{notify_msg::Column, read::Unreadable},
            state::columns::{self, Table},
        };
        let id = f.notice().await;
        let version = f.live(id).await.unwrap().version;
        let txn = f.store.db.begin().await.unwrap();
        // The statement of another park, first on this connection (it
        // matches no row).
        let sets = vec![
            (Column::Leased, Expr::val(false)),
            (Column::Status, Expr::val(Status::Parked as i16)),
            (Column::Errors, Expr::val(String::new())),
        ];
        let none = columns::move_rows(
            &txn,
            Table::Live,
            Table::History,
            columns::at_version(id + 1_000_000, version),
            sets,
        )
        .await
        .unwrap();
        assert!(none.is_empty());
        let row = Unreadable {
            id,
            version: Some(i64::from(version)),
            def_id: None,
            errors: None,
            ordering_key: None,
            cells: Vec::new(),
        };
        let parked = batch::park_unreadable_in(&txn, &[row], now())
            .await
            .unwrap();
        txn.commit().await.unwrap();
        assert_eq!(parked, [id]);
        assert_eq!(f.history(id).await.unwrap().status, Status::Parked);
        f
    }
);
