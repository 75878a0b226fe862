//! Ordered delivery per key: with `ordering = "per_key"`, the notices of one
//! definition sharing an `ordering_key` are sent one at a time, oldest
//! first, across every worker, while other keys keep flowing.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Error, NewNotice, Notice, Notifier, Outcome, Status, WorkerConfig,
};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

/// What the receiver saw: every call in the order calls started, and how
/// often two calls of one key overlapped.
#[derive(Default)]
struct Seen {
    calls: Vec<(String, i64, bool)>,
    started: Vec<i64>,
    running: HashMap<String, usize>,
    overlaps: usize,
}

type Shared = Arc<Mutex<Seen>>;

/// A handler recording `(key, seq, succeeded)`; `verdict` decides each call.
fn recording(
    seen: Shared,
    verdict: impl Fn(&Notice, i64) -> Outcome + Send + Sync + 'static,
) -> impl Fn(Notice) -> futures::future::BoxFuture<'static, Result<Outcome, solid_notify::BoxError>>
+ Send
+ Sync
+ 'static {
    let verdict = Arc::new(verdict);
    move |n: Notice| {
        let (seen, verdict) = (seen.clone(), verdict.clone());
        Box::pin(async move {
            let key = n.ordering_key.clone().unwrap_or_default();
            let seq = n.param["seq"].as_i64().unwrap();
            {
                let mut s = seen.lock().unwrap();
                s.started.push(seq);
                let running = s.running.entry(key.clone()).or_default();
                *running += 1;
                if *running > 1 {
                    s.overlaps += 1;
                }
            }
            let pause = n.param["ms"].as_u64().unwrap_or(fastrand::u64(0..15));
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let outcome = verdict(&n, seq);
            let mut s = seen.lock().unwrap();
            *s.running.get_mut(&key).unwrap() -= 1;
            let ok = matches!(outcome, Outcome::Success { .. });
            s.calls.push((key, seq, ok));
            Ok(outcome)
        })
    }
}

/// Each key's calls in order, as `(seq, succeeded)`.
fn per_key(seen: &Shared) -> BTreeMap<String, Vec<(i64, bool)>> {
    let mut keys: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    for (key, seq, ok) in &seen.lock().unwrap().calls {
        keys.entry(key.clone()).or_default().push((*seq, *ok));
    }
    keys
}

/// Asserts that a key's calls went strictly in turn: each seq is called
/// only after every smaller one succeeded, and succeeds once.
fn assert_in_turn(key: &str, calls: &[(i64, bool)], upto: i64) {
    let mut next = 0;
    for (seq, ok) in calls {
        assert_eq!(
            *seq, next,
            "key {key}: called {seq} before {next} succeeded: {calls:?}"
        );
        if *ok {
            next += 1;
        }
    }
    assert_eq!(next, upto, "key {key}: {calls:?}");
}

/// Notifiers (without after-commit attempts) whose handler of `ordered`
/// records every call in `seen` and succeeds.
fn succeeding<'a>(db: &'a TestDb, seen: &Shared) -> impl Fn() -> Notifier + 'a {
    let handler = Arc::new(recording(seen.clone(), |_, _| Outcome::success()));
    move || {
        let handler = handler.clone();
        db.notifier()
            .config(quiet())
            .handler("ordered", move |n: Notice| handler(n))
            .build()
            .unwrap()
    }
}

fn ordered(key: &str, seq: i64) -> NewNotice {
    NewNotice::new("ordered", &json!({ "seq": seq })).ordering_key(key)
}

