//! Worker: runs sweeps on a schedule until it is told to stop.
//!
//! In fixed-rate mode a sweep starts at each tick of a `cron` expression,
//! and ticks that pass while a sweep runs are skipped; in fixed-delay mode the
//! worker waits a fixed delay after each sweep. Several workers, in one
//! process or many, can share a database: claims keep them from sending the
//! same attempt, and `defs`, `handlers` and `partitions` split the work.
//! Cancelling the shutdown token stops claiming, lets running deliveries
//! finish up to `shutdown_timeout`, and releases what did not finish.

mod config;
pub mod wake;

use std::{
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::Utc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use crate::stats::{RECENT_SWEEPS, StatsSnapshot, WorkerStats};
/// The older name of [`WorkerMode`], kept for the tests and benchmarks.
#[doc(hidden)]
pub use config::WorkerMode as Mode;
pub use config::{
    DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_CRON, DEFAULT_DELAY, DEFAULT_DUE_CHECK_EVERY,
    DEFAULT_HEARTBEAT_EVERY, DEFAULT_MAX_IN_FLIGHT_BYTES, DEFAULT_SHUTDOWN_TIMEOUT, ListenUrl,
    MAX_BATCH_SIZE, MAX_CONCURRENCY, MAX_DUE_CHECK_EVERY, MIN_DUE_CHECK_EVERY, WorkerConfig,
    WorkerMode,
};

use crate::{
    error::{Error, Result},
    notifier::Notifier,
    notifier::{HARD_STOP_MARGIN, RELEASE_GRACE},
    schema::DatabaseCheck,
    state::{DefSelect, DueFilter, floor::Floor},
    sweep::SweepLimits,
};

/// How often a worker looks for notices of unknown or invalid definitions
/// to park: every 60 seconds (and at its first sweep).
pub const PARK_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Most notices parked by one check.
pub const PARK_CHECK_LIMIT: u64 = 500;
/// Shortest wait for a known due time: 5 ms (rows due but held by another
/// sender must not make a worker spin).
pub const MIN_DUE_WAIT: Duration = Duration::from_millis(5);
/// Connections of its pool a starting worker opens and warms up front (at
/// most the pool's size): 6. A connection opened mid-sweep costs a new
/// server backend and cold caches (tens of milliseconds) in the middle of
/// somebody's latency.
pub const WARM_CONNECTIONS: u32 = 6;

/// After this process abandoned a database call (one past
/// [`Config::db_timeout`](crate::Config::db_timeout)), for this long the
/// pools of [`pool_options`] ping every idle connection before handing it
/// out: 60 seconds. A partition cuts off every connection opened before
/// it; without the check each would be handed out in turn and cost a
/// whole `db_timeout`.
pub const SUSPECT_WINDOW: Duration = Duration::from_secs(60);
/// How long that ping may take before the connection is closed (and
/// another tried, or a new one opened): 500 milliseconds.
pub const SUSPECT_PING_BOUND: Duration = Duration::from_millis(500);

/// A transaction left idle this long on a connection of [`pool_options`]
/// is ended by the server, which closes its connection: 30 seconds
/// (`idle_in_transaction_session_timeout` on PostgreSQL,
/// `idle_transaction_timeout` on MariaDB; MySQL has no such setting). A
/// worker cut off by a partition between two statements of a claim would
/// otherwise keep its rows locked, out of every other worker's reach,
/// until TCP gives up on the server's side (up to hours). The library's
/// transactions last milliseconds; a caller's own transaction on such a
/// pool must not wait this long between statements.
pub const IDLE_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A pooled connection idle this long is pinged before use by
/// [`pool_options`]: 30 seconds.
pub const POOL_PING_IF_IDLE_FOR: Duration = Duration::from_secs(30);

/// How long a connection given back to the pool of [`pool_options`] may
/// take to answer a ping before it is closed instead: 5 seconds.
pub const RELEASE_PING_BOUND: Duration = Duration::from_secs(5);

/// Connection options of a worker's pool, as `solid-notify worker` opens
/// it (recommended for any pool given to a [`Notifier`]): sea-orm's
/// defaults, except that
///
/// - a connection is pinged before use only after it was idle for
///   [`POOL_PING_IF_IDLE_FOR`], and closed unless it answers within
///   [`RELEASE_PING_BOUND`]. (sea-orm pings every connection it hands
///   out: a round trip in front of each claim and each write. A connection
///   that died meanwhile fails its statement, which the worker retries like
///   any lost connection.)
/// - the server ends a transaction idle for [`IDLE_TRANSACTION_TIMEOUT`]
///   (PostgreSQL, MariaDB).
/// - for [`SUSPECT_WINDOW`] after this process abandoned a database call,
///   every idle connection is pinged before use (within
///   [`SUSPECT_PING_BOUND`]), and closed if it does not answer.
/// - waiting for a connection, or opening one, takes at most
///   [`DEFAULT_DB_TIMEOUT`](crate::config::DEFAULT_DB_TIMEOUT).
/// - a connection given back is closed unless it answers a ping (on
///   MySQL/MariaDB a `ROLLBACK`, which also ends a transaction whose
///   `BEGIN` was given up) within [`RELEASE_PING_BOUND`]. sqlx pings each
///   connection given back, without a bound: one cut off by a network
///   partition, whose statement the library abandoned, would otherwise hold
///   its place in the pool until TCP gives up (minutes to hours), and a
///   pool of such connections none; closed, it is replaced by a new one
///   once the network is back.
///
/// The hooks on PostgreSQL's connections exist with the `postgres` feature,
/// those on MySQL's with `mysql`; SQLite has none.
///
/// Statement logs: each statement at `TRACE`, one slower than
/// [`DEFAULT_SLOW_STATEMENT`] at [`DEFAULT_SLOW_STATEMENT_LEVEL`] (`DEBUG`),
/// with its SQL. Left to themselves sqlx and sea-orm print every statement
/// at `INFO` and a slow one at `WARN`: a claim's multi-kilobyte SQL at
/// each slow sweep. Change it on the options returned
/// (`sqlx_slow_statements_logging_settings`), or with the CLI's
/// `--slow-statement-level` and `--slow-statement-after`.
pub fn pool_options(url: impl Into<String>) -> sea_orm::ConnectOptions {
    let mut options = sea_orm::ConnectOptions::new(url.into());
    options
        .test_before_acquire(false)
        .acquire_timeout(crate::config::DEFAULT_DB_TIMEOUT)
        .sqlx_logging_level(log::LevelFilter::Trace)
        .sqlx_slow_statements_logging_settings(
            DEFAULT_SLOW_STATEMENT_LEVEL,
            DEFAULT_SLOW_STATEMENT,
        );
    #[cfg(feature = "postgres")]
    options
        .map_sqlx_postgres_before_acquire(hooks::checked::<hooks::sqlx::PgConnection>)
        .map_sqlx_postgres_pool_opts(|o| {
            o.after_connect(hooks::pg_session)
                .after_release(hooks::alive::<hooks::sqlx::PgConnection>)
        });
    #[cfg(feature = "mysql")]
    options
        .map_sqlx_mysql_before_acquire(hooks::checked::<hooks::sqlx::MySqlConnection>)
        .map_sqlx_mysql_pool_opts(|o| {
            o.after_connect(hooks::mysql_session)
                .after_release(hooks::rolled_back)
        });
    options
}

/// [`pool_options`]'s hooks on the connections of PostgreSQL and MySQL
/// pools.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod hooks {
    use std::time::Duration;

    pub(super) use sea_orm::sqlx;

    use crate::worker::{
        IDLE_TRANSACTION_TIMEOUT, POOL_PING_IF_IDLE_FOR, RELEASE_PING_BOUND, SUSPECT_PING_BOUND,
        SUSPECT_WINDOW,
    };
    // Whether a check answered within `bound`: past it an error, not
    // `false`, so the pool closes the connection without a goodbye (which
    // could hang too).
    async fn answered<T>(
        bound: Duration,
        check: impl std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> std::result::Result<bool, sqlx::Error> {
        match tokio::time::timeout(bound, check).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        }
    }
    #[cfg(feature = "postgres")]
    pub(super) fn alive<'c, C: sqlx::Connection>(
        conn: &'c mut C,
        _: sqlx::pool::PoolConnectionMetadata,
    ) -> futures::future::BoxFuture<'c, std::result::Result<bool, sqlx::Error>> {
        Box::pin(answered(RELEASE_PING_BOUND, conn.ping()))
    }
    // MySQL/MariaDB: a ROLLBACK instead of the ping (one round trip
    // either way, and harmless outside a transaction): it also ends a
    // transaction whose BEGIN was given up before it answered.
    #[cfg(feature = "mysql")]
    pub(super) fn rolled_back<'c>(
        conn: &'c mut sqlx::MySqlConnection,
        _: sqlx::pool::PoolConnectionMetadata,
    ) -> futures::future::BoxFuture<'c, std::result::Result<bool, sqlx::Error>> {
        use sqlx::Executor;
        Box::pin(answered(RELEASE_PING_BOUND, conn.execute("ROLLBACK")))
    }
    // Before use, a bounded ping: of a connection idle for
    // POOL_PING_IF_IDLE_FOR, and of every one for SUSPECT_WINDOW after an
    // abandoned call (more briefly); one that does not answer is closed
    // without a goodbye, and another tried.
    pub(super) fn checked<'c, C: sqlx::Connection>(
        conn: &'c mut C,
        meta: sqlx::pool::PoolConnectionMetadata,
    ) -> futures::future::BoxFuture<'c, std::result::Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let bound = if crate::db::abandoned_within(SUSPECT_WINDOW) {
                SUSPECT_PING_BOUND
            } else if meta.idle_for >= POOL_PING_IF_IDLE_FOR {
                RELEASE_PING_BOUND
            } else {
                return Ok(true);
            };
            answered(bound, conn.ping()).await
        })
    }
    // Each new connection: the server ends a transaction left idle.
    #[cfg(feature = "postgres")]
    pub(super) fn pg_session<'c>(
        conn: &'c mut sqlx::PgConnection,
        _: sqlx::pool::PoolConnectionMetadata,
    ) -> futures::future::BoxFuture<'c, std::result::Result<(), sqlx::Error>> {
        use sqlx::Executor;
        Box::pin(async move {
            let set = format!(
                "SET idle_in_transaction_session_timeout = {}",
                IDLE_TRANSACTION_TIMEOUT.as_millis()
            );
            conn.execute(sqlx::AssertSqlSafe(set)).await.map(drop)
        })
    }
    #[cfg(feature = "mysql")]
    pub(super) fn mysql_session<'c>(
        conn: &'c mut sqlx::MySqlConnection,
        _: sqlx::pool::PoolConnectionMetadata,
    ) -> futures::future::BoxFuture<'c, std::result::Result<(), sqlx::Error>> {
        use sqlx::Executor;
        Box::pin(async move {
            let set = format!(
                "SET SESSION idle_transaction_timeout = {}",
                IDLE_TRANSACTION_TIMEOUT.as_secs()
            );
            // MySQL has no such variable: the connection is used as is.
            if let Err(e) = conn.execute(sqlx::AssertSqlSafe(set)).await {
                tracing::debug!(error = %e, "no idle_transaction_timeout on this server");
            }
            Ok(())
        })
    }
}

