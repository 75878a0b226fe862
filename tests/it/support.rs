//! Test support: a fresh database per test on each backend, recording
//! handlers and alert hooks, and deadline-bounded polling.

use std::{
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, EntityTrait, PaginatorTrait, QueryOrder,
    QuerySelect,
    sea_query::{Alias, ColumnDef, Query, Table},
};
use serde_json::json;
use solid_notify::{
    AlertHook, BoxError, Config, FailureEvent, Notice, Notifier, NotifierBuilder, Outcome,
    def::{Channel, DefSpec, store},
    entity::{notify_msg, notify_msg_history},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
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

    /// Backends are all on unless `SN_TEST_BACKENDS` (e.g. `sqlite`) narrows
    /// them; CI never sets it, so there a missing server fails its tests.
    pub fn selected(self) -> bool {
        match std::env::var("SN_TEST_BACKENDS") {
            Ok(list) => list.split(',').any(|b| b.trim() == self.key()),
            Err(_) => true,
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh, migrated database of one backend.
pub struct TestDb {
    pub backend: Backend,
    pub db: DatabaseConnection,
    pub url: String,
    name: String,
    admin: Option<DatabaseConnection>,
}

fn unique_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "sn_t_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

impl TestDb {
    /// A fresh, empty database of `backend`: no table at all.
    pub async fn blank(backend: Backend) -> TestDb {
        // RUST_LOG=solid_notify=debug shows the library's logs of a test.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let name = unique_name();
        let (url, admin) = match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                (format!("sqlite://{}?mode=rwc", path.display()), None)
            }
            Backend::Postgres => {
                let base = std::env::var("SN_TEST_PG_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
                let admin = connect(&format!("{base}/postgres")).await;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create PostgreSQL test database");
                (format!("{base}/{name}"), Some(admin))
            }
            Backend::MySql => {
                let base = std::env::var("SN_TEST_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
                let admin = connect(&format!("{base}/test")).await;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create MariaDB test database");
                (format!("{base}/{name}"), Some(admin))
            }
        };
        let db = connect(&url).await;
        TestDb {
            backend,
            db,
            url,
            name,
            admin,
        }
    }

    pub async fn new(backend: Backend) -> TestDb {
        let test = TestDb::blank(backend).await;
        let db = &test.db;
        solid_notify::migrate(db).await.expect("migrate");
        let orders = Table::create()
            .table(Alias::new("orders"))
            .col(
                ColumnDef::new(Alias::new("id"))
                    .big_integer()
                    .not_null()
                    .primary_key(),
            )
            .col(
                ColumnDef::new(Alias::new("item"))
                    .string_len(100)
                    .not_null(),
            )
            .to_owned();
        db.execute(&orders).await.expect("create orders");
        test
    }

    /// This database's name on its server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection to the server as its administrator (none on SQLite).
    pub fn admin(&self) -> Option<&DatabaseConnection> {
        self.admin.as_ref()
    }

    /// Drops the database (best effort; `.ci/run` sweeps leftovers of failed runs).
    pub async fn cleanup(self) {
        // A pool closes once every connection is back: one a test left
        // checked out (a task still running, a leak) would hold the run.
        // Said, then the database is dropped all the same.
        if tokio::time::timeout(Duration::from_secs(20), self.db.close())
            .await
            .is_err()
        {
            eprintln!(
                "{}: the pool did not close within 20 s: a connection was still checked out",
                self.name
            );
        }
        match (self.backend, self.admin) {
            (Backend::Sqlite, _) => {
                let path = std::env::temp_dir().join(format!("{}.db", self.name));
                for suffix in ["", "-wal", "-shm"] {
                    std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
                }
            }
            (Backend::Postgres, Some(admin)) => {
                admin
                    .execute_unprepared(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        self.name
                    ))
                    .await
                    .ok();
            }
            (_, Some(admin)) => {
                // A session left in a transaction would hold the drop for a
                // day (`lock_wait_timeout`): the database's sessions are
                // ended first, and the drop waits 10 s at most.
                let sessions = admin
                    .query_all_raw(sea_orm::Statement::from_string(
                        sea_orm::DbBackend::MySql,
                        format!(
                            "SELECT id FROM information_schema.processlist WHERE db = '{}'",
                            self.name
                        ),
                    ))
                    .await
                    .unwrap_or_default();
                for session in sessions {
                    if let Ok(id) = session.try_get_by_index::<u64>(0) {
                        admin.execute_unprepared(&format!("KILL {id}")).await.ok();
                    }
                }
                admin
                    .execute_unprepared(&format!(
                        "SET STATEMENT lock_wait_timeout = 10 FOR DROP DATABASE IF EXISTS {}",
                        self.name
                    ))
                    .await
                    .ok();
            }
            _ => {}
        }
    }

    /// This database's URL with the server's port replaced by `port` (a
    /// [`Proxy`](crate::proxy::Proxy) in front of the server).
    pub fn url_via(&self, port: u16) -> String {
        let server = match self.backend {
            Backend::Postgres => ":5432/",
            Backend::MySql => ":3306/",
            Backend::Sqlite => panic!("SQLite has no server"),
        };
        self.url.replacen(server, &format!(":{port}/"), 1)
    }

    /// The server's address, for a proxy.
    pub fn server_addr(&self) -> std::net::SocketAddr {
        let port = match self.backend {
            Backend::Postgres => 5432,
            Backend::MySql => 3306,
            Backend::Sqlite => panic!("SQLite has no server"),
        };
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A new pool on `url` (for a worker of its own).
    pub async fn connect_to(url: &str) -> DatabaseConnection {
        connect(url).await
    }

    /// Terminates every other session on this PostgreSQL database (the
    /// workers' connections); returns how many.
    pub async fn terminate_backends(&self) -> i64 {
        assert_eq!(self.backend, Backend::Postgres);
        let admin = self.admin.as_ref().expect("admin connection");
        let row = admin
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = '{}' AND pid <> pg_backend_pid()",
                    self.name
                ),
            ))
            .await
            .expect("terminate backends")
            .expect("a row");
        row.try_get_by_index::<i64>(0).unwrap_or(0)
    }

    /// Runs `sql` and returns the first column of the first row as an integer.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let row = self
            .db
            .query_one_raw(sea_orm::Statement::from_string(
                self.db.get_database_backend(),
                sql.to_string(),
            ))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .expect("a row");
        row.try_get_by_index::<i64>(0)
            .or_else(|_| row.try_get_by_index::<i32>(0).map(i64::from))
            .or_else(|_| row.try_get_by_index::<bool>(0).map(i64::from))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// PostgreSQL: inserts a notice of `def` due in an hour from a session
    /// with triggers off (`session_replication_role = replica`), so no
    /// trigger writes its `due_at`; returns its id.
    pub async fn insert_with_triggers_off(&self, def: &str) -> i64 {
        use sea_orm::TransactionTrait;
        let tx = self.db.begin().await.unwrap();
        tx.execute_unprepared("SET LOCAL session_replication_role = replica")
            .await
            .unwrap();
        let row = tx
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                format!(
                    "INSERT INTO notify_msg (def_id, param, next_call_time) SELECT id, '{{}}', \
                     (now() AT TIME ZONE 'UTC') + interval '1 hour' FROM notify_def \
                     WHERE name = '{def}' RETURNING id"
                ),
            ))
            .await
            .unwrap()
            .expect("the row inserted");
        tx.commit().await.unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    }

    /// The database's "now" in the notice tables' format, as SQL.
    pub fn now_sql(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "(now() AT TIME ZONE 'UTC')",
            Backend::MySql => "UTC_TIMESTAMP(6)",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        }
    }

    /// Notices in flight that are due now by the database's clock.
    pub async fn due_now(&self) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM notify_msg WHERE next_call_time <= {}",
            self.now_sql()
        ))
        .await
    }

    /// A notifier on this database with test-friendly settings.
    pub fn notifier(&self) -> NotifierBuilder {
        Notifier::builder(self.db.clone()).config(test_config())
    }

    pub async fn insert_order(&self, conn: &impl ConnectionTrait, id: i64) {
        let stmt = Query::insert()
            .into_table(Alias::new("orders"))
            .columns([Alias::new("id"), Alias::new("item")])
            .values_panic([id.into(), "book".into()])
            .to_owned();
        conn.execute(&stmt).await.expect("insert order");
    }

    pub async fn count_orders(&self) -> i64 {
        let stmt = Query::select()
            .expr(sea_orm::sea_query::Expr::cust("COUNT(*)"))
            .from(Alias::new("orders"))
            .to_owned();
        let row = self.db.query_one(&stmt).await.expect("count").expect("row");
        row.try_get_by_index::<i64>(0).expect("count value")
    }

    pub async fn live(&self) -> Vec<notify_msg::Model> {
        notify_msg::Entity::find()
            .order_by_asc(notify_msg::Column::Id)
            .all(&self.db)
            .await
            .expect("read notify_msg")
    }

    pub async fn history_of(&self, id: i64) -> Option<notify_msg_history::Model> {
        notify_msg_history::Entity::find_by_id(id)
            .one(&self.db)
            .await
            .expect("read history row")
    }

    /// Notices live and in history. On SQLite (its default rollback
    /// journal), a reader waits for a writer's commit at most
    /// `busy_timeout` (5 s), and a worker moving megabytes of notices on a
    /// loaded machine can commit for longer: the count is asked again
    /// (for up to 2 minutes), as any poller would.
    pub async fn counts(&self) -> (u64, u64) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self.try_counts().await {
                Ok(counts) => return counts,
                Err(e)
                    if e.to_string().contains("database is locked")
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("count: {e:?}"),
            }
        }
    }

    async fn try_counts(&self) -> Result<(u64, u64), sea_orm::DbErr> {
        // Only ids: MariaDB reads every column a counted subquery names,
        // params included.
        let live = notify_msg::Entity::find()
            .select_only()
            .column(notify_msg::Column::Id)
            .count(&self.db)
            .await?;
        let done = notify_msg_history::Entity::find()
            .select_only()
            .column(notify_msg_history::Column::Id)
            .count(&self.db)
            .await?;
        Ok((live, done))
    }

    /// The definition `ship` and a notifier whose handler `ship` records
    /// every notice and succeeds.
    pub async fn shipping(&self) -> (Notifier, Recorder) {
        self.def("ship", "ship", |_| {}).await;
        let rec = Recorder::default();
        let notifier = self
            .notifier()
            .handler("ship", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        (notifier, rec)
    }

    /// Adds a `handler` definition named `name` delivered by handler `handler`.
    pub async fn def(&self, name: &str, handler: &str, edit: impl FnOnce(&mut DefSpec)) {
        let mut spec = DefSpec::new(name, Channel::Handler, json!({ "handler": handler }));
        edit(&mut spec);
        store::sync(&self.db, &[spec]).await.expect("sync def");
    }

    /// Inserts `n` due notices of `def` directly (as a bulk producer would),
    /// partition chosen by `partition(i)`.
    pub async fn insert_due(&self, def: &str, n: usize, partition: impl Fn(usize) -> i32) {
        use sea_orm::{ActiveValue::Set, ColumnTrait, QueryFilter};
        let def_id = solid_notify::entity::notify_def::Entity::find()
            .filter(solid_notify::entity::notify_def::Column::Name.eq(def))
            .one(&self.db)
            .await
            .unwrap()
            .expect("def exists")
            .id;
        let now = chrono::Utc::now().naive_utc();
        let rows: Vec<notify_msg::ActiveModel> = (0..n)
            .map(|i| notify_msg::ActiveModel {
                def_id: Set(def_id),
                param: Set(format!("{{\"i\":{i}}}")),
                next_call_time: Set(now),
                create_time: Set(now),
                load_balance_num: Set(partition(i)),
                ..Default::default()
            })
            .collect();
        for chunk in rows.chunks(500) {
            notify_msg::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(&self.db)
                .await
                .unwrap();
        }
    }

    pub async fn history(&self) -> Vec<notify_msg_history::Model> {
        notify_msg_history::Entity::find()
            .order_by_asc(notify_msg_history::Column::Id)
            .all(&self.db)
            .await
            .expect("read history")
    }

    /// Attempts every due row once, oldest first, as a sweep would.
    pub async fn attempt_due(&self, notifier: &Notifier) -> usize {
        notifier.sweep_once(10_000).await.expect("sweep").len()
    }
}

