//! Adding a notice: its row written through the caller's connection,
//! keyed ([`keyed`](super::keyed)) when it has an idempotency key, plainly
//! ([`insert`](super::insert)) otherwise; on PostgreSQL inside a savepoint.

use sea_orm::{ConnectionTrait, DbBackend, TransactionSession, TransactionTrait};

use super::{
    insert::{InsertError, NewRow, Within, insert_new},
    keyed::{self, Keyed},
};

/// Inserts `row` through `conn` (the caller's transaction, guarded by a
/// savepoint on PostgreSQL); returns the new notice id, or with an
/// idempotency key the existing notice's ([`keyed`](super::keyed)).
pub(crate) async fn insert<C>(conn: &C, row: &NewRow, within: Within) -> Result<Keyed, InsertError>
where
    C: ConnectionTrait + TransactionTrait,
{
    if conn.get_database_backend() != DbBackend::Postgres {
        return write(conn, row, within).await;
    }
    let savepoint = conn.begin().await?;
    match write(&savepoint, row, within).await {
        Ok(written) => {
            savepoint.commit().await.map_err(|error| InsertError::Db {
                error,
                aborted: true,
            })?;
            Ok(written)
        }
        Err(InsertError::Db { error, aborted }) => {
            let aborted = aborted || savepoint.rollback().await.is_err();
            Err(InsertError::Db { error, aborted })
        }
        Err(other) => Err(other),
    }
}

/// Writes `row`: keyed ([`keyed::insert`]) when it has
/// an idempotency key, plainly otherwise.
pub(crate) async fn write<C: ConnectionTrait>(
    conn: &C,
    row: &NewRow,
    within: Within,
) -> Result<Keyed, InsertError> {
    if row.idempotency_key.is_some() {
        return keyed::insert(conn, row, within).await;
    }
    insert_new(conn, row, within).await.map(Keyed::New)
}
