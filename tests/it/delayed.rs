//! Delayed notices (`NewNotice::delay`, `NewNotice::not_before`, a plain-SQL
//! row written due later): no attempt before their time, after commit or in
//! a sweep; delivered within a second after it by a worker that polls only
//! every 30 s, in process and from another process; not sent early after a
//! restart (a graceful stop, or a SIGKILL of a worker process), nor by
//! their key's turn; shown as scheduled; a cancelled one is
//! never sent, and a requeue makes it due at once.

use solid_notify::ops::Audit;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{NaiveDateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend};
use serde_json::json;
use solid_notify::{
    AttemptResult, NewNotice, Notifier, Outcome, Status, WorkerConfig,
    def::{Channel, DefSpec, store},
};

use crate::{
    db_test,
    faults::{quiet, start},
    ops::cli,
    receiver::Receiver,
    support::{Recorder, TestDb, eventually, test_config, worker_process},
    wake::slow_poll,
};

/// A worker process's flags: it polls only every 30 s.
const SLOW_POLL: &[&str] = &["--mode", "fixed-delay", "--delay", "30s"];

/// When each notice was delivered (UTC, this host's clock).
#[derive(Clone, Default)]
struct Times(Arc<Mutex<HashMap<i64, Vec<NaiveDateTime>>>>);

impl Times {
    fn of(&self, id: i64) -> Vec<NaiveDateTime> {
        self.0.lock().unwrap().get(&id).cloned().unwrap_or_default()
    }
}

/// A notifier delivering `def` (and `ordered`, ordered per key) to a
/// recording handler.
async fn notifier(db: &TestDb, config: solid_notify::Config) -> (Notifier, Times) {
    db.def("later", "later", |s| s.retry_interval = "1s".into())
        .await;
    db.def("later_ordered", "later", |s| {
        s.retry_interval = "1s".into();
        s.ordering = "per_key".into();
    })
    .await;
    let times = Times::default();
    let rec = Recorder::default();
    let handler = rec.handler({
        let times = times.clone();
        move |n| {
            times
                .0
                .lock()
                .unwrap()
                .entry(n.id)
                .or_default()
                .push(Utc::now().naive_utc());
            Outcome::success()
        }
    });
    let notifier = db
        .notifier()
        .config(config)
        .handler("later", handler)
        .build()
        .unwrap();
    (notifier, times)
}

/// The stored `not_before` of notice `id` (in flight or in history).
async fn not_before(notifier: &Notifier, id: i64) -> NaiveDateTime {
    notifier
        .status(id)
        .await
        .unwrap()
        .not_before
        .expect("a delayed notice has not_before")
}

/// Asserts `id` was delivered once, no earlier than its `not_before` and
/// within a second after it.
fn on_time(times: &Times, id: i64, due: NaiveDateTime) {
    let sent = times.of(id);
    assert_eq!(sent.len(), 1, "notice {id} delivered once: {sent:?}");
    let late = sent[0] - due;
    assert!(
        late >= chrono::Duration::zero(),
        "notice {id} sent {late} before its time {due}"
    );
    assert!(
        late < chrono::Duration::seconds(1),
        "notice {id} sent {late} after its time {due}"
    );
}

async fn wait_delivered(times: &Times, ids: &[i64], secs: u64) {
    eventually(secs, "the delayed notices delivered", || async {
        ids.iter().all(|id| !times.of(*id).is_empty()).then_some(())
    })
    .await;
}