async fn connect(url: &str) -> DatabaseConnection {
    let mut opts = sea_orm::ConnectOptions::new(url.to_string());
    opts.max_connections(10).sqlx_logging(false);
    // SQLite: a writer waits for another's commit up to 8 s (sqlx's
    // default 5 s is short on a machine busy with other tests; below
    // Config::db_timeout, 10 s).
    opts.map_sqlx_sqlite_opts(|o| o.busy_timeout(Duration::from_secs(8)));
    Database::connect(opts).await.unwrap_or_else(|e| {
        panic!("cannot connect to {url}: {e} (is the server running? .ci/run starts it)")
    })
}

pub fn test_config() -> Config {
    Config {
        lease: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(5),
        def_cache_ttl: Duration::from_millis(100),
        // The receivers listen on 127.0.0.1.
        allow_private_network: true,
        ..Config::default()
    }
}

/// Runs `body` on a fresh database of `backend`, then drops it.
pub async fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Arc<TestDb>) -> Fut,
    Fut: Future<Output = ()>,
{
    if !backend.selected() {
        eprintln!("{backend:?} not in SN_TEST_BACKENDS: not run");
        return;
    }
    let db = Arc::new(TestDb::new(backend).await);
    // A test that hangs fails, naming itself, instead of holding the run
    // until CI's own limit.
    tokio::time::timeout(TEST_LIMIT, body(db.clone()))
        .await
        .unwrap_or_else(|_| panic!("the test did not end within {TEST_LIMIT:?}: it hangs"));
    if let Ok(db) = Arc::try_unwrap(db) {
        db.cleanup().await;
    }
}

