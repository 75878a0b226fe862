//! PgTx: a business transaction on PostgreSQL whose notices cost no round
//! trip of their own.
//!
//! It holds a connection of the pool and speaks to it directly: `BEGIN` is
//! sent with the first statement that needs it, notices are checked and
//! buffered in memory (their ids taken from a block of the sequence), and
//! the commit writes them all with one prepared statement before `COMMIT`.
//! A transaction that carries only notices sends that one statement and
//! nothing else: it commits by itself. A failing insert fails the commit,
//! with nothing committed. A failed statement aborts a PostgreSQL
//! transaction: the commit then answers
//! [`Error::TransactionAborted`](crate::Error::TransactionAborted) and
//! nothing is committed. A transaction dropped unfinished, or mid-statement,
//! closes its connection (PostgreSQL rolls back) instead of handing it back
//! to the pool in an unknown state.

use std::sync::Arc;

use sea_orm::{
    DbErr, ExecResult, QueryResult, RuntimeErr, Statement,
    sqlx::{self, Executor, PgPool, Postgres, pool::PoolConnection},
};
use sea_query_sqlx::SqlxValues;
use tokio::sync::Mutex;

use crate::{
    error::{Error, Result},
    state::{
        ids::{self, IdBlocks},
        insert::{self, NewRow},
    },
};

struct Link {
    conn: Option<PoolConnection<Postgres>>,
    /// `BEGIN` was sent and the transaction has not ended.
    begun: bool,
    /// A statement failed: the transaction is aborted.
    failed: Option<String>,
    /// A statement is under way (still set if its future was dropped).
    in_flight: bool,
}

/// See the module docs.
pub(crate) struct PgTx {
    link: Mutex<Link>,
}

fn exec_err(e: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(e)))
}

fn query_err(e: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(Arc::new(e)))
}

impl Link {
    /// The connection, with the transaction begun when `begin`.
    async fn ready(
        &mut self,
        begin: bool,
    ) -> std::result::Result<&mut PoolConnection<Postgres>, DbErr> {
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| DbErr::Custom("the transaction has ended".into()))?;
        if begin && !self.begun {
            self.in_flight = true;
            conn.execute("BEGIN").await.map_err(exec_err)?;
            self.in_flight = false;
            self.begun = true;
        }
        Ok(conn)
    }

    fn note<T>(&mut self, result: std::result::Result<T, DbErr>) -> std::result::Result<T, DbErr> {
        self.in_flight = false;
        if let Err(e) = &result
            && self.begun
        {
            self.failed.get_or_insert_with(|| e.to_string());
        }
        result
    }
}