db_test!(
    a_delayed_notice_waits_for_its_time_and_no_longer,
    |db: Arc<TestDb>| async move {
        let (notifier, times) = notifier(&db, test_config()).await;
        let running = start(notifier.clone(), slow_poll());
        let tx = notifier.begin().await.unwrap();
        let by = tx
            .add(NewNotice::new("later", &json!({"by": 1})).delay(Duration::from_secs(4)))
            .await
            .unwrap();
        let at = tx
            .add(
                NewNotice::new("later", &json!({"at": 1}))
                    .not_before(Utc::now() + chrono::Duration::milliseconds(4500)),
            )
            .await
            .unwrap();
        // A time already past: due at once, for a sweeper (the database's
        // clock decides, not this host's).
        let past = tx
            .add(
                NewNotice::new("later", &json!({"past": 1}))
                    .not_before(Utc::now() - chrono::Duration::seconds(5)),
            )
            .await
            .unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let result = |id: i64| {
            reports
                .iter()
                .find(|r| r.notice_id == id)
                .map(|r| r.result.clone())
        };
        assert_eq!(result(by), Some(AttemptResult::Scheduled));
        assert_eq!(result(at), Some(AttemptResult::Scheduled));
        assert_eq!(result(past), Some(AttemptResult::Scheduled));
        eventually(2, "a time already past is sent at once", || async {
            (!times.of(past).is_empty()).then_some(())
        })
        .await;
        for id in [by, at] {
            let view = notifier.status(id).await.unwrap();
            assert!(
                view.scheduled && view.state() == "scheduled",
                "{id} is shown as scheduled: {view:?}"
            );
        }
        let (ok, out, err) = cli(&db, &["show", &by.to_string()]);
        assert!(ok, "{err}");
        assert!(out.contains("(scheduled)"), "show says scheduled: {out}");
        let (ok, out, err) = cli(&db, &["list", "--def", "later"]);
        assert!(ok, "{err}");
        assert!(out.contains("scheduled"), "list says scheduled: {out}");
        let (base, stop) = crate::dashboard::serve(&db, Default::default()).await;
        let http = crate::dashboard::client();
        let page = |path: String| {
            let http = http.clone();
            async move { http.get(path).send().await.unwrap().text().await.unwrap() }
        };
        let shown = page(format!("{base}/notices/{by}")).await;
        assert!(
            shown.contains(r#"class="scheduled""#),
            "the notice page says scheduled: {shown}"
        );
        assert!(shown.contains("Not before"), "{shown}");
        let listed = page(format!("{base}/notices?place=in_flight&def=later")).await;
        assert!(
            listed.contains(r#"class="scheduled""#),
            "the list says scheduled: {listed}"
        );
        let api: serde_json::Value =
            serde_json::from_str(&page(format!("{base}/api/notices/{by}")).await).unwrap();
        assert_eq!(api["scheduled"], true, "{api}");
        stop.cancel();
        let due_by = not_before(&notifier, by).await;
        let due_at = not_before(&notifier, at).await;
        wait_delivered(&times, &[by, at], 10).await;
        on_time(&times, by, due_by);
        on_time(&times, at, due_at);
        let done = db.history_of(by).await.unwrap();
        assert_eq!(done.status, Status::Succeeded);
        running.stop().await;
    }
);

db_test!(
    a_worker_restarted_before_the_time_does_not_send_early,
    |db: Arc<TestDb>| async move {
        let (notifier, times) = notifier(&db, test_config()).await;
        let first = start(notifier.clone(), slow_poll());
        let id = notifier
            .add(
                &db.db,
                NewNotice::new("later", &json!({})).delay(Duration::from_millis(2500)),
            )
            .await
            .unwrap()
            .id();
        // The first worker has seen it (its sweeps ran) and stops.
        first.stop().await;
        let second = start(notifier.clone(), slow_poll());
        let due = not_before(&notifier, id).await;
        wait_delivered(&times, &[id], 8).await;
        on_time(&times, id, due);
        second.stop().await;
    }
);

db_test!(
    a_cancelled_scheduled_notice_is_never_sent_and_a_requeue_sends_it_now,
    |db: Arc<TestDb>| async move {
        let (notifier, times) = notifier(&db, test_config()).await;
        let running = start(notifier.clone(), slow_poll());
        let add = |delay: Duration| {
            let notifier = notifier.clone();
            let db = db.clone();
            async move {
                notifier
                    .add(&db.db, NewNotice::new("later", &json!({})).delay(delay))
                    .await
                    .unwrap()
                    .id()
            }
        };
        let cancelled = add(Duration::from_millis(1500)).await;
        let marker = add(Duration::from_millis(1500)).await;
        let far = add(Duration::from_secs(3600)).await;
        let sent_now = add(Duration::from_secs(3600)).await;
        notifier
            .cancel(cancelled, &Audit::operator())
            .await
            .unwrap();
        notifier.cancel(far, &Audit::operator()).await.unwrap();
        // The marker, due with the cancelled one, is sent: the sweep that
        // would have sent the cancelled one has run.
        wait_delivered(&times, &[marker], 6).await;
        assert!(
            times.of(cancelled).is_empty(),
            "a cancelled notice is never sent"
        );
        let view = notifier.status(cancelled).await.unwrap();
        assert_eq!(view.status, Status::Cancelled);
        assert!(!view.scheduled);
        // A requeue makes a notice delayed by an hour due at once: once
        // cancelled, or while it is still scheduled ("send now").
        notifier.requeue(far, &Audit::operator()).await.unwrap();
        assert_eq!(notifier.status(far).await.unwrap().not_before, None);
        let (ok, out, err) = cli(
            &db,
            &[
                "requeue",
                &sent_now.to_string(),
                "--reason",
                "customer asked",
            ],
        );
        assert!(ok, "{out} {err}");
        wait_delivered(&times, &[far, sent_now], 5).await;
        // Delivered; its success is recorded right after.
        let done = eventually(5, "the success recorded", || async {
            let view = notifier.status(sent_now).await.unwrap();
            (view.status == Status::Succeeded).then_some(view)
        })
        .await;
        assert!(
            done.errors
                .iter()
                .any(|l| l.contains("sent now (was scheduled) by")),
            "{:?}",
            done.errors
        );
        running.stop().await;
    }
);

db_test!(
    a_delayed_notice_holds_its_key_and_its_key_does_not_send_it_early,
    |db: Arc<TestDb>| async move {
        let (notifier, times) = notifier(&db, test_config()).await;
        let running = start(notifier.clone(), slow_poll());
        let keyed = |key: &str, delay: Option<Duration>| {
            let notice = NewNotice::new("later_ordered", &json!({})).ordering_key(key);
            match delay {
                Some(d) => notice.delay(d),
                None => notice,
            }
        };
        // A delayed head holds the younger notice of its key.
        let tx = notifier.begin().await.unwrap();
        let head = tx
            .add(keyed("k1", Some(Duration::from_millis(1500))))
            .await
            .unwrap();
        let behind = tx.add(keyed("k1", None)).await.unwrap();
        // A delayed notice behind one sent at once is not made due by its
        // turn (the finish of the one before it), and holds the next.
        let first = tx.add(keyed("k2", None)).await.unwrap();
        let middle = tx
            .add(keyed("k2", Some(Duration::from_millis(2000))))
            .await
            .unwrap();
        let last = tx.add(keyed("k2", None)).await.unwrap();
        tx.commit().await.unwrap();
        let due_head = not_before(&notifier, head).await;
        let due_middle = not_before(&notifier, middle).await;
        wait_delivered(&times, &[head, behind, first, middle, last], 10).await;
        on_time(&times, head, due_head);
        on_time(&times, middle, due_middle);
        let sent = |id| times.of(id)[0];
        assert!(sent(behind) >= sent(head), "the key's order is kept");
        assert!(sent(first) <= sent(middle) && sent(middle) <= sent(last));
        running.stop().await;
    }
);

db_test!(
    a_worker_process_sends_another_process_s_delayed_notices_on_time,
    |db: Arc<TestDb>| async move {
        let receiver = Receiver::start(|_| crate::receiver::Reply::ok()).await;
        let mut spec = DefSpec::new("later_http", Channel::Http, json!({ "url": receiver.url }));
        spec.retry_interval = "1s".into();
        store::sync(&db.db, &[spec]).await.unwrap();
        let clock = (Instant::now(), Utc::now().naive_utc());
        let utc = |at: Instant| clock.1 + (at - clock.0);
        let worker = worker_process(&db, SLOW_POLL);
        eventually(30, "the worker process is up", || async {
            (db.scalar("SELECT COUNT(*) FROM notify_worker").await > 0).then_some(())
        })
        .await;
        // A notice due now, sent by the worker: its sweep has run and asked
        // what is due next. Past that sweep's end, only a wake-up (NOTIFY
        // on PostgreSQL) or an ask on `due_check_every` (elsewhere) can tell
        // the worker of the notices below before its 30 s poll.
        db.db
            .execute_unprepared(
                "INSERT INTO notify_msg (def_id, param) SELECT id, '{}' FROM notify_def WHERE name = 'later_http'",
            )
            .await
            .unwrap();
        eventually(5, "the first notice sent and recorded", || async {
            (db.scalar("SELECT COUNT(*) FROM notify_msg_history").await == 1).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        // This process has no worker, and attempts nothing after commit.
        let producer = db.notifier().config(quiet()).build().unwrap();
        let by = producer
            .add(
                &db.db,
                NewNotice::new("later_http", &json!({"by": 1})).delay(Duration::from_secs(2)),
            )
            .await
            .unwrap()
            .id();
        // A plain-SQL producer writes `next_call_time` ahead (a trigger
        // copies it into `not_before`).
        let later = match db.db.get_database_backend() {
            DbBackend::Postgres => {
                "(statement_timestamp() AT TIME ZONE 'UTC') + interval '2 seconds'"
            }
            DbBackend::MySql => "TIMESTAMPADD(SECOND, 2, UTC_TIMESTAMP(6))",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now', '+2 seconds')",
        };
        let columns = format!("next_call_time) SELECT id, '{{}}', {later}");
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, {columns} FROM notify_def WHERE name = 'later_http'"
            ))
            .await
            .unwrap();
        let plain = db
            .scalar("SELECT MAX(id) FROM notify_msg WHERE def_id = (SELECT id FROM notify_def WHERE name = 'later_http')")
            .await;
        let due_by = not_before(&producer, by).await;
        let due_plain = not_before(&producer, plain).await;
        assert!(producer.status(plain).await.unwrap().scheduled);
        wait_both(&receiver, by, plain).await;
        let on_time = |id: i64, due: NaiveDateTime| {
            let seen: Vec<_> = receiver.seen().into_iter().filter(|s| s.id == id).collect();
            assert_eq!(seen.len(), 1, "notice {id} sent once");
            let late = utc(seen[0].started) - due;
            assert!(
                late >= chrono::Duration::zero(),
                "notice {id} sent {late} before its time"
            );
            assert!(
                late < chrono::Duration::seconds(1),
                "notice {id} sent {late} after its time"
            );
        };
        on_time(by, due_by);
        on_time(plain, due_plain);

        // The worker that learnt of a delayed notice is killed (SIGKILL)
        // before its time; another process starts, finds it, and sends it
        // on time, once.
        let later = producer
            .add(
                &db.db,
                NewNotice::new("later_http", &json!({"after_kill": 1}))
                    .delay(Duration::from_secs(3)),
            )
            .await
            .unwrap()
            .id();
        let due_later = not_before(&producer, later).await;
        drop(worker);
        let _second = worker_process(&db, SLOW_POLL);
        wait_both(&receiver, later, later).await;
        on_time(later, due_later);
    }
);

db_test!(
    a_delayed_notice_in_a_rolled_back_savepoint_is_never_sent_and_absurd_times_are_refused,
    |db: Arc<TestDb>| async move {
        use sea_orm::TransactionTrait;
        let (notifier, times) = notifier(&db, test_config()).await;
        let running = start(notifier.clone(), slow_poll());
        let delayed = || NewNotice::new("later", &json!({})).delay(Duration::from_millis(1500));
        let tx = notifier.begin().await.unwrap();
        let kept = tx.add(delayed()).await.unwrap();
        let nested = tx.begin().await.unwrap();
        let rolled_back = nested.add(delayed()).await.unwrap();
        nested.rollback().await.unwrap();
        // Absurd times are refused, and the transaction goes on.
        for absurd in [
            NewNotice::new("later", &json!({})).delay(Duration::MAX),
            NewNotice::new("later", &json!({}))
                .delay(solid_notify::MAX_DELAY + Duration::from_secs(86_400)),
            NewNotice::new("later", &json!({}))
                .not_before(Utc::now() + chrono::Duration::days(366 * 11)),
            NewNotice::new("later", &json!({}))
                .not_before(Utc::now() - chrono::Duration::days(366 * 11)),
        ] {
            let refused = tx.add(absurd).await.unwrap_err();
            assert!(
                matches!(refused, solid_notify::Error::InvalidNotice { .. }),
                "{refused:?}"
            );
        }
        tx.commit().await.unwrap();
        let live = db.live().await;
        assert_eq!(live.len(), 1, "only the kept notice is stored");
        // Attempting the row by hand before its time sends nothing.
        let report = notifier.attempt(live[0].clone()).await;
        assert_eq!(report.result, AttemptResult::LostClaim, "{report:?}");
        assert!(times.of(kept).is_empty(), "not sent before its time");
        // A due check more often than 50 ms is refused.
        let too_often = solid_notify::Worker::new(
            notifier.clone(),
            WorkerConfig {
                due_check_every: Duration::from_millis(10),
                ..WorkerConfig::default()
            },
        );
        assert!(too_often.is_err());
        wait_delivered(&times, &[kept], 6).await;
        assert!(
            times.of(rolled_back).is_empty(),
            "a rolled-back notice is never sent"
        );
        running.stop().await;
    }
);

db_test!(
    large_delayed_notices_written_with_the_commit_keep_their_time,
    |db: Arc<TestDb>| async move {
        // Over 1 MiB in all: on PostgreSQL they go as one prepared
        // statement before the COMMIT, not as literals with it.
        let (notifier, times) = notifier(&db, test_config()).await;
        let running = start(notifier.clone(), slow_poll());
        let big = "x".repeat(600 * 1024);
        let tx = notifier.begin().await.unwrap();
        let mut ids = Vec::new();
        for at in [
            NewNotice::new("later", &json!({ "big": big })).delay(Duration::from_millis(1500)),
            NewNotice::new("later", &json!({ "big": big }))
                .not_before(Utc::now() + chrono::Duration::milliseconds(1500)),
        ] {
            ids.push(tx.add(at).await.unwrap());
        }
        tx.commit().await.unwrap();
        let mut due = Vec::new();
        for id in &ids {
            assert!(notifier.status(*id).await.unwrap().scheduled);
            due.push(not_before(&notifier, *id).await);
        }
        wait_delivered(&times, &ids, 8).await;
        for (id, due) in ids.iter().zip(due) {
            on_time(&times, *id, due);
        }
        running.stop().await;
    }
);

async fn wait_both(receiver: &Receiver, by: i64, plain: i64) {
    eventually(8, "both delivered by the other process", || async {
        (receiver.count_for(by) >= 1 && receiver.count_for(plain) >= 1).then_some(())
    })
    .await;
}

db_test!(
    a_plain_sql_row_due_now_is_not_taken_for_a_delayed_one,
    |db: Arc<TestDb>| async move {
        db.def("later", "later", |_| {}).await;
        // Due now to the nanosecond: on SQLite, text with more digits than
        // `strftime`'s milliseconds (as sqlx writes a bound time) in the
        // very millisecond of the insert.
        let now = match db.db.get_database_backend() {
            DbBackend::Postgres => "(statement_timestamp() AT TIME ZONE 'UTC')",
            DbBackend::MySql => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now') || '999999'",
        };
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, next_call_time) \
                 SELECT id, '{{}}', {now} FROM notify_def WHERE name = 'later'"
            ))
            .await
            .unwrap();
        let live = db.live().await;
        assert_eq!(live.len(), 1);
        assert_eq!(
            live[0].not_before, None,
            "due now, not delayed: {:?}",
            live[0]
        );
    }
);