db_test!(
    ordered_keys_go_in_turn_across_four_workers_while_a_stuck_key_waits,
    |db: Arc<TestDb>| async move {
        const KEYS: usize = 6;
        const PER_KEY: i64 = 10;
        db.def("ordered", "ordered", |s| {
            s.ordering = "per_key".into();
            s.retry_interval = "1s".into();
            s.max_retry_times = 20;
        })
        .await;
        let seen: Shared = Arc::default();
        // The first notice of `stuck-*` fails for good; the others fail a
        // third of their calls at random.
        let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let verdict = {
            let healed = healed.clone();
            move |n: &Notice, seq: i64| {
                let key = n.ordering_key.as_deref().unwrap_or_default();
                if key.starts_with("stuck") && seq == 0 {
                    if key == "stuck-requeue" && healed.load(std::sync::atomic::Ordering::SeqCst) {
                        return Outcome::success();
                    }
                    return Outcome::permanent("refused");
                }
                if fastrand::u8(0..3) == 0 {
                    Outcome::retry("flaky")
                } else {
                    Outcome::success()
                }
            }
        };
        let handler = recording(seen.clone(), verdict);
        let handler = Arc::new(handler);
        let notifier = |after_commit: bool| {
            let handler = handler.clone();
            let config = if after_commit {
                crate::support::test_config()
            } else {
                quiet()
            };
            db.notifier()
                .config(config)
                .handler("ordered", move |n: Notice| handler(n))
                .build()
                .unwrap()
        };
        let workers: Vec<_> = (0..4)
            .map(|_| start(notifier(false), fast(WorkerConfig::default())))
            .collect();
        // The producer attempts each notice after its commit when it is in
        // turn; the keys interleave.
        let producer = notifier(true);
        let mut keys: Vec<String> = (0..KEYS).map(|k| format!("key-{k}")).collect();
        keys.extend(["stuck-cancel".to_string(), "stuck-requeue".to_string()]);
        let mut ids: HashMap<(String, i64), i64> = HashMap::new();
        for seq in 0..PER_KEY {
            for key in &keys {
                let tx = producer.begin().await.unwrap();
                let id = tx.add(ordered(key, seq)).await.unwrap();
                tx.commit().await.unwrap();
                ids.insert((key.clone(), seq), id);
            }
        }
        let total = keys.len() as u64 * PER_KEY as u64;
        // Every free key finishes; each stuck key has its failure in history
        // and its nine later notices in flight, never called.
        let stuck_left = 2 * (PER_KEY as u64 - 1);
        eventually(40, "free keys delivered, stuck keys waiting", || async {
            (db.counts().await == (stuck_left, total - stuck_left)).then_some(())
        })
        .await;
        // A while longer: the stuck keys stay stuck.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(db.counts().await, (stuck_left, total - stuck_left));
        let calls = per_key(&seen);
        for key in keys.iter().filter(|k| k.starts_with("key-")) {
            assert_in_turn(key, &calls[key], PER_KEY);
        }
        for key in ["stuck-cancel", "stuck-requeue"] {
            assert_eq!(calls[key], vec![(0, false)], "{key}");
            let failed = db.history_of(ids[&(key.to_string(), 0)]).await.unwrap();
            assert_eq!(failed.status, Status::FinalFailure);
        }

        // Cancelling one failure lets its key go on; requeueing the other
        // (now healed) sends it first, then the rest of its key.
        producer
            .cancel(ids[&("stuck-cancel".to_string(), 0)])
            .await
            .unwrap();
        healed.store(true, std::sync::atomic::Ordering::SeqCst);
        producer
            .requeue(ids[&("stuck-requeue".to_string(), 0)])
            .await
            .unwrap();
        eventually(40, "every notice finished", || async {
            (db.counts().await == (0, total)).then_some(())
        })
        .await;
        for worker in workers {
            worker.stop().await;
        }
        producer.shutdown(Duration::from_secs(5)).await.unwrap();
        let calls = per_key(&seen);
        let cancelled = &calls["stuck-cancel"];
        assert_eq!(cancelled[0], (0, false));
        assert_in_turn(
            "stuck-cancel",
            &cancelled[1..]
                .iter()
                .map(|(s, ok)| (s - 1, *ok))
                .collect::<Vec<_>>(),
            PER_KEY - 1,
        );
        assert_eq!(
            db.history_of(ids[&("stuck-cancel".to_string(), 0)])
                .await
                .unwrap()
                .status,
            Status::Cancelled
        );
        let requeued = &calls["stuck-requeue"];
        assert_eq!(requeued[0], (0, false));
        assert_in_turn("stuck-requeue", &requeued[1..], PER_KEY);
        assert_eq!(
            seen.lock().unwrap().overlaps,
            0,
            "two calls of one key at once"
        );
    }
);

