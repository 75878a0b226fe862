//! Runs: a sweep kept going by a key's chain of notices still claims
//! others; retries, older notices, shutdown, cancels, final failures and
//! purges inside a run keep the order.

use solid_notify::ops::Audit;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{NewNotice, Notice, Notifier, Outcome, Status, WorkerConfig};

use super::{Shared, assert_in_turn, per_key, recording, succeeding};
use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

db_test!(
    a_sweep_kept_going_by_a_keys_chain_still_claims_other_due_notices,
    |db: Arc<TestDb>| async move {
        // One key's 80 notices, 40 ms each, keep a sweep going for over
        // three seconds (on PostgreSQL its batch claims each next notice);
        // meanwhile an unordered notice's retry falls due after 1 s. Polls
        // are 30 s apart and, on PostgreSQL, wake-ups are off (the `NOTIFY`
        // of each finish would wake it): the sweep must claim again by
        // itself, not after the key is drained. (Elsewhere a key moves on
        // by in-process wake-ups, which stay on.)
        const N: i64 = 80;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        db.def("plain", "plain", |s| s.retry_interval = "1s".into())
            .await;
        let seen: Shared = Arc::default();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let notifier = {
            let calls = calls.clone();
            db.notifier()
                .config(quiet())
                .handler(
                    "ordered",
                    recording(seen.clone(), |_, _| Outcome::success()),
                )
                .handler("plain", move |_n: Notice| {
                    let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                    Box::pin(async move {
                        Ok(if first {
                            Outcome::retry("not yet")
                        } else {
                            Outcome::success()
                        })
                    }) as futures::future::BoxFuture<'static, _>
                })
                .build()
                .unwrap()
        };
        let tx = notifier.begin().await.unwrap();
        tx.add(NewNotice::new("plain", &json!({}))).await.unwrap();
        for seq in 0..N {
            tx.add(NewNotice::new("ordered", &json!({ "seq": seq, "ms": 40 })).ordering_key("k"))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let worker = start(
            notifier,
            WorkerConfig {
                delay: Duration::from_secs(30),
                wake: db.backend != crate::support::Backend::Postgres,
                ..fast(WorkerConfig::default())
            },
        );
        let succeeded = "SELECT COUNT(*) FROM notify_msg_history h JOIN notify_def d \
                         ON d.id = h.def_id WHERE d.name = 'plain' AND h.status = 1";
        eventually(20, "the retry sent", || async {
            (db.scalar(succeeded).await == 1).then_some(())
        })
        .await;
        let left = seen.lock().unwrap().calls.len() as i64;
        assert!(
            left < N,
            "the retry due after 1 s waited for the key's {N} notices to drain"
        );
        // (The bound is not the property: the retry's turn above is.)
        eventually(60, "the key drained", || async {
            (db.counts().await == (0, N as u64 + 1)).then_some(())
        })
        .await;
        worker.stop().await;
        assert_in_turn("k", &per_key(&seen)["k"], N);
    }
);

/// Notice `seq` of key `key`, whose call takes `ms` milliseconds.
fn ordered_taking(key: &str, seq: i64, ms: u64) -> NewNotice {
    NewNotice::new("ordered", &json!({ "seq": seq, "ms": ms })).ordering_key(key)
}

/// Adds notices 0..`n` of key `key`, each call taking `ms`, in one
/// transaction; returns their ids.
async fn add_key(notifier: &Notifier, key: &str, n: i64, ms: u64) -> Vec<i64> {
    let tx = notifier.begin().await.unwrap();
    let mut ids = Vec::new();
    for seq in 0..n {
        ids.push(tx.add(ordered_taking(key, seq, ms)).await.unwrap());
    }
    tx.commit().await.unwrap();
    ids
}

/// Quiet notifiers with a lease of 60 s: a notice left leased by mistake
/// would hold its key far longer than these tests wait.
fn long_lease() -> solid_notify::Config {
    solid_notify::Config {
        lease: Duration::from_secs(60),
        ..quiet()
    }
}

db_test!(
    a_retry_inside_a_run_goes_first_without_waiting_for_the_leases_behind_it,
    |db: Arc<TestDb>| async move {
        // On PostgreSQL the batch of successes claims key `k` in runs of up
        // to 16, leased behind the notice being sent; 5 and 21 fail once
        // each, inside a run. Key `busy` keeps the sweep going all along
        // (a sweep that ends releases whatever it still holds).
        const N: i64 = 40;
        db.def("ordered", "ordered", |s| {
            s.ordering = "per_key".into();
            s.retry_interval = "1s".into();
            s.max_retry_times = 5;
        })
        .await;
        let seen: Shared = Arc::default();
        let failed = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let handler = recording(seen.clone(), move |n, seq| {
            let k = n.ordering_key.as_deref() == Some("k");
            if k && (seq == 5 || seq == 21) && failed.lock().unwrap().insert(seq) {
                Outcome::retry("once")
            } else {
                Outcome::success()
            }
        });
        let notifier = db
            .notifier()
            .config(long_lease())
            .handler("ordered", handler)
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        for seq in 0..N {
            tx.add(ordered_taking("k", seq, 1)).await.unwrap();
        }
        for seq in 0..100 {
            tx.add(ordered_taking("busy", seq, 200)).await.unwrap();
        }
        tx.commit().await.unwrap();
        let worker = start(notifier, fast(WorkerConfig::default()));
        // Each retry is due a second after its failure; had the notices
        // claimed behind it kept their leases, it would wait for them (a
        // minute) or for the sweep's end (`busy` takes 20 s).
        // The bound is the property on PostgreSQL, whose runs it tests.
        // Elsewhere there are no runs, and under 45 s still tells a retry
        // that waited for a lease of a minute.
        let bound = match db.backend {
            crate::support::Backend::Postgres => 12,
            _ => 45,
        };
        eventually(bound, "key k delivered, its retries on time", || async {
            let calls = per_key(&seen);
            let k = calls
                .get("k")
                .map_or(0, |c| c.iter().filter(|(_, ok)| *ok).count());
            (k == N as usize).then_some(())
        })
        .await;
        worker.stop().await;
        let calls = per_key(&seen);
        assert_in_turn("k", &calls["k"], N);
        assert_eq!(calls["k"].len() as i64, N + 2, "{:?}", calls["k"]);
        assert_eq!(seen.lock().unwrap().overlaps, 0);
    }
);

db_test!(
    a_notice_dated_before_those_in_flight_never_goes_beside_them,
    |db: Arc<TestDb>| async move {
        const N: i64 = 40;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen)();
        add_key(&notifier, "k", N, 20).await;
        let worker = start(notifier, fast(WorkerConfig::default()));
        eventually(10, "the key under way", || async {
            (seen.lock().unwrap().calls.len() >= 3).then_some(())
        })
        .await;
        // A plain-SQL producer's notice of the key, dated before every
        // other (its transaction committed late): it is the oldest now, but
        // must not be sent while any of the others is, claimed as they are
        // (on PostgreSQL in runs, of which only the first and the last
        // hold the key).
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ordered'")
            .await;
        let leased = if db.backend == crate::support::Backend::Postgres {
            "false"
        } else {
            "0"
        };
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, description, errors, status, retry_times, \
                 next_call_time, create_time, version, load_balance_num, leased, ordering_key) \
                 VALUES ({def_id}, '{{\"seq\":1000,\"ms\":20}}', '', '', 0, 0, {now}, \
                 '2000-01-01 00:00:00', 0, 0, {leased}, 'k')",
                now = db.now_sql(),
            ))
            .await
            .unwrap();
        eventually(30, "every notice delivered", || async {
            (db.counts().await == (0, N as u64 + 1)).then_some(())
        })
        .await;
        worker.stop().await;
        let calls = per_key(&seen);
        let mut sent: Vec<i64> = calls["k"].iter().map(|(seq, _)| *seq).collect();
        sent.sort();
        let mut expected: Vec<i64> = (0..N).collect();
        expected.push(1000);
        assert_eq!(sent, expected, "each notice sent once");
        assert_eq!(
            seen.lock().unwrap().overlaps,
            0,
            "two calls of one key at once"
        );
    }
);

