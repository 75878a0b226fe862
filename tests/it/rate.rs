//! Rate limit: a definition's `rate_limit` holds across every worker.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
};

use solid_notify::{Outcome, Status, WorkerConfig};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

/// A delivered notice and when its handler ran.
type Call = (i64, chrono::DateTime<chrono::Utc>);

db_test!(a_rate_limit_holds_across_three_workers, |db: Arc<
    TestDb,
>| async move {
    const N: usize = 150;
    const LIMIT: usize = 20;
    db.def("throttled", "throttled", |s| {
        s.rate_limit = format!("{LIMIT}/s")
    })
    .await;
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let calls = calls.clone();
            let notifier = db
                .notifier()
                .config(quiet())
                .handler("throttled", move |n: solid_notify::Notice| {
                    let calls = calls.clone();
                    async move {
                        calls.lock().unwrap().push((n.id, chrono::Utc::now()));
                        Ok(Outcome::success())
                    }
                })
                .build()
                .unwrap();
            start(notifier, fast(WorkerConfig::default()))
        })
        .collect();
    db.insert_due("throttled", N, |_| 0).await;
    eventually(30, "every notice delivered", || async {
        (db.counts().await == (0, N as u64)).then_some(())
    })
    .await;
    for worker in workers {
        worker.stop().await;
    }
    let calls = calls.lock().unwrap().clone();
    let ids: HashSet<i64> = calls.iter().map(|c| c.0).collect();
    assert_eq!((calls.len(), ids.len()), (N, N), "each delivered once");
    // At most LIMIT tries start per aligned second, by the database's
    // clock (this machine's). The handler runs a moment after its try was
    // granted: the first window's tries, granted at any point of it, may
    // reach the handler in the next second, beside that window's own (the
    // documented tolerance: 2 x LIMIT within one period straddling a
    // boundary). Every later window's tries are granted as it begins (the
    // notices refused before are due then), so they land in their own
    // second, give or take a try granted just before a boundary.
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, at) in &calls {
        *per_second.entry(at.timestamp()).or_default() += 1;
    }
    let counts: Vec<usize> = per_second.values().copied().collect();
    assert!(
        counts.iter().take(2).all(|n| *n <= 2 * LIMIT)
            && counts.iter().skip(2).all(|n| *n <= LIMIT + 3),
        "calls per second: {per_second:?}"
    );
    let first = calls.iter().map(|c| c.1).min().unwrap();
    let last = calls.iter().map(|c| c.1).max().unwrap();
    // (Less a quarter second: the windows are the database's seconds, the
    // calls are timed by this process, a moment after their grant.)
    assert!(
        last - first >= chrono::Duration::milliseconds((N / LIMIT - 1) as i64 * 1000 - 250),
        "{N} at {LIMIT}/s took only {:?}",
        last - first
    );
    // Held back, never charged: no failure, no retry counted.
    let history = db.history().await;
    assert!(
        history
            .iter()
            .all(|r| r.status == Status::Succeeded && r.retry_times == 0 && r.errors.is_empty()),
        "{:?}",
        history
            .iter()
            .find(|r| r.retry_times != 0 || !r.errors.is_empty())
    );
});
