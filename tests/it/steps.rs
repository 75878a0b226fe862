//! Multi-step notices: a definition's `steps` run in order within one
//! claim; a failed step is retried on the schedule and the notice resumes
//! there, never running the steps before it again.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use solid_notify::{
    Error, NewNotice, Notice, Notifier, NotifierBuilder, Outcome, Status, WorkerConfig,
    def::{DefSpec, store},
};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    receiver::{Receiver, Reply},
    support::{TestDb, eventually},
};

/// Every call a step's handler got: `(handler, step, previous result)`.
type Calls = Arc<Mutex<Vec<(String, u32, Option<Value>)>>>;

fn handler_step(name: &str) -> Value {
    json!({ "channel": "handler", "target": { "handler": name } })
}

async fn chain(db: &TestDb, steps: Value, edit: impl FnOnce(&mut DefSpec)) {
    let mut spec = DefSpec::new(
        "chain",
        solid_notify::def::Channel::Handler,
        json!({ "handler": "unused" }),
    );
    spec.steps = steps;
    spec.retry_interval = "1s".into();
    edit(&mut spec);
    store::sync(&db.db, &[spec]).await.unwrap();
}

/// Registers a handler `name` that records each call and answers with
/// `verdict(n-th call of this handler, 1-based)`.
fn recorded(
    builder: NotifierBuilder,
    calls: &Calls,
    name: &str,
    verdict: impl Fn(usize) -> Outcome + Send + Sync + 'static,
) -> NotifierBuilder {
    let (calls, owned) = (calls.clone(), name.to_string());
    builder.handler(name, move |n: Notice| {
        let (calls, owned) = (calls.clone(), owned.clone());
        let nth = {
            let mut calls = calls.lock().unwrap();
            calls.push((owned.clone(), n.step, n.previous_result.clone()));
            calls.iter().filter(|c| c.0 == owned).count()
        };
        let outcome = verdict(nth);
        async move { Ok(outcome) }
    })
}

fn calls_of(calls: &Calls, name: &str) -> Vec<(u32, Option<Value>)> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.0 == name)
        .map(|c| (c.1, c.2.clone()))
        .collect()
}

/// Waits (20 s at most) until notice `id` succeeded; its history row.
async fn succeeded(
    db: &TestDb,
    id: i64,
    what: &str,
) -> solid_notify::entity::notify_msg_history::Model {
    eventually(20, what, || async {
        db.history_of(id)
            .await
            .filter(|r| r.status == Status::Succeeded)
    })
    .await
}

async fn add(notifier: &Notifier) -> i64 {
    let tx = notifier.begin().await.unwrap();
    let id = tx
        .add(NewNotice::new("chain", &json!({ "order": 7 })))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    id
}

