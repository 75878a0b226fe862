//! Migrations never stop producers (PostgreSQL, on a database holding
//! 100,000 notices in flight and 1,000,000 in history, while a producer
//! commits notices): every migration after the baseline, undone and run
//! again, blocks no commit for 2 s; the check fails on a migration that
//! does; and a migration queued behind a long transaction steps back
//! after its lock timeout instead of holding the producers behind it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use migration::{IntoIden, MigrationTrait, MigratorTrait, SchemaManager};
use sea_orm::{ConnectionTrait, DbErr, TransactionTrait};
use serde_json::json;
use solid_notify::{Config, NewNotice, Notifier};

use crate::{pg_test, support::TestDb};

/// No commit may wait longer than this on a migration.
const LIMIT: Duration = Duration::from_secs(2);

/// A producer committing one notice after another until stopped: the
/// slowest commit since the last [`Producer::worst`].
struct Producer {
    stop: Arc<AtomicBool>,
    worst_ms: Arc<AtomicU64>,
    commits: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(notifier: Notifier) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let worst_ms = Arc::new(AtomicU64::new(0));
        let commits = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, worst_ms, commits) = (stop.clone(), worst_ms.clone(), commits.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let tx = notifier.begin().await.expect("begin");
                    tx.add(NewNotice::new("later", &json!({})))
                        .await
                        .expect("add");
                    tx.commit().await.expect("commit");
                    let took = started.elapsed().as_millis() as u64;
                    worst_ms.fetch_max(took, Ordering::Relaxed);
                    commits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Producer {
            stop,
            worst_ms,
            commits,
            task,
        }
    }

    /// The slowest commit since the last call, once one more has committed.
    async fn worst(&self) -> Duration {
        let seen = self.commits.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.commits.load(Ordering::Relaxed) <= seen {
            assert!(Instant::now() < deadline, "the producer stopped committing");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Duration::from_millis(self.worst_ms.swap(0, Ordering::Relaxed))
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
    }
}

/// 100,000 notices in flight (due tomorrow) and 1,000,000 in history.
async fn populate(db: &TestDb) {
    db.db
        .execute_unprepared(
            "INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT d.id, '{}', now() AT TIME ZONE 'utc' + interval '1 day' \
             FROM notify_def d, generate_series(1, 100000) WHERE d.name = 'later'",
        )
        .await
        .unwrap();
    db.db
        .execute_unprepared(
            "INSERT INTO notify_msg_history (id, def_id, param, status) \
             SELECT 10000000 + g, d.id, '{\"n\":' || g || '}', 1 \
             FROM notify_def d, generate_series(1, 1000000) g WHERE d.name = 'later'",
        )
        .await
        .unwrap();
    // Written out now, not by a checkpoint in the middle of a measure.
    db.db.execute_unprepared("ANALYZE").await.unwrap();
    db.db.execute_unprepared("CHECKPOINT").await.unwrap();
}

/// A long reader: a transaction that has read `notify_msg` (and holds its
/// share lock) for `long`, then commits.
async fn hold_for(db: &TestDb, long: Duration) -> tokio::task::JoinHandle<()> {
    let reader = db.db.begin().await.unwrap();
    reader
        .execute_unprepared("SELECT count(*) FROM notify_msg")
        .await
        .unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(long).await;
        reader.commit().await.unwrap();
    })
}

/// A stand-in for a migration that rewrites `notify_msg`: it holds the
/// table's exclusive lock for 3 s.
struct Rewrite;

