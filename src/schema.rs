//! The database a process is about to use, checked before it starts:
//! its schema against the migrations this build knows, and, on
//! PostgreSQL, whether a connection pooler stands between, which keeps
//! neither sessions nor prepared statements.
//!
//! [`Notifier::check_database`](crate::Notifier::check_database) runs both
//! once per notifier; workers, [`Notifier::begin`](crate::Notifier::begin)
//! and `/readyz` ask it.

use std::collections::HashSet;

use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, DatabaseConnection, sea_query::Query};

use crate::error::{Error, Result};

/// What a process found of its database before it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatabaseCheck {
    /// Migrations recorded in `solid_notify_migrations` that this build
    /// does not know (a newer release migrated the database: its
    /// migrations only add what this build ignores). Reported, never
    /// refused.
    pub newer: Vec<String>,
    /// PostgreSQL: the connections go through a pooler in transaction mode
    /// (two connections share one server session). Statements work, since
    /// the pooler keeps prepared statements; `LISTEN` does not, unless
    /// [`WorkerConfig::listen_url`](crate::WorkerConfig::listen_url) points
    /// at the server.
    pub transaction_pooled: bool,
}

/// Migrations of this build that `db` has not run, in order (all of them
/// when `solid_notify_migrations` does not exist), and those it has run
/// that this build does not know.
pub(crate) async fn migrations(db: &DatabaseConnection) -> Result<(Vec<String>, Vec<String>)> {
    let known: Vec<String> = migration::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    let table = migration::MIGRATION_TABLE;
    if !migration::SchemaManager::new(db).has_table(table).await? {
        return Ok((known, Vec::new()));
    }
    let select = Query::select()
        .column(migration::Alias::new("version"))
        .from(migration::Alias::new(table))
        .to_owned();
    let applied: HashSet<String> = db
        .query_all(&select)
        .await?
        .iter()
        .filter_map(|row| row.try_get_by_index::<String>(0).ok())
        .collect();
    let pending = known.iter().filter(|v| !applied.contains(*v)).cloned();
    let mut newer: Vec<String> = applied
        .iter()
        .filter(|v| !known.contains(*v))
        .cloned()
        .collect();
    newer.sort();
    Ok((pending.collect(), newer))
}

/// The schema's check: [`Error::SchemaBehind`] when a migration of this
/// build has not run; else the migrations that are newer than the build.
pub(crate) async fn check_schema(db: &DatabaseConnection) -> Result<Vec<String>> {
    let (pending, newer) = migrations(db).await?;
    match pending.first() {
        None => Ok(newer),
        Some(first) => Err(Error::SchemaBehind {
            first: first.clone(),
            count: pending.len(),
        }),
    }
}

/// Checks `db`'s schema and, on PostgreSQL, its pooler, within `bound`
/// each: the [`DatabaseCheck`], or the reason to refuse to start.
pub(crate) async fn check(
    db: &DatabaseConnection,
    bound: std::time::Duration,
) -> Result<DatabaseCheck> {
    // The pooler first: behind one that refuses, the pool's own statements
    // (the schema's read) fail with a prepared statement's clash instead.
    let transaction_pooled = within(bound, pooling::probe(db)).await?;
    let newer = within(bound, check_schema(db)).await?;
    if let Some(last) = newer.last() {
        tracing::warn!(
            newer = newer.len(),
            last = %last,
            "the schema is newer than this build (a later release migrated it); running on it, ignoring what that release added"
        );
    }
    Ok(DatabaseCheck {
        newer,
        transaction_pooled,
    })
}

