//! Db: small helpers for transactions that several workers run at once.

use std::{future::Future, time::Duration};

use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, RuntimeErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};

/// Times a transaction the database aborted as a conflict is tried in all.
pub const CONFLICT_TRIES: u32 = 5;

/// Whether the database aborted the statement as a conflict to be retried:
/// a deadlock or serialization failure (SQLSTATE 40001 / 40P01), or SQLite
/// busy or locked.
pub(crate) fn is_conflict(e: &DbErr) -> bool {
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = e else {
        return false;
    };
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| matches!(code.as_ref(), "40001" | "40P01" | "5" | "6" | "517"))
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

/// Begins a transaction: on MySQL/MariaDB at READ COMMITTED, which takes no
/// gap locks and so does not deadlock with concurrent claims; on SQLite as
/// `BEGIN IMMEDIATE`, so that a transaction that reads before it writes waits
/// for the write lock (busy timeout) instead of failing as "database is
/// locked" when another writer got in between.
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
