//! Operational events (`events_to`): each kind reaches a real HTTP receiver
//! with the documented JSON; an event definition's own failures fall back to
//! e-mail through a real SMTP server, with no loop; a worker killed with
//! events pending loses none.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use solid_notify::{
    Config, Origin, Outcome, Status, WorkerConfig,
    def::{Channel, DefSpec, store},
    ops::{Audit, PauseEnd},
};

use crate::{
    db_test,
    faults::{fast, quiet, start},
    mail::mail_config,
    receiver::{Receiver, Reply},
    smtp::SmtpServer,
    support::{KillOnDrop, Recorder, TestDb, eventually, worker_process},
};

const DASHBOARD: &str = "https://ops.example.com/notify";

/// A receiver that answers `status()` and keeps the body of each request
/// answered 200 at once.
async fn collecting(status: impl Fn() -> Reply + Send + Sync + 'static) -> (Receiver, Bodies) {
    let bodies = Bodies::default();
    let keep = bodies.clone();
    let receiver = Receiver::start(move |r| {
        let reply = status();
        if reply.status == 200 && reply.delay.is_zero() {
            keep.0.lock().unwrap().push((r.id, r.body.clone()));
        }
        reply
    })
    .await;
    (receiver, bodies)
}

/// The bodies a receiver answered 200 to, by notice id.
#[derive(Clone, Default)]
struct Bodies(Arc<Mutex<Vec<(i64, String)>>>);

impl Bodies {
    /// The event documents delivered, one per event notice (a redelivery
    /// counts once), in id order.
    fn events(&self) -> Vec<Value> {
        let by_id: BTreeMap<i64, Value> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(id, body)| (*id, serde_json::from_str(body).unwrap()))
            .collect();
        by_id.into_values().collect()
    }

    fn of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["type"] == kind)
            .collect()
    }
}

/// An HTTP definition to `url`, retried every second.
fn http_def(name: &str, url: &str, edit: impl FnOnce(&mut DefSpec)) -> DefSpec {
    let mut spec = DefSpec::new(name, Channel::Http, json!({ "url": url }));
    spec.retry_interval = "1s".into();
    edit(&mut spec);
    spec
}

fn handler_def(name: &str, edit: impl FnOnce(&mut DefSpec)) -> DefSpec {
    let mut spec = DefSpec::new(name, Channel::Handler, json!({ "handler": name }));
    spec.retry_interval = "1s".into();
    edit(&mut spec);
    spec
}

/// A handler that fails with `reason` (retryable) while `down` is set,
/// then succeeds.
fn failing_while(
    rec: &Recorder,
    down: Arc<AtomicBool>,
    reason: &'static str,
) -> impl solid_notify::Handler {
    rec.handler(move |_| {
        if down.load(Ordering::SeqCst) {
            Outcome::retry(reason)
        } else {
            Outcome::success()
        }
    })
}

fn with_dashboard(config: Config) -> Config {
    Config {
        dashboard_url: Some(DASHBOARD.into()),
        ..config
    }
}

/// Checks the fields every event has, for definition `def`.
fn check_common(event: &Value, def: &str) {
    assert_eq!(event["version"], 1, "{event}");
    assert_eq!(event["definition"]["name"], def, "{event}");
    assert!(event["definition"]["id"].as_i64().is_some(), "{event}");
    let at = event["at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(at).is_ok() && at.ends_with('Z'),
        "{event}"
    );
    assert!(event["reason"].as_str().is_some(), "{event}");
    assert!(
        event["link"].as_str().unwrap().starts_with(DASHBOARD),
        "{event}"
    );
}

