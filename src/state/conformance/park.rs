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
