//! PgTx: a business transaction on PostgreSQL whose notices cost no round
//! trip of their own.
//!
//! It holds a connection of the pool and speaks to it directly: `BEGIN` is
//! sent with the first statement that needs it, notices are checked and
//! buffered in memory (their ids taken from a block of the sequence), and
//! the commit sends them all as one `INSERT` in the same message as the
//! `COMMIT` (a notice costs the business transaction no round trip; a
//! statement over 1 MiB goes as a prepared insert before the `COMMIT`). Its
//! strings are dollar-quoted literals, so sqlx's statement log (when on)
//! shows them. A transaction that carries only notices sends one prepared
//! insert and nothing else: it commits by itself. Buffered notices are not
//! visible to the transaction's own queries before the commit.
//!
//! What the commit answers:
//! - `Ok`: the business data and every notice committed together.
//! - [`Error::TransactionAborted`](crate::Error::TransactionAborted): nothing
//!   committed. A statement had aborted the transaction (a failed statement
//!   does, on PostgreSQL, unless the caller rolled back to a savepoint of its
//!   own: the commit asks the server), a statement was cancelled mid-way,
//!   `BEGIN` failed, or the notices could not be written.
//! - [`Error::CommitOutcomeUnknown`](crate::Error::CommitOutcomeUnknown): the
//!   connection was lost while committing.
//!
//! A transaction dropped unfinished, or mid-statement, closes its connection
//! (PostgreSQL rolls back) instead of handing it back to the pool in an
//! unknown state. Once committed or rolled back it hands its connection
//! back at once and refuses every further statement, even from a nested
//! transaction that outlived it.
//!
//! **Savepoints.** Notices buffered for the `COMMIT` cannot follow
//! savepoints, so the wrapper stops buffering at the first savepoint
//! ([`PgTx::write_now`], called by [`NoticeTx`](super::NoticeTx) before the
//! statement that opens it): the notices buffered so far are written before
//! it, and every later notice as it is added, each in one message guarded by
//! a savepoint of its own. The database then decides which rows a rollback
//! to a savepoint takes back.

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

/// The savepoint around one write of notices ([`PgTx::write_now`]).
const ADD_SAVEPOINT: &str = "solid_notify_add";

/// Whether a transaction is open and alive, asked of PostgreSQL: a
/// savepoint is accepted only inside a transaction block that has not
/// been aborted (outside one it is refused, 25P01; in an aborted one,
/// 25P02), and released at once.
pub(crate) const PROBE: [&str; 2] = [
    "SAVEPOINT solid_notify_probe",
    "RELEASE SAVEPOINT solid_notify_probe",
];

struct Link {
    conn: Option<PoolConnection<Postgres>>,
    /// `BEGIN` was sent (or may have been) and the transaction has not ended.
    begun: bool,
    /// A statement failed inside the transaction (or one of the caller's
    /// may have rolled it back). The next add or commit asks the server
    /// whether that aborted the transaction: the caller may have rolled
    /// back to a savepoint of its own and gone on.
    failed: Option<String>,
    /// The transaction's state is unknown (a statement's future was dropped
    /// mid-way, or `BEGIN` failed): it can only be rolled back.
    broken: Option<String>,
    /// A statement is under way (still set if its future was dropped).
    in_flight: bool,
    /// The bound of the library's own statements
    /// ([`Config::db_timeout`](crate::Config::db_timeout)): `BEGIN`, the
    /// notices' inserts, the checks, the `COMMIT` and `ROLLBACK`, and the
    /// savepoints of nested transactions. The caller's statements are not
    /// bounded. One past its bound leaves the statement in flight: the
    /// transaction can then only be rolled back, and its connection is
    /// closed rather than pooled.
    bound: std::time::Duration,
}

/// `call`, abandoned after `bound` (the error of
/// [`timed_out`](crate::db::timed_out)).
async fn within<T>(
    bound: std::time::Duration,
    call: impl std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
) -> std::result::Result<T, DbErr> {
    match tokio::time::timeout(bound, call).await {
        Ok(done) => done.map_err(exec_err),
        Err(_) => Err(crate::db::timed_out(bound)),
    }
}

