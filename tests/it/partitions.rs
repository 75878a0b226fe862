//! Partitioned history (PostgreSQL): an installation converts online under
//! traffic and loses nothing; retention drops whole periods and keeps what
//! an operator may still requeue; lookups stay index-backed. MySQL/MariaDB
//! and SQLite refuse the conversion and keep the batched purge.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::json;
use solid_notify::{
    Error, Outcome, WorkerConfig,
    ops::{Audit, Partitioning, Period, Purge},
    worker::Mode,
};

use crate::{
    db_test,
    faults::start,
    pg_test,
    support::{Backend, Recorder, TestDb, eventually, test_config},
};

/// Seeded history ids start here, above every id the producer gets.
const SEED: i64 = 10_000_000;

/// Inserts `n` finished notices of `def` into history, ids from `SEED + 1`,
/// finished `g % days` days ago: every 50th a final failure, then a parked
/// and a cancelled one, the rest succeeded.
async fn seed(db: &TestDb, def: &str, n: i64, days: i64) {
    let def_id = db
        .scalar(&format!("SELECT id FROM notify_def WHERE name = '{def}'"))
        .await;
    db.db
        .execute_unprepared(&format!(
            "INSERT INTO notify_msg_history (id, def_id, param, status, last_call_time, next_call_time, create_time, version) \
             SELECT {SEED} + g, {def_id}, '{{\"seed\":' || g || '}}', \
                    CASE g % 50 WHEN 0 THEN 3 WHEN 1 THEN 6 WHEN 2 THEN 5 ELSE 1 END, \
                    (now() AT TIME ZONE 'utc') - (g % {days}) * interval '1 day', \
                    (now() AT TIME ZONE 'utc'), \
                    (now() AT TIME ZONE 'utc') - (g % {days}) * interval '1 day' - interval '1 minute', 1 \
             FROM generate_series(1, {n}) g"
        ))
        .await
        .unwrap();
}

fn fast() -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(50),
        confirm_listener: false,
        ..WorkerConfig::default()
    }
}

pg_test!(
    history_converts_online_under_traffic_and_an_operator_and_loses_nothing,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        seed(&db, "ship", 30_000, 90).await;
        let rec = Recorder::default();
        let notifier = db
            .notifier()
            .config(test_config())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        assert_eq!(notifier.history_layout().await.unwrap(), None);
        let running = start(notifier.clone(), fast());

        // A producer commits notices the whole time.
        let producing = Arc::new(AtomicBool::new(true));
        let producer = tokio::spawn({
            let (notifier, producing) = (notifier.clone(), producing.clone());
            async move {
                let mut ids = Vec::new();
                let mut i = 0;
                while producing.load(Ordering::SeqCst) {
                    let tx = notifier.begin().await.unwrap();
                    ids.push(tx.add_notice("ship", &json!({"n": i}), "").await.unwrap());
                    tx.commit().await.unwrap();
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                ids
            }
        });
        // An operator requeues seeded final failures meanwhile: each leaves
        // history, is delivered, and comes back as a success.
        let converting = Arc::new(AtomicBool::new(true));
        let operator = tokio::spawn({
            let (notifier, converting) = (notifier.clone(), converting.clone());
            async move {
                let mut requeued = Vec::new();
                let mut g = 50;
                while converting.load(Ordering::SeqCst) && g <= 30_000 {
                    notifier
                        .requeue(SEED + g, &Audit::operator())
                        .await
                        .unwrap();
                    requeued.push(SEED + g);
                    g += 50;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                requeued
            }
        });
        let how = Partitioning {
            period: Period::Month,
            ahead: 2,
            batch_size: 500,
            ..Partitioning::default()
        };
        let converted = notifier.partition_history(&how).await.unwrap();
        converting.store(false, Ordering::SeqCst);
        let requeued = operator.await.unwrap();
        producing.store(false, Ordering::SeqCst);
        let produced = producer.await.unwrap();
        println!(
            "converted: {} rows at the swap, {} copied in batches, {} partitions made; {} produced and {} requeued meanwhile",
            converted.rows,
            converted.copied,
            converted.made.len(),
            produced.len(),
            requeued.len()
        );
        assert!(!converted.already);
        assert!(converted.copied > 0, "{converted:?}");
        assert!(!produced.is_empty() && !requeued.is_empty());

        eventually(60, "every notice delivered", || {
            let db = db.clone();
            async move { (db.scalar("SELECT count(*) FROM notify_msg").await == 0).then_some(()) }
        })
        .await;
        running.stop().await;

        let layout = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned");
        assert_eq!(layout.period, Period::Month);
        // Seeded rows span 90 days: 4 months at most, then 2 ahead.
        assert!(layout.periods.len() >= 5, "{layout:?}");
        // Nothing lost, nothing twice.
        let total = db.scalar("SELECT count(*) FROM notify_msg_history").await;
        let distinct = db
            .scalar("SELECT count(DISTINCT id) FROM notify_msg_history")
            .await;
        assert_eq!(total, distinct, "an id is in history twice");
        assert_eq!(total, 30_000 + produced.len() as i64);
        for id in &produced {
            assert_eq!(rec.count_for(*id), 1, "notice {id} delivered once");
        }
        let ids = produced
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            db.scalar(&format!(
                "SELECT count(*) FROM notify_msg_history WHERE status = 1 AND id IN ({ids})"
            ))
            .await,
            produced.len() as i64
        );
        for id in &requeued {
            assert_eq!(rec.count_for(*id), 1, "requeued {id} delivered once");
            let row = db.history_of(*id).await.expect("back in history");
            assert_eq!(row.status, solid_notify::Status::Succeeded);
        }
        // Every seeded row kept its content: one spot check per status.
        for (g, status) in [(51, 6), (52, 5), (53, 1)] {
            let row = db.history_of(SEED + g).await.expect("seeded row");
            assert_eq!(row.status as i16, status);
            assert_eq!(row.param, format!("{{\"seed\":{g}}}"));
        }
        // The table's own trigger came along; the mirror did not stay.
        assert_eq!(
            db.scalar(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'notify_msg_history'::regclass \
                 AND tgname = 'solid_notify_wake_turn_cancel'"
            )
            .await,
            1
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM pg_proc WHERE proname = 'solid_notify_history_sync'")
                .await,
            0
        );
        // Run again: nothing to convert.
        let again = notifier.partition_history(&how).await.unwrap();
        assert!(again.already, "{again:?}");
    }
);

