//! Pause and resume, by an operator or by a definition's circuit breaker.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{
    AttemptResult, Outcome, Status, WorkerConfig,
    ops::{Audit, Page, PauseEnd, Place, find},
};

use super::filter_def;
use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{Recorder, TestDb, eventually},
};

db_test!(
    a_paused_definition_is_not_claimed_nor_charged_then_goes_on_resume,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.def("free", "ship", |_| {}).await;
        notifier
            .pause(
                "ship",
                PauseEnd::OnResume,
                &Audit::new("erin", "receiver maintenance"),
            )
            .await
            .unwrap();
        // The after-commit attempt leaves it to a sweeper.
        let tx = notifier.begin().await.unwrap();
        let id = tx.add_notice("ship", &json!({"n": 1}), "").await.unwrap();
        let free = tx.add_notice("free", &json!({"n": 2}), "").await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let of = |id: i64| {
            reports
                .iter()
                .find(|r| r.notice_id == id)
                .unwrap()
                .result
                .clone()
        };
        assert!(
            matches!(of(id), AttemptResult::Skipped { .. }),
            "{:?}",
            of(id)
        );
        assert_eq!(of(free), AttemptResult::Succeeded);
        // Released for the sweepers, without a charge.
        eventually(10, "the reservation released", || async {
            let row = db.live().await.into_iter().find(|r| r.id == id)?;
            (!row.leased && row.retry_times == 0).then_some(())
        })
        .await;
        db.insert_due("ship", 3, |_| 0).await;
        // Sweeps (and workers of other processes) do not claim it.
        let other = db
            .notifier()
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        for n in [&notifier, &other] {
            assert!(n.sweep_once(100).await.unwrap().is_empty());
        }
        assert_eq!(rec.count_for(id), 0);
        let live = db.live().await;
        assert_eq!(live.len(), 4);
        assert!(
            live.iter()
                .all(|r| r.retry_times == 0 && r.status == Status::NotSent)
        );
        let listed = solid_notify::def::store::list(&db.db).await.unwrap();
        let ship = listed.iter().find(|(r, _)| r.name == "ship").unwrap();
        assert_eq!(
            ship.0.pause_reason.as_deref(),
            Some("paused by erin: receiver maintenance")
        );

        // Resumed from another process: this one sees it within its
        // def_cache_ttl (5 s); until then what it claims it releases.
        other.resume("ship", &Audit::operator()).await.unwrap();
        eventually(20, "all delivered after the resume", || async {
            notifier.sweep_once(100).await.unwrap();
            (db.counts().await == (0, 5)).then_some(())
        })
        .await;
        assert_eq!(rec.count_for(id), 1);
        assert_eq!(rec.count(), 5);
        assert!(db.history().await.iter().all(|r| r.retry_times == 0));

        // A pause with an end lifts by itself.
        notifier
            .pause(
                "ship",
                PauseEnd::After(Duration::from_secs(2)),
                &Audit::new("f", "g"),
            )
            .await
            .unwrap();
        db.insert_due("ship", 1, |_| 0).await;
        assert!(notifier.sweep_once(100).await.unwrap().is_empty());
        eventually(10, "the pause ended", || async {
            (notifier.sweep_once(100).await.unwrap().len() == 1).then_some(())
        })
        .await;
    }
);