db_test!(
    shutting_down_inside_runs_releases_every_notice_held,
    |db: Arc<TestDb>| async move {
        const KEYS: usize = 10;
        const PER_KEY: i64 = 30;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = || {
            db.notifier()
                .config(long_lease())
                .handler(
                    "ordered",
                    recording(seen.clone(), |_, _| Outcome::success()),
                )
                .build()
                .unwrap()
        };
        let producer = notifier();
        let tx = producer.begin().await.unwrap();
        for seq in 0..PER_KEY {
            for key in 0..KEYS {
                tx.add(ordered_taking(&format!("k{key}"), seq, 5))
                    .await
                    .unwrap();
            }
        }
        tx.commit().await.unwrap();
        let worker = start(notifier(), fast(WorkerConfig::default()));
        eventually(10, "the keys under way", || async {
            (seen.lock().unwrap().calls.len() >= 3 * KEYS).then_some(())
        })
        .await;
        worker.stop().await;
        // Whatever the worker held (being sent, queued behind it, claimed
        // by its last writes) was released as it stopped: nothing waits
        // for a lease to run out.
        assert_eq!(
            db.scalar("SELECT COUNT(*) FROM notify_msg WHERE leased")
                .await,
            0,
            "notices left leased after shutdown"
        );
        let total = (KEYS as u64) * PER_KEY as u64;
        let done = db.counts().await.1;
        assert!(done < total, "shut down before the end: {done} of {total}");
        let worker = start(notifier(), fast(WorkerConfig::default()));
        eventually(20, "a second worker finishes every key", || async {
            (db.counts().await == (0, total)).then_some(())
        })
        .await;
        worker.stop().await;
        for (key, calls) in per_key(&seen) {
            assert_in_turn(&key, &calls, PER_KEY);
        }
        assert_eq!(seen.lock().unwrap().overlaps, 0);
    }
);

