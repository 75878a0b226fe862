//! Bulk requeue and cancel: counts, audit lines, rows changed meanwhile
//! skipped, ten thousand at once beside a worker, never beside a running
//! attempt.

use std::{sync::Arc, time::Duration};

use solid_notify::{
    Config, Outcome, Status, WorkerConfig,
    ops::{Audit, BulkAction, NoticeFilter, Page, Place, find},
};

use super::{cancelled, filter_def};
use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

db_test!(
    bulk_requeue_and_cancel_count_audit_and_skip_changed_rows,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.def("other", "ship", |_| {}).await;
        db.insert_due("ship", 30, |_| 0).await;
        db.insert_due("other", 4, |_| 0).await;

        // Dry run: counted and listed, nothing changed.
        let mut action = BulkAction::new(filter_def("ship"), Audit::new("alice", "receiver down"));
        action.dry_run = true;
        action.batch_size = 7;
        let dry = notifier.cancel_where(&action).await.unwrap();
        assert_eq!((dry.matched, dry.changed, dry.skipped), (30, 0, 0));
        assert_eq!(dry.first_ids.len(), 10);
        assert_eq!(db.counts().await, (34, 0));

        action.dry_run = false;
        let done = notifier.cancel_where(&action).await.unwrap();
        assert_eq!((done.matched, done.changed, done.skipped), (30, 30, 0));
        assert_eq!(db.counts().await, (4, 30));
        for row in db.history().await {
            assert_eq!(row.status, Status::Cancelled);
            assert!(
                row.errors.ends_with("cancelled by alice: receiver down"),
                "{}",
                row.errors
            );
        }

        // Requeue, in batches; then the worker path delivers each exactly once.
        let mut requeue = BulkAction::new(
            NoticeFilter {
                status: Some(Status::Cancelled),
                ..filter_def("ship")
            },
            Audit::new("bob", "fixed"),
        );
        requeue.batch_size = 8;
        requeue.dry_run = true;
        assert_eq!(notifier.requeue_where(&requeue).await.unwrap().matched, 30);
        requeue.dry_run = false;
        let back = notifier.requeue_where(&requeue).await.unwrap();
        assert_eq!((back.matched, back.changed, back.skipped), (30, 30, 0));
        for row in db
            .live()
            .await
            .iter()
            .filter(|r| r.errors.contains("alice"))
        {
            assert_eq!((row.status, row.retry_times), (Status::NotSent, 0));
            assert!(
                row.errors.ends_with("requeued by bob: fixed"),
                "{}",
                row.errors
            );
        }
        db.attempt_due(&notifier).await;
        assert_eq!(rec.count(), 34);
        assert_eq!(db.counts().await, (0, 34));

        // Version check: rows seen, then changed by someone else, are skipped.
        let other = db.notifier().config(quiet()).build().unwrap();
        db.insert_due("other", 3, |_| 0).await;
        let seen = find::list(
            &db.db,
            Place::InFlight,
            &filter_def("other"),
            Page::default(),
        )
        .await
        .unwrap();
        assert_eq!(seen.len(), 3);
        other.cancel(seen[0].id, &Audit::operator()).await.unwrap();
        let stale = notifier
            .cancel_seen(&seen, &Audit::new("carol", "stale view"))
            .await
            .unwrap();
        assert_eq!((stale.matched, stale.changed, stale.skipped), (3, 2, 1));
        let history = find::list(
            &db.db,
            Place::History,
            &filter_def("other"),
            Page::default(),
        )
        .await
        .unwrap();
        let cancelled: Vec<_> = history
            .iter()
            .filter(|v| v.status == Status::Cancelled)
            .collect();
        assert_eq!(cancelled.len(), 3);
        assert_eq!(
            history
                .iter()
                .filter(|v| v.errors.iter().any(|l| l.contains("carol")))
                .count(),
            2
        );
        let requeued = notifier
            .requeue_seen(&history, &Audit::new("dave", "again"))
            .await
            .unwrap();
        // 4 delivered (not requeueable) and 3 cancelled: only these go back.
        assert_eq!((requeued.matched, requeued.changed), (7, 3));
        let again = notifier
            .requeue_seen(&history, &Audit::new("dave", "twice"))
            .await
            .unwrap();
        assert_eq!((again.changed, again.skipped), (0, 7));

        // Refusals.
        let wrong = BulkAction::new(
            NoticeFilter {
                status: Some(Status::Succeeded),
                ..NoticeFilter::default()
            },
            Audit::new("x", "y"),
        );
        // A filter that can match nothing requeueable: a client error
        // naming the status (never "notice 0 is succeeded").
        let refused = notifier.requeue_where(&wrong).await.map_err(|e| e.error);
        assert!(
            matches!(&refused, Err(solid_notify::Error::Config(m)) if m.contains("succeeded")),
            "{refused:?}"
        );
        let unknown = BulkAction::new(filter_def("nope"), Audit::new("x", "y"));
        assert!(matches!(
            notifier.cancel_where(&unknown).await.map_err(|e| e.error),
            Err(solid_notify::Error::UnknownDef(_))
        ));
    }
);

