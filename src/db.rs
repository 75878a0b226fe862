//! Db: transactions several workers run at once, and what to do when the
//! database refuses a statement.
//!
//! Errors fall in three kinds: a *conflict* (deadlock, serialization failure,
//! SQLite busy) is retried at once; a *transient* fault (a lost or refused
//! connection, a terminated backend, a server shutting down, an exhausted
//! pool, a call past its bound) is retried with backoff for as long as the
//! caller allows; anything else is a bug or bad data and is not retried.
//!
//! **Every call of the attempt path is bounded.** Claims, records,
//! releases, heartbeats and the producer's own statements reach the tables
//! through a [`Db`]: each statement (and each `BEGIN`, `COMMIT` and
//! `ROLLBACK` of its transactions) that takes longer than
//! [`Config::db_timeout`](crate::Config::db_timeout) is abandoned and fails
//! as a lost connection ([`timed_out`]). A network partition keeps sockets
//! open, and a statement sent into one would otherwise wait for TCP to give
//! up, hours later; a statement abandoned this way may still run once the
//! network is back, which the version guards make harmless (a claim so
//! abandoned leases its rows to nobody: they are due again when the lease
//! ends). A `BEGIN` is never abandoned half-way ([`begin_bounded`]).
//! Operator calls (purge, the dashboard's reads, definition sync) and
//! migrations use the caller's pool as it is.

use std::{future::Future, pin::Pin, time::Duration};

use async_trait::async_trait;
use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    ExecResult, IsolationLevel, QueryResult, RuntimeErr, SqliteTransactionMode, Statement,
    TransactionError, TransactionOptions, TransactionSession, TransactionTrait,
};
use tokio_util::sync::CancellationToken;

/// Times a statement the database aborted as a conflict is tried in all.
pub const CONFLICT_TRIES: u32 = 5;
/// First pause before a transient fault is retried; it doubles each time ...
pub const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// ... up to this pause between tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Refuses a backend whose cargo feature is off in this build
/// ([`Error::BackendNotCompiled`](crate::error::Error::BackendNotCompiled)):
/// sea-orm may still have its driver, from another crate of the build, but
/// solid-notify's own code for it (PostgreSQL's producer connection and
/// reads, MySQL's error numbers, the pools' hooks) would be missing.
pub fn check_backend(backend: DbBackend) -> Result<(), crate::error::Error> {
    let (name, feature, compiled) = match backend {
        DbBackend::Postgres => ("PostgreSQL", "postgres", cfg!(feature = "postgres")),
        DbBackend::MySql => ("MySQL/MariaDB", "mysql", cfg!(feature = "mysql")),
        DbBackend::Sqlite => ("SQLite", "sqlite", cfg!(feature = "sqlite")),
        _ => ("this database", "", false),
    };
    if compiled {
        Ok(())
    } else {
        Err(crate::error::Error::BackendNotCompiled {
            backend: name,
            feature,
        })
    }
}

/// The backend a database URL names, by its scheme (as the `url` crate
/// reads it: spaces around it trimmed, any case).
pub(crate) fn backend_of_url(url: &url::Url) -> Option<DbBackend> {
    match url.scheme() {
        "postgres" | "postgresql" => Some(DbBackend::Postgres),
        "mysql" => Some(DbBackend::MySql),
        "sqlite" => Some(DbBackend::Sqlite),
        _ => None,
    }
}

/// The driver's error under `e` (none without a backend feature).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn sqlx_error(e: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e)) => Some(e.as_ref()),
        _ => None,
    }
}

/// The SQLSTATE (or SQLite's code) of the database's error under `e`.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn sql_state(e: &DbErr) -> Option<String> {
    sqlx_error(e)?
        .as_database_error()
        .and_then(|db| db.code())
        .map(|c| c.into_owned())
}

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
pub(crate) fn sql_state(_: &DbErr) -> Option<String> {
    None
}

