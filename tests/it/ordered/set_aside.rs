//! Waiting notices set aside: each finish promotes the next of its key, at
//! its insert or after, to the after-commit attempt or a sweeper, to a
//! worker of its partition; a stopped worker leaves no next notice claimed.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use sea_orm::ConnectionTrait;
use solid_notify::{Notice, Outcome, WorkerConfig};

use super::{Shared, assert_in_turn, ordered, per_key, recording, succeeding};
use crate::{
    db_test,
    faults::{fast, quiet, start},
    support::{TestDb, eventually},
};

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