/// `work` within `bound`, or the timeout as a database error.
async fn within<T>(
    bound: std::time::Duration,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(bound, work).await {
        Ok(done) => done,
        Err(_) => Err(Error::Db(crate::db::timed_out(bound))),
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod pooling {
    //! PostgreSQL: is there a pooler in transaction mode between us and the
    //! server, and does it keep prepared statements?
    //!
    //! Two new connections (none of the pool's: a pool of one must not
    //! wait on itself) each ask for their server process, in turn: behind a
    //! pooler in transaction mode the second is served by the session the
    //! first just gave back. Then each prepares a statement: sqlx names
    //! them `sqlx_s_1`, `sqlx_s_2`, … per connection, so on one shared
    //! session the second's name exists already, unless the pooler tracks
    //! prepared statements itself (PgBouncer 1.21 and later with
    //! `max_prepared_statements`).

    use sea_orm::{
        DatabaseConnection, DbBackend, DbErr,
        sqlx::{self, Connection, Row},
    };

    use crate::error::{Error, Result};

    /// How many times [`shared`] asks: 4.
    const PROBE_ROUNDS: usize = 4;

    /// What to change, said by the refusal.
    const REFUSAL: &str = "the PostgreSQL connections go through a pooler in transaction mode \
        that does not keep prepared statements (sqlx names its statements, and another client's \
        session already holds the name): connect to PostgreSQL directly, or to the pooler in \
        session mode (PgBouncer: pool_mode = session), or use a pooler that keeps prepared \
        statements in transaction mode (PgBouncer 1.21 or later with max_prepared_statements \
        above 0)";

    /// Whether `db` goes through a pooler in transaction mode that keeps
    /// prepared statements (`true`), or through none (`false`); refused
    /// ([`Error::Pooler`]) when its pooler does not keep them.
    pub(super) async fn probe(db: &DatabaseConnection) -> Result<bool> {
        if db.get_database_backend() != DbBackend::Postgres {
            return Ok(false);
        }
        let options = db.get_postgres_connection_pool().connect_options();
        match pooled(&options).await? {
            Pooled::No => Ok(false),
            Pooled::KeepsPrepared => Ok(true),
            Pooled::Refused(e) => Err(Error::Pooler(format!("{REFUSAL} ({e})"))),
        }
    }

    /// What stands between `options`' connections and the server.
    pub(crate) enum Pooled {
        /// Nothing that shares sessions: the server, or a pooler in
        /// session mode.
        No,
        /// A pooler in transaction mode that keeps prepared statements.
        KeepsPrepared,
        /// A pooler in transaction mode whose prepared statements clash:
        /// the error one of them got.
        Refused(String),
    }

    /// Whether connections made with `options` share server sessions, and
    /// if so whether prepared statements survive it.
    pub(crate) async fn pooled(options: &sqlx::postgres::PgConnectOptions) -> Result<Pooled> {
        let mut first = sqlx::PgConnection::connect_with(options)
            .await
            .map_err(db_err)?;
        let mut second = sqlx::PgConnection::connect_with(options)
            .await
            .map_err(db_err)?;
        let probed = shared(&mut first, &mut second).await;
        let prepared = match probed {
            Ok(true) => prepares(&mut first, &mut second).await,
            _ => Ok(()),
        };
        // Closed politely; a close that fails leaves nothing behind.
        first.close().await.ok();
        second.close().await.ok();
        Ok(match (probed?, prepared) {
            (false, _) => Pooled::No,
            (true, Ok(())) => Pooled::KeepsPrepared,
            (true, Err(e)) => Pooled::Refused(e.to_string()),
        })
    }

    /// Whether `first` and `second` are served by one server process at
    /// some point, or `first` by two: asked in turn, [`PROBE_ROUNDS`]
    /// times (another client of the pooler may take the session one gave
    /// back), in the simple protocol, which prepares nothing.
    async fn shared(
        first: &mut sqlx::PgConnection,
        second: &mut sqlx::PgConnection,
    ) -> Result<bool> {
        for _ in 0..PROBE_ROUNDS {
            let a = backend(first).await?;
            let b = backend(second).await?;
            let a_again = backend(first).await?;
            if a == b || a != a_again {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The server process serving `conn` now.
    async fn backend(conn: &mut sqlx::PgConnection) -> Result<i32> {
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe("SELECT pg_backend_pid()"))
            .fetch_one(&mut *conn)
            .await
            .map_err(db_err)?;
        row.try_get::<i32, _>(0).map_err(db_err)
    }

    /// Each connection prepares and runs a statement of its own, in turn:
    /// the error of the one that failed.
    async fn prepares(
        first: &mut sqlx::PgConnection,
        second: &mut sqlx::PgConnection,
    ) -> std::result::Result<(), sqlx::Error> {
        sqlx::query("SELECT $1::int4 AS probe")
            .bind(1)
            .fetch_one(&mut *first)
            .await?;
        sqlx::query("SELECT $1::int4 + 1 AS probe")
            .bind(1)
            .fetch_one(&mut *second)
            .await?;
        Ok(())
    }

    fn db_err(e: sqlx::Error) -> Error {
        Error::Db(DbErr::Custom(format!("checking for a pooler: {e}")))
    }
}

#[cfg(not(feature = "postgres"))]
mod pooling {
    //! Without PostgreSQL there is no pooler to check.
    pub(super) async fn probe(_: &sea_orm::DatabaseConnection) -> crate::error::Result<bool> {
        Ok(false)
    }
}