db_test!(
    a_three_step_notice_resumes_at_the_step_that_failed,
    |db: Arc<TestDb>| async move {
        chain(
            &db,
            json!([
                handler_step("one"),
                handler_step("two"),
                handler_step("three")
            ]),
            |_| {},
        )
        .await;
        let calls: Calls = Arc::default();
        let mut builder = db.notifier().config(quiet());
        builder = recorded(builder, &calls, "one", |_| {
            Outcome::success().with_result(json!({ "from": 1 }))
        });
        builder = recorded(builder, &calls, "two", |nth| match nth {
            1 | 2 => Outcome::retry("busy"),
            _ => Outcome::success().with_result(json!({ "from": 2 })),
        });
        builder = recorded(builder, &calls, "three", |_| Outcome::success());
        let notifier = builder.build().unwrap();
        let id = add(&notifier).await;
        let worker = start(notifier, fast(WorkerConfig::default()));
        let done = succeeded(&db, id, "the chain succeeded").await;
        worker.stop().await;
        assert_eq!(calls_of(&calls, "one"), vec![(0, None)]);
        let from_one = Some(json!({ "from": 1 }));
        assert_eq!(calls_of(&calls, "two"), vec![(1, from_one.clone()); 3]);
        assert_eq!(
            calls_of(&calls, "three"),
            vec![(2, Some(json!({ "from": 2 })))]
        );
        // History: on its last step, two failed attempts, each naming it.
        assert_eq!((done.step, done.retry_times), (2, 2));
        let failures: Vec<&str> = done.errors.lines().collect();
        assert_eq!(failures.len(), 2, "{}", done.errors);
        assert!(
            failures.iter().all(|l| l.contains("step 2 of 3: busy")),
            "{}",
            done.errors
        );
        assert_eq!(done.step_result.as_deref(), Some(r#"{"from":2}"#));
    }
);

db_test!(
    need_confirm_waits_on_the_last_step_and_a_rejection_resends_only_it,
    |db: Arc<TestDb>| async move {
        chain(
            &db,
            json!([handler_step("one"), handler_step("two")]),
            |s| s.need_confirm = true,
        )
        .await;
        let calls: Calls = Arc::default();
        let mut builder = db.notifier().config(quiet());
        builder = recorded(builder, &calls, "one", |_| Outcome::success());
        builder = recorded(builder, &calls, "two", |_| Outcome::success());
        let notifier = builder.build().unwrap();
        let id = add(&notifier).await;
        let worker = start(notifier.clone(), fast(WorkerConfig::default()));
        let awaiting = |n: usize| {
            let (db, calls) = (db.clone(), calls.clone());
            async move {
                let row = db.live().await.into_iter().find(|r| r.id == id)?;
                (row.status == Status::AwaitingConfirm && calls_of(&calls, "two").len() == n)
                    .then_some(row)
            }
        };
        let row = eventually(20, "the last step sent, awaiting", || awaiting(1)).await;
        assert_eq!(row.step, 1);
        notifier.reject(id, "not taken").await.unwrap();
        eventually(20, "the last step sent again", || awaiting(2)).await;
        notifier.confirm(id).await.unwrap();
        let done = db.history_of(id).await.unwrap();
        worker.stop().await;
        assert_eq!(done.status, Status::Succeeded);
        assert_eq!(calls_of(&calls, "one").len(), 1, "the first step ran once");
        assert!(done.errors.contains("step 2 of 2"), "{}", done.errors);
    }
);

db_test!(
    a_handler_step_then_an_http_step_resumes_at_the_receiver,
    |db: Arc<TestDb>| async move {
        // The receiver refuses the first request: the HTTP step is retried,
        // the handler step before it is not.
        let receiver = Receiver::start(|r| {
            if r.attempt == 1 {
                Reply::status(503)
            } else {
                Reply::ok()
            }
        })
        .await;
        chain(
            &db,
            json!([
                handler_step("reserve"),
                { "channel": "http", "target": { "url": receiver.url } }
            ]),
            |_| {},
        )
        .await;
        let calls: Calls = Arc::default();
        let builder = recorded(db.notifier().config(quiet()), &calls, "reserve", |_| {
            Outcome::success()
        });
        let notifier = builder.build().unwrap();
        let id = add(&notifier).await;
        let worker = start(notifier, fast(WorkerConfig::default()));
        succeeded(&db, id, "delivered at the receiver").await;
        worker.stop().await;
        assert_eq!(calls_of(&calls, "reserve").len(), 1);
        let seen = receiver.seen();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(receiver.overlaps().is_empty());
        // The second step has its own identity at the receiver.
        for request in &seen {
            assert_eq!(request.step.as_deref(), Some("2"));
            assert_eq!(request.idempotency_key, Some(format!("{id}:2")));
        }
    }
);

db_test!(
    shutdown_mid_step_keeps_the_steps_done_and_resumes_at_the_unfinished_one,
    |db: Arc<TestDb>| async move {
        chain(
            &db,
            json!([handler_step("one"), handler_step("slow")]),
            |_| {},
        )
        .await;
        let calls: Calls = Arc::default();
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlaps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let build = |calls: &Calls| {
            let (running, overlaps) = (running.clone(), overlaps.clone());
            let builder = recorded(db.notifier().config(quiet()), calls, "one", |_| {
                Outcome::success().with_result(json!("reserved"))
            });
            let calls = calls.clone();
            builder
                .handler("slow", move |n: Notice| {
                    let (running, overlaps, calls) =
                        (running.clone(), overlaps.clone(), calls.clone());
                    async move {
                        let first = {
                            let mut calls = calls.lock().unwrap();
                            calls.push(("slow".into(), n.step, n.previous_result.clone()));
                            calls.iter().filter(|c| c.0 == "slow").count() == 1
                        };
                        use std::sync::atomic::Ordering::SeqCst;
                        if running.fetch_add(1, SeqCst) > 0 {
                            overlaps.fetch_add(1, SeqCst);
                        }
                        // Ends with the call, also when the call is dropped.
                        struct Ends(Arc<std::sync::atomic::AtomicUsize>);
                        impl Drop for Ends {
                            fn drop(&mut self) {
                                self.0.fetch_sub(1, SeqCst);
                            }
                        }
                        let _ends = Ends(running);
                        if first {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                        }
                        Ok(Outcome::success())
                    }
                })
                .build()
                .unwrap()
        };
        let first = build(&calls);
        let id = add(&first).await;
        let worker = start(
            first.clone(),
            WorkerConfig {
                shutdown_timeout: Duration::from_millis(200),
                ..fast(WorkerConfig::default())
            },
        );
        eventually(20, "the second step running", || async {
            (calls_of(&calls, "slow").len() == 1).then_some(())
        })
        .await;
        // Stopped mid-step: the delivery is abandoned, the row released at
        // the step it was on.
        worker.stop().await;
        let row = db.live().await.into_iter().find(|r| r.id == id).unwrap();
        assert_eq!((row.step, row.leased), (1, false), "{row:?}");
        assert_eq!(row.step_result.as_deref(), Some(r#""reserved""#));
        let second = start(build(&calls), fast(WorkerConfig::default()));
        succeeded(&db, id, "finished by another worker").await;
        second.stop().await;
        assert_eq!(calls_of(&calls, "one").len(), 1, "the first step ran once");
        assert_eq!(
            calls_of(&calls, "slow"),
            vec![(1, Some(json!("reserved"))); 2]
        );
        assert_eq!(overlaps.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
);

db_test!(a_target_override_is_refused_on_several_steps, |db: Arc<
    TestDb,
>| async move {
    chain(
        &db,
        json!([handler_step("one"), handler_step("two")]),
        |_| {},
    )
    .await;
    let notifier = db
        .notifier()
        .handler("one", |_| async { Ok(Outcome::success()) })
        .handler("two", |_| async { Ok(Outcome::success()) })
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    let refused = tx
        .add(NewNotice::new("chain", &json!({})).target_override(json!({ "handler": "two" })))
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::InvalidNotice { .. }), "{refused}");
    // The transaction goes on; a notice without override is sent, both
    // steps, right after the commit.
    tx.add(NewNotice::new("chain", &json!({}))).await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert_eq!(
        reports[0].result,
        solid_notify::AttemptResult::Succeeded,
        "{reports:?}"
    );
    let history = db.history().await;
    assert_eq!((history.len(), history[0].step), (1, 1));
});

db_test!(
    each_step_renews_the_lease_so_long_chains_never_overlap,
    |db: Arc<TestDb>| async move {
        // Three steps of 0.7 s under a 2 s lease: 2.1 s in all. Without a
        // renewed lease a second worker would claim the notice while its
        // third step runs.
        chain(
            &db,
            json!([
                handler_step("step"),
                handler_step("step"),
                handler_step("step")
            ]),
            |_| {},
        )
        .await;
        let calls: Calls = Arc::default();
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlaps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let build = || {
            let (calls, running, overlaps) = (calls.clone(), running.clone(), overlaps.clone());
            db.notifier()
                .config(solid_notify::Config {
                    lease: Duration::from_secs(2),
                    attempt_timeout: Duration::from_secs(1),
                    ..quiet()
                })
                .handler("step", move |n: Notice| {
                    let (calls, running, overlaps) =
                        (calls.clone(), running.clone(), overlaps.clone());
                    async move {
                        use std::sync::atomic::Ordering::SeqCst;
                        calls.lock().unwrap().push(("step".into(), n.step, None));
                        if running.fetch_add(1, SeqCst) > 0 {
                            overlaps.fetch_add(1, SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        running.fetch_sub(1, SeqCst);
                        Ok(Outcome::success())
                    }
                })
                .build()
                .unwrap()
        };
        let first = build();
        let id = add(&first).await;
        let workers = [
            start(first, fast(WorkerConfig::default())),
            start(build(), fast(WorkerConfig::default())),
        ];
        let done = succeeded(&db, id, "the chain succeeded").await;
        for worker in workers {
            worker.stop().await;
        }
        assert_eq!(overlaps.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            calls_of(&calls, "step"),
            vec![(0, None), (1, None), (2, None)],
            "each step once, in order"
        );
        assert_eq!((done.step, done.retry_times), (2, 0));
    }
);

db_test!(a_large_step_result_reaches_the_next_step, |db: Arc<
    TestDb,
>| async move {
    chain(
        &db,
        json!([handler_step("one"), handler_step("two")]),
        |_| {},
    )
    .await;
    let big = "x".repeat(100_000);
    let calls: Calls = Arc::default();
    let mut builder = db.notifier().config(quiet());
    builder = recorded(builder, &calls, "one", {
        let big = big.clone();
        move |_| Outcome::success().with_result(json!({ "blob": big }))
    });
    builder = recorded(builder, &calls, "two", |_| Outcome::success());
    let notifier = builder.build().unwrap();
    let id = add(&notifier).await;
    let worker = start(notifier, fast(WorkerConfig::default()));
    succeeded(&db, id, "the chain succeeded").await;
    worker.stop().await;
    assert_eq!(
        calls_of(&calls, "two"),
        vec![(1, Some(json!({ "blob": big })))]
    );
});
