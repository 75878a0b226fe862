//! Clock: the database's time, as SQL expressions.
//!
//! Due checks, leases, `last_call_time`, `next_call_time` and `create_time`
//! are all computed by the database in the statement that writes or compares
//! them, so the clocks of application hosts never decide who may send: a
//! worker whose clock is minutes off claims exactly what a correct one would.
//! PostgreSQL uses `statement_timestamp()` in UTC, MySQL/MariaDB
//! `UTC_TIMESTAMP(6)`, SQLite `strftime('%Y-%m-%d %H:%M:%f', 'now')`
//! (milliseconds; compared with the nanosecond text sqlx writes as ISO
//! text, a bound time sorts after the same millisecond's `strftime`: it
//! counts as due up to a millisecond later). SQLite has no server: its clock is that of
//! the process running the statement, which is the host's clock for every
//! process sharing the file.
//!
//! The lease a claim grants is also tracked in-process with a monotonic
//! [`Instant`](std::time::Instant) taken *before* the claiming statement is
//! sent, so the in-process view of a lease always ends no later than the
//! database's.

use std::time::Duration;

use chrono::NaiveDateTime;
use sea_orm::{DbBackend, sea_query::Expr};

/// The application's clock, for the dates of failure-log lines and
/// events (the database's clock decides everything else).
pub(crate) fn app_now() -> NaiveDateTime {
    chrono::Utc::now().naive_utc()
}

/// The database's current UTC time.
pub(crate) fn now(backend: DbBackend) -> Expr {
    Expr::cust(now_sql(backend))
}

/// [`now`] as SQL text.
pub(crate) fn now_sql(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "(statement_timestamp() AT TIME ZONE 'UTC')",
        DbBackend::MySql => "UTC_TIMESTAMP(6)",
        _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }
}

/// A new notice's `create_time`: the database's time of its insert. On
/// PostgreSQL the wall clock at the row (`clock_timestamp()`), not the
/// start of the statement's message, so that an insert sent in one message
/// after a lock wait is stamped after that wait, and rows of one statement
/// in the order they are written.
pub(crate) fn insert_time(backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::cust(PG_INSERT_TIME),
        _ => now(backend),
    }
}

/// [`insert_time`] on PostgreSQL.
pub(crate) const PG_INSERT_TIME: &str = "(clock_timestamp() AT TIME ZONE 'UTC')";

/// The database's current UTC time plus `d`.
pub(crate) fn after(backend: DbBackend, d: Duration) -> Expr {
    if d.is_zero() {
        return now(backend);
    }
    match backend {
        DbBackend::Postgres => Expr::cust_with_values(
            "((statement_timestamp() AT TIME ZONE 'UTC') + make_interval(secs => $1))",
            [d.as_secs_f64()],
        ),
        DbBackend::MySql => Expr::cust_with_values(
            "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6))",
            [i64::try_from(d.as_micros()).unwrap_or(i64::MAX)],
        ),
        _ => Expr::cust_with_values(
            "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
            [format!("+{:.3} seconds", d.as_secs_f64())],
        ),
    }
}

/// The database's current UTC time minus `d`.
pub(crate) fn before(backend: DbBackend, d: Duration) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::cust_with_values(
            "((statement_timestamp() AT TIME ZONE 'UTC') - make_interval(secs => $1))",
            [d.as_secs_f64()],
        ),
        DbBackend::MySql => Expr::cust_with_values(
            "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6))",
            [-i64::try_from(d.as_micros()).unwrap_or(i64::MAX)],
        ),
        _ => Expr::cust_with_values(
            "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
            [format!("-{:.3} seconds", d.as_secs_f64())],
        ),
    }
}

/// `next_call_time` of a notice that waits for confirmation forever.
pub fn far_future() -> NaiveDateTime {
    chrono::NaiveDate::from_ymd_opt(9999, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or(NaiveDateTime::MAX)
}

/// When a new notice is first due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// At once, for any sweeper.
    Now,
    /// After this long: reserved for the producer's own after-commit
    /// attempt, and due for sweepers only if that attempt never happens.
    Reserved(Duration),
    /// At once, and attempted after commit by the producer through a claim
    /// that respects its key's order (a notice with an `ordering_key`: it
    /// cannot be reserved, since an older notice of its key may be unfinished).
    InTurn,
    /// Later: a delayed notice, due for sweepers only from then on (its
    /// `not_before`), never attempted after commit.
    Later(Later),
}

/// When a delayed notice falls due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Later {
    /// This long after its insert, by the database's clock.
    By(Duration),
    /// At this UTC time (whole microseconds: every backend keeps them).
    At(NaiveDateTime),
}

impl Later {
    /// The time as an SQL expression.
    pub fn expr(self, backend: DbBackend) -> Expr {
        match self {
            Later::By(d) => after(backend, d),
            Later::At(t) => Expr::val(t),
        }
    }
}

impl Due {
    /// Whether the row is reserved (held) for an after-commit attempt.
    pub fn reserved(self) -> bool {
        matches!(self, Due::Reserved(_))
    }

    /// The row's `next_call_time`. A delayed notice's time already past
    /// is now on the servers, so the row is above the claims'
    /// [`floor`](super::floor) (claimed at once, not at its next rescan).
    pub fn expr(self, backend: DbBackend) -> Expr {
        match self {
            Due::Now | Due::InTurn => now(backend),
            Due::Reserved(d) => after(backend, d),
            Due::Later(Later::At(t)) if backend != DbBackend::Sqlite => {
                let greatest = match backend {
                    DbBackend::Postgres => "GREATEST($1, $2)",
                    _ => "GREATEST(?, ?)",
                };
                Expr::cust_with_exprs(greatest, [Expr::val(t), now(backend)])
            }
            Due::Later(later) => later.expr(backend),
        }
    }

    /// The row's `not_before`: the due time of a delayed notice, else NULL.
    pub fn not_before(self, backend: DbBackend) -> Expr {
        match self {
            Due::Later(later) => later.expr(backend),
            _ => Expr::val(Option::<NaiveDateTime>::None),
        }
    }
}

/// The database's current UTC time.
pub(crate) async fn db_now<C: sea_orm::ConnectionTrait>(
    db: &C,
) -> crate::error::Result<chrono::NaiveDateTime> {
    let mut select = sea_orm::sea_query::Query::select();
    select.expr(now(db.get_database_backend()));
    let row = db
        .query_one(&select)
        .await?
        .ok_or_else(|| sea_orm::DbErr::Custom("no time from the database".into()))?;
    // SQLite answers text, the servers a timestamp.
    match row.try_get_by_index::<chrono::NaiveDateTime>(0) {
        Ok(t) => Ok(t),
        Err(_) => {
            let text: String = row.try_get_by_index(0)?;
            chrono::NaiveDateTime::parse_from_str(&text, "%Y-%m-%d %H:%M:%S%.f")
                .map_err(|e| crate::error::Error::Config(format!("database time `{text}`: {e}")))
        }
    }
}
