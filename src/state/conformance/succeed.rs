//! Succeed: a delivered notice moves to history as succeeded, alone or in
//! a sweep's batch; a late completion never overwrites a row another
//! worker claimed since (river #1302), and a stale lease in a batch is
//! reported lost while the others move.

use super::{Fixture, conformance, lost_of};
use crate::{state::batch, status::Status};

conformance!(moves_a_success_to_history, |f: Fixture| async move {
    let id = f.notice().await;
    let lease = f.claim(id).await;
    assert_eq!(
        lease.succeed(Some("shipped"), &[]).await.unwrap(),
        Ok(vec![])
    );
    assert!(f.live(id).await.is_none());
    let done = f.history(id).await.unwrap();
    assert_eq!((done.status, done.leased), (Status::Succeeded, false));
    assert_eq!(done.description, "shipped");
    f
});

conformance!(
    a_late_completion_never_overwrites_a_row_another_worker_claimed,
    |f: Fixture| async move {
        let id = f.notice().await;
        let (stale, current) = f.stale_and_current(id).await;
        let before = f.live(id).await.unwrap();
        let lost = lost_of(&stale);
        assert_eq!(stale.succeed(Some("late"), &[]).await.unwrap(), Err(lost));
        f.unchanged(id, &before).await;
        // The current claim still finishes it, once.
        assert_eq!(current.succeed(None, &[]).await.unwrap(), Ok(vec![]));
        assert_eq!(f.counts().await, (0, 1));
        assert_eq!(f.history(id).await.unwrap().description, "");
        f
    }
);

conformance!(
    a_batch_moves_what_it_holds_and_reports_the_rest_lost,
    |f: Fixture| async move {
        let (a, b) = (f.notice().await, f.notice().await);
        let (stale, current) = f.stale_and_current(a).await;
        let held = f.claim(b).await;
        let before = f.live(a).await.unwrap();
        let lost = lost_of(&stale);
        let (written, claimed) = batch::succeed_many(&f.store, vec![stale, held], None)
            .await
            .ok()
            .unwrap();
        assert_eq!(written, [Err(lost), Ok(b)]);
        assert_eq!(claimed.len(), 0);
        f.unchanged(a, &before).await;
        assert_eq!(f.history(b).await.unwrap().status, Status::Succeeded);
        current.forget();
        f
    }
);

conformance!(
    a_cancelled_notice_is_not_completed,
    |f: Fixture| async move {
        let id = f.notice().await;
        let lease = f.claim(id).await;
        let row = f.live(id).await.unwrap();
        let seen = crate::state::operator::Seen {
            id,
            version: row.version,
            errors: row.errors.clone(),
        };
        let at = chrono::Utc::now().naive_utc();
        let cancelled = crate::state::operator::cancel(&f.store, &[seen], "cancelled by ops", at)
            .await
            .unwrap();
        assert_eq!(cancelled, [id]);
        let before = f.history(id).await.unwrap();
        let lost = lost_of(&lease);
        assert_eq!(lease.succeed(None, &[]).await.unwrap(), Err(lost));
        assert_eq!(f.history(id).await.unwrap(), before);
        assert_eq!(before.status, Status::Cancelled);
        f
    }
);