/// A statement that runs longer than this on a pool of [`pool_options`] is
/// logged as slow: 1 second.
pub const DEFAULT_SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// The level at which a pool of [`pool_options`] logs a slow statement:
/// `DEBUG` (sqlx's own is `WARN`).
pub const DEFAULT_SLOW_STATEMENT_LEVEL: log::LevelFilter = log::LevelFilter::Debug;

/// How long [`connect`] waits for the database: 5 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a pool with [`pool_options`], giving up after `timeout` with
/// [`Error::Unreachable`], which names the host
/// (never the password).
pub async fn connect(
    url: &str,
    timeout: Duration,
) -> crate::error::Result<sea_orm::DatabaseConnection> {
    connect_with(pool_options(url), timeout).await
}

/// [`connect`] with these options (made with [`pool_options`], then
/// changed).
pub async fn connect_with(
    options: sea_orm::ConnectOptions,
    timeout: Duration,
) -> crate::error::Result<sea_orm::DatabaseConnection> {
    let url = options.get_url().to_string();
    let url = url.as_str();
    // Bounded here, not by sea-orm's `connect_timeout`: that one becomes the
    // pool's acquire timeout for the pool's whole life.
    let target = describe_url(url);
    let unreachable = |problem: String| crate::error::Error::Unreachable {
        target: target.clone(),
        timeout,
        problem,
    };
    let parsed = url::Url::parse(url).ok();
    if let Some(backend) = parsed.as_ref().and_then(crate::db::backend_of_url) {
        crate::db::check_backend(backend)?;
    }
    // A server URL without `//host` (`postgres:user:pw@host/db`) would
    // have the driver take `user:pw@host/db` for a database name, and echo
    // it in its error: refused before connecting.
    let authority = |u: &url::Url| {
        let rest = url.trim().get(u.scheme().len() + 1..);
        rest.is_some_and(|rest| rest.starts_with("//"))
    };
    if parsed
        .as_ref()
        .is_some_and(|u| u.scheme() != "sqlite" && !authority(u))
    {
        return Err(unreachable(
            "not a URL of the form scheme://user:password@host:port/database".into(),
        ));
    }
    match tokio::time::timeout(timeout, sea_orm::Database::connect(options)).await {
        // Whatever the URL said, the connection's backend must be compiled in.
        Ok(Ok(db)) => match crate::db::check_backend(db.get_database_backend()) {
            Ok(()) => Ok(db),
            Err(refused) => {
                db.close().await.ok();
                Err(refused)
            }
        },
        // sea-orm names the whole URL in some errors (an unknown scheme):
        // the host only, never the password.
        Ok(Err(e)) if url.is_empty() => Err(unreachable(e.to_string())),
        Ok(Err(e)) => Err(unreachable(e.to_string().replace(url, &target))),
        Err(_) => Err(unreachable("timed out".into())),
    }
}