db_test!(
    without_stop_on_failure_a_key_goes_on_after_a_final_failure,
    |db: Arc<TestDb>| async move {
        db.def("ordered", "ordered", |s| {
            s.ordering = "per_key".into();
            s.stop_on_failure = false;
        })
        .await;
        let seen: Shared = Arc::default();
        let handler = recording(seen.clone(), |_, seq| {
            if seq == 0 {
                Outcome::permanent("refused")
            } else {
                Outcome::success()
            }
        });
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("ordered", handler)
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        for seq in 0..3 {
            tx.add(ordered("k", seq)).await.unwrap();
        }
        tx.commit().await.unwrap();
        let worker = start(notifier, fast(WorkerConfig::default()));
        eventually(20, "all three finished", || async {
            (db.counts().await == (0, 3)).then_some(())
        })
        .await;
        worker.stop().await;
        assert_eq!(per_key(&seen)["k"], vec![(0, false), (1, true), (2, true)]);
    }
);

db_test!(
    a_finished_notice_wakes_the_next_of_its_key_without_waiting_for_a_poll,
    |db: Arc<TestDb>| async move {
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ordered'")
            .await;
        // Plain-SQL producer: one statement, so one create_time; the ids
        // order them.
        let rows: Vec<String> = (0..5)
            .map(|seq| {
                format!(
                    "({def_id}, '{{\"seq\":{seq}}}', '', '', 0, 0, {now}, {now}, 0, 0, {f}, 'plain')",
                    now = db.now_sql(),
                    f = if db.backend == crate::support::Backend::Postgres { "false" } else { "0" },
                )
            })
            .collect();
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, description, errors, status, retry_times, \
                 next_call_time, create_time, version, load_balance_num, leased, ordering_key) \
                 VALUES {}",
                rows.join(", ")
            ))
            .await
            .unwrap();
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen)();
        // Polls every 30 s; it catches up once when it starts, and each
        // finished notice wakes it for the next.
        let worker = start(
            notifier,
            WorkerConfig {
                delay: Duration::from_secs(30),
                ..fast(WorkerConfig::default())
            },
        );
        eventually(5, "five in a row, well before a poll", || async {
            (db.counts().await == (0, 5)).then_some(())
        })
        .await;
        worker.stop().await;
        assert_in_turn("plain", &per_key(&seen)["plain"], 5);
    }
);

db_test!(an_ordering_key_needs_an_ordered_definition, |db: Arc<
    TestDb,
>| async move {
    db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
        .await;
    db.def("loose", "ordered", |_| {}).await;
    let seen: Shared = Arc::default();
    let notifier: Notifier = db
        .notifier()
        .handler(
            "ordered",
            recording(seen.clone(), |_, _| Outcome::success()),
        )
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let refused = tx
        .add(NewNotice::new("loose", &json!({ "seq": 0 })).ordering_key("k"))
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::InvalidNotice { .. }), "{refused}");
    let long = tx.add(ordered(&"k".repeat(256), 0)).await.unwrap_err();
    assert!(matches!(long, Error::InvalidNotice { .. }), "{long}");
    // The refusals left the transaction usable; the first notice of a
    // key is in turn at once and sent after the commit.
    tx.add(ordered("k", 0)).await.unwrap();
    tx.add(ordered("k", 1)).await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert_eq!(reports[0].result, AttemptResult::Succeeded, "{reports:?}");
    // The second waited its turn: its after-commit claim found the first
    // still in flight, or a sweeper sends it now.
    assert!(
        matches!(
            reports[1].result,
            AttemptResult::Succeeded | AttemptResult::Skipped { .. }
        ),
        "{reports:?}"
    );
    eventually(10, "both sent", || async {
        db.attempt_due(&notifier).await;
        (db.counts().await == (0, 2)).then_some(())
    })
    .await;
    assert_in_turn("k", &per_key(&seen)["k"], 2);
});