/// Inserts one history row `id` of `def_id` finished `days` ago.
async fn finished(db: &TestDb, def_id: i64, id: i64, status: i16, days: i64, live_lease: bool) {
    let lease = if live_lease {
        "true, (now() AT TIME ZONE 'utc') + interval '1 hour'"
    } else {
        "false, (now() AT TIME ZONE 'utc')"
    };
    db.db
        .execute_unprepared(&format!(
            "INSERT INTO notify_msg_history (id, def_id, param, status, last_call_time, create_time, version, leased, next_call_time) \
             VALUES ({id}, {def_id}, '{{}}', {status}, (now() AT TIME ZONE 'utc') - interval '{days} days', \
                     (now() AT TIME ZONE 'utc') - interval '{days} days', 3, {lease})"
        ))
        .await
        .unwrap();
}

pg_test!(
    retention_drops_ended_periods_whole_and_keeps_what_an_operator_may_requeue,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ship'")
            .await;
        // 40 days ago: 3 succeeded, 2 cancelled, a final failure, a parked
        // notice, and a cancelled one whose lease is still live.
        for id in 1..=3 {
            finished(&db, def_id, id, 1, 40, false).await;
        }
        for id in 4..=5 {
            finished(&db, def_id, id, 5, 40, false).await;
        }
        finished(&db, def_id, 6, 3, 40, false).await;
        finished(&db, def_id, 7, 6, 40, false).await;
        finished(&db, def_id, 8, 5, 40, true).await;
        // 39 days ago: 2 succeeded. 20 days ago: 2 succeeded, 1 failed. Today: 1.
        finished(&db, def_id, 9, 1, 39, false).await;
        finished(&db, def_id, 10, 1, 39, false).await;
        finished(&db, def_id, 11, 1, 20, false).await;
        finished(&db, def_id, 12, 1, 20, false).await;
        finished(&db, def_id, 13, 3, 20, false).await;
        finished(&db, def_id, 14, 1, 0, false).await;
        let notifier = db.notifier().config(test_config()).build().unwrap();
        let how = Partitioning {
            period: Period::Day,
            ahead: 2,
            batch_size: 5,
            ..Partitioning::default()
        };
        notifier.partition_history(&how).await.unwrap();
        let before = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned");
        // Day 40 ago through 2 days ahead.
        assert!(before.periods.len() >= 42, "{}", before.periods.len());

        let mut purge = Purge::older_than(Duration::from_secs(30 * 86_400));
        purge.dry_run = true;
        let dry = notifier.purge(&purge).await.unwrap();
        assert_eq!(dry.matched, 7, "{dry:?}");
        // With failures: the final failure and the parked notice too (the
        // batches purge them once moved aside), not the live lease.
        purge.include_failures = true;
        let dry = notifier.purge(&purge).await.unwrap();
        assert_eq!(dry.matched, 9, "{dry:?}");
        purge.include_failures = false;
        assert_eq!(
            db.scalar("SELECT count(*) FROM notify_msg_history").await,
            14
        );

        let archive = std::env::temp_dir().join(format!("{}-archive.jsonl", db.url.len()));
        let _ = std::fs::remove_file(&archive);
        purge.dry_run = false;
        purge.archive = Some(archive.clone());
        let report = notifier.purge(&purge).await.unwrap();
        println!("{report}");
        assert_eq!(report.deleted, 7, "{report:?}");
        assert_eq!(report.archived, 7, "{report:?}");
        // Days 40 through 31 ago ended before the cutoff: 10 periods.
        assert_eq!(report.dropped_partitions, 10, "{report:?}");
        let archived = std::fs::read_to_string(&archive).unwrap();
        assert_eq!(archived.lines().count(), 7);
        let _ = std::fs::remove_file(&archive);
        let after = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned");
        assert_eq!(after.periods.len(), before.periods.len() - 10);
        // What an operator may requeue, and the live lease, are kept whole.
        for (id, status) in [(6, 3), (7, 6), (8, 5)] {
            let row = db.history_of(id).await.expect("kept");
            assert_eq!((row.status as i16, row.version), (status, 3));
        }
        for id in [1, 2, 3, 4, 5, 9, 10] {
            assert!(db.history_of(id).await.is_none(), "{id} dropped");
        }
        for id in 11..=14 {
            assert!(db.history_of(id).await.is_some(), "{id} is younger");
        }
        assert_eq!(
            db.scalar("SELECT count(*) FROM notify_msg_history_kept")
                .await,
            3
        );
        // A kept final failure is still an operator's to requeue.
        notifier.requeue(6, &Audit::operator()).await.unwrap();
        assert!(db.history_of(6).await.is_none());

        // Failures asked for: the batches purge the kept partition, but not
        // the live lease.
        purge.archive = None;
        purge.include_failures = true;
        let report = notifier.purge(&purge).await.unwrap();
        assert_eq!(
            (report.deleted, report.dropped_partitions),
            (1, 0),
            "{report:?}"
        );
        assert!(db.history_of(7).await.is_none());
        assert!(db.history_of(8).await.is_some());
        assert!(db.history_of(13).await.is_some(), "younger than 30 days");
    }
);