/// `host:port/database` of a database URL (the file for SQLite), without
/// user or password.
fn describe_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) if u.scheme() == "sqlite" => {
            format!("{}{}", u.host_str().unwrap_or(""), u.path())
        }
        // No host: its path may hold anything, a password included.
        Ok(u) if !u.has_host() => format!("a {} URL without a host", u.scheme()),
        Ok(u) => format!(
            "{}:{}{}",
            u.host_str().unwrap_or("localhost"),
            u.port()
                .map_or_else(|| "default port".into(), |p| p.to_string()),
            u.path()
        ),
        Err(_) => "(unparsable database URL)".into(),
    }
}

/// After a sweep that failed (the database away), the next one runs this
/// soon, the wait doubling after each failure in a row up to
/// [`SWEEP_RETRY_MAX`], and never later than the schedule's next tick:
/// 500 ms.
pub const SWEEP_RETRY_FIRST: Duration = Duration::from_millis(500);
/// Longest wait after failed sweeps: 30 seconds.
pub const SWEEP_RETRY_MAX: Duration = Duration::from_secs(30);

/// How often a worker asks the database what is due next when its sweeps
/// scheduled nothing for later: every 250 ms at most.
pub const NEXT_DUE_EVERY: Duration = Duration::from_millis(250);

/// What a worker's wait listens to, besides time and shutdown.
struct Listeners<'a> {
    /// Notices due now (this process, and `NOTIFY` on PostgreSQL).
    wakes: &'a mut tokio::sync::watch::Receiver<u64>,
    /// Due times recorded in this process.
    hints: &'a mut tokio::sync::watch::Receiver<Option<Instant>>,
    /// Notices added due later in another process (PostgreSQL).
    checks: &'a mut tokio::sync::watch::Receiver<u64>,
}

/// What a worker's sweeping loop carries from one round to the next
/// ([`Worker::sweep_loop`]).
struct Rounds {
    /// Notices due now (this process, and `NOTIFY` on PostgreSQL).
    wakes: tokio::sync::watch::Receiver<u64>,
    /// Due times recorded in this process.
    hints: tokio::sync::watch::Receiver<Option<Instant>>,
    /// Notices added due later in another process (PostgreSQL).
    checks: tokio::sync::watch::Receiver<u64>,
    /// The earliest due time known.
    next_due: Option<Instant>,
    /// When the database was last asked what is due next.
    next_due_asked: Option<Instant>,
    /// A pending ask of what is due next, without a sweep.
    recheck: Option<Instant>,
    /// Whether the first round is still to come.
    first: bool,
    /// After a failed sweep: the next one within this, doubling from
    /// SWEEP_RETRY_FIRST (never later than the schedule's tick).
    retry: Option<Duration>,
}

/// What ended a worker's wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The schedule's tick.
    Tick,
    /// A wake-up or a due time, before the tick.
    Early,
    /// Time to ask what is due next (no sweep).
    Check,
    /// Told that a notice was added due later: ask what is due next, at
    /// most every [`NEXT_DUE_EVERY`] (no sweep).
    Told,
}

/// A sweeping loop over one notifier.
///
/// ```no_run
/// # async fn run(notifier: solid_notify::Notifier) -> Result<(), solid_notify::Error> {
/// use solid_notify::{Worker, WorkerConfig};
/// use tokio_util::sync::CancellationToken;
/// let worker = Worker::new(notifier.clone(), WorkerConfig::default())?;
/// let stop = CancellationToken::new();
/// let running = tokio::spawn({
///     let stop = stop.clone();
///     async move { worker.run(stop).await }
/// });
/// tokio::signal::ctrl_c().await.ok();
/// stop.cancel(); // finishes the sweep in flight, then returns
/// running.await.ok();
/// notifier.shutdown(std::time::Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct Worker {
    /// `host:pid:random`: its heartbeat row's id, and the `worker` field of
    /// its log lines.
    id: String,
    notifier: Notifier,
    config: WorkerConfig,
    cron: cron::Schedule,
    stats: Arc<WorkerStats>,
    last_park_check: Mutex<Option<Instant>>,
    /// Whether the current run of failed sweeps was alerted.
    alerted: std::sync::atomic::AtomicBool,
    /// The definitions this worker takes, worked out from the definition
    /// cache's rows it holds: again only when those change, not on every
    /// sweep (at 100,000 definitions that walk was a tenth of a drain's CPU).
    selection: Mutex<Option<(KnownDefs, Selection)>>,
    /// The lower bound on due times its claims read
    /// ([`floor`](crate::state::floor)).
    floor: Floor,
    /// Whether the pool's connections were warmed up (once per worker).
    warmed: std::sync::atomic::AtomicBool,
    /// PostgreSQL: whether `NOTIFY` reaches this worker; `false` once its
    /// listener found a pooler in transaction mode (it then asks what is
    /// due every `due_check_every`, as on the other backends).
    hears_notify: Arc<std::sync::atomic::AtomicBool>,
}

