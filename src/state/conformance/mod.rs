//! Conformance: every guarded transition of [`state`](super), run on
//! SQLite, PostgreSQL and MariaDB, as river's driver suite does for
//! `JobSetStateIfRunning`.
//!
//! Each transition is taken from a fresh claim (it writes what it says), and
//! from a stale one (the version moved on: the lease ran out and another
//! worker claimed the row, or an operator cancelled it), where it must
//! write nothing and say so with a [`Lost`](super::Lost) (or, for the
//! operator's and the batch transitions, by leaving the row out of what it
//! reports as changed). A late completion never overwrites a row another
//! worker has claimed since (river #1302). Each stale case fails when its
//! transition's version guard is removed.
//!
//! One file per transition; [`Fixture`] makes a fresh, migrated database of
//! one backend with one handler definition, and [`conformance!`] runs a
//! case on each backend (`SN_TEST_BACKENDS` narrows them, as for the
//! integration tests; the servers are those of `SN_TEST_PG_URL` and
//! `SN_TEST_MYSQL_URL`, else 127.0.0.1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cancel;
mod claim;
mod confirm;
mod fail;
mod park;
mod promote;
mod purge;
mod release;
mod requeue;
mod retry;
mod runs;
mod succeed;

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, EntityTrait, PaginatorTrait,
    Statement,
};

use super::{
    Lease, Store,
    clock::Due,
    insert::{self, NewRow},
};
use crate::entity::{notify_msg, notify_msg_history};

/// The backends a case runs on (those compiled in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    fn key(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::MySql => "mysql",
        }
    }

    fn selected(self) -> bool {
        std::env::var("SN_TEST_BACKENDS")
            .map(|list| list.split(',').any(|b| b.trim() == self.key()))
            .unwrap_or(true)
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The lease of the fixture's store: long enough that no case sees one run
/// out by itself ([`Fixture::expire`] ends one on purpose).
pub(crate) const LEASE: Duration = Duration::from_secs(60);

/// A fresh database with the definition `c` (a handler), and its store.
pub(crate) struct Fixture {
    pub store: Store,
    pub def_id: i64,
    backend: Backend,
    name: String,
    admin: Option<DatabaseConnection>,
}

async fn connect(url: &str) -> DatabaseConnection {
    let mut opts = sea_orm::ConnectOptions::new(url.to_string());
    opts.max_connections(5).sqlx_logging(false);
    Database::connect(opts)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e} (.ci/run starts the servers)"))
}

