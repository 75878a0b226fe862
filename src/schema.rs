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
    if !has_table(db, table).await? {
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

/// Whether `table` is there for `db`'s statements: on PostgreSQL as its
/// `search_path` finds it (`to_regclass`), which is how every statement
/// names it (sea-orm-migration's `has_table` looks in `current_schema()`
/// alone, and misses tables a migration role made in `public` for a worker
/// role whose own schema comes first).
async fn has_table(db: &DatabaseConnection, table: &str) -> Result<bool> {
    if db.get_database_backend() != sea_orm::DbBackend::Postgres {
        return Ok(migration::SchemaManager::new(db).has_table(table).await?);
    }
    let found = db
        .query_one_raw(sea_orm::Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT to_regclass($1) IS NOT NULL AS found",
            [table.into()],
        ))
        .await?
        .map(|row| row.try_get_by_index::<bool>(0))
        .transpose()?;
    Ok(found.unwrap_or(false))
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

/// How long a PostgreSQL migration waits for a table's lock before it
/// gives up and is tried again: 2 seconds. A DDL statement queued behind a
/// long transaction blocks every statement queued behind it, producers'
/// inserts included: past this it steps back (its transaction rolls back)
/// and the producers go on.
pub const MIGRATION_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How many times a PostgreSQL migration that could not take its lock is
/// tried, [`MIGRATION_LOCK_PAUSE`] apart: 30 (about two minutes with
/// [`MIGRATION_LOCK_TIMEOUT`]).
pub const MIGRATION_LOCK_TRIES: u32 = 30;

/// The pause between two tries of a migration that could not take its
/// lock: 2 seconds.
pub const MIGRATION_LOCK_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `M`'s pending migrations on `db`. On PostgreSQL they run on a
/// connection of their own whose `lock_timeout` is `lock_timeout`, each in
/// its transaction (sea-orm-migration's rule there): one that cannot take
/// its lock in time rolls back and is tried again, up to
/// [`MIGRATION_LOCK_TRIES`] times. MySQL/MariaDB and SQLite run them as
/// sea-orm-migration does (MySQL's DDL is not transactional: a statement
/// given up half way would leave half a migration).
pub(crate) async fn migrate<M: migration::MigratorTrait>(
    db: &DatabaseConnection,
    lock_timeout: std::time::Duration,
) -> Result<()> {
    #[cfg(feature = "postgres")]
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        return migrate_pg::<M>(db, lock_timeout).await;
    }
    let _ = lock_timeout;
    M::up(db, None).await?;
    Ok(())
}

#[cfg(feature = "postgres")]
async fn migrate_pg<M: migration::MigratorTrait>(
    db: &DatabaseConnection,
    lock_timeout: std::time::Duration,
) -> Result<()> {
    use sea_orm::sqlx;
    // The session the caller's pool gives its connections (its hooks may
    // set a search_path or a role), then the lock timeout: set on the
    // connection, not as a startup option, which PgBouncer refuses.
    let session = session_of(db).await?;
    let set = format!(
        "{session}SET lock_timeout = '{}ms'",
        lock_timeout.as_millis().max(1)
    );
    let options = db
        .get_postgres_connection_pool()
        .connect_options()
        .as_ref()
        .clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(set))
                    .execute(&mut *conn)
                    .await
                    .map(drop)
            })
        })
        .connect_lazy_with(options);
    let own = sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(pool);
    let mut tries = 0;
    let ran = loop {
        tries += 1;
        match M::up(&own, None).await {
            Err(e) if lock_not_available(&e) && tries < MIGRATION_LOCK_TRIES => {
                tracing::warn!(
                    tries,
                    "a migration could not take its lock within {} (a long transaction holds the table); trying again",
                    humantime::format_duration(lock_timeout)
                );
                tokio::time::sleep(MIGRATION_LOCK_PAUSE).await;
            }
            ran => break ran,
        }
    };
    own.close().await.ok();
    ran.map_err(|e| match lock_not_available(&e) {
        true => Error::Db(sea_orm::DbErr::Migration(format!(
            "a migration could not take its lock within {} in {tries} tries: a long transaction holds the table (see pg_stat_activity); the migration's transaction was rolled back (one that runs outside a transaction may have applied its first statements)",
            humantime::format_duration(lock_timeout)
        ))),
        false => Error::Db(e),
    })
}