/// See the module docs.
pub(crate) struct PgTx {
    link: Mutex<Link>,
    /// Savepoints of nested transactions dropped unfinished: rolled back to
    /// (newest first) before the next statement.
    undo: std::sync::Mutex<Vec<String>>,
    /// The savepoints of nested transactions that exist, oldest first: one
    /// released or rolled back to ends every one opened after it too.
    live: std::sync::Mutex<Vec<String>>,
}

fn exec_err(e: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(e)))
}

fn query_err(e: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(Arc::new(e)))
}

fn ended() -> DbErr {
    DbErr::Custom("the transaction has ended".into())
}

impl Link {
    /// The connection for the next statement, with the transaction begun
    /// when `begin`; the statement counts as in flight until [`note`](Self::note).
    async fn ready(
        &mut self,
        begin: bool,
    ) -> std::result::Result<&mut PoolConnection<Postgres>, DbErr> {
        if self.in_flight {
            self.broken
                .get_or_insert_with(|| "a statement was cancelled mid-way".into());
        }
        if let Some(why) = &self.broken {
            return Err(DbErr::Custom(format!(
                "the transaction can only be rolled back: {why}"
            )));
        }
        self.in_flight = true;
        if begin && !self.begun {
            // Begun from here on: a BEGIN whose outcome is unknown leaves a
            // transaction that can only be rolled back.
            self.begun = true;
            let bound = self.bound;
            let conn = self.conn.as_mut().ok_or_else(ended)?;
            if let Err(e) = within(bound, conn.execute("BEGIN")).await {
                self.broken = Some(format!("BEGIN failed: {e}"));
                return Err(e);
            }
        }
        self.conn.as_mut().ok_or_else(ended)
    }

    /// `Err` with the reason when the transaction can only be rolled back:
    /// known broken, or, after a failed statement (or one of the caller's
    /// that may have rolled it back), found so by asking the server once
    /// ([`PROBE`]).
    async fn ask(&mut self) -> std::result::Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        let Some(why) = self.failed.clone() else {
            return Ok(());
        };
        let bound = self.bound;
        let asked = match self.ready(false).await {
            Ok(conn) => {
                let asked = async {
                    conn.execute(PROBE[0]).await?;
                    conn.execute(PROBE[1]).await
                };
                within(bound, asked).await
            }
            Err(e) => return Err(format!("{why}; then: {e}")),
        };
        let broken = match asked {
            Ok(_) => {
                self.in_flight = false;
                self.failed = None;
                return Ok(());
            }
            Err(e @ DbErr::Conn(_)) => format!("{why}; then: {e}"),
            Err(e) => {
                self.in_flight = false;
                format!("{why} (no open transaction takes a savepoint: {e})")
            }
        };
        self.broken = Some(broken.clone());
        Err(broken)
    }

    /// Ends the statement in flight, noting a failure inside the transaction.
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

/// Where a commit failed.
#[derive(PartialEq, Eq)]
enum Stage {
    Insert,
    Commit,
    /// The insert or the `COMMIT` sent with it in one message.
    Either,
}

impl Stage {
    /// What failed, as a commit's error says it.
    fn failed(&self) -> &'static str {
        match self {
            Stage::Insert => "writing its notices at the commit failed",
            Stage::Commit => "COMMIT failed",
            Stage::Either => "writing its notices or the COMMIT failed",
        }
    }
}