db_test!(
    a_cancelled_or_requeued_notice_never_runs_beside_another_of_its_key,
    |db: Arc<TestDb>| async move {
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = db
            .notifier()
            .config(solid_notify::Config {
                lease: Duration::from_secs(4),
                attempt_timeout: Duration::from_secs(2),
                ..quiet()
            })
            .handler(
                "ordered",
                recording(seen.clone(), |_, _| Outcome::success()),
            )
            .build()
            .unwrap();
        let slow = |seq: i64| {
            NewNotice::new("ordered", &json!({ "seq": seq, "ms": 1200 })).ordering_key("k")
        };
        let tx = notifier.begin().await.unwrap();
        let a = tx.add(slow(0)).await.unwrap();
        tx.add(slow(1)).await.unwrap();
        tx.commit().await.unwrap();
        let worker = start(notifier.clone(), fast(WorkerConfig::default()));
        let started = |n: usize| {
            let seen = seen.clone();
            async move { (seen.lock().unwrap().started.len() >= n).then_some(()) }
        };
        // A is being sent: cancelled now, it still holds its key until its
        // claim ends, so B does not start beside it.
        eventually(10, "A started", || started(1)).await;
        notifier.cancel(a).await.unwrap();
        // B is being sent: A requeued now is older, yet waits for B.
        eventually(10, "B started", || started(2)).await;
        notifier.requeue(a).await.unwrap();
        eventually(20, "A sent again after B", || async {
            (db.counts().await == (0, 2)).then_some(())
        })
        .await;
        worker.stop().await;
        let s = seen.lock().unwrap();
        assert_eq!(s.started, vec![0, 1, 0]);
        assert_eq!(s.overlaps, 0, "two calls of one key at once");
    }
);

db_test!(attempting_a_notice_by_hand_respects_its_turn, |db: Arc<
    TestDb,
>| async move {
    db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
        .await;
    let seen: Shared = Arc::default();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "ordered",
            recording(seen.clone(), |_, seq| {
                if seq == 0 {
                    Outcome::retry("not yet")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    tx.add(ordered("k", 0)).await.unwrap();
    let b = tx.add(ordered("k", 1)).await.unwrap();
    tx.commit().await.unwrap();
    // A fails and waits for its retry; B, attempted by hand, is not sent.
    db.attempt_due(&notifier).await;
    let row = db.live().await.into_iter().find(|r| r.id == b).unwrap();
    let report = notifier.attempt(row).await;
    assert_eq!(report.result, AttemptResult::LostClaim, "{report:?}");
    assert_eq!(seen.lock().unwrap().started, vec![0]);
});

db_test!(
    waiting_notices_are_set_aside_and_each_finish_promotes_the_next,
    |db: Arc<TestDb>| async move {
        const KEYS: usize = 12;
        const PER_KEY: i64 = 8;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen);
        let producer = notifier();
        let tx = producer.begin().await.unwrap();
        for seq in 0..PER_KEY {
            for key in 0..KEYS {
                tx.add(ordered(&format!("k{key}"), seq)).await.unwrap();
            }
        }
        tx.commit().await.unwrap();
        // Two workers polling every 30 s: after their first sweep only
        // promotions move the keys on. A notice set aside and never
        // promoted would wait a whole recheck (60 s).
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let config = WorkerConfig {
                    delay: Duration::from_secs(30),
                    ..fast(WorkerConfig::default())
                };
                start(notifier(), config)
            })
            .collect();
        let later = match db.backend {
            crate::support::Backend::Postgres => {
                "(now() AT TIME ZONE 'UTC') + interval '30 seconds'"
            }
            crate::support::Backend::MySql => "UTC_TIMESTAMP(6) + INTERVAL 30 SECOND",
            crate::support::Backend::Sqlite => {
                "strftime('%Y-%m-%d %H:%M:%f', 'now', '+30 seconds')"
            }
        };
        let aside_sql = format!(
            "SELECT COUNT(*) FROM notify_msg WHERE NOT leased AND next_call_time > {later}"
        );
        let most_aside = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let total = (KEYS as u64) * PER_KEY as u64;
        eventually(20, "every key drained, long before a recheck", || {
            let (db, most_aside, aside_sql) = (db.clone(), most_aside.clone(), aside_sql.clone());
            async move {
                let aside = db.scalar(&aside_sql).await;
                most_aside.fetch_max(aside, std::sync::atomic::Ordering::SeqCst);
                (db.counts().await == (0, total)).then_some(())
            }
        })
        .await;
        for worker in workers {
            worker.stop().await;
        }
        assert!(
            most_aside.load(std::sync::atomic::Ordering::SeqCst) > 0,
            "no waiting notice was ever set aside"
        );
        let calls = per_key(&seen);
        for key in 0..KEYS {
            let key = format!("k{key}");
            assert_in_turn(&key, &calls[&key], PER_KEY);
        }
        assert_eq!(
            seen.lock().unwrap().overlaps,
            0,
            "two calls of one key at once"
        );
    }
);

