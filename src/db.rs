//! Db: transactions several workers run at once, and what to do when the
//! database refuses a statement.
//!
//! Errors fall in three kinds: a *conflict* (deadlock, serialization failure,
//! SQLite busy) is retried at once; a *transient* fault (a lost or refused
//! connection, a terminated backend, a server shutting down, an exhausted
//! pool) is retried with backoff for as long as the caller allows; anything
//! else is a bug or bad data and is not retried.

use std::{future::Future, time::Duration};

use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, RuntimeErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use tokio_util::sync::CancellationToken;

/// Times a statement the database aborted as a conflict is tried in all.
pub const CONFLICT_TRIES: u32 = 5;
/// First pause before a transient fault is retried; it doubles each time ...
pub const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// ... up to this pause between tries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

fn sqlx_error(e: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e)) => Some(e.as_ref()),
        _ => None,
    }
}

fn sql_state(e: &DbErr) -> Option<String> {
    sqlx_error(e)?
        .as_database_error()
        .and_then(|db| db.code())
        .map(|c| c.into_owned())
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

fn mysql_code(e: &DbErr) -> Option<u16> {
    let db = sqlx_error(e)?.as_database_error()?;
    db.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
        .map(|m| m.number())
}

/// Whether `e` is a fault of the connection or the server rather than of the
/// statement: worth retrying with backoff (conflicts included).
pub(crate) fn is_transient(e: &DbErr) -> bool {
    if is_conflict(e) {
        return true;
    }
    if matches!(e, DbErr::ConnectionAcquire(_) | DbErr::Conn(_)) {
        return true;
    }
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
                // pg_cancel_backend); 55P03: lock not available (lock_timeout).
                code.starts_with("08")
                    || code.starts_with("57P")
                    || matches!(code.as_str(), "53300" | "57014" | "55P03")
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
    if matches!(e, DbErr::Conn(_)) {
        return true;
    }
    let Some(sqlx) = sqlx_error(e) else {
        return false;
    };
    use sea_orm::sqlx::Error as S;
    match sqlx {
        S::Io(_) | S::Tls(_) | S::Protocol(_) | S::WorkerCrashed => true,
        S::Database(_) => {
            sql_state(e).is_some_and(|code| code.starts_with("08") || code.starts_with("57P"))
                || mysql_code(e).is_some_and(|n| matches!(n, 1053 | 1927 | 2006 | 2013))
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

/// Begins one of solid-notify's own short transactions: on MySQL/MariaDB at
/// READ COMMITTED, which takes no gap locks and so does not deadlock with
/// concurrent claims; on SQLite as `BEGIN IMMEDIATE`, so that a transaction
/// that reads before it writes waits for the write lock (busy timeout)
/// instead of failing as "database is locked" when another writer got in
/// between. Business transactions ([`Notifier::begin`](crate::Notifier::begin))
/// keep the database's default isolation.
pub(crate) async fn begin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
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

/// Begins a business transaction: the database's default isolation, and
/// `BEGIN IMMEDIATE` on SQLite (a writer takes the lock up front).
pub(crate) async fn begin_business(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let options = match db.get_database_backend() {
        DbBackend::Sqlite => TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        },
        _ => TransactionOptions::default(),
    };
    db.begin_with_options(options).await
}