/// The definition cache's rows, as shared by its snapshot.
type KnownDefs = Arc<std::collections::HashMap<i64, crate::def::cache::Entry>>;

/// The definitions a worker takes, as worked out from one read of them.
#[derive(Clone)]
struct Selection {
    /// Which definitions' notices it takes.
    defs: DefSelect,
    /// Those it takes from any partition ([`DueFilter::any_partition`]).
    any_partition: Vec<i64>,
}

/// The definitions named by some definition's `events_to`: operational
/// events come from no producer's balancer, so they are written to
/// partition 0, and a worker limited to partitions takes them from any.
fn event_defs(known: &std::collections::HashMap<i64, crate::def::cache::Entry>) -> Vec<i64> {
    let targets: std::collections::HashSet<&str> = known
        .values()
        .filter_map(|entry| entry.as_ref().ok()?.events_to.as_deref())
        .collect();
    let mut ids: Vec<i64> = known
        .iter()
        .filter(|(_, entry)| {
            entry
                .as_ref()
                .is_ok_and(|def| targets.contains(def.name.as_str()))
        })
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids
}

impl Worker {
    /// Checks `config` and prepares a worker (nothing runs until [`Worker::run`]).
    pub fn new(notifier: Notifier, config: WorkerConfig) -> Result<Worker> {
        let cron = cron::Schedule::from_str(&config.cron)
            .map_err(|e| Error::Config(format!("cron `{}`: {e}", config.cron)))?;
        if !(1..=config::MAX_BATCH_SIZE).contains(&config.batch_size) {
            return Err(Error::Config(format!(
                "batch_size: {} is not between 1 and {}",
                config.batch_size,
                config::MAX_BATCH_SIZE
            )));
        }
        if !(1..=config::MAX_CONCURRENCY).contains(&config.concurrency) {
            return Err(Error::Config(format!(
                "concurrency: {} is not between 1 and {}",
                config.concurrency,
                config::MAX_CONCURRENCY
            )));
        }
        if config.partitions.iter().any(|p| *p < 0) {
            return Err(Error::Config("partitions must not be negative".into()));
        }
        wake::check_listen_url(&notifier, config.listen_url.as_ref())?;
        let check = config.due_check_every;
        if !check.is_zero()
            && !(config::MIN_DUE_CHECK_EVERY..=config::MAX_DUE_CHECK_EVERY).contains(&check)
        {
            return Err(Error::Config(format!(
                "due_check_every: {check:?} is neither zero nor between {:?} and {:?}",
                config::MIN_DUE_CHECK_EVERY,
                config::MAX_DUE_CHECK_EVERY
            )));
        }
        Ok(Worker {
            id: worker_id(),
            notifier,
            config,
            cron,
            stats: Arc::default(),
            last_park_check: Mutex::new(None),
            alerted: std::sync::atomic::AtomicBool::new(false),
            selection: Mutex::new(None),
            floor: Floor::kept(),
            warmed: std::sync::atomic::AtomicBool::new(false),
            hears_notify: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        })
    }

    /// Gets ready to sweep: opens and warms up to [`WARM_CONNECTIONS`] of
    /// the pool's connections, reads the definitions, works out which of
    /// them this worker takes, and parks the notices of unknown or invalid
    /// definitions. [`Worker::run`] does it before its first sweep when it
    /// was not done; a caller that wants that sweep at full speed (a rolling
    /// deploy, a benchmark) awaits it first. At 100,000 definitions this is
    /// the one-off part of a start (about 1.5 s on PostgreSQL, most of it
    /// reading the definitions).
    ///
    /// # Errors
    /// The definitions could not be read; nothing was claimed, and the
    /// sweeps try again.
    pub async fn prepare(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.warmed.swap(true, Ordering::Relaxed) {
            warm_up(self.notifier.db()).await;
        }
        self.filter().await?;
        self.park_check().await;
        Ok(())
    }

    #[doc(hidden)]
    /// The worker's counters.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Runs until `shutdown` is cancelled, then returns once in-flight work is
    /// finished or released. Database errors are logged and retried at the next
    /// tick; they never end the loop. `shutdown` itself is only watched,
    /// never cancelled here.
    ///
    /// Once `shutdown` is cancelled it returns within `shutdown_timeout` +
    /// [`RELEASE_GRACE`] + [`HARD_STOP_MARGIN`], whatever the database does:
    /// deliveries still running at `shutdown_timeout` are abandoned; rows
    /// are released and delivered successes recorded for up to
    /// `RELEASE_GRACE` more; what is still waiting for the database then is
    /// given up (a count at `warn`, and `solid_notify_outcomes_given_up_total`)
    /// and left to its lease: a success delivered but not recorded is sent
    /// again, never lost.
    ///
    /// Before anything starts it checks the database
    /// ([`Notifier::check_database`]): on a schema older than this build,
    /// or behind a pooler it cannot use, it returns that error at once,
    /// having claimed nothing. A database that does not answer is asked
    /// again until it does, or until `shutdown`.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<()> {
        let Some(check) = self.checked(&shutdown).await? else {
            return Ok(());
        };
        // Known before the listener starts: the first wait already polls.
        if check.transaction_pooled && self.config.listen_url.is_none() {
            self.hears_notify
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        let listening = shutdown.child_token();
        let listener_tasks = self.spawn_listeners(&listening, &check);
        // The deadline, once shutdown is asked for: everything is done,
        // or given up, by then.
        // (A timeout too long to add up means no deadline.)
        let total = self
            .config
            .shutdown_timeout
            .saturating_add(RELEASE_GRACE + HARD_STOP_MARGIN);
        let (deadline, noted) = note_deadline(&shutdown, total);
        let hard_stop = async {
            shutdown.cancelled().await;
            tokio::time::sleep(total).await;
        };
        let finished = tokio::select! {
            () = self.sweep_loop(&shutdown) => true,
            () = hard_stop => false,
        };
        if shutdown.is_cancelled() {
            noted.await.ok();
        } else {
            // The schedule ended (a cron with no future tick).
            noted.abort();
        }
        listening.cancel();
        if !finished {
            // The sweep is dropped with what it held: deliveries abandoned,
            // leases left to run out (their drop releases them in the
            // background if the database answers), and the successes its
            // batch had not written yet left to that batch (it gives them
            // up, counted, or writes them, if the database answers first).
            let unrecorded = self.stats.snapshot().unrecorded;
            tracing::warn!(
                unrecorded,
                "shutdown: the database did not take the last outcomes in time; their notices are due again when their leases end (delivered successes are sent again)"
            );
        }
        stop_listeners(listener_tasks, &deadline).await;
        Ok(())
    }

