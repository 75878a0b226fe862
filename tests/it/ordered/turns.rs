//! Keys in turn: across four workers while a stuck key waits, after a
//! final failure with and without `stop_on_failure`, woken by a finish;
//! keys need an ordered definition; operator requeues, cancels and attempts
//! by hand keep the turn.

use solid_notify::ops::Audit;
use std::{collections::HashMap, sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Error, NewNotice, Notice, Notifier, Outcome, Status, WorkerConfig,
};

use super::{Shared, assert_in_turn, ordered, per_key, recording, succeeding};
use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

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
            .cancel(ids[&("stuck-cancel".to_string(), 0)], &Audit::operator())
            .await
            .unwrap();
        healed.store(true, std::sync::atomic::Ordering::SeqCst);
        producer
            .requeue(ids[&("stuck-requeue".to_string(), 0)], &Audit::operator())
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
        notifier.cancel(a, &Audit::operator()).await.unwrap();
        // B is being sent: A requeued now is older, yet waits for B.
        eventually(10, "B started", || started(2)).await;
        notifier.requeue(a, &Audit::operator()).await.unwrap();
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
