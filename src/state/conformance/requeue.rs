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
        follow: Vec::new(),
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
    let (done, _) = operator::requeue(&f.store, &[seen], "requeued by ops", now(), None)
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
        let (done, _) = operator::requeue(&f.store, &[stale], "requeued by ops", now(), None)
            .await
            .unwrap();
        assert!(done.is_empty());
        assert_eq!(f.history(row.id).await.unwrap(), row);
        assert!(f.live(row.id).await.is_none());
        f
    }
);

/// Rows in flight that report a release (as the test's `on_release` writes
/// them).
async fn released(f: &Fixture) -> i64 {
    f.scalar("SELECT COUNT(*) FROM notify_msg WHERE description LIKE 'released %'")
        .await
}

conformance!(
    a_key_is_released_only_when_nothing_holds_it_any_more,
    |f: Fixture| async move {
        let mut failed = Vec::new();
        for _ in 0..3 {
            let id = f.keyed("k").await;
            let lease = f.claim(id).await;
            let fail = Final {
                errors: "refused".into(),
                retry_times: 1,
                follow: Vec::new(),
            };
            lease.fail_for_good(&fail).await.unwrap().unwrap();
            failed.push(f.history(id).await.unwrap());
        }
        let def_id = f.def_id;
        let template = f.row(None, crate::state::clock::Due::Now);
        let on_release = move |def: i64, key: &str| {
            (def == def_id).then(|| crate::state::insert::NewRow {
                description: format!("released {key}"),
                ..template.clone()
            })
        };
        let seen = |row: &crate::entity::notify_msg_history::Model| Seen {
            id: row.id,
            version: row.version,
            errors: row.errors.clone(),
        };
        // Two of three: the third still holds the key.
        let (done, events) = operator::requeue(
            &f.store,
            &[seen(&failed[0]), seen(&failed[1])],
            "requeued by ops",
            now(),
            Some(&on_release),
        )
        .await
        .unwrap();
        assert_eq!((done.len(), events), (2, 0));
        assert_eq!(released(&f).await, 0);
        // A stale read changes nothing and reports nothing.
        let stale = Seen {
            version: failed[2].version - 1,
            ..seen(&failed[2])
        };
        let (done, events) = operator::cancel_finished(
            &f.store,
            &[stale],
            "cancelled by ops",
            now(),
            Some(&on_release),
        )
        .await
        .unwrap();
        assert_eq!((done.len(), events), (0, 0));
        // The last one: released, once, in the same transaction.
        let (done, events) = operator::cancel_finished(
            &f.store,
            &[seen(&failed[2])],
            "cancelled by ops",
            now(),
            Some(&on_release),
        )
        .await
        .unwrap();
        assert_eq!((done, events), (vec![failed[2].id], 1));
        assert_eq!(released(&f).await, 1);
        f
    }
);
