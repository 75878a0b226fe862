//! Dispatch: claims, retries on schedule, final failure, panics.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use serde_json::json;
use solid_notify::{AttemptResult, Config, Outcome, Status, entity::notify_msg};

use crate::{
    db_test,
    support::{Alerts, Recorder, TestDb, eventually, test_config},
};

db_test!(
    two_concurrent_claimers_one_sends,
    |db: Arc<TestDb>| async move {
        db.def("slow", "slow", |_| {}).await;
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let notifier = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..test_config()
            })
            .handler("slow", move |_n| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(Outcome::success())
                }
            })
            .build()
            .unwrap();
        for round in 0..5 {
            let tx = notifier.begin().await.unwrap();
            tx.add_notice("slow", &json!({"round": round}), "")
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        for row in db.live().await {
            // Eight senders read the same version; exactly one may send.
            let attempts = (0..8).map(|_| {
                let notifier = notifier.clone();
                let row = row.clone();
                tokio::spawn(async move { notifier.attempt(row).await.result })
            });
            let results: Vec<AttemptResult> = futures::future::join_all(attempts)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let won = results
                .iter()
                .filter(|r| **r == AttemptResult::Succeeded)
                .count();
            let lost = results
                .iter()
                .filter(|r| **r == AttemptResult::LostClaim)
                .count();
            assert_eq!((won, lost), (1, 7), "{results:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(db.counts().await, (0, 5));
    }
);

db_test!(
    failing_handler_retries_on_schedule_then_final_failure,
    |db: Arc<TestDb>| async move {
        db.def("always_fails", "fails", |s| {
            s.retry_interval = "1s,2s".into();
            s.max_retry_times = 2;
        })
        .await;
        let rec = Recorder::default();
        let alerts = Alerts::default();
        let notifier = db
            .notifier()
            .alert_hook(alerts.clone())
            .handler(
                "fails",
                rec.handler(|n| Outcome::retry(format!("boom {}", n.attempt))),
            )
            .build()
            .unwrap();

        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add_notice("always_fails", &json!({"k": "v"}), "")
            .await
            .unwrap();
        let first = tx.commit_and_wait().await.unwrap();
        assert!(matches!(
            first[0].result,
            AttemptResult::WillRetry { attempt: 1, .. }
        ));

        // After each failure the row waits the schedule's entry for that retry.
        for (failures, wait) in [(1, 1), (2, 2)] {
            let row = db.live().await.pop().expect("still in flight");
            assert_eq!((row.status, row.retry_times), (Status::Failed, failures));
            assert_eq!(row.errors.lines().count(), failures as usize);
            let waited = (row.next_call_time - row.last_call_time.unwrap())
                .to_std()
                .unwrap();
            assert!(
                waited >= Duration::from_secs(wait)
                    && waited < Duration::from_secs(wait) + Duration::from_millis(500),
                "retry {failures} waits {waited:?}"
            );
            // Not due before its time: a sweep now sends nothing (checked
            // while half a second is left: a loaded machine may have
            // reached the time already).
            if chrono::Utc::now().naive_utc() + chrono::Duration::milliseconds(500)
                < row.next_call_time
            {
                assert_eq!(db.attempt_due(&notifier).await, 0);
            }
            eventually(10, "retry attempted", || async {
                (db.attempt_due(&notifier).await > 0).then_some(())
            })
            .await;
        }

        let done = db.history_of(id).await.expect("final failure in history");
        assert_eq!(done.status, Status::FinalFailure);
        assert_eq!(done.retry_times, 3);
        let lines: Vec<&str> = done.errors.lines().collect();
        assert_eq!(lines.len(), 3, "{}", done.errors);
        for (i, line) in lines.iter().enumerate() {
            assert!(
                line.ends_with(&format!("attempt {}: boom {}", i + 1, i + 1)),
                "{line}"
            );
        }
        assert_eq!(db.counts().await, (0, 1));
        assert_eq!(rec.count(), 3);
        // Alert type 0: exactly one alert, on the final failure, with the whole log.
        let events = alerts.events();
        assert_eq!(events.len(), 1);
        assert!(events[0].is_final);
        assert_eq!(
            (events[0].notice_id, events[0].attempt, events[0].failures),
            (id, 3, 3)
        );
        assert_eq!(events[0].errors, done.errors);
    }
);

db_test!(
    permanent_failure_skips_retries,
    |db: Arc<TestDb>| async move {
        db.def("reject", "reject", |s| s.max_retry_times = -1).await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .handler(
                "reject",
                rec.handler(|_| Outcome::permanent("400 bad request")),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("reject", &json!({}), "").await.unwrap();
        let report = tx.commit_and_wait().await.unwrap();
        assert!(matches!(
            report[0].result,
            AttemptResult::FinalFailure { attempt: 1, .. }
        ));
        let done = db.history_of(id).await.unwrap();
        assert_eq!((done.status, done.retry_times), (Status::FinalFailure, 1));
        assert!(done.errors.ends_with("attempt 1: 400 bad request"));
    }
);

db_test!(panicking_handler_is_a_retryable_failure, |db: Arc<
    TestDb,
>| async move {
    db.def("panics", "panics", |_| {}).await;
    db.def("fine", "fine", |_| {}).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler("panics", |_n| async move {
            if true {
                panic!("handler bug");
            }
            Ok(Outcome::success())
        })
        .handler("fine", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let bad = tx.add_notice("panics", &json!({}), "").await.unwrap();
    tx.commit().await.unwrap();
    let row = eventually(10, "panic recorded", || async {
        db.live()
            .await
            .into_iter()
            .find(|r| r.id == bad && r.retry_times == 1)
    })
    .await;
    assert_eq!(row.status, Status::Failed);
    assert!(
        row.errors.contains("handler panicked: handler bug"),
        "{}",
        row.errors
    );

    // The notifier keeps working.
    let tx = notifier.begin().await.unwrap();
    let good = tx.add_notice("fine", &json!({}), "").await.unwrap();
    let report = tx.commit_and_wait().await.unwrap();
    assert_eq!(report[0].result, AttemptResult::Succeeded);
    assert_eq!(rec.count_for(good), 1);
});

db_test!(errors_and_timeouts_are_retryable_failures, |db: Arc<
    TestDb,
>| async move {
    db.def("errs", "errs", |_| {}).await;
    db.def("hangs", "hangs", |_| {}).await;
    let notifier = db
        .notifier()
        .config(Config {
            attempt_timeout: Duration::from_millis(200),
            ..test_config()
        })
        .handler("errs", |_n| async move {
            Err::<Outcome, _>("connection reset".into())
        })
        .handler("hangs", |_n| async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Outcome::success())
        })
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    tx.add_notice("errs", &json!({}), "").await.unwrap();
    tx.add_notice("hangs", &json!({}), "").await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    let reasons: Vec<String> = reports
        .iter()
        .map(|r| match &r.result {
            AttemptResult::WillRetry { reason, .. } => reason.clone(),
            other => panic!("expected retry, got {other:?}"),
        })
        .collect();
    assert_eq!(reasons[0], "handler error: connection reset");
    assert!(
        reasons[1].starts_with("attempt timed out"),
        "{}",
        reasons[1]
    );
    assert!(
        db.live()
            .await
            .iter()
            .all(|r| r.status == Status::Failed && r.retry_times == 1)
    );
});

db_test!(
    plain_sql_insert_is_due_at_once,
    |db: Arc<TestDb>| async move {
        use sea_orm::ConnectionTrait;
        db.def("from_sql", "rec", |_| {}).await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .handler("rec", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        // What a producer in another language writes: the def id and the param.
        db.db
            .execute_unprepared(
                "INSERT INTO notify_msg (def_id, param) \
             SELECT id, '{\"from\":\"sql\"}' FROM notify_def WHERE name = 'from_sql'",
            )
            .await
            .unwrap();
        let rows = db.live().await;
        assert_eq!(rows.len(), 1);
        let row: &notify_msg::Model = &rows[0];
        assert_eq!(
            (row.status, row.version, row.retry_times),
            (Status::NotSent, 0, 0)
        );
        assert_eq!(db.attempt_due(&notifier).await, 1);
        let calls = rec.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].param, json!({"from": "sql"}));
        assert_eq!(calls[0].idempotency_key, row.id.to_string());
        assert_eq!(
            db.history_of(row.id).await.unwrap().status,
            Status::Succeeded
        );
    }
);