/// Longest a database test may run: 15 minutes (the longest take about
/// two on a loaded machine; the memory and many-definitions tests allow
/// their drains 10).
const TEST_LIMIT: Duration = Duration::from_secs(900);

/// One test function per backend.
#[macro_export]
macro_rules! db_test {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                $crate::support::run($crate::support::Backend::Sqlite, $body).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                $crate::support::run($crate::support::Backend::Postgres, $body).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mysql() {
                $crate::support::run($crate::support::Backend::MySql, $body).await
            }
        }
    };
}

/// One test function per backend that has a server (PostgreSQL, MariaDB).
#[macro_export]
macro_rules! server_test {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                $crate::support::run($crate::support::Backend::Postgres, $body).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mysql() {
                $crate::support::run($crate::support::Backend::MySql, $body).await
            }
        }
    };
}

/// A PostgreSQL-only test (a fault only PostgreSQL has, or can inject).
#[macro_export]
macro_rules! pg_test {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                $crate::support::run($crate::support::Backend::Postgres, $body).await
            }
        }
    };
}

/// A child process that is killed (SIGKILL) when the guard drops, so that a
/// failing test never leaves a worker running behind it.
pub struct KillOnDrop(pub std::process::Child);

/// A `solid-notify worker` process on `db` with its defaults (and `extra`
/// flags), quiet.
pub fn worker_process(db: &TestDb, extra: &[&str]) -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(["worker", "--allow-private-network"])
            .args(extra)
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A `solid-notify worker` on the database at `url`, expected to exit (a
/// refusal): its exit status and what it wrote to stderr, within 60 s.
pub async fn worker_until_exit(url: &str) -> (std::process::ExitStatus, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
        .args(["worker", "--allow-private-network"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the worker exits")
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `solid-notify worker` process on `db` (fixed delay of 100 ms, gauges
/// every 200 ms, and `extra` flags) serving metrics on a free port; returns
/// it and the metrics URL it printed.
pub async fn metrics_worker(db: &TestDb, extra: &[&str]) -> (KillOnDrop, String) {
    metrics_worker_at(&db.url, extra).await
}

/// [`metrics_worker`] on the database at `url` (through a proxy, say).
pub async fn metrics_worker_at(url: &str, extra: &[&str]) -> (KillOnDrop, String) {
    let mut child = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args([
                "worker",
                "--allow-private-network",
                "--mode",
                "fixed-delay",
                "--delay",
                "100ms",
                "--metrics-addr",
                "127.0.0.1:0",
                "--gauge-every",
                "200ms",
            ])
            .args(extra)
            .env("DATABASE_URL", url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let addr = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        loop {
            line.clear();
            if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0 {
                panic!("the worker ended without printing its metrics address");
            }
            if let Some(url) = line.trim().strip_prefix("metrics: ") {
                // Keep reading, so the worker never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
                return url.to_string();
            }
        }
    })
    .await
    .unwrap();
    (child, addr)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A handler that records every call and answers from a script.
#[derive(Clone, Default)]
pub struct Recorder {
    calls: Arc<Mutex<Vec<Notice>>>,
}

impl Recorder {
    pub fn calls(&self) -> Vec<Notice> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    pub fn count_for(&self, id: i64) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|n| n.id == id)
            .count()
    }

    /// A handler recording the call, then answering `script(notice)`.
    pub fn handler(
        &self,
        script: impl Fn(&Notice) -> Outcome + Send + Sync + 'static,
    ) -> impl Fn(Notice) -> std::pin::Pin<Box<dyn Future<Output = Result<Outcome, BoxError>> + Send>>
    + Send
    + Sync
    + 'static {
        let calls = self.calls.clone();
        let script = Arc::new(script);
        move |notice: Notice| {
            let calls = calls.clone();
            let script = script.clone();
            Box::pin(async move {
                let outcome = script(&notice);
                calls.lock().unwrap().push(notice);
                Ok(outcome)
            })
        }
    }
}

/// An alert hook that records every event.
#[derive(Clone, Default)]
pub struct Alerts(pub Arc<Mutex<Vec<FailureEvent>>>);

#[async_trait::async_trait]
impl AlertHook for Alerts {
    async fn alert(&self, event: FailureEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Alerts {
    pub fn events(&self) -> Vec<FailureEvent> {
        self.0.lock().unwrap().clone()
    }
}