pg_test!(
    lookups_on_partitioned_history_stay_index_backed,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        seed(&db, "ship", 5_000, 120).await;
        db.db
            .execute_unprepared(
                "UPDATE notify_msg_history SET idempotency_key = 'k' || id, ordering_key = 'o' || (id % 7) WHERE id % 3 = 0",
            )
            .await
            .unwrap();
        let notifier = db.notifier().config(test_config()).build().unwrap();
        notifier
            .partition_history(&Partitioning::default())
            .await
            .unwrap();
        db.db
            .execute_unprepared("ANALYZE notify_msg_history")
            .await
            .unwrap();
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ship'")
            .await;
        let lookups = [
            ("by id", format!("SELECT * FROM notify_msg_history WHERE id = {}", SEED + 7)),
            (
                "by idempotency key",
                format!("SELECT * FROM notify_msg_history WHERE def_id = {def_id} AND idempotency_key = 'k{}'", SEED + 9),
            ),
            (
                "by definition and status, newest first",
                format!("SELECT * FROM notify_msg_history WHERE def_id = {def_id} AND status = 3 ORDER BY create_time DESC LIMIT 50"),
            ),
            (
                "finished since",
                "SELECT * FROM notify_msg_history WHERE last_call_time >= (now() AT TIME ZONE 'utc') - interval '1 day'".to_string(),
            ),
            (
                "held ordering keys",
                format!("SELECT ordering_key FROM notify_msg_history WHERE def_id = {def_id} AND ordering_key IS NOT NULL AND status IN (3, 6) ORDER BY ordering_key, create_time, id"),
            ),
            (
                "what a drop keeps",
                "SELECT id FROM notify_msg_history WHERE finished_time >= '2026-01-01' AND finished_time < '2026-02-01' \
                 AND (status NOT IN (1, 5) OR leased) AND (status NOT IN (1, 5) OR next_call_time > (now() AT TIME ZONE 'utc'))".to_string(),
            ),
        ];
        for (what, sql) in lookups {
            // With sequential scans priced out, a plan still scanning one
            // has no index to use.
            let txn = db.db.begin().await.unwrap();
            txn.execute_unprepared("SET LOCAL enable_seqscan = off")
                .await
                .unwrap();
            let rows = txn
                .query_all_raw(sea_orm::Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    format!("EXPLAIN (COSTS OFF) {sql}"),
                ))
                .await
                .unwrap();
            txn.rollback().await.unwrap();
            let plan = rows
                .iter()
                .map(|r| r.try_get_by_index::<String>(0).unwrap())
                .collect::<Vec<_>>()
                .join("\n");
            println!("-- {what}\n{plan}\n");
            assert!(
                !plan.contains("Seq Scan"),
                "{what} scans a partition:\n{plan}"
            );
        }
    }
);