impl PgTx {
    /// Takes a connection from `pool`; nothing is sent yet.
    pub async fn new(pool: &PgPool) -> std::result::Result<PgTx, DbErr> {
        let conn = pool
            .acquire()
            .await
            .map_err(|e| DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e))))?;
        Ok(PgTx {
            link: Mutex::new(Link {
                conn: Some(conn),
                begun: false,
                failed: None,
                in_flight: false,
            }),
        })
    }

    pub async fn execute(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        let mut link = self.link.lock().await;
        let conn = link.ready(true).await?;
        let values = stmt.values.unwrap_or(sea_orm::Values(Vec::new()));
        let done = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql), SqlxValues(values))
            .execute(&mut **conn)
            .await
            .map(ExecResult::from)
            .map_err(exec_err);
        link.note(done)
    }

    pub async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        let mut link = self.link.lock().await;
        let conn = link.ready(true).await?;
        let done = conn
            .execute(sqlx::AssertSqlSafe(sql.to_owned()))
            .await
            .map(ExecResult::from)
            .map_err(exec_err);
        link.note(done)
    }

    pub async fn query_all(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        let mut link = self.link.lock().await;
        let conn = link.ready(true).await?;
        let values = stmt.values.unwrap_or(sea_orm::Values(Vec::new()));
        let rows = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql), SqlxValues(values))
            .fetch_all(&mut **conn)
            .await
            .map(|rows| rows.into_iter().map(QueryResult::from).collect())
            .map_err(query_err);
        link.note(rows)
    }

    pub async fn query_one(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        let mut link = self.link.lock().await;
        let conn = link.ready(true).await?;
        let values = stmt.values.unwrap_or(sea_orm::Values(Vec::new()));
        let row = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql), SqlxValues(values))
            .fetch_optional(&mut **conn)
            .await
            .map(|row| row.map(QueryResult::from))
            .map_err(query_err);
        link.note(row)
    }

    /// An id for a new notice: from `blocks`, refilled from the sequence on
    /// this connection (outside the transaction when it has not begun).
    pub async fn next_id(&self, blocks: &IdBlocks) -> std::result::Result<i64, DbErr> {
        if let Some(id) = blocks.take() {
            return Ok(id);
        }
        let mut link = self.link.lock().await;
        let conn = link.ready(false).await?;
        link_fetch(conn, blocks).await.map_err(query_err)?;
        blocks
            .take()
            .ok_or_else(|| DbErr::Custom("the id sequence returned no ids".into()))
    }

    /// Writes `rows` and commits: one statement when nothing else ran,
    /// else the insert then `COMMIT`.
    pub async fn commit(&self, rows: &[(i64, NewRow)]) -> Result<()> {
        let mut link = self.link.lock().await;
        if let Some(why) = link.failed.take() {
            drop(link);
            self.rollback().await.ok();
            return Err(Error::TransactionAborted(why));
        }
        let begun = link.begun;
        if !begun && rows.is_empty() {
            return Ok(());
        }
        link.ready(false).await?;
        link.in_flight = true;
        let Some(conn) = link.conn.as_mut() else {
            return Err(Error::TransactionAborted(
                "the transaction has ended".into(),
            ));
        };
        let inserted = if rows.is_empty() {
            Ok(())
        } else {
            insert::pg_insert_rows(conn, rows).await
        };
        // The error, and whether the transaction is still open (to roll back).
        let outcome = match inserted {
            Err(e) => Err((e, begun)),
            Ok(()) if begun => conn
                .execute("COMMIT")
                .await
                .map(drop)
                .map_err(|e| (e, false)),
            Ok(()) => Ok(()),
        };
        link.in_flight = false;
        match outcome {
            Ok(()) => {
                link.begun = false;
                Ok(())
            }
            Err((e, true)) => {
                // The insert failed inside the transaction: roll it back.
                drop(link);
                self.rollback().await.ok();
                Err(Error::Db(exec_err(e)))
            }
            Err((e, false)) => {
                // A failed COMMIT, or a lone insert, ends the transaction itself.
                link.begun = false;
                Err(Error::Db(exec_err(e)))
            }
        }
    }

    /// Rolls back (nothing to do when nothing was sent).
    pub async fn rollback(&self) -> std::result::Result<(), DbErr> {
        let mut link = self.link.lock().await;
        if !link.begun {
            return Ok(());
        }
        let conn = link.ready(false).await?;
        let done = conn.execute("ROLLBACK").await.map(drop).map_err(exec_err);
        link.in_flight = false;
        if done.is_ok() {
            link.begun = false;
        }
        done
    }
}

async fn link_fetch(
    conn: &mut PoolConnection<Postgres>,
    blocks: &IdBlocks,
) -> std::result::Result<(), sqlx::Error> {
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(ids::block_sql()))
        .fetch_all(&mut **conn)
        .await?;
    blocks.put(ids);
    Ok(())
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let link = self.link.get_mut();
        if let Some(conn) = link.conn.as_mut()
            && (link.begun || link.in_flight)
        {
            // Unfinished: PostgreSQL rolls back when the connection closes.
            conn.close_on_drop();
        }
    }
}