impl PgTx {
    /// Takes a connection from `pool` (waiting at most `bound`, the bound of
    /// its own statements); nothing is sent yet.
    pub async fn new(
        pool: &PgPool,
        bound: std::time::Duration,
    ) -> std::result::Result<PgTx, DbErr> {
        let conn = match tokio::time::timeout(bound, pool.acquire()).await {
            Ok(conn) => conn.map_err(|e| DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e))))?,
            Err(_) => return Err(crate::db::timed_out(bound)),
        };
        Ok(PgTx {
            link: Mutex::new(Link {
                conn: Some(conn),
                begun: false,
                failed: None,
                broken: None,
                in_flight: false,
                bound,
            }),
            undo: std::sync::Mutex::new(Vec::new()),
            live: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The link, once the savepoints of nested transactions dropped
    /// unfinished are rolled back to (a failure there leaves a transaction
    /// that can only be rolled back).
    async fn lock(&self) -> tokio::sync::MutexGuard<'_, Link> {
        let mut link = self.link.lock().await;
        let undo: Vec<String> = std::mem::take(&mut *lock_undo(&self.undo));
        for savepoint in undo.into_iter().rev() {
            if !link.begun || link.broken.is_some() {
                break;
            }
            // Ended already with one opened before it.
            if !lock_undo(&self.live).contains(&savepoint) {
                continue;
            }
            self.ended(&savepoint);
            let sql = format!("ROLLBACK TO SAVEPOINT {savepoint}; RELEASE SAVEPOINT {savepoint}");
            let bound = link.bound;
            let done = match link.ready(false).await {
                Ok(conn) => within(bound, conn.execute(sqlx::AssertSqlSafe(sql)))
                    .await
                    .map(drop),
                Err(_) => break,
            };
            if done.is_ok() {
                link.in_flight = false;
            }
            if let Err(e) = done {
                link.broken = Some(format!(
                    "rolling back a nested transaction dropped unfinished failed: {e}"
                ));
            }
        }
        link
    }

    /// From now on the transaction can only be rolled back, for `why`.
    pub async fn break_with(&self, why: String) {
        self.link.lock().await.broken.get_or_insert(why);
    }

    /// A nested transaction was dropped unfinished: its savepoint is rolled
    /// back to before the next statement, as sea-orm does for its own
    /// (unless it has ended already, with one opened before it).
    pub fn undo_later(&self, savepoint: String) {
        if lock_undo(&self.live).contains(&savepoint) {
            lock_undo(&self.undo).push(savepoint);
        }
    }

    /// Opens a nested transaction's savepoint.
    pub async fn open_savepoint(&self, savepoint: &str) -> std::result::Result<(), DbErr> {
        self.execute_own(&format!("SAVEPOINT {savepoint}")).await?;
        lock_undo(&self.live).push(savepoint.to_string());
        Ok(())
    }

    /// Ends a nested transaction's savepoint: released, or rolled back to
    /// (`rollback`) and released. Nothing to do when it ended already,
    /// with one opened before it.
    pub async fn end_savepoint(
        &self,
        savepoint: &str,
        rollback: bool,
    ) -> std::result::Result<(), DbErr> {
        if !lock_undo(&self.live).iter().any(|s| s == savepoint) {
            return Ok(());
        }
        let sql = if rollback {
            format!("ROLLBACK TO SAVEPOINT {savepoint}; RELEASE SAVEPOINT {savepoint}")
        } else {
            format!("RELEASE SAVEPOINT {savepoint}")
        };
        self.execute_own(&sql).await?;
        self.ended(savepoint);
        Ok(())
    }

    /// `savepoint` and every one opened after it no longer exist.
    fn ended(&self, savepoint: &str) {
        let mut live = lock_undo(&self.live);
        if let Some(at) = live.iter().position(|s| s == savepoint) {
            live.truncate(at);
        }
    }

    /// Whether the transaction can go on: `Err` with the reason when it
    /// can only be rolled back. After a failed statement (which aborts a
    /// PostgreSQL transaction unless the caller rolled back to a savepoint
    /// of its own), or one of the caller's that may have rolled it back,
    /// the server is asked, once ([`Link::ask`]).
    pub async fn alive(&self) -> std::result::Result<(), String> {
        let mut link = self.lock().await;
        link.ask().await
    }

    /// A statement of the caller's may have ended the transaction (a
    /// `ROLLBACK`): the next add or commit asks the server first.
    pub async fn check_later(&self, why: String) {
        let mut link = self.link.lock().await;
        if link.begun {
            link.failed.get_or_insert(why);
        }
    }

    /// Writes `rows` now, inside the transaction (begun if it was not), in
    /// a savepoint of their own: one message when they fit a literal insert.
    /// A refusal rolls back only these rows ([`Error::Db`]); a rollback
    /// that fails too leaves a transaction that can only be rolled back
    /// ([`Error::TransactionAborted`]).
    pub async fn write_now(&self, rows: &[(i64, NewRow)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut link = self.lock().await;
        let bound = link.bound;
        let conn = link
            .ready(true)
            .await
            .map_err(|e| Error::TransactionAborted(e.to_string()))?;
        let writing = async {
            match insert::pg_insert_literal(rows) {
                Some(insert) => conn
                    .execute(sqlx::AssertSqlSafe(format!(
                        "SAVEPOINT {ADD_SAVEPOINT}; {insert}; RELEASE SAVEPOINT {ADD_SAVEPOINT}"
                    )))
                    .await
                    .map(drop),
                None => {
                    let savepoint = format!("SAVEPOINT {ADD_SAVEPOINT}");
                    conn.execute(sqlx::AssertSqlSafe(savepoint)).await?;
                    insert::pg_insert_rows(conn, rows).await?;
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "RELEASE SAVEPOINT {ADD_SAVEPOINT}"
                    )))
                    .await
                    .map(drop)
                }
            }
        };
        let Err(e) = within(bound, writing).await else {
            link.in_flight = false;
            return Ok(());
        };
        if crate::db::connection_lost(&e) {
            // Lost, or past its bound (still in flight): the rows' fate is
            // unknown, and only a rollback is left.
            link.broken = Some(format!("the connection was lost writing notices: {e}"));
            return Err(Error::TransactionAborted(e.to_string()));
        }
        let conn = link
            .conn
            .as_mut()
            .ok_or_else(|| Error::TransactionAborted(ended().to_string()))?;
        let undo =
            format!("ROLLBACK TO SAVEPOINT {ADD_SAVEPOINT}; RELEASE SAVEPOINT {ADD_SAVEPOINT}");
        let undone = within(bound, conn.execute(sqlx::AssertSqlSafe(undo))).await;
        if undone.is_ok() {
            link.in_flight = false;
        }
        match undone {
            Ok(_) => Err(Error::Db(e)),
            Err(undo) => {
                let why = format!("writing notices failed: {e}; then: {undo}");
                link.broken = Some(why.clone());
                Err(Error::TransactionAborted(why))
            }
        }
    }

    pub async fn execute(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        let mut link = self.lock().await;
        let conn = link.ready(true).await?;
        let values = stmt.values.unwrap_or(sea_orm::Values(Vec::new()));
        let done = sqlx::query_with(sqlx::AssertSqlSafe(stmt.sql), SqlxValues(values))
            .execute(&mut **conn)
            .await
            .map(ExecResult::from)
            .map_err(exec_err);
        link.note(done)
    }

    /// One of the library's own statements (a nested transaction's
    /// savepoint), bounded.
    pub async fn execute_own(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        let mut link = self.lock().await;
        let bound = link.bound;
        let conn = link.ready(true).await?;
        let done = within(bound, conn.execute(sqlx::AssertSqlSafe(sql.to_owned())))
            .await
            .map(ExecResult::from);
        if matches!(done, Err(DbErr::Conn(_))) {
            return done;
        }
        link.note(done)
    }

    pub async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        let mut link = self.lock().await;
        let conn = link.ready(true).await?;
        let done = conn
            .execute(sqlx::AssertSqlSafe(sql.to_owned()))
            .await
            .map(ExecResult::from)
            .map_err(exec_err);
        link.note(done)
    }

    pub async fn query_all(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        let mut link = self.lock().await;
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
        let mut link = self.lock().await;
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
        let mut link = self.lock().await;
        let bound = link.bound;
        let conn = link.ready(false).await?;
        let fetched = within(bound, link_fetch(conn, blocks)).await;
        if let Err(e @ DbErr::Conn(_)) = fetched {
            // Past its bound: left in flight (the transaction can only be
            // rolled back).
            return Err(e);
        }
        link.note(fetched)?;
        blocks
            .take()
            .ok_or_else(|| DbErr::Custom("the id sequence returned no ids".into()))
    }

    /// Writes `rows` and commits: one prepared insert when nothing else ran
    /// (it commits by itself); else the insert and `COMMIT` in one message
    /// ([`insert::pg_insert_literal`]), or, over its size limit, a prepared
    /// insert then `COMMIT`.
    ///
    /// - [`Error::TransactionAborted`]: nothing was committed (a statement
    ///   had aborted the transaction, one was cancelled mid-way, or the
    ///   notices could not be written).
    /// - [`Error::CommitOutcomeUnknown`]: the connection was lost while
    ///   committing, or the `COMMIT` did not answer within its bound
    ///   ([`Config::db_timeout`](crate::Config::db_timeout)).
    pub async fn commit(&self, rows: &[(i64, NewRow)]) -> Result<()> {
        let mut link = self.lock().await;
        if let Some(why) = link.broken.clone() {
            drop(link);
            self.rollback().await.ok();
            return Err(Error::TransactionAborted(why));
        }
        // Aborted by the server, or recovered by the caller (a savepoint)?
        if let Err(why) = link.ask().await {
            drop(link);
            self.rollback().await.ok();
            return Err(Error::TransactionAborted(why));
        }
        let begun = link.begun;
        if !begun && rows.is_empty() {
            link.conn = None;
            return Ok(());
        }
        let bound = link.bound;
        let conn = link
            .ready(false)
            .await
            .map_err(|e| Error::TransactionAborted(e.to_string()))?;
        let outcome = insert_and_commit(conn, rows, begun, bound).await;
        let (e, stage) = match outcome {
            Ok(()) => {
                link.in_flight = false;
                link.begun = false;
                // Back to the pool now: a nested transaction that outlived
                // this one can send nothing more on it.
                link.conn = None;
                return Ok(());
            }
            Err(failed) => failed,
        };
        if crate::db::connection_lost(&e) && (stage != Stage::Insert || !begun) {
            // Still marked in flight: the connection is closed, not pooled.
            return Err(Error::CommitOutcomeUnknown(e.to_string()));
        }
        link.in_flight = false;
        if begun && stage != Stage::Commit {
            // A failed insert aborted the open transaction: roll it back (a
            // no-op when it was the COMMIT that failed and ended it).
            drop(link);
            self.rollback().await.ok();
        } else {
            // A failed COMMIT, or a failed lone insert, ends the transaction.
            link.begun = false;
            link.conn = None;
        }
        Err(Error::TransactionAborted(format!(
            "{}: {e}",
            stage.failed()
        )))
    }

    /// Rolls back (nothing to do when nothing was sent). A connection that
    /// cannot be rolled back is closed when the transaction is dropped.
    pub async fn rollback(&self) -> std::result::Result<(), DbErr> {
        lock_undo(&self.undo).clear();
        let mut link = self.link.lock().await;
        if !link.begun && !link.in_flight {
            link.conn = None;
            return Ok(());
        }
        let bound = link.bound;
        // Past its bound the statement stays in flight: the connection is
        // closed when the transaction is dropped, which rolls it back.
        link.in_flight = true;
        let conn = link.conn.as_mut().ok_or_else(ended)?;
        let done = within(bound, conn.execute("ROLLBACK")).await.map(drop);
        if done.is_ok() {
            link.begun = false;
            link.in_flight = false;
            link.conn = None;
        }
        done
    }
}