db_test!(
    each_kind_reaches_a_real_http_receiver_as_documented,
    |db: Arc<TestDb>| async move {
        let (ops, bodies) = collecting(Reply::ok).await;
        // events_to is checked: it must name a definition, not its own.
        let unknown = handler_def("orders", |s| s.events_to = "nope".into());
        let err = store::sync(&db.db, &[unknown]).await.unwrap_err();
        assert!(err.to_string().contains("events_to"), "{err}");
        let own = handler_def("orders", |s| s.events_to = "orders".into());
        assert!(store::sync(&db.db, &[own]).await.is_err());
        let alerts = handler_def("orders", |s| s.events_to = "solid_notify_alert".into());
        assert!(store::sync(&db.db, &[alerts]).await.is_err());
        store::sync(
            &db.db,
            &[
                http_def("ops", &ops.url, |_| {}),
                handler_def("orders", |s| {
                    s.alert_trigger_type = 1;
                    s.max_retry_times = 3;
                    s.ordering = "per_key".into();
                    s.events_to = "ops".into();
                }),
                handler_def("flaky", |s| {
                    s.alert_trigger_type = 2;
                    s.circuit_failures = 2;
                    s.circuit_cool_down = 1;
                    s.events_to = "ops".into();
                }),
            ],
        )
        .await
        .unwrap();
        let refusing = Arc::new(AtomicBool::new(true));
        let down = Arc::new(AtomicBool::new(true));
        let (refuse, flaky_down) = (refusing.clone(), down.clone());
        let notifier = db
            .notifier()
            .config(with_dashboard(quiet()))
            .handler(
                "orders",
                Recorder::default().handler(move |n| match n.param["mode"].as_str() {
                    Some("recover") if n.attempt == 1 => Outcome::retry("receiver down: 503"),
                    Some("fail") if refuse.load(Ordering::SeqCst) => {
                        Outcome::permanent("refused: unknown order")
                    }
                    _ => Outcome::success(),
                }),
            )
            .handler(
                "flaky",
                failing_while(&Recorder::default(), flaky_down, "flaky: down"),
            )
            .build()
            .unwrap();
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        let tx = notifier.begin().await.unwrap();
        let add = async |mode: &str, key: &str| {
            let notice = solid_notify::NewNotice::new(
                "orders",
                &json!({"mode": mode, "card": "4111-SECRET-PARAM"}),
            )
            .ordering_key(key);
            tx.add(notice).await.unwrap()
        };
        let recovering = add("recover", "ka").await;
        let cancelled = add("fail", "kb").await;
        let requeued = add("fail", "kc").await;
        tx.commit().await.unwrap();

        // notice.failing, notice.recovered, notice.failed and key.blocked.
        eventually(30, "the recovery and two final failures", || async {
            let mut statuses = Vec::new();
            for id in [recovering, cancelled, requeued] {
                statuses.push(db.history_of(id).await.map(|r| r.status));
            }
            (statuses
                == [
                    Some(Status::Succeeded),
                    Some(Status::FinalFailure),
                    Some(Status::FinalFailure),
                ])
            .then_some(())
        })
        .await;
        // key.released: by a cancel, and by a requeue that then succeeds.
        let audit = Audit::new("erin", "order fixed");
        notifier.cancel(cancelled, &audit).await.unwrap();
        refusing.store(false, Ordering::SeqCst);
        notifier.requeue(requeued, &audit).await.unwrap();
        // definition.paused and definition.resumed, once: a second resume of
        // a definition not paused writes nothing.
        notifier
            .pause("orders", PauseEnd::OnResume, &audit)
            .await
            .unwrap();
        notifier.resume("orders", &audit).await.unwrap();
        notifier.resume("orders", &audit).await.unwrap();
        // circuit.opened (with definition.paused), then circuit.closed (with
        // definition.resumed) once the probe is delivered.
        db.insert_due("flaky", 3, |_| 0).await;
        eventually(30, "the circuit opened", || async {
            (!bodies.of("circuit.opened").is_empty()).then_some(())
        })
        .await;
        down.store(false, Ordering::SeqCst);
        eventually(30, "every event delivered", || async {
            (bodies.events().len() >= 14 && !bodies.of("circuit.closed").is_empty()).then_some(())
        })
        .await;
        eventually(30, "everything finished", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        running.stop().await;

        let events = bodies.events();
        let kinds: Vec<(&str, &str)> = events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap(),
                    e["definition"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        let count = |kind: &str, def: &str| kinds.iter().filter(|k| **k == (kind, def)).count();
        for (kind, def, n) in [
            ("notice.failing", "orders", 1),
            ("notice.recovered", "orders", 1),
            ("notice.failed", "orders", 2),
            ("key.blocked", "orders", 2),
            ("key.released", "orders", 2),
            ("definition.paused", "orders", 1),
            ("definition.resumed", "orders", 1),
            ("definition.paused", "flaky", 1),
            ("definition.resumed", "flaky", 1),
            ("circuit.opened", "flaky", 1),
            ("circuit.closed", "flaky", 1),
            // Alert type 2: never reported failing, so no recovery either.
            ("notice.failing", "flaky", 0),
            ("notice.recovered", "flaky", 0),
            ("notice.failed", "flaky", 0),
        ] {
            assert_eq!(count(kind, def), n, "{kind} of {def} in {kinds:?}");
        }
        assert_eq!(kinds.len(), 14, "{kinds:?}");
        for event in &events {
            let body = event.to_string();
            assert!(!body.contains("SECRET-PARAM"), "the param leaked: {body}");
        }
        let failing = &bodies.of("notice.failing")[0];
        check_common(failing, "orders");
        assert_eq!(failing["notice"]["id"], recovering);
        assert_eq!(
            (
                &failing["notice"]["attempt"],
                &failing["notice"]["failures"],
                &failing["notice"]["ordering_key"]
            ),
            (&json!(1), &json!(1), &json!("ka"))
        );
        assert!(failing["notice"]["next_attempt_at"].is_string());
        assert_eq!(failing["reason"], "receiver down: 503");
        assert_eq!(failing["link"], format!("{DASHBOARD}/notices/{recovering}"));
        let recovered = bodies
            .of("notice.recovered")
            .into_iter()
            .find(|e| e["definition"]["name"] == "orders")
            .unwrap();
        let recovered = &recovered;
        check_common(recovered, "orders");
        assert_eq!(
            (&recovered["notice"]["id"], &recovered["notice"]["attempt"]),
            (&json!(recovering), &json!(2))
        );
        let failed: HashSet<i64> = bodies
            .of("notice.failed")
            .iter()
            .inspect(|e| {
                check_common(e, "orders");
                assert_eq!(e["reason"], "refused: unknown order");
            })
            .map(|e| e["notice"]["id"].as_i64().unwrap())
            .collect();
        assert_eq!(failed, HashSet::from([cancelled, requeued]));
        for kind in ["key.blocked", "key.released"] {
            let keys: HashSet<String> = bodies
                .of(kind)
                .iter()
                .inspect(|e| {
                    check_common(e, "orders");
                    assert_eq!(e["link"], format!("{DASHBOARD}/keys/blocked?def=orders"));
                })
                .map(|e| e["key"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(keys, HashSet::from(["kb".into(), "kc".into()]), "{kind}");
        }
        let released = bodies.of("key.released");
        assert!(
            released
                .iter()
                .any(|e| e["reason"] == "cancelled by erin: order fixed")
        );
        assert!(
            released
                .iter()
                .any(|e| e["reason"] == "requeued by erin: order fixed")
        );
        let paused = bodies.of("definition.paused");
        let by_operator = paused
            .iter()
            .find(|e| e["definition"]["name"] == "orders")
            .unwrap();
        assert_eq!(by_operator["reason"], "paused by erin: order fixed");
        assert!(by_operator.get("paused_until").is_none(), "until resumed");
        let by_circuit = paused
            .iter()
            .find(|e| e["definition"]["name"] == "flaky")
            .unwrap();
        check_common(by_circuit, "flaky");
        assert!(by_circuit["paused_until"].is_string());
        let opened = &bodies.of("circuit.opened")[0];
        check_common(opened, "flaky");
        assert!(
            opened["reason"]
                .as_str()
                .unwrap()
                .contains("2 consecutive failures"),
            "{opened}"
        );
        assert!(opened["paused_until"].is_string());
        check_common(&bodies.of("circuit.closed")[0], "flaky");
        let resumed: HashSet<String> = bodies
            .of("definition.resumed")
            .iter()
            .map(|e| e["definition"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(resumed, HashSet::from(["orders".into(), "flaky".into()]));
        // Each event is a notice of `ops`, described by its kind.
        let history = db.history().await;
        let ops_id = history
            .iter()
            .find(|r| r.description == "solid-notify event circuit.opened")
            .unwrap()
            .def_id;
        assert_eq!(
            history.iter().filter(|r| r.def_id == ops_id).count(),
            events.len(),
            "one notice per event"
        );
    }
);

db_test!(
    a_failing_event_definition_falls_back_to_email_with_no_loop,
    |db: Arc<TestDb>| async move {
        let smtp = SmtpServer::start().await;
        let (broken, _) = collecting(|| Reply::status(500)).await;
        // `orders` and `ops` send their events to each other: a loop if
        // events raised events. `billing` sends to `ops2`, which has no
        // `email`: its failures go to the alert definition's recipients.
        store::sync(
            &db.db,
            &[
                http_def("ops", &broken.url, |s| {
                    s.max_retry_times = 1;
                    s.email = "oncall@example.com".into();
                    s.events_to = "orders".into();
                }),
                http_def("ops2", &broken.url, |s| s.max_retry_times = 1),
                handler_def("orders", |s| {
                    s.max_retry_times = 0;
                    s.events_to = "ops".into();
                }),
                handler_def("billing", |s| {
                    s.max_retry_times = 0;
                    s.events_to = "ops2".into();
                }),
            ],
        )
        .await
        .unwrap();
        db.db
            .execute_unprepared(
                "UPDATE notify_def SET email = 'fallback@example.com' WHERE name = 'solid_notify_alert'",
            )
            .await
            .unwrap();
        let notifier = db
            .notifier()
            .config(mail_config(Some(&smtp), None))
            .handler(
                "orders",
                Recorder::default().handler(|_| Outcome::permanent("refused")),
            )
            .handler(
                "billing",
                Recorder::default().handler(|_| Outcome::permanent("refused")),
            )
            .build()
            .unwrap();
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        let tx = notifier.begin().await.unwrap();
        tx.add_notice("orders", &json!({"n": 1}), "").await.unwrap();
        tx.add_notice("billing", &json!({"n": 2}), "")
            .await
            .unwrap();
        // A producer's description is free text: one that reads like an
        // event's is still a producer's notice, and its failure raises an
        // event like any other.
        tx.add_notice(
            "orders",
            &json!({"n": 3}),
            "solid-notify event notice.failed",
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        eventually(30, "the three alert mails", || async {
            (smtp.to("oncall@example.com").len() == 2 && smtp.to("fallback@example.com").len() == 1)
                .then_some(())
        })
        .await;
        eventually(30, "nothing left in flight", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        running.stop().await;
        let oncall = &smtp.to("oncall@example.com")[0];
        assert!(
            oncall.subject.contains("ops:") && oncall.subject.contains("failed for good"),
            "{oncall:?}"
        );
        assert!(smtp.to("fallback@example.com")[0].subject.contains("ops2:"));
        // Three producer notices (two of orders, one of billing), one event
        // about each (two for ops, one for ops2), and an alert mail about
        // each event: nothing raised an event about an event.
        let history = db.history().await;
        let of = |origin: Origin| history.iter().filter(|r| r.origin == origin).count();
        assert_eq!(of(Origin::Producer), 3, "{history:#?}");
        assert_eq!(of(Origin::Event), 3, "{history:#?}");
        assert_eq!(of(Origin::Alert), 3, "{history:#?}");
        assert_eq!(history.len(), 3 + 3 + 3, "{history:#?}");
        assert_eq!(smtp.messages().len(), 3);
    }
);

db_test!(a_worker_killed_with_events_pending_loses_none, |db: Arc<
    TestDb,
>| async move {
    let (orders, _) = collecting(|| Reply::status(500)).await;
    // The event receiver hangs until the first worker is killed.
    let hang = Arc::new(AtomicBool::new(true));
    let hanging = hang.clone();
    let (ops, bodies) = collecting(move || {
        if hanging.load(Ordering::SeqCst) {
            Reply::ok().after(Duration::from_secs(60))
        } else {
            Reply::ok()
        }
    })
    .await;
    store::sync(
        &db.db,
        &[
            http_def("ops", &ops.url, |s| s.max_retry_times = -1),
            // A key in the query string must not reach an event.
            http_def(
                "orders",
                &format!("{}?token=SECRET-TOKEN", orders.url),
                |s| {
                    s.max_retry_times = 0;
                    s.events_to = "ops".into();
                },
            ),
        ],
    )
    .await
    .unwrap();
    const N: usize = 20;
    db.insert_due("orders", N, |_| 0).await;
    let flags = [
        "--mode",
        "fixed-delay",
        "--delay",
        "50ms",
        "--lease",
        "4s",
        "--attempt-timeout",
        "2s",
    ];
    let mut first: KillOnDrop = worker_process(&db, &flags);
    eventually(60, "every order failed, events in flight", || async {
        let failed = db
            .history()
            .await
            .iter()
            .filter(|r| r.status == Status::FinalFailure)
            .count();
        let hung = ops.seen().iter().any(|s| !s.answered);
        (failed == N && hung).then_some(())
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(bodies.events().is_empty(), "nothing was delivered yet");
    hang.store(false, Ordering::SeqCst);
    let _second = worker_process(&db, &flags);
    eventually(60, "an event for every order, after the kill", || async {
        (bodies.of("notice.failed").len() == N).then_some(())
    })
    .await;
    let ids: HashSet<i64> = bodies
        .of("notice.failed")
        .iter()
        .map(|e| e["notice"]["id"].as_i64().unwrap())
        .collect();
    let orders_ids: HashSet<i64> = db
        .history()
        .await
        .iter()
        .filter(|r| r.status == Status::FinalFailure)
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, orders_ids, "one event per final failure, none lost");
    for event in bodies.events() {
        assert!(!event.to_string().contains("SECRET-TOKEN"), "{event}");
    }
    eventually(30, "the events finished", || async {
        (db.counts().await.0 == 0).then_some(())
    })
    .await;
});

db_test!(
    an_operator_resume_of_an_open_circuit_closes_it_in_the_events,
    |db: Arc<TestDb>| async move {
        let (ops, bodies) = collecting(Reply::ok).await;
        store::sync(
            &db.db,
            &[
                http_def("ops", &ops.url, |_| {}),
                handler_def("flaky", |s| {
                    s.alert_trigger_type = 2;
                    s.circuit_failures = 2;
                    s.circuit_cool_down = 1;
                    s.events_to = "ops".into();
                }),
            ],
        )
        .await
        .unwrap();
        let down = Arc::new(AtomicBool::new(true));
        let flag = down.clone();
        let notifier = db
            .notifier()
            .config(with_dashboard(quiet()))
            .handler("flaky", failing_while(&Recorder::default(), flag, "down"))
            .build()
            .unwrap();
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        db.insert_due("flaky", 3, |_| 0).await;
        eventually(30, "the circuit opened", || async {
            (!bodies.of("circuit.opened").is_empty()).then_some(())
        })
        .await;
        // The receiver is fixed; another process's operator resumes before
        // the probe.
        down.store(false, Ordering::SeqCst);
        db.notifier()
            .config(with_dashboard(quiet()))
            .build()
            .unwrap()
            .resume("flaky", &Audit::new("erin", "receiver fixed"))
            .await
            .unwrap();
        eventually(30, "circuit.closed after the operator's resume", || async {
            (!bodies.of("circuit.closed").is_empty()).then_some(())
        })
        .await;
        running.stop().await;
        let resumed = bodies.of("definition.resumed");
        assert_eq!(resumed.len(), 1, "{resumed:?}");
        assert_eq!(resumed[0]["reason"], "resumed by erin: receiver fixed");
        let closed = bodies.of("circuit.closed");
        assert_eq!(closed.len(), 1, "{closed:?}");
        assert_eq!(
            closed[0]["reason"],
            "an operator resumed or paused the definition meanwhile"
        );
        check_common(&closed[0], "flaky");
    }
);

db_test!(
    a_worker_limited_to_partitions_delivers_the_events,
    |db: Arc<TestDb>| async move {
        let (ops, bodies) = collecting(Reply::ok).await;
        store::sync(
            &db.db,
            &[
                http_def("ops", &ops.url, |_| {}),
                handler_def("orders", |s| {
                    s.max_retry_times = 0;
                    s.events_to = "ops".into();
                }),
            ],
        )
        .await
        .unwrap();
        // Notices of partition 1 only; every worker takes partition 1 alone.
        let notifier = db
            .notifier()
            .config(Config {
                load_balance: solid_notify::LoadBalance::Fixed { num: 1 },
                ..quiet()
            })
            .handler(
                "orders",
                Recorder::default().handler(|_| Outcome::permanent("refused")),
            )
            .build()
            .unwrap();
        let running = start(
            notifier.clone(),
            fast(WorkerConfig {
                partitions: vec![1],
                ..WorkerConfig::default()
            }),
        );
        let tx = notifier.begin().await.unwrap();
        tx.add_notice("orders", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        // notice.failed, written by the recorder (partition 0), and
        // definition.paused / resumed, written by an operator.
        eventually(30, "the failure's event delivered", || async {
            (!bodies.of("notice.failed").is_empty()).then_some(())
        })
        .await;
        notifier
            .pause(
                "orders",
                solid_notify::ops::PauseEnd::OnResume,
                &solid_notify::ops::Audit::operator(),
            )
            .await
            .unwrap();
        eventually(30, "the pause's event delivered", || async {
            (!bodies.of("definition.paused").is_empty()).then_some(())
        })
        .await;
        running.stop().await;
        eventually(5, "nothing left in flight", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
    }
);