/// Inserts plain-SQL notices of key `key`, one per seq, due now.
async fn insert_plain(db: &TestDb, key: &str, seqs: std::ops::Range<i64>) {
    insert_plain_in(db, key, seqs, |_| 0).await
}

/// [`insert_plain`], each notice in the partition `partition(seq)`.
async fn insert_plain_in(
    db: &TestDb,
    key: &str,
    seqs: std::ops::Range<i64>,
    partition: impl Fn(i64) -> i32,
) {
    let def_id = db
        .scalar("SELECT id FROM notify_def WHERE name = 'ordered'")
        .await;
    let leased = if db.backend == crate::support::Backend::Postgres {
        "false"
    } else {
        "0"
    };
    for seq in seqs {
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, description, errors, status, retry_times, \
                 next_call_time, create_time, version, load_balance_num, leased, ordering_key) \
                 VALUES ({def_id}, '{{\"seq\":{seq}}}', '', '', 0, 0, {now}, {now}, 0, {part}, {leased}, '{key}')",
                now = db.now_sql(),
                part = partition(seq),
            ))
            .await
            .unwrap();
    }
}

/// A fourth notice of key `k` is added while three older ones are in
/// flight (on PostgreSQL it is written set aside), and the three go before
/// its producer commits. With `attempts`, its after-commit attempt sends it
/// (no worker runs); without, a worker polling every 30 s, started after
/// the commit, must be handed it at once.
async fn turn_came_before_commit(db: Arc<TestDb>, attempts: bool) {
    db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
        .await;
    insert_plain(&db, "k", 0..3).await;
    // On PostgreSQL the third is written set aside (two older ones are in
    // flight); elsewhere the first claim that meets it would.
    let aside = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM notify_msg WHERE next_call_time > {}",
            db.now_sql()
        ))
        .await;
    let expected = i64::from(db.backend == crate::support::Backend::Postgres);
    assert_eq!(aside, expected, "notices written set aside");
    let seen: Shared = Arc::default();
    let config = if attempts {
        crate::support::test_config()
    } else {
        quiet()
    };
    let notifier = db
        .notifier()
        .config(config)
        .handler(
            "ordered",
            recording(seen.clone(), |_, _| Outcome::success()),
        )
        .build()
        .unwrap();
    let older: Vec<String> = db.live().await.iter().map(|r| r.id.to_string()).collect();
    let delete = format!("DELETE FROM notify_msg WHERE id IN ({})", older.join(", "));
    let tx = notifier.begin().await.unwrap();
    let id = tx.add(ordered("k", 3)).await.unwrap();
    if db.backend == crate::support::Backend::Postgres {
        db.db.execute_unprepared(&delete).await.unwrap();
    } else {
        // Nothing is set aside at insert here (and SQLite has one writer,
        // MariaDB locks the key's range): delete them in the producer's own
        // transaction.
        tx.execute_unprepared(&delete).await.unwrap();
    }
    tx.commit().await.unwrap();
    let worker = (!attempts).then(|| {
        let config = WorkerConfig {
            delay: Duration::from_secs(30),
            ..fast(WorkerConfig::default())
        };
        start(notifier.clone(), config)
    });
    eventually(5, "the fourth, well before its recheck", || async {
        (db.counts().await == (0, 1)).then_some(())
    })
    .await;
    if let Some(worker) = worker {
        worker.stop().await;
    }
    assert_eq!(seen.lock().unwrap().started, vec![3]);
    let moved = db
        .scalar(&format!(
            "SELECT COUNT(*) FROM notify_msg_history WHERE id = {id} AND status = 1"
        ))
        .await;
    assert_eq!(moved, 1);
}

db_test!(
    a_notice_set_aside_at_its_insert_is_attempted_after_commit_when_its_turn_came_meanwhile,
    |db: Arc<TestDb>| turn_came_before_commit(db, true)
);

db_test!(
    a_notice_set_aside_at_its_insert_goes_to_a_sweeper_when_its_turn_came_meanwhile,
    |db: Arc<TestDb>| turn_came_before_commit(db, false)
);