    /// [`Notifier::check_database`], asked again after
    /// [`SWEEP_RETRY_FIRST`], doubling up to [`SWEEP_RETRY_MAX`], while the
    /// database does not answer: the check, `None` at shutdown, or the
    /// refusal ([`Error::SchemaBehind`], [`Error::Pooler`]).
    async fn checked(&self, shutdown: &CancellationToken) -> Result<Option<DatabaseCheck>> {
        let mut pause = SWEEP_RETRY_FIRST;
        loop {
            let check = tokio::select! {
                check = self.notifier.check_database() => check,
                () = shutdown.cancelled() => return Ok(None),
            };
            match check {
                Ok(check) => return Ok(Some(check)),
                Err(e @ (Error::SchemaBehind { .. } | Error::Pooler(_))) => {
                    tracing::error!(error = %e, "refusing to start");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check the database before the first sweep; asking again");
                }
            }
            if !sleep_or_stop(pause, shutdown).await {
                return Ok(None);
            }
            pause = pause.saturating_mul(2).min(SWEEP_RETRY_MAX);
        }
    }

    /// Starts what listens beside the sweeps until `listening` is
    /// cancelled: the confirmation listener, the wake-up listener and the
    /// heartbeat, each when configured.
    fn spawn_listeners(
        &self,
        listening: &CancellationToken,
        check: &DatabaseCheck,
    ) -> [Option<JoinHandle<()>>; 4] {
        let confirmations =
            (self.config.confirm_listener && self.notifier.amqp_enabled()).then(|| {
                tokio::spawn(crate::confirm::listen(
                    self.notifier.clone(),
                    listening.clone(),
                ))
            });
        let wakes = self.config.wake.then(|| {
            tokio::spawn(wake::listen(
                self.notifier.clone(),
                self.config.listen_url.clone(),
                check.transaction_pooled,
                self.hears_notify.clone(),
                listening.clone(),
            ))
        });
        let heartbeat = (!self.config.heartbeat_every.is_zero()).then(|| {
            tokio::spawn(heartbeat(
                self.id.clone(),
                self.notifier.clone(),
                self.stats.clone(),
                self.config.heartbeat_every,
                listening.clone(),
            ))
        });
        let partitions = Some(tokio::spawn(partition_upkeep(
            self.notifier.clone(),
            listening.clone(),
        )));
        [confirmations, wakes, heartbeat, partitions]
    }

    /// Sweeps on the schedule until shutdown (or until the schedule has no
    /// more ticks): [`start_sweeping`](Self::start_sweeping), then rounds of
    /// [`next_tick`](Self::next_tick), [`wait_for_sweep`](Self::wait_for_sweep),
    /// [`sweep_round`](Self::sweep_round) and [`plan_next_due`](Self::plan_next_due).
    async fn sweep_loop(&self, shutdown: &CancellationToken) {
        if !self.start_sweeping(shutdown).await {
            return;
        }
        let mut rounds = self.rounds();
        loop {
            let Some(tick) = self.next_tick(&mut rounds) else {
                return;
            };
            let Some(woken) = self.wait_for_sweep(&mut rounds, tick, shutdown).await else {
                return;
            };
            let Some(before) = self.sweep_round(&mut rounds, woken, shutdown).await else {
                return;
            };
            self.plan_next_due(&mut rounds, woken, before).await;
        }
    }

    /// Waits the initial delay, then gets ready ([`prepare`](Self::prepare));
    /// `false`: shutdown came first.
    async fn start_sweeping(&self, shutdown: &CancellationToken) -> bool {
        if !sleep_or_stop(self.config.initial_delay, shutdown).await {
            return false;
        }
        // A database that does not answer holds the start, never a shutdown.
        tokio::select! {
            prepared = self.prepare() => if let Err(e) = prepared {
                tracing::warn!(error = %e, "cannot read the definitions before the first sweep");
            },
            () = shutdown.cancelled() => return false,
        }
        true
    }

    /// The sweeping loop's state before its first round: subscribed to
    /// wake-ups, due hints and due checks.
    fn rounds(&self) -> Rounds {
        let mut wakes = self.notifier.store().wakes.subscribe();
        wakes.mark_unchanged();
        let hints = self.notifier.signals().subscribe_due_hint();
        let mut checks = self.notifier.signals().subscribe_due_checks();
        checks.mark_unchanged();
        Rounds {
            wakes,
            hints,
            checks,
            // With wake-ups on, a starting worker catches up at once.
            next_due: self.config.wake.then(Instant::now),
            next_due_asked: None,
            recheck: None,
            first: true,
            retry: None,
        }
    }

    /// When the next sweep is scheduled: the schedule's tick, or sooner
    /// after a failed sweep. `None`: the cron has no future tick (logged).
    fn next_tick(&self, rounds: &mut Rounds) -> Option<Instant> {
        let tick = match self.config.mode {
            WorkerMode::FixedRate => {
                let Some(tick) = self.cron.after(&Utc::now()).next() else {
                    tracing::warn!(cron = %self.config.cron, "cron schedule has no future tick");
                    return None;
                };
                Instant::now() + (tick - Utc::now()).to_std().unwrap_or_default()
            }
            WorkerMode::FixedDelay if rounds.first => Instant::now(),
            WorkerMode::FixedDelay => Instant::now() + self.config.delay,
        };
        rounds.first = false;
        let tick = match rounds.retry {
            Some(after) => tick.min(Instant::now() + after),
            None => tick,
        };
        Some(tick)
    }