impl migration::MigrationName for Rewrite {
    fn name(&self) -> &str {
        "m20990101_000001_rewrite"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for Rewrite {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("LOCK TABLE notify_msg IN ACCESS EXCLUSIVE MODE")
            .await?;
        db.execute_unprepared("SELECT pg_sleep(3)").await?;
        Ok(())
    }
}

/// A quick migration that needs `notify_msg`'s exclusive lock for an
/// instant (a column added without a default).
struct AddColumn;

impl migration::MigrationName for AddColumn {
    fn name(&self) -> &str {
        "m20990101_000002_add_column"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for AddColumn {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE notify_msg ADD COLUMN probe_added integer")
            .await
            .map(drop)
    }
}

/// A migrator of one migration, with its own tracking table.
macro_rules! migrator {
    ($name:ident, $migration:ident, $table:literal) => {
        struct $name;
        #[async_trait::async_trait]
        impl MigratorTrait for $name {
            fn migrations() -> Vec<Box<dyn MigrationTrait>> {
                vec![Box::new($migration)]
            }
            fn migration_table_name() -> migration::DynIden {
                migration::Alias::new($table).into_iden()
            }
        }
    };
}
migrator!(Rewrites, Rewrite, "probe_rewrite_migrations");
migrator!(AddsColumn, AddColumn, "probe_add_column_migrations");
migrator!(AddsColumnWaiting, AddColumn, "probe_add_column_waiting");

pg_test!(no_migration_blocks_a_producer_for_two_seconds, |db: Arc<
    TestDb,
>| async move {
    db.def("later", "later", |_| {}).await;
    populate(&db).await;
    let notifier = db
        .notifier()
        .config(Config {
            immediate_attempt: false,
            ..crate::support::test_config()
        })
        .build()
        .unwrap();
    let producer = Producer::start(notifier);
    producer.worst().await;

    // Every migration after the baseline, undone and run again.
    let after = u32::try_from(migration::Migrator::migrations().len() - 1).unwrap();
    if after > 0 {
        migration::Migrator::down(&db.db, Some(after))
            .await
            .unwrap();
    }
    let started = Instant::now();
    solid_notify::migrate(&db.db).await.unwrap();
    let worst = producer.worst().await;
    eprintln!(
        "{after} migration(s) after the baseline in {:?}; slowest commit meanwhile {worst:?}",
        started.elapsed()
    );
    assert!(worst < LIMIT, "a migration blocked a commit for {worst:?}");

    // The check can fail: a migration that holds the table 3 s.
    solid_notify::migrate_with::<Rewrites>(&db.db, solid_notify::MIGRATION_LOCK_TIMEOUT)
        .await
        .unwrap();
    let worst = producer.worst().await;
    eprintln!("a migration holding notify_msg 3 s: slowest commit {worst:?}");
    assert!(
        worst >= LIMIT,
        "a 3 s lock went unseen: slowest commit {worst:?}"
    );

    // A long transaction holds notify_msg (a reader): a migration that
    // waits for it without a bound holds every commit queued behind
    // it ...
    let release = hold_for(&db, Duration::from_secs(4)).await;
    solid_notify::migrate_with::<AddsColumnWaiting>(&db.db, Duration::from_secs(60))
        .await
        .unwrap();
    release.await.unwrap();
    let worst = producer.worst().await;
    eprintln!("a migration queued behind a 4 s reader, no lock timeout: slowest commit {worst:?}");
    assert!(worst >= LIMIT, "an unbounded wait went unseen: {worst:?}");
    db.db
        .execute_unprepared("ALTER TABLE notify_msg DROP COLUMN probe_added")
        .await
        .unwrap();
    producer.worst().await;

    // ... while `migrate`'s lock timeout steps back and tries again.
    let release = hold_for(&db, Duration::from_secs(4)).await;
    solid_notify::migrate_with::<AddsColumn>(&db.db, Duration::from_millis(500))
        .await
        .unwrap();
    release.await.unwrap();
    let worst = producer.worst().await;
    eprintln!("the same with a 500 ms lock timeout: slowest commit {worst:?}");
    assert!(
        worst < LIMIT,
        "the lock timeout let a commit wait {worst:?}"
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM information_schema.columns \
                 WHERE table_name = 'notify_msg' AND column_name = 'probe_added'"
        )
        .await,
        1,
        "the migration ran once the reader was gone"
    );
    producer.stop().await;
});