db_test!(
    a_keys_next_notice_goes_to_a_worker_of_its_partition,
    |db: Arc<TestDb>| async move {
        // One key, its notices alternating between partitions 0 and 1, a
        // worker for each. On PostgreSQL a batch of successes claims the
        // key's next notice for its own sweep: never one of a partition its
        // worker does not take.
        const N: i64 = 12;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        insert_plain_in(&db, "k", 0..N, |seq| (seq % 2) as i32).await;
        let by: Arc<Mutex<Vec<(i64, i32)>>> = Arc::default();
        let seen: Shared = Arc::default();
        let workers: Vec<_> = [0, 1]
            .into_iter()
            .map(|partition| {
                let handler = recording(seen.clone(), |_, _| Outcome::success());
                let by = by.clone();
                let notifier = db
                    .notifier()
                    .config(quiet())
                    .handler("ordered", move |n: Notice| {
                        by.lock()
                            .unwrap()
                            .push((n.param["seq"].as_i64().unwrap(), partition));
                        handler(n)
                    })
                    .build()
                    .unwrap();
                let config = WorkerConfig {
                    partitions: vec![partition],
                    ..fast(WorkerConfig::default())
                };
                start(notifier, config)
            })
            .collect();
        eventually(20, "the key drained", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        for worker in workers {
            worker.stop().await;
        }
        for (seq, partition) in by.lock().unwrap().iter() {
            assert_eq!(
                i64::from(*partition),
                seq % 2,
                "notice {seq} sent by the worker of partition {partition}"
            );
        }
        let keys = per_key(&seen);
        assert_in_turn("k", &keys["k"], N);
        assert_eq!(seen.lock().unwrap().overlaps, 0);
    }
);

db_test!(
    a_worker_stopped_mid_drain_leaves_no_next_notice_claimed,
    |db: Arc<TestDb>| async move {
        // Twelve keys drained by one worker, stopped once some notices are
        // sent: the next notices its last writes claimed (PostgreSQL) are
        // released at once, not left to their lease; another worker then
        // sends every notice of every key, in turn, each exactly once.
        const KEYS: usize = 12;
        const PER_KEY: i64 = 15;
        db.def("ordered", "ordered", |s| s.ordering = "per_key".into())
            .await;
        for key in 0..KEYS {
            insert_plain(&db, &format!("k{key}"), 0..PER_KEY).await;
        }
        let seen: Shared = Arc::default();
        let notifier = succeeding(&db, &seen);
        let first = start(notifier(), fast(WorkerConfig::default()));
        eventually(20, "some notices sent", || async {
            (seen.lock().unwrap().calls.len() >= 40).then_some(())
        })
        .await;
        first.stop().await;
        let leased = db
            .scalar("SELECT COUNT(*) FROM notify_msg WHERE leased")
            .await;
        assert_eq!(leased, 0, "rows left claimed by a stopped worker");
        let total = KEYS as u64 * PER_KEY as u64;
        assert!(db.counts().await.1 < total, "stopped before the end");
        let second = start(notifier(), fast(WorkerConfig::default()));
        eventually(20, "every key drained", || async {
            (db.counts().await == (0, total)).then_some(())
        })
        .await;
        second.stop().await;
        let keys = per_key(&seen);
        for key in 0..KEYS {
            let key = format!("k{key}");
            assert_in_turn(&key, &keys[&key], PER_KEY);
        }
        assert_eq!(seen.lock().unwrap().overlaps, 0);
    }
);

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
        eventually(20, "the key drained", || async {
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
        eventually(12, "key k delivered, its retries on time", || async {
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
        notifier.cancel(ids[12]).await.unwrap();
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
    notifier.cancel(ids[0]).await.unwrap();
    notifier.cancel(ids[1]).await.unwrap();
    let worker = start(notifier.clone(), fast(WorkerConfig::default()));
    eventually(10, "c failed for good", || async {
        let c = db.history_of(ids[2]).await?;
        (c.status == Status::FinalFailure).then_some(())
    })
    .await;
    notifier.requeue(ids[0]).await.unwrap();
    notifier.requeue(ids[1]).await.unwrap();
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
    notifier.cancel(ids[2]).await.unwrap();
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
        notifier.cancel(first).await.unwrap();
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