db_test!(
    a_notice_cancelled_while_queued_behind_another_of_its_key_breaks_no_order,
    |db: Arc<TestDb>| async move {
        const N: i64 = 40;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen)();
        let ids = add_key(&notifier, "k", N, 30).await;
        let worker = start(notifier.clone(), fast(WorkerConfig::default()));
        // Under way: on PostgreSQL notice 12 is then claimed already, in a
        // run, queued behind the one being sent.
        eventually(10, "the key under way", || async {
            (seen.lock().unwrap().calls.len() >= 3).then_some(())
        })
        .await;
        notifier.cancel(ids[12], &Audit::operator()).await.unwrap();
        // Every other notice is delivered (after the run's lease at worst).
        eventually(40, "every notice finished", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        worker.stop().await;
        assert_eq!(
            db.history_of(ids[12]).await.unwrap().status,
            Status::Cancelled,
            "the cancel stands, whether or not a claimed attempt ran"
        );
        // The others went once each, in order, one at a time; the
        // cancelled one at most once, in its place.
        let calls = per_key(&seen);
        let rest: Vec<(i64, bool)> = calls["k"]
            .iter()
            .filter(|(seq, _)| *seq != 12)
            .map(|&(seq, ok)| (if seq > 12 { seq - 1 } else { seq }, ok))
            .collect();
        assert_in_turn("k", &rest, N - 1);
        let order: Vec<i64> = calls["k"].iter().map(|(seq, _)| *seq).collect();
        if let Some(at) = order.iter().position(|seq| *seq == 12) {
            assert_eq!(
                order.iter().filter(|seq| **seq == 12).count(),
                1,
                "{order:?}"
            );
            assert!(order[..at].iter().all(|seq| *seq < 12), "{order:?}");
            assert!(order[at + 1..].iter().all(|seq| *seq > 12), "{order:?}");
        }
        assert_eq!(seen.lock().unwrap().overlaps, 0);
    }
);

