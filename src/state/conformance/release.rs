//! Release: a claim given back is due again at once, uncharged; a stale
//! lease releases nothing, alone or in a sweep's batch.

use std::time::Duration;

use super::{Fixture, conformance, lost_of};
use crate::state::batch;

conformance!(releases_its_own_claim, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    assert_eq!(lease.release_for(Duration::ZERO).await.unwrap(), Ok(()));
    let row = f.live(id).await.unwrap();
    assert!(!row.leased);
    assert_eq!(
        (row.version, row.retry_times, row.errors.as_str()),
        (2, 0, "")
    );
    f
});

conformance!(
    does_not_release_a_row_another_worker_claimed,
    |f: Fixture| async move {
        let id = f.notice().await;
        let (stale, current) = f.stale_and_current(id).await;
        let before = f.live(id).await.unwrap();
        let lost = lost_of(&stale);
        assert_eq!(stale.release_for(Duration::ZERO).await.unwrap(), Err(lost));
        f.unchanged(id, &before).await;
        current.forget();
        f
    }
);

conformance!(
    a_batch_releases_only_the_rows_it_still_holds,
    |f: Fixture| async move {
        let (a, b) = (f.notice().await, f.notice().await);
        let (stale, current) = f.stale_and_current(a).await;
        let held = f.claim(b).await;
        let before = f.live(a).await.unwrap();
        let released = batch::release_many(&f.store, vec![stale, held])
            .await
            .ok()
            .unwrap();
        assert_eq!(released, 1);
        f.unchanged(a, &before).await;
        assert!(!f.live(b).await.unwrap().leased);
        current.forget();
        f
    }
);