/// Sends `rows` and, in a begun transaction, the `COMMIT` on `conn`, each
/// bounded by `bound`: in one message when they fit a literal insert, else a
/// prepared insert (if any rows) then the `COMMIT`. `Err` says where it failed.
async fn insert_and_commit(
    conn: &mut PoolConnection<Postgres>,
    rows: &[(i64, NewRow)],
    begun: bool,
    bound: std::time::Duration,
) -> std::result::Result<(), (DbErr, Stage)> {
    let literal = begun.then(|| insert::pg_insert_literal(rows)).flatten();
    if let Some(insert) = literal {
        // One round trip: the notices and the COMMIT in one
        // simple-protocol message (the server skips the COMMIT when the
        // insert fails).
        within(
            bound,
            conn.execute(sqlx::AssertSqlSafe(format!("{insert}; COMMIT"))),
        )
        .await
        .map(drop)
        .map_err(|e| (e, Stage::Either))
    } else {
        let inserted = if rows.is_empty() {
            Ok(())
        } else {
            within(bound, insert::pg_insert_rows(conn, rows)).await
        };
        match inserted {
            Err(e) => Err((e, Stage::Insert)),
            Ok(()) if begun => within(bound, conn.execute("COMMIT"))
                .await
                .map(drop)
                .map_err(|e| (e, Stage::Commit)),
            Ok(()) => Ok(()),
        }
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

fn lock_undo(undo: &std::sync::Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    undo.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