/// Asserts, for `secs`, that notice `seq` of key `key` is never called.
async fn never_called(seen: &Shared, key: &str, seq: i64, secs: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        let calls = per_key(seen);
        assert!(
            !calls
                .get(key)
                .is_some_and(|c| c.iter().any(|(s, _)| *s == seq)),
            "notice {seq} of key {key} was sent: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

db_test!(a_run_never_passes_a_final_failure_of_its_key, |db: Arc<
    TestDb,
>| async move {
    // Key k: a < b < c < d. a and b are cancelled, c fails for good and
    // holds d (stop_on_failure, the default). a and b are requeued: on
    // PostgreSQL a's success claims b with a run behind it, which must
    // stop before d.
    db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
        .await;
    let seen: Shared = Arc::default();
    let handler = recording(seen.clone(), |_, seq| {
        if seq == 2 {
            Outcome::permanent("refused")
        } else {
            Outcome::success()
        }
    });
    let notifier = db
        .notifier()
        .config(long_lease())
        .handler("ordered", handler)
        .build()
        .unwrap();
    let ids = add_key(&notifier, "k", 4, 1).await;
    notifier.cancel(ids[0], &Audit::operator()).await.unwrap();
    notifier.cancel(ids[1], &Audit::operator()).await.unwrap();
    let worker = start(notifier.clone(), fast(WorkerConfig::default()));
    eventually(10, "c failed for good", || async {
        let c = db.history_of(ids[2]).await?;
        (c.status == Status::FinalFailure).then_some(())
    })
    .await;
    notifier.requeue(ids[0], &Audit::operator()).await.unwrap();
    notifier.requeue(ids[1], &Audit::operator()).await.unwrap();
    eventually(10, "a and b delivered again", || async {
        let b = db.history_of(ids[1]).await?;
        (b.status == Status::Succeeded).then_some(())
    })
    .await;
    never_called(&seen, "k", 3, 2).await;
    let d = db.live().await;
    assert_eq!(d.len(), 1, "only d in flight: {d:?}");
    assert!(!d[0].leased, "d is not claimed behind a final failure");
    // Cancelling c lets d go.
    notifier.cancel(ids[2], &Audit::operator()).await.unwrap();
    eventually(10, "d delivered", || async {
        (db.counts().await == (0, 4)).then_some(())
    })
    .await;
    worker.stop().await;
    let order: Vec<(i64, bool)> = per_key(&seen)["k"].clone();
    assert_eq!(order, [(2, false), (0, true), (1, true), (3, true)]);
});

db_test!(
    purge_leaves_a_notice_cancelled_mid_send_until_its_lease_ends,
    |db: Arc<TestDb>| async move {
        // Notice 0 of key k is being sent (slowly) when an operator cancels
        // it; its lease, kept in history, holds the key. A purge meanwhile
        // must not delete it: notice 1 would go beside the send.
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen)();
        let tx = notifier.begin().await.unwrap();
        let first = tx.add(ordered_taking("k", 0, 2_000)).await.unwrap();
        tx.add(ordered_taking("k", 1, 1)).await.unwrap();
        tx.commit().await.unwrap();
        let worker = start(notifier.clone(), fast(WorkerConfig::default()));
        eventually(10, "notice 0 being sent", || async {
            (seen.lock().unwrap().started.contains(&0)).then_some(())
        })
        .await;
        notifier.cancel(first, &Audit::operator()).await.unwrap();
        let purge = solid_notify::ops::Purge {
            include_failures: true,
            ..solid_notify::ops::Purge::older_than(Duration::from_millis(1))
        };
        let report = solid_notify::ops::purge::purge(&db.db, &purge)
            .await
            .unwrap();
        assert_eq!(report.deleted, 0, "{report}");
        assert!(db.history_of(first).await.is_some(), "kept while leased");
        eventually(10, "notice 0's send over", || async {
            (seen.lock().unwrap().calls.iter().any(|(_, s, _)| *s == 0)).then_some(())
        })
        .await;
        eventually(30, "notice 1 delivered once the lease ended", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        worker.stop().await;
        assert_eq!(
            seen.lock().unwrap().overlaps,
            0,
            "two sends of key k at once"
        );
        let report = solid_notify::ops::purge::purge(&db.db, &purge)
            .await
            .unwrap();
        assert_eq!(report.deleted, 2, "{report}");
    }
);
