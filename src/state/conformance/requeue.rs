//! Requeue: a finished notice as read goes back in flight, due now, with a
//! fresh budget and an audit line; one that changed since it was read
//! stays where it is.

use super::{Fixture, conformance};
use crate::{
    state::{
        Final,
        operator::{self, Seen},
    },
    status::Status,
};

async fn failed(f: &Fixture) -> crate::entity::notify_msg_history::Model {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    let fail = Final {
        errors: "refused".into(),
        retry_times: 3,
        alert: None,
    };
    lease.fail_for_good(&fail).await.unwrap().unwrap();
    f.history(id).await.unwrap()
}

fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

conformance!(requeues_a_final_failure_as_read, |f: Fixture| async move {
    let row = failed(&f).await;
    let seen = Seen {
        id: row.id,
        version: row.version,
        errors: row.errors.clone(),
    };
    let done = operator::requeue(&f.store, &[seen], "requeued by ops", now())
        .await
        .unwrap();
    assert_eq!(done, [row.id]);
    let back = f.live(row.id).await.unwrap();
    assert_eq!(
        (back.status, back.retry_times, back.leased),
        (Status::NotSent, 0, false)
    );
    assert!(back.errors.ends_with("requeued by ops"));
    assert!(f.history(row.id).await.is_none());
    f
});

conformance!(
    does_not_requeue_a_notice_that_changed_since_it_was_read,
    |f: Fixture| async move {
        let row = failed(&f).await;
        let stale = Seen {
            id: row.id,
            version: row.version - 1,
            errors: row.errors.clone(),
        };
        let done = operator::requeue(&f.store, &[stale], "requeued by ops", now())
            .await
            .unwrap();
        assert!(done.is_empty());
        assert_eq!(f.history(row.id).await.unwrap(), row);
        assert!(f.live(row.id).await.is_none());
        f
    }
);