    /// Waits until it is time to sweep, asking what is due next meanwhile
    /// when told to. `Some(true)`: woken early; `Some(false)`: the tick;
    /// `None`: shutdown.
    async fn wait_for_sweep(
        &self,
        rounds: &mut Rounds,
        tick: Instant,
        shutdown: &CancellationToken,
    ) -> Option<bool> {
        loop {
            let check_at = self.check_at(rounds, tick);
            let listeners = Listeners {
                wakes: &mut rounds.wakes,
                hints: &mut rounds.hints,
                checks: &mut rounds.checks,
            };
            match self
                .wait(tick, rounds.next_due, check_at, listeners, shutdown)
                .await
            {
                None => return None,
                Some(Woke::Check) => {
                    rounds.recheck = None;
                    rounds.next_due = self.next_due(rounds.next_due).await;
                    rounds.next_due_asked = Some(Instant::now());
                }
                // Asked at most every NEXT_DUE_EVERY, however many
                // notices are added due later.
                Some(Woke::Told) => {
                    let at = rounds
                        .next_due_asked
                        .map_or_else(Instant::now, |t| t + NEXT_DUE_EVERY)
                        .max(Instant::now());
                    rounds.recheck = Some(rounds.recheck.map_or(at, |r| r.min(at)));
                }
                Some(Woke::Early) => return Some(true),
                Some(Woke::Tick) => return Some(false),
            }
        }
    }

    /// When to ask what is due next without sweeping: a check armed after
    /// a wake-up (a notice added for later, in another process), and, where
    /// no `NOTIFY` tells of other processes' notices, every
    /// `due_check_every`.
    fn check_at(&self, rounds: &Rounds, tick: Instant) -> Option<Instant> {
        let every = (self.config.wake
            && !self.config.due_check_every.is_zero()
            && (self.notifier.store().backend() != sea_orm::DbBackend::Postgres
                || !self.hears_notify.load(std::sync::atomic::Ordering::Relaxed)))
        .then(|| {
            rounds.next_due_asked.map_or_else(Instant::now, |t| {
                t.checked_add(self.config.due_check_every).unwrap_or(tick)
            })
        });
        match (rounds.recheck, every) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// One sweep, woken or at the tick, and the wait before the next after
    /// a failure. `None`: shutdown; otherwise the counters from before it.
    async fn sweep_round(
        &self,
        rounds: &mut Rounds,
        woken: bool,
        shutdown: &CancellationToken,
    ) -> Option<StatsSnapshot> {
        match woken {
            true => {
                tracing::trace!("woken");
                self.stats.add_wakeup();
            }
            false => tracing::trace!("tick"),
        }
        let before = self.stats.snapshot();
        let swept_at = Instant::now();
        let swept = self
            .sweep_with(shutdown, self.config.wake.then_some(&mut rounds.wakes))
            .await;
        rounds.retry = match (swept, rounds.retry) {
            (true, _) => None,
            (false, None) => Some(SWEEP_RETRY_FIRST),
            (false, Some(after)) => Some((after * 2).min(SWEEP_RETRY_MAX)),
        };
        self.notifier.signals().clear_due_hint(swept_at);
        if shutdown.is_cancelled() {
            return None;
        }
        Some(before)
    }

    /// After a sweep (its counters `before` it): asks what is due next, or
    /// arms a check for later.
    async fn plan_next_due(&self, rounds: &mut Rounds, woken: bool, before: StatsSnapshot) {
        // What is due next: asked after a sweep that scheduled something
        // for later, and otherwise at most every NEXT_DUE_EVERY.
        let after = self.stats.snapshot();
        let scheduled = after.retried + after.awaiting_confirm + after.released + after.lost_claims
            > before.retried + before.awaiting_confirm + before.released + before.lost_claims;
        let stale = rounds
            .next_due_asked
            .is_none_or(|t: Instant| t.elapsed() >= NEXT_DUE_EVERY);
        if self.config.wake && (scheduled || stale) {
            let asked = Instant::now();
            rounds.next_due = self.next_due(rounds.next_due).await;
            tracing::trace!(ms = asked.elapsed().as_millis() as u64, due_in_ms = ?rounds.next_due.map(|d| d.saturating_duration_since(Instant::now()).as_millis()), "next due");
            rounds.next_due_asked = Some(Instant::now());
            rounds.recheck = None;
        } else {
            if rounds.next_due.is_some_and(|d| d <= Instant::now()) {
                rounds.next_due = None;
            }
            // Woken (a notice added, perhaps due later) but asked too
            // recently to ask again: ask once NEXT_DUE_EVERY has passed.
            if self.config.wake && woken && rounds.recheck.is_none() {
                rounds.recheck = rounds.next_due_asked.map(|t| t + NEXT_DUE_EVERY);
            }
        }
    }

    /// Waits for the scheduled `tick`, the earliest known due time (what the
    /// database said, or a due time recorded in this process meanwhile), a
    /// wake-up, or `check_at` (time to ask what is due next). `None`:
    /// shutdown.
    async fn wait(
        &self,
        tick: Instant,
        next_due: Option<Instant>,
        check_at: Option<Instant>,
        listeners: Listeners<'_>,
        shutdown: &CancellationToken,
    ) -> Option<Woke> {
        let Listeners {
            wakes,
            hints,
            checks,
        } = listeners;
        loop {
            let hint = if self.config.wake {
                *hints.borrow_and_update()
            } else {
                None
            };
            let due = match (next_due, hint) {
                (Some(a), Some(b)) => Some(a.min(b.max(Instant::now() + MIN_DUE_WAIT))),
                (a, b) => a.or(b.map(|b| b.max(Instant::now() + MIN_DUE_WAIT))),
            };
            let (at, early) = match due {
                Some(due) if due < tick => (due, true),
                _ => (tick, false),
            };
            let woke = |early: bool| match early {
                true => Woke::Early,
                false => Woke::Tick,
            };
            return tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => Some(woke(early)),
                _ = tokio::time::sleep_until(check_at.unwrap_or(at).into()), if check_at.is_some_and(|c| c < at) => Some(Woke::Check),
                changed = wakes.changed(), if self.config.wake => Some(woke(changed.is_ok())),
                changed = hints.changed(), if self.config.wake => match changed {
                    Ok(()) => continue,
                    Err(_) => Some(Woke::Early),
                },
                changed = checks.changed(), if self.config.wake => match changed {
                    Ok(()) => Some(Woke::Told),
                    Err(_) => Some(Woke::Early),
                },
                _ = shutdown.cancelled() => None,
            };
        }
    }

