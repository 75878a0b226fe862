//! Fail for good: the notice moves to history as a final failure with its
//! alert notice in the same transaction; a stale lease moves nothing and
//! queues no alert.

use super::{Fixture, conformance, lost_of};
use crate::{
    state::{Final, clock::Due},
    status::Status,
};

fn final_failure(f: &Fixture) -> Final {
    Final {
        errors: "attempt 1: refused".into(),
        retry_times: 1,
        follow: vec![f.row(None, Due::Now)],
    }
}

conformance!(
    records_a_final_failure_and_its_alert,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        let queued = lease
            .fail_for_good(&final_failure(&f))
            .await
            .unwrap()
            .unwrap();
        let [alert] = queued[..] else {
            panic!("one alert notice, got {queued:?}")
        };
        let done = f.history(id).await.unwrap();
        assert_eq!((done.status, done.retry_times), (Status::FinalFailure, 1));
        assert!(f.live(alert).await.is_some());
        f
    }
);

conformance!(
    a_stale_lease_fails_nothing_and_queues_no_alert,
    |f: Fixture| async move {
        let id = f.notice().await;
        let (stale, current) = f.stale_and_current(id).await;
        let before = f.live(id).await.unwrap();
        let lost = lost_of(&stale);
        assert_eq!(
            stale.fail_for_good(&final_failure(&f)).await.unwrap(),
            Err(lost)
        );
        f.unchanged(id, &before).await;
        assert_eq!(f.counts().await, (1, 0), "an alert was queued");
        current.forget();
        f
    }
);