db_test!(
    unregistered_handler_is_left_for_another_process,
    |db: Arc<TestDb>| async move {
        db.def("elsewhere", "not_here", |_| {}).await;
        let notifier = db.notifier().build().unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("elsewhere", &json!({}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        assert!(matches!(reports[0].result, AttemptResult::Skipped { .. }));
        // Its reservation is released: due at once for a process that can.
        let row = eventually(5, "the reservation released", || async {
            db.live().await.pop().filter(|r| r.version == 1)
        })
        .await;
        assert_eq!(
            (row.id, row.status, row.leased),
            (id, Status::NotSent, false)
        );
        assert_eq!(db.due_now().await, 1);
    }
);

db_test!(
    on_error_fail_makes_handler_errors_and_panics_final,
    |db: Arc<TestDb>| async move {
        // Seed 000's exception strategy: an error or a panic moves the notice
        // to history as a final failure at once; a retry outcome still retries.
        db.def("strict", "strict", |s| s.on_error = "fail".into())
            .await;
        db.def("lenient", "lenient", |_| {}).await;
        let notifier = db
            .notifier()
            .handler("strict", |n: solid_notify::Notice| async move {
                match n.param["do"].as_str() {
                    Some("err") => Err::<Outcome, _>("connection reset".into()),
                    Some("panic") => panic!("handler bug"),
                    _ => Ok(Outcome::retry("busy, later")),
                }
            })
            .handler("lenient", |_n| async move {
                Err::<Outcome, _>("connection reset".into())
            })
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let err = tx
            .add_notice("strict", &json!({"do": "err"}), "")
            .await
            .unwrap();
        let panicked = tx
            .add_notice("strict", &json!({"do": "panic"}), "")
            .await
            .unwrap();
        let retried = tx
            .add_notice("strict", &json!({"do": "retry"}), "")
            .await
            .unwrap();
        let lenient = tx.add_notice("lenient", &json!({}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let result = |id: i64| {
            reports
                .iter()
                .find(|r| r.notice_id == id)
                .unwrap()
                .result
                .clone()
        };
        assert!(
            matches!(result(err), AttemptResult::FinalFailure { attempt: 1, .. }),
            "{:?}",
            result(err)
        );
        assert!(matches!(
            result(panicked),
            AttemptResult::FinalFailure { attempt: 1, .. }
        ));
        assert!(matches!(result(retried), AttemptResult::WillRetry { .. }));
        assert!(matches!(result(lenient), AttemptResult::WillRetry { .. }));
        for (id, why) in [
            (err, "handler error: connection reset"),
            (panicked, "handler panicked: handler bug"),
        ] {
            let row = db.history_of(id).await.expect("in history");
            assert_eq!((row.status, row.retry_times), (Status::FinalFailure, 1));
            assert!(
                row.errors.contains(why) && row.errors.contains("on_error = \"fail\""),
                "{}",
                row.errors
            );
        }
        let live = db.live().await;
        assert_eq!(
            live.len(),
            2,
            "the retry outcome and the lenient error stay in flight"
        );
        assert!(
            live.iter()
                .all(|r| r.status == Status::Failed && r.retry_times == 1)
        );
    }
);

db_test!(
    immediate_retries_run_within_one_claim_and_fit_the_lease,
    |db: Arc<TestDb>| async move {
        // Seed 002: try again at once a few times, then hand the notice to
        // the schedule. Every call of one attempt shares its claim (version).
        db.def("flaky", "flaky", |s| {
            s.immediate_retries = 2;
            s.immediate_retry_delay = 50;
        })
        .await;
        // More tries than the lease holds: fewer are run.
        db.def("greedy", "greedy", |s| {
            s.immediate_retries = 10;
            s.immediate_retry_delay = 300;
        })
        .await;
        let calls: Arc<std::sync::Mutex<Vec<(i64, i32, std::time::Instant)>>> = Arc::default();
        let (flaky_calls, greedy_calls) = (calls.clone(), calls.clone());
        let notifier = db
            .notifier()
            .config(Config {
                lease: Duration::from_secs(2),
                attempt_timeout: Duration::from_millis(500),
                ..test_config()
            })
            .handler("flaky", move |n: solid_notify::Notice| {
                let calls = flaky_calls.clone();
                async move {
                    let seen = {
                        let mut calls = calls.lock().unwrap();
                        calls.push((n.id, n.version, std::time::Instant::now()));
                        calls.iter().filter(|c| c.0 == n.id).count() as u64
                    };
                    match n.param["fail"].as_u64() {
                        Some(fails) if seen <= fails => Ok(Outcome::retry(format!("busy {seen}"))),
                        None => Ok(Outcome::permanent("bad order")),
                        _ => Ok(Outcome::success()),
                    }
                }
            })
            .handler("greedy", move |n: solid_notify::Notice| {
                let calls = greedy_calls.clone();
                async move {
                    calls
                        .lock()
                        .unwrap()
                        .push((n.id, n.version, std::time::Instant::now()));
                    Ok(Outcome::retry("still busy"))
                }
            })
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let second_try = tx
            .add_notice("flaky", &json!({"fail": 1}), "")
            .await
            .unwrap();
        let exhausted = tx
            .add_notice("flaky", &json!({"fail": 5}), "")
            .await
            .unwrap();
        let permanent = tx.add_notice("flaky", &json!({}), "").await.unwrap();
        let greedy = tx.add_notice("greedy", &json!({}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let result = |id: i64| {
            reports
                .iter()
                .find(|r| r.notice_id == id)
                .unwrap()
                .result
                .clone()
        };
        let calls = calls.lock().unwrap().clone();
        let calls_of = |id: i64| -> Vec<(i64, i32, std::time::Instant)> {
            calls.iter().filter(|c| c.0 == id).cloned().collect()
        };
        let one_claim = |id: i64| {
            let of = calls_of(id);
            assert!(of.iter().all(|c| c.1 == of[0].1), "one version: {of:?}");
            of.len()
        };

        // Failed once, succeeded on the second call: in history, both
        // calls in `errors` as tries of attempt 1.
        assert_eq!(result(second_try), AttemptResult::Succeeded);
        assert_eq!(one_claim(second_try), 2);
        let row = db.history_of(second_try).await.expect("in history");
        assert_eq!((row.status, row.retry_times), (Status::Succeeded, 0));
        assert!(
            row.errors.contains("attempt 1, try 1: busy 1"),
            "{}",
            row.errors
        );

        // Failed on every call: N+1 calls, then one failure on the
        // schedule (the tries count once toward max_retry_times).
        assert!(
            matches!(
                result(exhausted),
                AttemptResult::WillRetry { attempt: 1, .. }
            ),
            "{:?}",
            result(exhausted)
        );
        assert_eq!(one_claim(exhausted), 3);
        let row = db
            .live()
            .await
            .into_iter()
            .find(|r| r.id == exhausted)
            .expect("in flight");
        assert_eq!((row.status, row.retry_times), (Status::Failed, 1));
        for n in 1..=3 {
            assert!(
                row.errors
                    .contains(&format!("attempt 1, try {n}: busy {n}")),
                "{}",
                row.errors
            );
        }
        let of = calls_of(exhausted);
        assert!(
            of[1].2 - of[0].2 >= Duration::from_millis(50),
            "the delay between tries"
        );

        // A permanent failure is never tried again.
        assert!(matches!(
            result(permanent),
            AttemptResult::FinalFailure { attempt: 1, .. }
        ));
        assert_eq!(one_claim(permanent), 1);

        // Lease 2 s, timeout 0.5 s, margin 0.2 s, delay 0.3 s: a try starts
        // only while 1 s of the lease is left, so at most 5 calls, not 11,
        // and the last one starts early enough to end within the lease.
        let n = one_claim(greedy);
        assert!((2..=5).contains(&n), "{n} calls");
        let of = calls_of(greedy);
        let last_start = of[n - 1].2 - of[0].2;
        assert!(
            last_start + Duration::from_millis(500) < Duration::from_secs(2),
            "a try may not outrun the lease: last began {last_start:?} after the first"
        );
        let row = db
            .live()
            .await
            .into_iter()
            .find(|r| r.id == greedy)
            .expect("in flight");
        assert_eq!(row.retry_times, 1);
        assert!(
            row.errors
                .contains(&format!("attempt 1, try {n}: still busy")),
            "{}",
            row.errors
        );
    }
);