    /// When the earliest notice this worker may take is due (at least
    /// [`MIN_DUE_WAIT`] from now); `None` when nothing is in flight. When
    /// the database cannot tell, the time `known` so far.
    async fn next_due(&self, known: Option<Instant>) -> Option<Instant> {
        let filter = match self.filter().await {
            Ok(filter) => filter,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read definitions for the next due time");
                return known;
            }
        };
        match crate::state::claim::next_due(self.notifier.store(), &filter).await {
            Ok(due) => due.map(|d| Instant::now() + d.max(MIN_DUE_WAIT)),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the next due time");
                known
            }
        }
    }

    /// The rows this worker may take.
    async fn filter(&self) -> Result<DueFilter> {
        let inner = &self.notifier.engine;
        let known = inner.defs.known(&inner.store.db).await?;
        let memo = self
            .selection
            .lock()
            .ok()
            .and_then(|memo| match memo.as_ref() {
                Some((seen, selection)) if Arc::ptr_eq(seen, &known) => Some(selection.clone()),
                _ => None,
            });
        let Selection {
            defs,
            any_partition,
        } = match memo {
            Some(selection) => selection,
            None => {
                let selection = Selection {
                    defs: self.notifier.deliverable_among(
                        &known,
                        &self.config.defs,
                        &self.config.handlers,
                    ),
                    any_partition: match self.config.partitions.is_empty() {
                        true => Vec::new(),
                        false => event_defs(&known),
                    },
                };
                if let Ok(mut memo) = self.selection.lock() {
                    *memo = Some((known, selection.clone()));
                }
                selection
            }
        };
        // Alerts are swept by every worker, whatever its filters, that can
        // deliver them (built with `email`): one that cannot would claim and
        // release them again and again.
        let filtered = !(self.config.defs.is_empty()
            && self.config.handlers.is_empty()
            && self.config.partitions.is_empty());
        let always = match filtered {
            false => Vec::new(),
            true => match self.notifier.alert_def().await {
                Ok(def) if crate::attempt::available(&self.notifier.engine, &def).is_ok() => {
                    vec![def.id]
                }
                Ok(_) => Vec::new(),
                Err(e) => {
                    // The worker's own notices go on; alerts wait for the
                    // next sweep that can read their definition.
                    tracing::warn!(error = %e, "cannot read the alert definition; sweeping without alerts");
                    Vec::new()
                }
            },
        };
        Ok(DueFilter {
            defs,
            partitions: self.config.partitions.clone(),
            any_partition,
            always,
            floor: self.floor.clone(),
        })
    }

    /// One sweep now (claiming again at once while batches come back full),
    /// and, once every [`PARK_CHECK_INTERVAL`], parking notices of unknown or
    /// invalid definitions.
    pub async fn sweep_now(&self, shutdown: &CancellationToken) {
        self.sweep_with(shutdown, None).await;
    }

    /// One sweep; `false` when it failed (logged and counted).
    async fn sweep_with(
        &self,
        shutdown: &CancellationToken,
        wakes: Option<&mut tokio::sync::watch::Receiver<u64>>,
    ) -> bool {
        self.park_check().await;
        self.stats.sweep_started();
        let span = tracing::info_span!(
            "sweep",
            worker = %self.id,
            claimed = tracing::field::Empty,
            ms = tracing::field::Empty
        );
        let started = Instant::now();
        let result = async {
            let filter = self.filter().await?;
            tracing::trace!(
                ms = started.elapsed().as_millis() as u64,
                "definitions selected"
            );
            let limits = SweepLimits {
                batch_size: self.config.batch_size,
                concurrency: self.config.concurrency,
                shutdown_timeout: self.config.shutdown_timeout,
                max_in_flight_bytes: self.config.max_in_flight_bytes,
            };
            match wakes {
                Some(wakes) => {
                    self.notifier
                        .sweep_woken(&filter, &limits, shutdown, &self.stats, wakes)
                        .await
                }
                None => {
                    self.notifier
                        .sweep(&filter, &limits, shutdown, &self.stats)
                        .await
                }
            }
        }
        .instrument(span.clone())
        .await;
        span.record("ms", started.elapsed().as_millis() as u64);
        match result {
            Ok(summary) => {
                span.record("claimed", summary.claimed);
                self.alerted
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                let failed = self.stats.sweep_succeeded();
                if failed >= SWEEP_FAILURES_ALERT {
                    tracing::warn!(parent: &span, "sweeps succeed again after {failed} failures in a row");
                }
                true
            }
            Err(e) => {
                let n = self.stats.sweep_failed();
                if n == SWEEP_FAILURES_ALERT {
                    tracing::error!(parent: &span, error = %e, "{n} sweeps failed in a row: nothing is claimed by this worker until this is fixed");
                }
                if n >= SWEEP_FAILURES_ALERT
                    && !self.alerted.load(std::sync::atomic::Ordering::Relaxed)
                {
                    // Until the alert is stored (the database may refuse it
                    // for the reason the sweeps fail), tried again each time.
                    if self.sweeps_failing_alert(n, &e).await {
                        self.alerted
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                } else if n != SWEEP_FAILURES_ALERT {
                    tracing::warn!(parent: &span, error = %e, in_a_row = n, "sweep failed; retrying soon");
                }
                false
            }
        }
    }
}