/// Whether the database aborted the statement as a conflict to be retried:
/// a deadlock or serialization failure (SQLSTATE 40001 / 40P01, MySQL 1213
/// and lock wait timeout 1205), or SQLite busy or locked.
pub(crate) fn is_conflict(e: &DbErr) -> bool {
    sql_state(e).is_some_and(|code| {
        matches!(
            code.as_str(),
            "40001" | "40P01" | "5" | "6" | "517" | "261" | "262"
        )
    }) || mysql_code(e).is_some_and(|n| n == 1213 || n == 1205)
}

/// Whether `e` is known to have rolled back the whole transaction it ran
/// in, whatever the server: a MySQL/MariaDB deadlock (1213; InnoDB rolls
/// the transaction back).
pub(crate) fn rolled_back_transaction(e: &DbErr) -> bool {
    mysql_code(e) == Some(1213)
}

/// Whether `e` says the statement ran in a transaction the database had
/// aborted already: PostgreSQL's `in_failed_sql_transaction` (25P02), which
/// refuses every statement until the transaction is rolled back (or rolled
/// back to a savepoint), or a deadlock that rolled it back
/// ([`rolled_back_transaction`]).
pub(crate) fn in_aborted_transaction(e: &DbErr) -> bool {
    sql_state(e).is_some_and(|code| code == "25P02") || rolled_back_transaction(e)
}

/// MySQL's or MariaDB's error number under `e`.
#[cfg(feature = "mysql")]
fn mysql_code(e: &DbErr) -> Option<u16> {
    let db = sqlx_error(e)?.as_database_error()?;
    db.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
        .map(|m| m.number())
}

#[cfg(not(feature = "mysql"))]
fn mysql_code(_: &DbErr) -> Option<u16> {
    None
}

/// Whether `e` is a fault of the connection or the server rather than of the
/// statement: worth retrying with backoff (conflicts included).
pub(crate) fn is_transient(e: &DbErr) -> bool {
    if is_conflict(e) {
        return true;
    }
    matches!(e, DbErr::ConnectionAcquire(_) | DbErr::Conn(_)) || driver_transient(e)
}

/// [`is_transient`], for the driver's own errors.
#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn driver_transient(_: &DbErr) -> bool {
    false
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn driver_transient(e: &DbErr) -> bool {
    let Some(sqlx) = sqlx_error(e) else {
        return false;
    };
    use sea_orm::sqlx::Error as S;
    match sqlx {
        S::Io(_) | S::Tls(_) | S::PoolTimedOut | S::PoolClosed | S::WorkerCrashed => true,
        S::Protocol(_) => true,
        S::Database(_) => {
            sql_state(e).is_some_and(|code| {
                // 08: connection exception; 57P01-03: admin shutdown, crash
                // shutdown, cannot connect now; 53300: too many connections;
                // 57014: statement cancelled (statement_timeout,
                // pg_cancel_backend); 55P03: lock not available (lock_timeout);
                // 25P03: idle in transaction too long (the session ended).
                code.starts_with("08")
                    || code.starts_with("57P")
                    || matches!(code.as_str(), "53300" | "57014" | "55P03" | "25P03")
            }) || mysql_code(e).is_some_and(|n| {
                // 1040 too many connections, 1053 server shutdown, 1158-1161
                // network read/write errors, 1317 query interrupted, 1927
                // connection killed (MariaDB), 1969 statement timeout
                // (MariaDB), 3024 query timeout (MySQL), 2006/2013 server
                // gone or connection lost.
                matches!(
                    n,
                    1040 | 1053 | 1158..=1161 | 1317 | 1927 | 1969 | 3024 | 2006 | 2013
                )
            })
        }
        _ => false,
    }
}

/// Whether `e` means the connection (or the server) went away while the
/// statement ran, so that its outcome is unknown: it may have been applied.
pub(crate) fn connection_lost(e: &DbErr) -> bool {
    matches!(e, DbErr::Conn(_)) || driver_lost(e)
}

