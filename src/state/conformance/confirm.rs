//! Await confirmation, confirm, reject: a sent notice waits (status 4) until
//! its deadline; a confirmation of the row as read moves it to history; a
//! rejection claims it like any failure. From a stale lease or a stale read
//! none of them writes.

use std::time::Duration;

use super::{Fixture, conformance, lost_of};
use crate::{
    state::{Deadline, Lost, claim, confirm},
    status::Status,
};

conformance!(awaits_then_confirms, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    let until = Deadline::After(Duration::from_secs(3600));
    assert_eq!(
        lease.await_confirmation(until, None, &[]).await.unwrap(),
        Ok(vec![])
    );
    let waiting = f.live(id).await.unwrap();
    assert_eq!(
        (waiting.status, waiting.leased),
        (Status::AwaitingConfirm, false)
    );
    assert_eq!(confirm::confirm(&f.store, &waiting).await.unwrap(), Ok(()));
    assert_eq!(f.history(id).await.unwrap().status, Status::Succeeded);
    f
});

conformance!(a_stale_lease_does_not_await, |f: Fixture| async move {
    let id = f.notice().await;
    let (stale, current) = f.stale_and_current(id).await;
    let before = f.live(id).await.unwrap();
    let lost = lost_of(&stale);
    let until = Deadline::Forever;
    assert_eq!(
        stale.await_confirmation(until, None, &[]).await.unwrap(),
        Err(lost)
    );
    f.unchanged(id, &before).await;
    current.forget();
    f
});

conformance!(
    a_confirmation_of_a_row_claimed_again_since_is_lost,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        let until = Deadline::After(Duration::from_secs(3600));
        lease
            .await_confirmation(until, None, &[])
            .await
            .unwrap()
            .unwrap();
        let read = f.live(id).await.unwrap();
        // Its deadline passes and a sweeper claims it to resend.
        f.expire(id).await;
        let resend = f.claim(id).await;
        let before = f.live(id).await.unwrap();
        assert_eq!(
            confirm::confirm(&f.store, &read).await.unwrap(),
            Err(Lost {
                id,
                version: read.version
            })
        );
        f.unchanged(id, &before).await;
        // A rejection of the row as read is a claim: lost too.
        assert!(claim::claim_one(&f.store, &read).await.unwrap().is_none());
        f.unchanged(id, &before).await;
        resend.forget();
        f
    }
);

conformance!(
    a_rejection_claims_the_awaiting_row,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        lease
            .await_confirmation(Deadline::Forever, None, &[])
            .await
            .unwrap()
            .unwrap();
        let waiting = f.live(id).await.unwrap();
        let rejected = claim::claim_one(&f.store, &waiting)
            .await
            .unwrap()
            .expect("an awaiting row is claimed to record its rejection");
        assert_eq!(rejected.version(), waiting.version + 1);
        rejected.forget();
        f
    }
);
