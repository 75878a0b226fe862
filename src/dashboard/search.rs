//! Search: a listing's statements bounded in time by the database itself,
//! so that one that runs past its time
//! ([`DashboardConfig::search_timeout`](super::DashboardConfig::search_timeout))
//! stops there and gives its place among
//! [`MAX_SEARCHES`](super::view::MAX_SEARCHES) back.
//!
//! - PostgreSQL: `SET LOCAL statement_timeout` in the search's transaction
//!   (in [`find_bounded`](super::view::find_bounded)).
//! - MariaDB: each statement as `SET STATEMENT max_statement_time = … FOR
//!   …`; MySQL: each `SELECT` with the `MAX_EXECUTION_TIME` hint ([`Limited`]).
//! - SQLite: a pool of its own for searches, whose connections carry a
//!   progress handler that interrupts a statement once its search's time
//!   is up ([`sqlite_pool`]). (Not for an in-memory database, which a
//!   second pool would not see: there a statement runs to its end.)

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, ExecResult, QueryResult, Statement,
};

/// A connection whose every statement the database stops at `timeout`
/// (MySQL and MariaDB).
pub(super) struct Limited<'a> {
    pub inner: &'a DatabaseConnection,
    /// MariaDB (`SET STATEMENT`), else MySQL (an optimizer hint).
    pub mariadb: bool,
    pub timeout: Duration,
}

impl Limited<'_> {
    fn bounded(&self, sql: &str) -> String {
        let timeout = self.timeout;
        if self.mariadb {
            return format!(
                "SET STATEMENT max_statement_time = {} FOR {sql}",
                timeout.as_secs_f64()
            );
        }
        match sql.get(..6) {
            Some(head) if head.eq_ignore_ascii_case("SELECT") => format!(
                "SELECT /*+ MAX_EXECUTION_TIME({}) */{}",
                timeout.as_millis(),
                &sql[6..]
            ),
            _ => sql.to_string(),
        }
    }

    fn statement(&self, mut stmt: Statement) -> Statement {
        stmt.sql = self.bounded(&stmt.sql);
        stmt
    }
}

#[async_trait]
impl ConnectionTrait for Limited<'_> {
    fn get_database_backend(&self) -> DbBackend {
        self.inner.get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.inner.execute_raw(self.statement(stmt)).await
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.inner.execute_unprepared(&self.bounded(sql)).await
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.inner.query_one_raw(self.statement(stmt)).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.inner.query_all_raw(self.statement(stmt)).await
    }
}

/// Whether the MySQL-protocol server of `db` is MariaDB; `None` when it
/// cannot tell now (not to be remembered).
pub(super) async fn is_mariadb(db: &DatabaseConnection) -> Option<bool> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::MySql,
            "SELECT VERSION()".to_string(),
        ))
        .await
        .ok()??;
    let version = row.try_get_by_index::<String>(0).ok()?;
    Some(version.to_ascii_lowercase().contains("mariadb"))
}

/// Every how many SQLite virtual machine steps a search's statement checks
/// its time: 32 (a row of a notice listing takes about 20; a search's
/// `LIKE` over a large param runs within one).
#[cfg(feature = "sqlite")]
const PROGRESS_STEPS: i32 = 32;

/// SQLite: a pool for searches on the file `db` is open on, at most
/// `size` connections, each given at acquire a progress handler that ends
/// its statements once `timeout` has passed since. `None` for an in-memory
/// database, or another backend.
#[cfg(feature = "sqlite")]
pub(super) fn sqlite_pool(
    db: &DatabaseConnection,
    size: usize,
    timeout: Duration,
) -> Option<DatabaseConnection> {
    use sea_orm::sqlx::sqlite::SqlitePoolOptions;
    if db.get_database_backend() != DbBackend::Sqlite {
        return None;
    }
    let main = db.get_sqlite_connection_pool();
    let options = (*main.connect_options()).clone();
    let file = options.get_filename().to_string_lossy().into_owned();
    // (sqlx names `sqlite::memory:` `file:sqlx-in-memory-N`, shared.)
    if file.is_empty()
        || file == ":memory:"
        || file.contains("mode=memory")
        || file.contains("sqlx-in-memory")
    {
        return None;
    }
    // A search's time starts when its connection is taken: a new one
    // (after_connect) or an idle one (before_acquire).
    let pool = SqlitePoolOptions::new()
        .max_connections(u32::try_from(size).unwrap_or(u32::MAX).max(1))
        .min_connections(0)
        .idle_timeout(Duration::from_secs(60))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                bounded_from_now(conn, timeout).await?;
                Ok(())
            })
        })
        .before_acquire(move |conn, _| {
            Box::pin(async move {
                bounded_from_now(conn, timeout).await?;
                Ok(true)
            })
        })
        .connect_lazy_with(options);
    Some(sea_orm::SqlxSqliteConnector::from_sqlx_sqlite_pool(pool))
}

/// Gives `conn` a progress handler that interrupts its statements once
/// `timeout` has passed from now.
#[cfg(feature = "sqlite")]
async fn bounded_from_now(
    conn: &mut sea_orm::sqlx::SqliteConnection,
    timeout: Duration,
) -> Result<(), sea_orm::sqlx::Error> {
    let deadline = std::time::Instant::now() + timeout;
    conn.lock_handle()
        .await?
        .set_progress_handler(PROGRESS_STEPS, move || std::time::Instant::now() < deadline);
    Ok(())
}

/// Without SQLite compiled in: no such pool.
#[cfg(not(feature = "sqlite"))]
pub(super) fn sqlite_pool(
    _: &DatabaseConnection,
    _: usize,
    _: Duration,
) -> Option<DatabaseConnection> {
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn mysql_statements_carry_their_bound() {
        let db = sea_orm::DatabaseConnection::default();
        let maria = super::Limited {
            inner: &db,
            mariadb: true,
            timeout: std::time::Duration::from_secs(10),
        };
        assert_eq!(
            maria.bounded("SELECT 1"),
            "SET STATEMENT max_statement_time = 10 FOR SELECT 1"
        );
        let mysql = super::Limited {
            inner: &db,
            mariadb: false,
            timeout: std::time::Duration::from_secs(10),
        };
        assert_eq!(
            mysql.bounded("SELECT `id` FROM t"),
            "SELECT /*+ MAX_EXECUTION_TIME(10000) */ `id` FROM t"
        );
    }
}