/// The statements that give a new connection the session of `db`'s pool:
/// its `search_path` and, when a hook set one, its role.
#[cfg(feature = "postgres")]
async fn session_of(db: &DatabaseConnection) -> Result<String> {
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT current_setting('search_path') AS path, current_user::text AS role, \
             session_user::text AS login, quote_ident(current_user) AS quoted",
        ))
        .await?
        .ok_or_else(|| Error::Db(sea_orm::DbErr::RecordNotFound("the session".into())))?;
    let path: String = row.try_get("", "path")?;
    let role: String = row.try_get("", "role")?;
    let login: String = row.try_get("", "login")?;
    let quoted: String = row.try_get("", "quoted")?;
    // A search_path as the server shows it is valid SQL for SET.
    let mut set = format!("SET search_path TO {path}; ");
    if role != login {
        set.push_str(&format!("SET ROLE {quoted}; "));
    }
    Ok(set)
}

/// PostgreSQL's `lock_not_available` (55P03): `lock_timeout` ran out.
#[cfg(feature = "postgres")]
fn lock_not_available(e: &sea_orm::DbErr) -> bool {
    crate::db::sql_state(e).is_some_and(|code| code == "55P03")
        || e.to_string().contains("due to lock timeout")
}

/// How long a failed [`check`] is answered again without checking: 1 second.
const REFUSAL_KEPT: std::time::Duration = std::time::Duration::from_secs(1);

/// The last refusal of [`check`], kept for [`REFUSAL_KEPT`].
#[derive(Default)]
pub(crate) struct Refused(std::sync::Mutex<Option<(std::time::Instant, Kept)>>);

/// A refusal, as it can be given again (a database that did not answer
/// is not kept: it is asked again at once).
#[derive(Clone)]
enum Kept {
    Behind { first: String, count: usize },
    Pooler(String),
}

impl Refused {
    /// Keeps `e`.
    pub(crate) fn keep(&self, e: &Error) {
        let kept = match e {
            Error::SchemaBehind { first, count } => Kept::Behind {
                first: first.clone(),
                count: *count,
            },
            Error::Pooler(why) => Kept::Pooler(why.clone()),
            _ => return,
        };
        if let Ok(mut last) = self.0.lock() {
            *last = Some((std::time::Instant::now(), kept));
        }
    }

    /// The error kept less than [`REFUSAL_KEPT`] ago.
    pub(crate) fn recent(&self) -> Option<Error> {
        let last = self.0.lock().ok()?;
        let (at, kept) = last.as_ref()?;
        if at.elapsed() >= REFUSAL_KEPT {
            return None;
        }
        Some(match kept.clone() {
            Kept::Behind { first, count } => Error::SchemaBehind { first, count },
            Kept::Pooler(why) => Error::Pooler(why),
        })
    }
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
        // A probe that cannot connect fails the check (asked again), never
        // passes it: statements through a pooler it did not see could
        // meet another client's prepared statements.
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
    /// some point, or either by two: asked in the order first, second,
    /// second, first, [`PROBE_ROUNDS`] times, in the simple protocol,
    /// which prepares nothing. A pooler that hands sessions out last in,
    /// first out gives the second the first's session; one that hands them
    /// out first in, first out gives the second a new one on its second
    /// question.
    async fn shared(
        first: &mut sqlx::PgConnection,
        second: &mut sqlx::PgConnection,
    ) -> Result<bool> {
        let mut pids = [
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        ];
        for _ in 0..PROBE_ROUNDS {
            pids[0].insert(backend(first).await?);
            pids[1].insert(backend(second).await?);
            pids[1].insert(backend(second).await?);
            pids[0].insert(backend(first).await?);
            if pids[0].len() > 1 || pids[1].len() > 1 || !pids[0].is_disjoint(&pids[1]) {
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
        // Each prepares statements of its own, named `sqlx_s_1`, … on
        // each connection: on sessions handed around, one of the names
        // meets another's.
        for n in 0..PROBE_ROUNDS as i32 {
            for conn in [&mut *first, &mut *second] {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT $1::int4 + {n} AS probe"
                )))
                .bind(1)
                .fetch_one(&mut *conn)
                .await?;
            }
        }
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