/// [`connection_lost`], for the driver's own errors.
#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn driver_lost(_: &DbErr) -> bool {
    false
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn driver_lost(e: &DbErr) -> bool {
    let Some(sqlx) = sqlx_error(e) else {
        return false;
    };
    use sea_orm::sqlx::Error as S;
    match sqlx {
        S::Io(_) | S::Tls(_) | S::Protocol(_) | S::WorkerCrashed => true,
        S::Database(_) => {
            sql_state(e).is_some_and(|code| {
                code.starts_with("08") || code.starts_with("57P") || code == "25P03"
            }) || mysql_code(e).is_some_and(|n| matches!(n, 1053 | 1927 | 2006 | 2013))
        }
        _ => false,
    }
}

/// Runs `op` again (up to [`CONFLICT_TRIES`] times in all, with a short
/// jittered pause) while it fails with a conflict.
pub(crate) async fn on_conflict_retry<T, F, Fut>(mut op: F) -> Result<T, DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if tries < CONFLICT_TRIES && is_conflict(&e) => {
                tracing::debug!(error = %e, tries, "conflict; trying again");
                let pause = 5 * u64::from(tries) + fastrand::u64(0..10);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Pauses between tries of a transient fault: [`BACKOFF_FIRST`], doubling,
/// at most [`BACKOFF_MAX`], each with up to 20% jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    /// Sleeps the next pause; `false` when `give_up` was cancelled first.
    pub async fn wait(&mut self, give_up: &CancellationToken) -> bool {
        let jitter = self.next.mul_f64(fastrand::f64() * 0.2);
        let pause = self.next + jitter;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        tokio::select! {
            _ = tokio::time::sleep(pause) => !give_up.is_cancelled(),
            _ = give_up.cancelled() => false,
        }
    }
}

/// When this process last abandoned a database call: milliseconds after
/// [`EPOCH`], plus one (0: never).
static ABANDONED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The process's reference instant for [`ABANDONED`].
static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn millis_since_epoch() -> u64 {
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether this process abandoned a database call ([`timed_out`]) within
/// the last `window`: its pools' idle connections may be cut off too.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn abandoned_within(window: Duration) -> bool {
    use std::sync::atomic::Ordering;
    match ABANDONED.load(Ordering::Relaxed) {
        0 => false,
        at => {
            let since = millis_since_epoch().saturating_add(1).saturating_sub(at);
            u128::from(since) < window.as_millis()
        }
    }
}

/// The error of a call that did not answer within `bound`: a lost
/// connection (transient; its outcome unknown). Noted, so that the pools
/// of [`pool_options`](crate::worker::pool_options) check each idle
/// connection before handing it out for a while
/// ([`SUSPECT_WINDOW`](crate::worker::SUSPECT_WINDOW)).
pub(crate) fn timed_out(bound: Duration) -> DbErr {
    ABANDONED.store(
        millis_since_epoch().saturating_add(1),
        std::sync::atomic::Ordering::Relaxed,
    );
    DbErr::Conn(RuntimeErr::Internal(format!(
        "the database did not answer within {bound:?} (Config::db_timeout); the call was abandoned"
    )))
}

/// Begins a transaction on `pool`, waiting at most `bound`, without ever
/// abandoning a `BEGIN` half-way: sqlx counts a transaction only once its
/// `BEGIN` has answered, so one dropped before that could leave the
/// connection inside a transaction nobody knows of, back in the pool, for
/// the next caller's statements. The `BEGIN` runs on a task of its own;
/// past `bound` the caller gets [`timed_out`], and the transaction, should
/// it begin later, is rolled back by the task (dropped, as sea-orm does).
/// A `BEGIN` sent on a connection a partition cut off holds that
/// connection until TCP gives up; the pools of
/// [`pool_options`](crate::worker::pool_options) ping each idle connection
/// after such a call, so the next ones go to connections that answer.
pub(crate) async fn begin_bounded(
    pool: &DatabaseConnection,
    options: TransactionOptions,
    bound: Duration,
) -> Result<DatabaseTransaction, DbErr> {
    let pool = pool.clone();
    let begun = tokio::spawn(async move { pool.begin_with_options(options).await });
    match tokio::time::timeout(bound, begun).await {
        Ok(Ok(begun)) => begun,
        Ok(Err(e)) => Err(DbErr::Custom(format!(
            "beginning a transaction failed: {e}"
        ))),
        Err(_) => Err(timed_out(bound)),
    }
}