db_test!(
    bulk_requeue_of_ten_thousand_while_a_worker_drains,
    |db: Arc<TestDb>| async move {
        const N: usize = 10_000;
        let (notifier, rec) = db.shipping().await;
        cancelled(&db, &notifier, "ship", N).await;
        let running = start(
            notifier.clone(),
            fast(WorkerConfig {
                ..WorkerConfig::default()
            }),
        );
        let mut action = BulkAction::new(filter_def("ship"), Audit::new("ops", "replay"));
        action.batch_size = 500;
        let report = notifier.requeue_where(&action).await.unwrap();
        assert_eq!(report.matched, N as u64);
        assert_eq!(report.changed + report.skipped, N as u64);
        assert_eq!(report.changed, N as u64, "nothing else touched these rows");
        eventually(120, "every requeued notice delivered", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        running.stop().await;
        let calls = rec.calls();
        let unique: std::collections::HashSet<i64> = calls.iter().map(|n| n.id).collect();
        assert_eq!((calls.len(), unique.len()), (N, N), "each delivered once");
        let history = db.history().await;
        assert!(
            history
                .iter()
                .all(|r| r.status == Status::Succeeded
                    && r.errors.contains("requeued by ops: replay"))
        );
    }
);

db_test!(
    a_bulk_cancel_then_requeue_never_overlaps_the_running_attempts,
    |db: Arc<TestDb>| async move {
        use std::{sync::Mutex, time::Instant};
        db.def("slow", "slow", |_| {}).await;
        // (id, start, end) of every delivery.
        let spans: Arc<Mutex<Vec<(i64, Instant, Instant)>>> = Arc::default();
        let seen = spans.clone();
        let notifier = db
            .notifier()
            .config(Config {
                lease: Duration::from_secs(4),
                attempt_timeout: Duration::from_secs(2),
                ..quiet()
            })
            .handler("slow", move |n: solid_notify::Notice| {
                let seen = seen.clone();
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    seen.lock().unwrap().push((n.id, start, Instant::now()));
                    Ok(Outcome::success())
                }
            })
            .build()
            .unwrap();
        db.insert_due("slow", 4, |_| 0).await;
        let running = start(
            notifier.clone(),
            fast(WorkerConfig {
                ..WorkerConfig::default()
            }),
        );
        eventually(10, "four attempts running", || async {
            let live = db.live().await;
            (live.len() == 4 && live.iter().all(|r| r.leased)).then_some(())
        })
        .await;
        // Mid-attempt: cancel all four, then requeue all four, in bulk.
        let ops = db.notifier().config(quiet()).build().unwrap();
        let cancel = ops
            .cancel_where(&BulkAction::new(
                filter_def("slow"),
                Audit::new("op", "oops"),
            ))
            .await
            .unwrap();
        assert_eq!(cancel.changed, 4);
        let requeue = ops
            .requeue_where(&BulkAction::new(
                filter_def("slow"),
                Audit::new("op", "undo"),
            ))
            .await
            .unwrap();
        assert_eq!(requeue.changed, 4);
        // Back in flight but still held by the running attempts' leases.
        let live = db.live().await;
        assert_eq!(live.len(), 4);
        assert!(
            live.iter().all(|r| r.leased && r.retry_times == 0),
            "{live:?}"
        );
        eventually(30, "all four delivered again and finished", || async {
            let (live, done) = db.counts().await;
            (live == 0 && done == 4).then_some(())
        })
        .await;
        running.stop().await;
        let spans = spans.lock().unwrap().clone();
        for id in db.history().await.iter().map(|r| r.id) {
            let mut mine: Vec<_> = spans.iter().filter(|s| s.0 == id).collect();
            assert_eq!(mine.len(), 2, "the lost first attempt and the requeued one");
            mine.sort_by_key(|s| s.1);
            assert!(mine[0].2 <= mine[1].1, "overlap on notice {id}");
        }
    }
);
