//! Run claims (PostgreSQL): a batch of successes claims the next notice of
//! each key it moves, with the run behind it; a stale success claims
//! nothing; a run stops before a final failure of its key; a queued member
//! cancelled meanwhile is not completed.

use super::{Fixture, conformance, lost_of, on_postgres};
use crate::{
    state::{
        Final, Lease,
        batch::{self, ClaimNext},
        operator::{self, Seen},
    },
    status::Status,
};

/// Ordered `c` and `n` notices of key `k`, oldest first.
async fn key(f: &Fixture, n: usize) -> Vec<i64> {
    f.exec("UPDATE notify_def SET ordering = 'per_key'").await;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(f.keyed("k").await);
    }
    ids
}

/// The batch of successes of `leases`, claiming what follows them.
async fn succeed(
    f: &Fixture,
    leases: Vec<Lease>,
) -> (Vec<crate::state::Written<i64>>, batch::Claims) {
    batch::succeed_many(&f.store, leases, Some((&ClaimNext::default(), &[])))
        .await
        .ok()
        .unwrap()
}

fn now() -> chrono::NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

conformance!(
    a_success_claims_the_run_behind_it,
    |f: Fixture| async move {
        if !on_postgres(&f) {
            return f;
        }
        let ids = key(&f, 4).await;
        let first = f.claim(ids[0]).await;
        let (written, claims) = succeed(&f, vec![first]).await;
        assert_eq!(written, [Ok(ids[0])]);
        let runs: Vec<Vec<i64>> = claims
            .runs
            .iter()
            .map(|run| run.iter().map(Lease::id).collect())
            .collect();
        assert_eq!(runs, [ids[1..].to_vec()]);
        for id in &ids[1..] {
            let row = f.live(*id).await.unwrap();
            assert!(row.leased);
            assert_eq!(row.version, 1);
        }
        for lease in claims.runs.into_iter().flatten() {
            lease.forget();
        }
        f
    }
);

conformance!(a_stale_success_claims_nothing, |f: Fixture| async move {
    if !on_postgres(&f) {
        return f;
    }
    let ids = key(&f, 3).await;
    let (stale, current) = f.stale_and_current(ids[0]).await;
    let before: Vec<_> = {
        let mut rows = Vec::new();
        for id in &ids {
            rows.push(f.live(*id).await.unwrap());
        }
        rows
    };
    let lost = lost_of(&stale);
    let (written, claims) = succeed(&f, vec![stale]).await;
    assert_eq!(written, [Err(lost)]);
    assert_eq!(claims.len(), 0);
    for (id, row) in ids.iter().zip(&before) {
        f.unchanged(*id, row).await;
    }
    current.forget();
    f
});

conformance!(
    a_run_stops_before_a_final_failure_of_its_key,
    |f: Fixture| async move {
        if !on_postgres(&f) {
            return f;
        }
        let ids = key(&f, 4).await;
        // 0 and 1 cancelled, 2 fails for good, 0 and 1 requeued.
        for id in &ids[..2] {
            let row = f.live(*id).await.unwrap();
            let seen = Seen {
                id: *id,
                version: row.version,
                errors: row.errors,
            };
            operator::cancel(&f.store, &[seen], "cancelled", now())
                .await
                .unwrap();
        }
        let third = f.claim(ids[2]).await;
        let fail = Final {
            errors: "refused".into(),
            retry_times: 1,
            follow: Vec::new(),
        };
        third.fail_for_good(&fail).await.unwrap().unwrap();
        for id in &ids[..2] {
            let row = f.history(*id).await.unwrap();
            let seen = Seen {
                id: *id,
                version: row.version,
                errors: row.errors,
            };
            operator::requeue(&f.store, &[seen], "requeued", now(), None)
                .await
                .unwrap();
        }
        let first = f.claim(ids[0]).await;
        let (_, claims) = succeed(&f, vec![first]).await;
        let claimed: Vec<i64> = claims.runs.iter().flatten().map(Lease::id).collect();
        assert_eq!(claimed, [ids[1]], "the run passed the final failure");
        let last = f.live(ids[3]).await.unwrap();
        assert!(!last.leased);
        for lease in claims.runs.into_iter().flatten() {
            lease.forget();
        }
        f
    }
);

conformance!(
    a_queued_member_cancelled_meanwhile_is_not_completed,
    |f: Fixture| async move {
        if !on_postgres(&f) {
            return f;
        }
        let ids = key(&f, 3).await;
        let first = f.claim(ids[0]).await;
        let (_, claims) = succeed(&f, vec![first]).await;
        let mut run = claims.runs.into_iter().next().unwrap();
        let queued = run.pop().unwrap();
        assert_eq!(queued.id(), ids[2]);
        let row = f.live(ids[2]).await.unwrap();
        let seen = Seen {
            id: ids[2],
            version: row.version,
            errors: row.errors,
        };
        operator::cancel(&f.store, &[seen], "cancelled", now())
            .await
            .unwrap();
        let before = f.history(ids[2]).await.unwrap();
        let lost = lost_of(&queued);
        let (written, _) = succeed(&f, vec![queued]).await;
        assert_eq!(written, [Err(lost)]);
        assert_eq!(f.history(ids[2]).await.unwrap(), before);
        assert_eq!(before.status, Status::Cancelled);
        for lease in run {
            lease.forget();
        }
        f
    }
);