/// Runs `call`, abandoning it after `bound` ([`timed_out`]).
pub(crate) async fn bounded<T>(
    bound: Duration,
    call: impl Future<Output = Result<T, DbErr>>,
) -> Result<T, DbErr> {
    tokio::time::timeout(bound, call)
        .await
        .unwrap_or_else(|_| Err(timed_out(bound)))
}

/// The pool as the library uses it: every call bounded (see the module
/// docs). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Db {
    pool: DatabaseConnection,
    bound: Duration,
}

impl Db {
    pub fn new(pool: DatabaseConnection, bound: Duration) -> Self {
        Db { pool, bound }
    }

    /// The pool itself, for calls that bound themselves (the raw sqlx pool
    /// of PostgreSQL, the listener).
    pub fn pool(&self) -> &DatabaseConnection {
        &self.pool
    }

    /// The bound of each call.
    pub fn bound(&self) -> Duration {
        self.bound
    }
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("backend", &self.pool.get_database_backend())
            .field("bound", &self.bound)
            .finish()
    }
}

/// A transaction of a [`Db`]: every statement, and its end, bounded.
pub(crate) struct Txn {
    txn: DatabaseTransaction,
    bound: Duration,
}

impl Txn {
    /// Commits (bounded: past it the outcome is unknown).
    pub async fn commit(self) -> Result<(), DbErr> {
        bounded(self.bound, self.txn.commit()).await
    }

    /// Rolls back (bounded; a transaction dropped unfinished is rolled back
    /// by the pool too).
    pub async fn rollback(self) -> Result<(), DbErr> {
        bounded(self.bound, self.txn.rollback()).await
    }
}

/// Implements [`ConnectionTrait`] for a wrapper whose field `$inner` does
/// the work, each call bounded by its `bound`.
macro_rules! bounded_connection {
    ($type:ty, $inner:ident) => {
        #[async_trait]
        impl ConnectionTrait for $type {
            fn get_database_backend(&self) -> DbBackend {
                self.$inner.get_database_backend()
            }

            async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
                bounded(self.bound, self.$inner.execute_raw(stmt)).await
            }

            async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
                bounded(self.bound, self.$inner.execute_unprepared(sql)).await
            }

            async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
                bounded(self.bound, self.$inner.query_one_raw(stmt)).await
            }

            async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
                bounded(self.bound, self.$inner.query_all_raw(stmt)).await
            }

            fn support_returning(&self) -> bool {
                self.$inner.support_returning()
            }
        }

        #[async_trait]
        impl TransactionTrait for $type {
            type Transaction = Txn;

            async fn begin(&self) -> Result<Txn, DbErr> {
                self.begin_with_options(TransactionOptions::default()).await
            }

            async fn begin_with_config(
                &self,
                isolation_level: Option<IsolationLevel>,
                access_mode: Option<AccessMode>,
            ) -> Result<Txn, DbErr> {
                self.begin_with_options(TransactionOptions {
                    isolation_level,
                    access_mode,
                    ..TransactionOptions::default()
                })
                .await
            }

            async fn begin_with_options(&self, options: TransactionOptions) -> Result<Txn, DbErr> {
                Ok(Txn {
                    txn: self.begin_inner(options).await?,
                    bound: self.bound,
                })
            }

            async fn transaction<F, T, E>(&self, callback: F) -> Result<T, TransactionError<E>>
            where
                F: for<'c> FnOnce(
                        &'c Txn,
                    )
                        -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
                    + Send,
                T: Send,
                E: std::fmt::Display + std::fmt::Debug + Send,
            {
                let txn = self.begin().await.map_err(TransactionError::Connection)?;
                match callback(&txn).await {
                    Ok(value) => {
                        txn.commit().await.map_err(TransactionError::Connection)?;
                        Ok(value)
                    }
                    Err(e) => {
                        txn.rollback().await.map_err(TransactionError::Connection)?;
                        Err(TransactionError::Transaction(e))
                    }
                }
            }

            async fn transaction_with_config<F, T, E>(
                &self,
                callback: F,
                _isolation_level: Option<IsolationLevel>,
                _access_mode: Option<AccessMode>,
            ) -> Result<T, TransactionError<E>>
            where
                F: for<'c> FnOnce(
                        &'c Txn,
                    )
                        -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
                    + Send,
                T: Send,
                E: std::fmt::Display + std::fmt::Debug + Send,
            {
                self.transaction(callback).await
            }
        }
    };
}

