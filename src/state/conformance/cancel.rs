//! Cancel: an operator's cancel of a notice as read moves it to history
//! (status 5), keeping a live lease there; a cancel of a final failure
//! gives it up in place. A notice that changed since it was read is left
//! as it is and not reported changed.

use super::{Fixture, conformance};
use crate::{
    state::{
        Final,
        operator::{self, Seen},
    },
    status::Status,
};

fn seen(row: &crate::entity::notify_msg::Model) -> Seen {
    Seen {
        id: row.id,
        version: row.version,
        errors: row.errors.clone(),
    }
}

fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

conformance!(cancels_a_notice_as_read, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    let row = f.live(id).await.unwrap();
    let done = operator::cancel(&f.store, &[seen(&row)], "cancelled by ops", now())
        .await
        .unwrap();
    assert_eq!(done, [id]);
    let gone = f.history(id).await.unwrap();
    assert_eq!(gone.status, Status::Cancelled);
    assert!(
        gone.leased,
        "the running attempt's lease is kept in history"
    );
    assert!(gone.errors.ends_with("cancelled by ops"));
    lease.forget();
    f
});

conformance!(
    does_not_cancel_a_notice_that_changed_since_it_was_read,
    |f: Fixture| async move {
        let id = f.notice().await;
        let read = f.live(id).await.unwrap();
        let lease = f.claim(id).await;
        let before = f.live(id).await.unwrap();
        let done = operator::cancel(&f.store, &[seen(&read)], "cancelled by ops", now())
            .await
            .unwrap();
        assert!(done.is_empty());
        f.unchanged(id, &before).await;
        lease.forget();
        f
    }
);

conformance!(
    gives_up_a_final_failure_only_as_read,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        let fail = Final {
            errors: "refused".into(),
            retry_times: 1,
            follow: Vec::new(),
        };
        lease.fail_for_good(&fail).await.unwrap().unwrap();
        let failed = f.history(id).await.unwrap();
        let stale = Seen {
            id,
            version: failed.version - 1,
            errors: failed.errors.clone(),
        };
        let (done, _) =
            operator::cancel_finished(&f.store, &[stale], "cancelled by ops", now(), None)
                .await
                .unwrap();
        assert!(done.is_empty());
        assert_eq!(f.history(id).await.unwrap(), failed);
        let current = Seen {
            id,
            version: failed.version,
            errors: failed.errors.clone(),
        };
        let (done, _) =
            operator::cancel_finished(&f.store, &[current], "cancelled by ops", now(), None)
                .await
                .unwrap();
        assert_eq!(done, [id]);
        assert_eq!(f.history(id).await.unwrap().status, Status::Cancelled);
        f
    }
);
