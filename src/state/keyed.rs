//! Keyed: an idempotent insert. A notice with an `idempotency_key` is
//! written only if its definition has no notice with that key, in flight or
//! in history; otherwise the existing notice's id is returned and nothing is
//! written (gruelbox's `uniqueRequestId`).
//!
//! The unique index `idx_notify_msg_def_key` on `notify_msg (def_id,
//! idempotency_key)` (migration 10) decides between concurrent producers:
//! the second insert waits for the first transaction and then finds its row
//! (`ON CONFLICT DO NOTHING` on PostgreSQL and SQLite, the duplicate-key
//! error on MySQL/MariaDB, which rolls back only the statement). History is
//! looked up after the insert, so a notice of the key that finished while
//! the insert ran is still found (its move to history is one transaction):
//! the row just written is then deleted again, in the caller's transaction.
//! On MySQL/MariaDB the lookups are locking reads, which see the latest
//! committed rows whatever the transaction's snapshot. The guarantee holds
//! under the default isolation of each database (READ COMMITTED on
//! PostgreSQL, REPEATABLE READ on MariaDB, SQLite's serial writers).

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, ExprTrait, SqlErr,
    sea_query::{Alias, Expr, OnConflict, Query},
};

use super::{
    columns::{Column, Table},
    insert::{InsertError, NewRow, Within, statement},
};

/// The unique index that decides between producers of one key.
pub const UNIQUE_KEY_INDEX: &str = "idx_notify_msg_def_key";

/// How often an insert is tried again when the notice it conflicted with
/// was gone by the time it was looked up (finished and purged, say).
const TRIES: usize = 3;

/// What a keyed insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keyed {
    /// Written: the new notice's id.
    New(i64),
    /// The definition already has a notice with this key (in flight or in
    /// history): its id. Nothing was written.
    Existing(i64),
}

/// Inserts `row`, whose `idempotency_key` is set, unless its definition
/// already has a notice with that key.
pub(crate) async fn insert<C: ConnectionTrait>(
    conn: &C,
    row: &NewRow,
    within: Within,
) -> Result<Keyed, InsertError> {
    let Some(key) = row.idempotency_key.as_deref() else {
        return Err(DbErr::Custom("a keyed insert needs an idempotency key".into()).into());
    };
    for _ in 0..TRIES {
        if let Some(id) = insert_unless_taken(conn, row, within).await? {
            if let Some(existing) = find(conn, Table::History, row.def_id, key).await? {
                let mut delete = Query::delete();
                delete
                    .from_table(Alias::new(Table::Live.name()))
                    .and_where(Expr::col(Column::Id).eq(id));
                conn.execute(&delete).await?;
                return Ok(Keyed::Existing(existing));
            }
            return Ok(Keyed::New(id));
        }
        for table in [Table::Live, Table::History] {
            if let Some(existing) = find(conn, table, row.def_id, key).await? {
                return Ok(Keyed::Existing(existing));
            }
        }
    }
    Err(DbErr::Custom(format!(
        "idempotency key `{key}`: the notice it conflicted with vanished {TRIES} times in a row; try again"
    ))
    .into())
}

/// Inserts `row`; `None` when the unique key index refused it.
async fn insert_unless_taken<C: ConnectionTrait>(
    conn: &C,
    row: &NewRow,
    within: Within,
) -> Result<Option<i64>, InsertError> {
    let backend = conn.get_database_backend();
    let mut stmt = statement(backend, row, within);
    if backend == DbBackend::MySql {
        return match conn.execute(&stmt).await {
            // No transaction to insert into: nothing written.
            Ok(done) if done.rows_affected() == 0 => Err(InsertError::NoTransaction),
            Ok(done) => Ok(Some(
                i64::try_from(done.last_insert_id()).map_err(|_| DbErr::UnpackInsertId)?,
            )),
            Err(e) if is_key_conflict(&e) => Ok(None),
            Err(e) => Err(e.into()),
        };
    }
    stmt.on_conflict(
        OnConflict::columns([Column::DefId, Column::IdempotencyKey])
            .target_and_where(Expr::col(Column::IdempotencyKey).is_not_null())
            .do_nothing()
            .to_owned(),
    );
    if backend == DbBackend::Postgres {
        stmt.returning_col(Column::Id);
        return match conn.query_one(&stmt).await? {
            Some(found) => Ok(Some(found.try_get_by_index::<i64>(0)?)),
            None => Ok(None),
        };
    }
    let done = conn.execute(&stmt).await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    Ok(Some(
        i64::try_from(done.last_insert_id()).map_err(|_| DbErr::UnpackInsertId)?,
    ))
}

/// Whether `e` is the unique key index refusing a second notice of a key.
pub(crate) fn is_key_conflict(e: &DbErr) -> bool {
    // PostgreSQL and MySQL name the index; SQLite names the columns.
    matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(msg))
        if msg.contains(UNIQUE_KEY_INDEX) || msg.contains("notify_msg.idempotency_key"))
}

/// The oldest notice of `def_id` with `key` in `table`.
async fn find<C: ConnectionTrait>(
    conn: &C,
    table: Table,
    def_id: i64,
    key: &str,
) -> Result<Option<i64>, DbErr> {
    let mut select = Query::select();
    select
        .column(Column::Id)
        .from(Alias::new(table.name()))
        .and_where(Expr::col(Column::DefId).eq(def_id))
        .and_where(Expr::col(Column::IdempotencyKey).eq(key))
        .order_by(Column::Id, sea_orm::sea_query::Order::Asc)
        .limit(1);
    if conn.get_database_backend() == DbBackend::MySql {
        select.lock_shared();
    }
    match conn.query_one(&select).await? {
        Some(found) => found.try_get_by_index::<i64>(0).map(Some),
        None => Ok(None),
    }
}