impl Db {
    /// A transaction on the pool ([`begin_bounded`]).
    async fn begin_inner(&self, options: TransactionOptions) -> Result<DatabaseTransaction, DbErr> {
        begin_bounded(&self.pool, options, self.bound).await
    }
}

impl Txn {
    /// A savepoint: abandoned past the bound, sqlx rolls it back (it counts
    /// the transaction it is in).
    async fn begin_inner(&self, options: TransactionOptions) -> Result<DatabaseTransaction, DbErr> {
        bounded(self.bound, self.txn.begin_with_options(options)).await
    }
}

bounded_connection!(Db, pool);
bounded_connection!(Txn, txn);

#[async_trait]
impl TransactionSession for Txn {
    async fn commit(self) -> Result<(), DbErr> {
        Txn::commit(self).await
    }

    async fn rollback(self) -> Result<(), DbErr> {
        Txn::rollback(self).await
    }
}

/// Begins one of solid-notify's own short transactions: on MySQL/MariaDB at
/// READ COMMITTED, which takes no gap locks and so does not deadlock with
/// concurrent claims; on SQLite as `BEGIN IMMEDIATE`, so that a transaction
/// that reads before it writes waits for the write lock (busy timeout)
/// instead of failing as "database is locked" when another writer got in
/// between. Business transactions ([`Notifier::begin`](crate::Notifier::begin))
/// keep the database's default isolation.
pub(crate) async fn begin<C>(db: &C) -> Result<C::Transaction, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let options = match db.get_database_backend() {
        DbBackend::MySql => TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        },
        DbBackend::Sqlite => TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        },
        _ => TransactionOptions::default(),
    };
    db.begin_with_options(options).await
}

/// How a business transaction begins: the database's default isolation,
/// and `BEGIN IMMEDIATE` on SQLite (a writer takes the lock up front).
pub(crate) fn business_options(db: &DatabaseConnection) -> TransactionOptions {
    match db.get_database_backend() {
        DbBackend::Sqlite => TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        },
        _ => TransactionOptions::default(),
    }
}

/// `LIKE` pattern for values containing `text` (its `%`, `_` and `\\`
/// taken literally).
pub(crate) fn containing(text: &str) -> sea_orm::sea_query::LikeExpr {
    let escaped = text
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    sea_orm::sea_query::LikeExpr::new(format!("%{escaped}%")).escape('\\')
}

/// Tries a database call until it lands (transient faults, until `give_up`).
pub(crate) async fn retry_db<T, F, Fut>(
    give_up: &CancellationToken,
    mut op: F,
) -> Result<T, crate::error::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = crate::error::Result<T>>,
{
    let mut backoff = Backoff::default();
    loop {
        match op().await {
            Err(crate::error::Error::Db(e)) if is_transient(&e) => {
                tracing::warn!(error = %e, "database unavailable; retrying");
                if !backoff.wait(give_up).await {
                    return Err(crate::error::Error::Db(e));
                }
            }
            other => return other,
        }
    }
}