db_test!(a_circuit_opens_alerts_once_probes_and_closes, |db: Arc<
    TestDb,
>| async move {
    use std::sync::atomic::{AtomicBool, Ordering};
    // The TOML form of the policy.
    let specs = solid_notify::def::file::parse(
        "[flaky]\nchannel = \"handler\"\ntarget = { handler = \"flaky\" }\n\
         retry_interval = \"1h\"\nalert_trigger_type = 2\nemail = \"oncall@example.com\"\n\
         circuit = { failures = 5, window = \"1m\", cool_down = \"2s\" }\n",
        "flaky.toml",
    )
    .unwrap();
    assert_eq!(
        (
            specs[0].circuit_failures,
            specs[0].circuit_window,
            specs[0].circuit_cool_down
        ),
        (5, 60, 2)
    );
    solid_notify::def::store::sync(&db.db, &specs)
        .await
        .unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let rec = Recorder::default();
    let flag = failing.clone();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "flaky",
            rec.handler(move |_| {
                if flag.load(Ordering::SeqCst) {
                    Outcome::retry("receiver down")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    db.insert_due("flaky", 20, |_| 0).await;
    let running = start(
        notifier.clone(),
        fast(WorkerConfig {
            concurrency: 1,
            ..WorkerConfig::default()
        }),
    );
    let paused = || async {
        let rows = solid_notify::def::store::list(&db.db).await.unwrap();
        let (row, _) = rows.into_iter().find(|(r, _)| r.name == "flaky").unwrap();
        let now = chrono::Utc::now().naive_utc();
        row.paused_until
            .filter(|u| *u > now)
            .map(|_| row.pause_reason.clone().unwrap_or_default())
    };
    let reason = eventually(20, "the circuit opened", || async { paused().await }).await;
    assert_eq!(reason, "circuit open: paused after 5 consecutive failures");
    assert_eq!(rec.count(), 5, "nothing attempted once it opened");

    // One probe after the cool-down; it fails: open again, no second alert.
    eventually(20, "the first probe", || async {
        (rec.count() == 6).then_some(())
    })
    .await;
    failing.store(false, Ordering::SeqCst);
    let reason = eventually(5, "re-opened", || async {
        paused().await.filter(|r| r.contains("probe failed"))
    })
    .await;
    assert_eq!(reason, "circuit open: the probe failed");
    assert_eq!(rec.count(), 6, "one probe per cool-down");

    // The next probe succeeds: closed, and the rest go (the six failed
    // notices wait for their retry, an hour away).
    let conn = &db.db;
    let flaky = |place| async move {
        find::list(conn, place, &filter_def("flaky"), Page::default())
            .await
            .unwrap()
            .len()
    };
    eventually(30, "closed and drained", || async {
        (paused().await.is_none()
            && flaky(Place::InFlight).await == 6
            && flaky(Place::History).await == 14)
            .then_some(())
    })
    .await;
    running.stop().await;
    // 5 failures, a failed probe, a good probe, the other 13 once each.
    assert_eq!(rec.count(), 5 + 1 + 1 + 13);
    let history = db.history().await;
    assert!(
        history
            .iter()
            .all(|r| r.status == Status::Succeeded && r.retry_times <= 1),
        "released attempts were not charged"
    );
    let alerts: Vec<String> = db
        .live()
        .await
        .into_iter()
        .map(|r| r.param)
        .chain(history.into_iter().map(|r| r.param))
        .filter(|p| p.contains("consecutive failures"))
        .collect();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert!(alerts[0].contains("oncall@example.com"));
});

db_test!(an_operator_resume_beats_an_open_circuit, |db: Arc<
    TestDb,
>| async move {
    use std::sync::atomic::{AtomicBool, Ordering};
    db.def("flaky", "flaky", |s| {
        s.retry_interval = "1h".into();
        s.alert_trigger_type = 2;
        s.circuit_failures = 3;
        s.circuit_cool_down = 3_600;
    })
    .await;
    let rec = Recorder::default();
    let failing = Arc::new(AtomicBool::new(true));
    let flag = failing.clone();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "flaky",
            rec.handler(move |_| {
                if flag.load(Ordering::SeqCst) {
                    Outcome::retry("down")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    db.insert_due("flaky", 10, |_| 0).await;
    let running = start(
        notifier.clone(),
        fast(WorkerConfig {
            concurrency: 1,
            ..WorkerConfig::default()
        }),
    );
    eventually(20, "the circuit opened", || async {
        let rows = solid_notify::def::store::list(&db.db).await.unwrap();
        rows.iter()
            .any(|(r, _)| r.name == "flaky" && r.pause_reason.is_some())
            .then_some(())
    })
    .await;
    assert_eq!(rec.count(), 3);
    // The receiver is fixed; an operator in another process resumes at
    // once instead of waiting an hour for the probe.
    failing.store(false, Ordering::SeqCst);
    db.notifier()
        .build()
        .unwrap()
        .resume("flaky", &Audit::operator())
        .await
        .unwrap();
    eventually(
        30,
        "the other seven delivered by the opening process",
        || async {
            let done = find::list(
                &db.db,
                Place::History,
                &filter_def("flaky"),
                Page::default(),
            )
            .await
            .unwrap();
            (done.len() == 7).then_some(())
        },
    )
    .await;
    running.stop().await;
    assert_eq!(rec.count(), 3 + 7);
});

db_test!(
    a_circuit_that_trips_once_shutdown_began_pauses_nothing,
    |db: Arc<TestDb>| async move {
        db.def("flaky", "flaky", |spec| {
            spec.circuit_failures = 3;
            spec.retry_interval = "1h".into();
        })
        .await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .config(quiet())
            .handler("flaky", rec.handler(|_| Outcome::retry("receiver down")))
            .build()
            .unwrap();
        // A timeout too long to add up waits without a deadline.
        notifier.shutdown(Duration::MAX).await.unwrap();
        // A clone (or a caller of `attempt`) still delivers after this one
        // shut down: three failures trip the breaker.
        db.insert_due("flaky", 3, |_| 0).await;
        for row in db.live().await {
            let report = notifier.attempt(row).await;
            assert!(
                matches!(report.result, AttemptResult::WillRetry { .. }),
                "{report:?}"
            );
        }
        assert_eq!(rec.count(), 3);
        // Shutdown waits for the controller the trip started; it must not
        // have paused the definition for every process with no one left
        // here to probe it.
        notifier.shutdown(Duration::from_secs(5)).await.unwrap();
        let rows = solid_notify::def::store::list(&db.db).await.unwrap();
        let (row, _) = rows.into_iter().find(|(r, _)| r.name == "flaky").unwrap();
        assert_eq!(
            (row.paused_until, row.pause_reason.clone()),
            (None, None),
            "paused by a circuit that opened during shutdown"
        );
    }
);