impl Fixture {
    pub async fn new(backend: Backend) -> Fixture {
        let name = format!(
            "sn_t_c{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let (url, admin) = match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                (format!("sqlite://{}?mode=rwc", path.display()), None)
            }
            Backend::Postgres | Backend::MySql => {
                let (base, admin_db) = if backend == Backend::Postgres {
                    (
                        std::env::var("SN_TEST_PG_URL")
                            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into()),
                        "postgres",
                    )
                } else {
                    (
                        std::env::var("SN_TEST_MYSQL_URL")
                            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into()),
                        "test",
                    )
                };
                let admin = connect(&format!("{base}/{admin_db}")).await;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .unwrap();
                (format!("{base}/{name}"), Some(admin))
            }
        };
        let db = connect(&url).await;
        crate::migrate(&db).await.unwrap();
        let spec = crate::def::DefSpec::new(
            "c",
            crate::def::Channel::Handler,
            serde_json::json!({ "handler": "h" }),
        );
        crate::def::store::sync(&db, &[spec]).await.unwrap();
        let mut fixture = Fixture {
            store: Store::new(db, LEASE, crate::config::DEFAULT_DB_TIMEOUT),
            def_id: 0,
            backend,
            name,
            admin,
        };
        fixture.def_id = fixture
            .scalar("SELECT id FROM notify_def WHERE name = 'c'")
            .await;
        fixture
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    async fn cleanup(self) {
        self.store.db.pool().clone().close().await.ok();
        match (self.backend, self.admin) {
            (Backend::Sqlite, _) => {
                let path = std::env::temp_dir().join(format!("{}.db", self.name));
                for suffix in ["", "-wal", "-shm"] {
                    std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
                }
            }
            (Backend::Postgres, Some(admin)) => {
                let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
                admin.execute_unprepared(&sql).await.ok();
            }
            (_, Some(admin)) => {
                let sql = format!("DROP DATABASE IF EXISTS {}", self.name);
                admin.execute_unprepared(&sql).await.ok();
            }
            _ => {}
        }
    }

    /// The first column of the first row of `sql`, as an integer.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let backend = self.store.backend();
        let row = self
            .store
            .db
            .query_one_raw(Statement::from_string(backend, sql.to_string()))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0)
            .or_else(|_| row.try_get_by_index::<i32>(0).map(i64::from))
            .unwrap()
    }

    /// Runs `sql` (a test's own change of the world, such as time passing).
    pub async fn exec(&self, sql: &str) {
        self.store.db.execute_unprepared(sql).await.unwrap();
    }

    /// A new row of definition `c`, written as `insert` writes it.
    pub fn row(&self, key: Option<&str>, due: Due) -> NewRow {
        NewRow {
            def_id: self.def_id,
            param: format!("{{\"n\":{}}}", COUNTER.fetch_add(1, Ordering::Relaxed)),
            description: String::new(),
            load_balance_num: 0,
            idempotency_key: None,
            target_override: None,
            trace_context: None,
            ordering_key: key.map(str::to_string),
            due,
            origin: crate::status::Origin::Producer,
        }
    }

    /// Inserts a notice due now; its id.
    pub async fn notice(&self) -> i64 {
        insert::insert_plain(&self.store.db, &self.row(None, Due::Now))
            .await
            .unwrap()
    }

    /// Inserts a notice of ordering key `key`, due now; its id.
    pub async fn keyed(&self, key: &str) -> i64 {
        insert::insert_plain(&self.store.db, &self.row(Some(key), Due::Now))
            .await
            .unwrap()
    }

    /// The row in flight, if any.
    pub async fn live(&self, id: i64) -> Option<notify_msg::Model> {
        notify_msg::Entity::find_by_id(id)
            .one(&self.store.db)
            .await
            .unwrap()
    }

    /// The row in history, if any.
    pub async fn history(&self, id: i64) -> Option<notify_msg_history::Model> {
        notify_msg_history::Entity::find_by_id(id)
            .one(&self.store.db)
            .await
            .unwrap()
    }

    /// Rows in flight and in history.
    pub async fn counts(&self) -> (u64, u64) {
        (
            notify_msg::Entity::find()
                .count(&self.store.db)
                .await
                .unwrap(),
            notify_msg_history::Entity::find()
                .count(&self.store.db)
                .await
                .unwrap(),
        )
    }

    /// Claims notice `id` as read now (it must be claimable).
    pub async fn claim(&self, id: i64) -> Lease {
        let row = self.live(id).await.expect("in flight");
        super::claim::claim_one(&self.store, &row)
            .await
            .unwrap()
            .expect("claimable")
    }

    /// Ends the lease of notice `id` now, as if its time had passed: the
    /// next call is due a second ago (in flight or in history).
    pub async fn expire(&self, id: i64) {
        let past = match self.backend {
            Backend::Postgres => "(now() AT TIME ZONE 'UTC') - interval '1 second'",
            Backend::MySql => "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds')",
        };
        let due_at = if self.backend == Backend::Postgres {
            format!(", due_at = {past}")
        } else {
            String::new()
        };
        self.exec(&format!(
            "UPDATE notify_msg SET next_call_time = {past}{due_at} WHERE id = {id}"
        ))
        .await;
        self.exec(&format!(
            "UPDATE notify_msg_history SET next_call_time = {past} WHERE id = {id}"
        ))
        .await;
    }

    /// A late worker's lease and the current one: worker A claims `id`,
    /// its lease runs out, worker B claims the row again.
    pub async fn stale_and_current(&self, id: i64) -> (Lease, Lease) {
        let a = self.claim(id).await;
        self.expire(id).await;
        let b = self.claim(id).await;
        assert_eq!(b.version(), a.version() + 1);
        (a, b)
    }

    /// Asserts that notice `id` is in flight exactly as `before` left it.
    pub async fn unchanged(&self, id: i64, before: &notify_msg::Model) {
        let now = self.live(id).await.expect("still in flight");
        assert_eq!(&now, before, "a stale transition wrote");
        assert!(self.history(id).await.is_none(), "moved to history");
    }
}

/// Runs `body` on a fresh fixture of `backend`, then drops its database.
pub(crate) async fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Fixture) -> Fut,
    Fut: Future<Output = Fixture>,
{
    if !backend.selected() {
        return;
    }
    let started = Instant::now();
    let fixture = body(Fixture::new(backend).await).await;
    fixture.cleanup().await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a case ran a minute"
    );
}

/// One case of a transition, on each backend: `body` takes the fixture and
/// gives it back for cleanup.
macro_rules! conformance {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            // Each backend's tests exist in the builds that have it.
            #[cfg(feature = "sqlite")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $crate::state::conformance::run($crate::state::conformance::Backend::Sqlite, $body)
                    .await
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $crate::state::conformance::run(
                    $crate::state::conformance::Backend::Postgres,
                    $body,
                )
                .await
            }

            #[cfg(feature = "mysql")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                $crate::state::conformance::run($crate::state::conformance::Backend::MySql, $body)
                    .await
            }
        }
    };
}
pub(crate) use conformance;

/// The claim a stale transition must report: `lease`'s id and version.
pub(crate) fn lost_of(lease: &Lease) -> super::Lost {
    super::Lost {
        id: lease.id(),
        version: lease.version(),
    }
}

/// Whether the backend is PostgreSQL (the cases only it has: runs).
pub(crate) fn on_postgres(f: &Fixture) -> bool {
    f.store.backend() == DbBackend::Postgres
}