impl Worker {
    /// The alert that `n` sweeps failed in a row (to the alert
    /// definition's recipients; none: no alert), added and attempted at
    /// once. `false`: it could not be stored (logged).
    async fn sweeps_failing_alert(&self, n: u64, error: &Error) -> bool {
        let result = async {
            let def = self.notifier.alert_def().await?;
            if def.alert_emails.is_empty() {
                return Ok(());
            }
            let host = hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "unknown".into());
            let mail = crate::alert::AlertMail::sweeps_failing(
                def.alert_emails.clone(),
                &format!("{host}:{}", std::process::id()),
                n,
                &error.to_string(),
            );
            let pending = self
                .notifier
                .add(
                    self.notifier.db(),
                    crate::producer::NewNotice::new(crate::alert::ALERT_DEF, &mail.param())
                        .description(crate::alert::ALERT_DESCRIPTION)
                        .written_by(crate::status::Origin::Alert),
                )
                .await?;
            self.notifier.dispatch(vec![pending], false).await;
            Ok::<(), Error>(())
        }
        .await;
        match result {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot raise the alert about failing sweeps yet");
                false
            }
        }
    }

    async fn park_check(&self) {
        {
            let mut last = self
                .last_park_check
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < PARK_CHECK_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        let started = Instant::now();
        let parked = self.notifier.park_orphans(PARK_CHECK_LIMIT).await;
        tracing::trace!(ms = started.elapsed().as_millis() as u64, "park check");
        match parked {
            Ok(reports) => {
                for report in &reports {
                    self.stats.count(&report.result);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look for notices to park"),
        }
    }
}

/// Opens up to [`WARM_CONNECTIONS`] connections of the pool at once (those
/// it can have within 200 ms) and runs a statement on each that touches the
/// notice tables, so the connections a worker needs exist, warm, before its
/// first sweep.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn warm_up(db: &sea_orm::DatabaseConnection) {
    use sea_orm::sqlx;
    const WARM: &str = "SELECT 1 FROM notify_msg WHERE id < 0 UNION ALL SELECT 1 FROM notify_msg_history WHERE id < 0";
    async fn warm<DB: sqlx::Database>(pool: &sqlx::Pool<DB>)
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        // A pool shared with others may have no connection to spare: each
        // acquire gives up quickly, and all are given back at once.
        let n = pool.options().get_max_connections().min(WARM_CONNECTIONS);
        let acquire = || tokio::time::timeout(Duration::from_millis(200), pool.acquire());
        let connections = futures::future::join_all((0..n).map(|_| acquire())).await;
        for mut conn in connections.into_iter().flatten().flatten() {
            if let Err(e) = sqlx::Executor::execute(&mut *conn, WARM).await {
                tracing::debug!(error = %e, "warming a connection failed");
            }
        }
    }
    match db.get_database_backend() {
        #[cfg(feature = "postgres")]
        sea_orm::DbBackend::Postgres => warm(db.get_postgres_connection_pool()).await,
        #[cfg(feature = "mysql")]
        sea_orm::DbBackend::MySql => warm(db.get_mysql_connection_pool()).await,
        _ => {}
    }
}

/// Nothing to warm: SQLite's connections are files.
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
async fn warm_up(_: &sea_orm::DatabaseConnection) {}

/// Notes when everything must be done once `shutdown` is cancelled: `total`
/// from then (a task; unset while shutdown is not asked for).
fn note_deadline(
    shutdown: &CancellationToken,
    total: Duration,
) -> (Arc<std::sync::OnceLock<Instant>>, JoinHandle<()>) {
    let deadline = Arc::new(std::sync::OnceLock::new());
    let noted = tokio::spawn({
        let (shutdown, deadline) = (shutdown.clone(), deadline.clone());
        async move {
            shutdown.cancelled().await;
            if let Some(at) = Instant::now().checked_add(total) {
                let _ = deadline.set(at);
            }
        }
    });
    (deadline, noted)
}

/// Waits for the listeners' tasks to end, for at most [`HARD_STOP_MARGIN`]
/// and never past `deadline`, then aborts those still running.
async fn stop_listeners(
    listeners: [Option<JoinHandle<()>>; 4],
    deadline: &std::sync::OnceLock<Instant>,
) {
    // Listeners stop between calls (and out of them); whatever still
    // runs at the deadline is aborted.
    let mut tasks: Vec<_> = listeners.into_iter().flatten().collect();
    let left = deadline
        .get()
        .map_or(HARD_STOP_MARGIN, |d| {
            d.saturating_duration_since(Instant::now())
        })
        .min(HARD_STOP_MARGIN);
    let all = futures::future::join_all(tasks.iter_mut());
    if tokio::time::timeout(left, all).await.is_err() {
        for task in &tasks {
            task.abort();
        }
    }
}

/// After this many sweeps failed in a row a worker logs at `error` and
/// raises an alert (once per run of failures): 10.
pub const SWEEP_FAILURES_ALERT: u64 = 10;

/// Sleeps `d`; `false` if `shutdown` was cancelled first.
async fn sleep_or_stop(d: std::time::Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => !shutdown.is_cancelled(),
        _ = shutdown.cancelled() => false,
    }
}

/// This host's name, cut to 200 characters (the heartbeat's columns hold
/// 255: the host, `:pid:` and 16 hex digits fit).
fn host_name() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
        .chars()
        .take(200)
        .collect()
}

/// A new worker's id: `host:pid:` and 16 random hex digits.
fn worker_id() -> String {
    format!(
        "{}:{}:{:016x}",
        host_name(),
        std::process::id(),
        fastrand::u64(..)
    )
}

/// Makes the periods ahead of partitioned history (PostgreSQL) at start and
/// every [`UPKEEP_EVERY`](crate::state::partitions::UPKEEP_EVERY) until
/// `stop`; nothing on one history table. A failure is logged and tried
/// again at the next round (until then rows of a missing period go to the
/// default partition).
async fn partition_upkeep(notifier: Notifier, stop: CancellationToken) {
    let mut tick = tokio::time::interval(crate::state::partitions::UPKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let made = tokio::select! {
            made = crate::state::partitions::upkeep(notifier.db()) => made,
            _ = stop.cancelled() => return,
        };
        match made {
            Ok(made) if !made.is_empty() => tracing::info!(?made, "made periods of history ahead"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot make the periods of history ahead"),
        }
    }
}

/// Writes this worker's heartbeat row every `every` until `stop` (the row
/// then goes stale: the worker is shown as gone). A failed write is logged
/// and tried again at the next beat.
async fn heartbeat(
    id: String,
    notifier: Notifier,
    stats: Arc<WorkerStats>,
    every: Duration,
    stop: CancellationToken,
) {
    let host = host_name();
    let pid = std::process::id();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let s = stats.snapshot();
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let beat = crate::state::heartbeat::Beat {
            id: id.clone(),
            host: host.clone(),
            pid: i32::try_from(pid).unwrap_or(i32::MAX),
            sweeps: count(s.sweeps),
            claimed: count(s.claimed),
            succeeded: count(s.succeeded + s.awaiting_confirm),
            failed: count(s.retried + s.final_failures),
            beat_secs: every.as_secs_f64(),
        };
        let written = tokio::select! {
            written = crate::state::heartbeat::beat(&notifier.store().db, &beat) => written,
            _ = stop.cancelled() => return,
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write the worker heartbeat");
        }
    }
}
