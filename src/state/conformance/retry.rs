//! Retry: a failed attempt records its line, counts, and is due after its
//! wait, with its alert notice in the same transaction; a stale lease
//! records nothing and queues no alert.

use std::time::Duration;

use super::{Fixture, conformance, lost_of};
use crate::{
    state::{Retry, clock::Due},
    status::Status,
};

fn retry(f: &Fixture) -> Retry {
    Retry {
        errors: "attempt 1: refused".into(),
        retry_times: 1,
        delay: Duration::from_secs(3600),
        follow: vec![f.row(None, Due::Now)],
    }
}

conformance!(records_a_retry_and_its_alert, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    let scheduled = lease.retry(&retry(&f)).await.unwrap().unwrap();
    let [alert] = scheduled.follow[..] else {
        panic!("one alert notice, got {:?}", scheduled.follow)
    };
    let row = f.live(id).await.unwrap();
    assert_eq!(
        (row.status, row.retry_times, row.version, row.leased),
        (Status::Failed, 1, 2, false)
    );
    assert_eq!(row.errors, "attempt 1: refused");
    assert!(f.live(alert).await.is_some());
    f
});

conformance!(
    a_stale_lease_records_no_retry_and_no_alert,
    |f: Fixture| async move {
        let id = f.notice().await;
        let (stale, current) = f.stale_and_current(id).await;
        let before = f.live(id).await.unwrap();
        let lost = lost_of(&stale);
        assert_eq!(stale.retry(&retry(&f)).await.unwrap(), Err(lost));
        f.unchanged(id, &before).await;
        assert_eq!(f.counts().await, (1, 0), "an alert was queued");
        current.forget();
        f
    }
);