db_test!(
    only_postgresql_partitions_history,
    |db: Arc<TestDb>| async move {
        let notifier = db.notifier().config(test_config()).build().unwrap();
        assert_eq!(notifier.history_layout().await.unwrap(), None);
        if db.backend == Backend::Postgres {
            return;
        }
        match notifier.partition_history(&Partitioning::default()).await {
            Err(e @ Error::Config(_)) => {
                assert!(e.to_string().contains("PostgreSQL"), "{e}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // The batched purge is unchanged there.
        let report = notifier
            .purge(&Purge::older_than(Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(report.dropped_partitions, 0);
    }
);

pg_test!(
    a_drop_behind_a_long_reader_steps_back_within_its_lock_timeout,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        seed(&db, "ship", 200, 60).await;
        let notifier = db.notifier().config(test_config()).build().unwrap();
        let how = Partitioning {
            period: Period::Day,
            ahead: 1,
            batch_size: 100,
            ..Partitioning::default()
        };
        notifier.partition_history(&how).await.unwrap();
        let before = db.scalar("SELECT count(*) FROM notify_msg_history").await;
        // A reader holds history (ACCESS SHARE) for longer than a drop may wait.
        let reader = TestDb::connect_to(&db.url).await;
        let txn = reader.begin().await.unwrap();
        txn.execute_unprepared("SELECT count(*) FROM notify_msg_history")
            .await
            .unwrap();
        let purge = Purge::older_than(Duration::from_secs(30 * 86_400));
        let started = std::time::Instant::now();
        let report = notifier.purge(&purge).await.unwrap();
        let waited = started.elapsed();
        println!("behind the reader: {report} in {waited:?}");
        assert_eq!(report.dropped_partitions, 0, "{report:?}");
        assert!(
            waited < solid_notify::ops::PARTITION_LOCK_TIMEOUT + Duration::from_secs(2),
            "the drop waited {waited:?}"
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM notify_msg_history").await,
            before
        );
        // A worker's move into history goes on meanwhile (no queue behind
        // the drop: it stepped back).
        let rec = Recorder::default();
        let sender = db
            .notifier()
            .config(test_config())
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let tx = sender.begin().await.unwrap();
        let id = tx.add_notice("ship", &json!({}), "").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), tx.commit_and_wait())
            .await
            .expect("a success moves into history beside the reader")
            .unwrap();
        assert!(db.history_of(id).await.is_some());
        txn.rollback().await.unwrap();
        // The reader gone, the next purge drops the ended periods.
        let report = notifier.purge(&purge).await.unwrap();
        assert!(report.dropped_partitions >= 29, "{report:?}");
        assert!(report.deleted > 0, "{report:?}");
        assert!(db.history_of(id).await.is_some(), "today's success stays");
    }
);

pg_test!(
    a_stray_old_row_goes_to_the_default_partition_not_to_thousands_of_periods,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ship'")
            .await;
        // A plain-SQL producer's row dated ten years back, and one of today.
        finished(&db, def_id, 1, 1, 3_650, false).await;
        finished(&db, def_id, 2, 1, 0, false).await;
        let notifier = db.notifier().config(test_config()).build().unwrap();
        // At most 30 periods back (400 by default).
        let how = Partitioning {
            period: Period::Day,
            ahead: 1,
            batch_size: 100,
            behind: 30,
        };
        notifier.partition_history(&how).await.unwrap();
        let layout = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned");
        assert!(layout.periods.len() <= 30 + 2, "{}", layout.periods.len());
        assert_eq!(
            db.scalar("SELECT count(*) FROM notify_msg_history_default WHERE id = 1")
                .await,
            1
        );
        // The batches purge the default partition; periods go whole.
        let report = notifier
            .purge(&Purge::older_than(Duration::from_secs(20 * 86_400)))
            .await
            .unwrap();
        assert_eq!(report.deleted, 1, "{report:?}");
        assert!(report.dropped_partitions >= 9, "{report:?}");
        assert!(db.history_of(1).await.is_none());
        assert!(db.history_of(2).await.is_some());
    }
);

pg_test!(
    a_role_that_does_not_own_history_may_not_partition_it,
    |db: Arc<TestDb>| async move {
        let role = format!("sn_owner_{}", std::process::id());
        db.db
            .execute_unprepared(&format!(
                "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; ALTER TABLE notify_msg_history OWNER TO {role}"
            ))
            .await
            .unwrap();
        let notifier = db.notifier().config(test_config()).build().unwrap();
        let refused = notifier.partition_history(&Partitioning::default()).await;
        // Given back before the assertions, so the role can go.
        db.db
            .execute_unprepared(&format!(
                "ALTER TABLE notify_msg_history OWNER TO CURRENT_USER; DROP ROLE {role}"
            ))
            .await
            .unwrap();
        match refused {
            Err(e @ Error::Config(_)) => assert!(e.to_string().contains(&role), "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Nothing was built: no copy, no trigger.
        assert_eq!(
            db.scalar(
                "SELECT count(*) FROM pg_class WHERE relname = 'notify_msg_history_partitioned'"
            )
            .await,
            0
        );
    }
);

pg_test!(
    a_worker_role_that_does_not_own_history_purges_in_batches,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'ship'")
            .await;
        finished(&db, def_id, 1, 1, 40, false).await;
        finished(&db, def_id, 2, 3, 40, false).await;
        finished(&db, def_id, 3, 1, 0, false).await;
        // Grants, PUBLIC's among them, go with the table.
        db.db
            .execute_unprepared("GRANT SELECT ON notify_msg_history TO PUBLIC")
            .await
            .unwrap();
        let notifier = db.notifier().config(test_config()).build().unwrap();
        let how = Partitioning {
            period: Period::Day,
            ahead: 1,
            batch_size: 100,
            ..Partitioning::default()
        };
        notifier.partition_history(&how).await.unwrap();
        assert_eq!(
            db.scalar(
                "SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a \
                 WHERE c.oid = 'notify_msg_history'::regclass AND a.grantee = 0"
            )
            .await,
            1
        );
        let periods = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned")
            .periods
            .len();
        // A worker's role: every right on the tables, not their owner.
        let role = format!("sn_worker_{}", std::process::id());
        db.db
            .execute_unprepared(&format!(
                "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
                 GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}; \
                 GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"
            ))
            .await
            .unwrap();
        let url = db
            .url
            .replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
        let worker = TestDb::connect_to(&url).await;
        let report = solid_notify::ops::purge::purge(
            &worker,
            &Purge::older_than(Duration::from_secs(30 * 86_400)),
        )
        .await;
        let made = solid_notify::state::partitions::upkeep(&worker).await;
        worker.close().await.unwrap();
        db.db
            .execute_unprepared(&format!(
                "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}; \
                 REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}; DROP ROLE {role}"
            ))
            .await
            .unwrap();
        let report = report.unwrap();
        assert_eq!(
            (report.deleted, report.dropped_partitions),
            (1, 0),
            "{report:?}"
        );
        assert!(made.unwrap().is_empty());
        assert!(db.history_of(1).await.is_none());
        assert!(db.history_of(2).await.is_some(), "a final failure stays");
        assert!(db.history_of(3).await.is_some());
        let after = notifier
            .history_layout()
            .await
            .unwrap()
            .expect("partitioned");
        assert_eq!(after.periods.len(), periods, "no period dropped");
    }
);
