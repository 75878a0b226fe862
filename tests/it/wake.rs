//! Wake-ups: a worker polling every 30 s still delivers within a second of a
//! commit (NOTIFY on PostgreSQL, in-process elsewhere), catches up after its
//! listener's connection is killed, coalesces bursts, and sleeps only until
//! the next retry it knows of.

use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{Notice, Notifier, Outcome, Status, WorkerConfig, worker::Mode};

use crate::{
    db_test,
    faults::{Running, quiet, start},
    pg_test,
    support::{Recorder, TestDb, eventually},
};

/// A worker that polls only every 30 s: anything on time was woken for.
pub fn slow_poll() -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_secs(30),
        confirm_listener: false,
        ..WorkerConfig::default()
    }
}

async fn worker(db: &TestDb, rec: &Recorder) -> (Notifier, Running) {
    db.def("ship", "ship", |s| s.retry_interval = "1s".into())
        .await;
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "ship",
            rec.handler(|n| {
                if n.param["fail_once"] == true && n.attempt == 1 {
                    Outcome::retry("not yet")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    let running = start(notifier.clone(), slow_poll());
    // Its first sweep runs at once; wait until it sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (notifier, running)
}

pg_test!(
    plain_sql_from_another_connection_wakes_the_worker,
    |db: Arc<TestDb>| async move {
        let rec = Recorder::default();
        let (_, running) = worker(&db, &rec).await;
        let other = TestDb::connect_to(&db.url).await;
        other
        .execute_unprepared(
            "INSERT INTO notify_msg (def_id, param) SELECT id, '{}' FROM notify_def WHERE name = 'ship'",
        )
        .await
        .unwrap();
        eventually(1, "delivered well before the 30 s poll", || async {
            (rec.count() == 1).then_some(())
        })
        .await;
        running.stop().await;
    }
);

pg_test!(
    a_killed_listener_loses_no_notice,
    |db: Arc<TestDb>| async move {
        let rec = Recorder::default();
        let (_, running) = worker(&db, &rec).await;
        // Listening once the worker's start (its database check) is done.
        eventually(10, "one listener connection", || async {
            let n = db
                .scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()")
                .await;
            (n == 1).then_some(())
        })
        .await;
        let listening = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE query LIKE 'LISTEN%' AND datname = current_database()";
        assert_eq!(db.scalar(listening).await, 1, "one listener connection");
        db.insert_due("ship", 1, |_| 0).await;
        eventually(3, "delivered after the listener reconnected", || async {
            (rec.count() == 1).then_some(())
        })
        .await;
        eventually(5, "listening again", || async {
        let n = db
            .scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()")
            .await;
        (n == 1).then_some(())
    })
    .await;
        db.insert_due("ship", 1, |_| 0).await;
        eventually(1, "woken by NOTIFY again", || async {
            (rec.count() == 2).then_some(())
        })
        .await;
        running.stop().await;
    }
);

db_test!(a_producer_wakes_its_workers_in_process, |db: Arc<
    TestDb,
>| async move {
    let rec = Recorder::default();
    let (notifier, running) = worker(&db, &rec).await;
    let tx = notifier.begin().await.unwrap();
    tx.add_notice("ship", &json!({}), "").await.unwrap();
    tx.commit().await.unwrap();
    eventually(1, "delivered well before the 30 s poll", || async {
        (rec.count() == 1).then_some(())
    })
    .await;
    running.stop().await;
});

db_test!(
    a_retry_due_between_polls_is_on_time,
    |db: Arc<TestDb>| async move {
        let rec = Recorder::default();
        let (notifier, running) = worker(&db, &rec).await;
        retry_is_on_time(&db, &notifier).await;
        running.stop().await;
    }
);

/// Adds a notice whose first attempt fails; its retry after 1 s is
/// delivered on time, not at the worker's next 30 s poll.
async fn retry_is_on_time(db: &TestDb, notifier: &Notifier) {
    let tx = notifier.begin().await.unwrap();
    let id = tx
        .add_notice("ship", &json!({"fail_once": true}), "")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let done = eventually(4, "the retry delivered", || async {
        db.history_of(id).await
    })
    .await;
    assert_eq!((done.status, done.retry_times), (Status::Succeeded, 1));
}

pg_test!(
    a_row_written_with_triggers_off_does_not_hide_a_retry,
    |db: Arc<TestDb>| async move {
        let rec = Recorder::default();
        let (notifier, running) = worker(&db, &rec).await;
        // Due in an hour, written with triggers off: its `due_at` stays at
        // the default, first in the due index (migration 16).
        db.insert_with_triggers_off("ship").await;
        retry_is_on_time(&db, &notifier).await;
        assert_eq!(rec.count(), 2, "the row due in an hour is not sent");
        running.stop().await;
    }
);

db_test!(a_burst_is_coalesced, |db: Arc<TestDb>| async move {
    db.def("ship", "ship", |_| {}).await;
    let notifier = db
        .notifier()
        .config(quiet())
        .handler("ship", |_: Notice| async { Ok(Outcome::success()) })
        .build()
        .unwrap();
    let running = start(notifier.clone(), slow_poll());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 1,000 notices committed one per transaction by 8 producers at once
    // (SQLite: 2, its one writer at a time; 8 there wait past the busy
    // timeout on a loaded machine).
    let producers = if db.backend == crate::support::Backend::Sqlite {
        2
    } else {
        8
    };
    let burst: Vec<_> = (0..producers)
        .map(|p| {
            let notifier = notifier.clone();
            tokio::spawn(async move {
                for i in 0..1000 / producers {
                    let tx = notifier.begin().await.unwrap();
                    tx.add_notice("ship", &json!({ "p": p, "i": i }), "")
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for b in burst {
        b.await.unwrap();
    }
    eventually(20, "all delivered", || async {
        (db.counts().await == (0, 1000)).then_some(())
    })
    .await;
    let stats = running.stats();
    running.stop().await;
    let wakeups = stats.snapshot().wakeups;
    assert!(
        wakeups > 0 && wakeups < 500,
        "1,000 commits woke the worker {wakeups} times"
    );
});

db_test!(a_retry_scheduled_after_commit_is_on_time, |db: Arc<
    TestDb,
>| async move {
    // The defaults: the producer attempts after commit, and a worker of
    // the same process polls only every 30 s.
    db.def("ship", "ship", |s| s.retry_interval = "1s".into())
        .await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler(
            "ship",
            rec.handler(|n| {
                if n.attempt == 1 {
                    Outcome::retry("not yet")
                } else {
                    Outcome::success()
                }
            }),
        )
        .build()
        .unwrap();
    let running = start(notifier.clone(), slow_poll());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tx = notifier.begin().await.unwrap();
    let id = tx.add_notice("ship", &json!({}), "").await.unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert!(
        matches!(
            reports[0].result,
            solid_notify::AttemptResult::WillRetry { .. }
        ),
        "{reports:?}"
    );
    let done = eventually(3, "the retry delivered about 1 s later", || async {
        db.history_of(id).await
    })
    .await;
    assert_eq!((done.status, done.retry_times), (Status::Succeeded, 1));
    running.stop().await;
});

pg_test!(a_lost_notification_costs_at_most_one_poll, |db: Arc<
    TestDb,
>| async move {
    db.def("ship", "ship", |_| {}).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler("ship", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let running = start(
        notifier,
        WorkerConfig {
            delay: Duration::from_secs(2),
            ..slow_poll()
        },
    );
    let stats = running.stats();
    eventually(10, "the first sweep", || async {
        (stats.snapshot().sweeps >= 1).then_some(())
    })
    .await;
    // Triggers do not fire in this session: no NOTIFY is ever sent.
    let other = TestDb::connect_to(&db.url).await;
    // A row the sweep running at the insert claims is not the poll's to
    // deliver: then a later row is tried (at most three).
    let mut by_a_poll = false;
    for sent in 1..=3 {
        let before = stats.snapshot();
        other
            .execute_unprepared(
                "SET session_replication_role = replica; \
                 INSERT INTO notify_msg (def_id, param) SELECT id, '{}' FROM notify_def WHERE name = 'ship'",
            )
            .await
            .unwrap();
        // The next poll is at most 2 s away.
        eventually(6, "delivered by the next poll", || async {
            (rec.count() == sent).then_some(())
        })
        .await;
        let after = stats.snapshot();
        assert_eq!(
            after.wakeups, before.wakeups,
            "no wake-up was expected: the notice was written without its trigger"
        );
        if after.sweeps > before.sweeps {
            by_a_poll = true;
            break;
        }
    }
    assert!(
        by_a_poll,
        "every row was claimed by the sweep running at its insert"
    );
    running.stop().await;
});
