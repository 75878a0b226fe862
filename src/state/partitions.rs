//! Partitioned history (PostgreSQL): `notify_msg_history` split by the time
//! each notice entered it (`finished_time`), one partition a day or a month,
//! so that retention drops a whole period instead of deleting its rows one
//! by one (no dead tuples, no vacuum debt, the space back at once).
//!
//! The layout:
//!
//! | partition | holds |
//! |---|---|
//! | `notify_msg_history_p2026_11` (month) or `_p2026_11_29` (day) | the notices that finished in that period |
//! | `notify_msg_history_kept` (`finished_time` before 1970-01-02) | the final failures, parked notices and live leases of a dropped period, moved there first: never dropped, purged in batches only when asked |
//! | `notify_msg_history_default` | whatever no period takes (a period not created in time); purged in batches |
//!
//! A period is dropped once it ended before the purge's cutoff: its final
//! failures, parked notices and cancelled notices whose lease is still live
//! move to the kept partition first (`evacuate`), in one statement backed
//! by a partial index of exactly those rows, and the drop takes the parent's
//! lock for milliseconds under a `lock_timeout` (`drop_period`).
//!
//! An installation converts online (`convert`): a partitioned copy is
//! built beside the table while a trigger mirrors every change into it,
//! filled in batches of ids (each in a REPEATABLE READ transaction that
//! locks its rows, tried again when one changed meanwhile), counted against
//! the table in one snapshot, and swapped in under a lock held for
//! milliseconds. MySQL/MariaDB and SQLite keep one table and the batched
//! purge.

use std::time::Duration;

use chrono::{Datelike, Months, NaiveDate, NaiveDateTime};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The history table.
const TABLE: &str = "notify_msg_history";
/// The partitioned copy an online conversion builds, renamed to [`TABLE`]
/// when it is complete.
const COPY: &str = "notify_msg_history_partitioned";
/// The partition of the kept rows of dropped periods.
const KEPT: &str = "notify_msg_history_kept";
/// The partition of rows no period takes.
const DEFAULT: &str = "notify_msg_history_default";
/// The trigger (and its function) that mirrors the table into [`COPY`].
const SYNC: &str = "solid_notify_history_sync";
/// The partial index of the rows a drop must keep, per partition.
const KEEP_INDEX: &str = "idx_notify_msg_history_keep";
/// The `finished_time` kept rows are given: below every period.
const KEPT_TIME: &str = "1970-01-01 00:00:00";
/// Statuses a dropped period takes with it: succeeded (1) and cancelled (5).
const DROPPED_STATUSES: &str = "1, 5";

/// How long a statement of partition upkeep waits for a lock before it
/// steps back (its transaction rolls back, and it is tried again later): 2
/// seconds, as migrations ([`crate::schema::MIGRATION_LOCK_TIMEOUT`]).
pub const PARTITION_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Default number of periods created ahead of the current one: 3.
pub const DEFAULT_AHEAD: u32 = 3;

/// Default ids copied per batch by the online conversion: 5,000.
pub const DEFAULT_COPY_BATCH: u64 = 5_000;

/// How many times a conversion batch whose rows changed meanwhile is tried
/// again before the conversion stops (it can be run again; it resumes): 50.
const COPY_TRIES: u32 = 50;

/// Default number of periods before the current one a conversion makes at
/// most ([`Partitioning::behind`]): 400. Older rows (a stray row dated years back would otherwise make
/// thousands of partitions) go to the default partition, purged in
/// batches.
pub const MAX_PERIODS_BEHIND: u32 = 400;

/// The advisory lock key that makes the periods of history one at a time
/// (two purges, two upkeeps): "snparts" in ASCII.
const UPKEEP_LOCK: i64 = 0x0073_6e70_6172_7473;

/// How often a worker makes the periods ahead: every hour.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(3_600);

/// The length of one partition of history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Period {
    /// One partition per UTC day: for retention counted in days.
    Day,
    /// One partition per UTC month (the default): for retention of a month
    /// or more.
    Month,
}

impl Period {
    /// The start of the period holding `t`.
    fn start(self, t: NaiveDateTime) -> NaiveDate {
        let d = t.date();
        match self {
            Period::Day => d,
            Period::Month => d.with_day(1).unwrap_or(d),
        }
    }

    /// The start of the period after the one starting at `start`.
    fn next(self, start: NaiveDate) -> NaiveDate {
        match self {
            Period::Day => start.succ_opt().unwrap_or(start),
            Period::Month => start.checked_add_months(Months::new(1)).unwrap_or(start),
        }
    }

    /// The start of the period `n` periods before the one starting at
    /// `start` (the earliest date there is, past it).
    fn back(self, start: NaiveDate, n: u32) -> NaiveDate {
        match self {
            Period::Day => start.checked_sub_days(chrono::Days::new(n.into())),
            Period::Month => start.checked_sub_months(Months::new(n)),
        }
        .unwrap_or(NaiveDate::MIN)
    }

    /// The partition name of the period starting at `start`.
    fn name(self, start: NaiveDate) -> String {
        match self {
            Period::Day => format!("{TABLE}_p{}", start.format("%Y_%m_%d")),
            Period::Month => format!("{TABLE}_p{}", start.format("%Y_%m")),
        }
    }

    /// The period and start a partition's name gives, if it is a period's.
    fn of_name(name: &str) -> Option<(Period, NaiveDate)> {
        let tail = name.strip_prefix(TABLE)?.strip_prefix("_p")?;
        match tail.len() {
            10 => NaiveDate::parse_from_str(tail, "%Y_%m_%d")
                .ok()
                .map(|d| (Period::Day, d)),
            7 => NaiveDate::parse_from_str(&format!("{tail}_01"), "%Y_%m_%d")
                .ok()
                .map(|d| (Period::Month, d)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Period::Day => "day",
            Period::Month => "month",
        })
    }
}

/// One period partition of history: its name and the `finished_time` range
/// `[from, to)` it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeriodPartition {
    /// The partition's table name.
    pub name: String,
    /// First `finished_time` it holds (UTC).
    pub from: NaiveDateTime,
    /// First `finished_time` it no longer holds (UTC).
    pub to: NaiveDateTime,
}

/// How history is partitioned, as the catalog says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The period of its partitions.
    pub period: Period,
    /// Its period partitions, oldest first.
    pub periods: Vec<PeriodPartition>,
}

impl Layout {
    /// The periods that ended at or before `cutoff`, oldest first.
    pub(crate) fn ended_by(&self, cutoff: NaiveDateTime) -> impl Iterator<Item = &PeriodPartition> {
        self.periods.iter().filter(move |p| p.to <= cutoff)
    }

    /// The `finished_time` ranges the periods cover, joined where they
    /// touch: rows outside them are in the kept or default partition.
    pub(crate) fn spans(&self) -> Vec<(NaiveDateTime, NaiveDateTime)> {
        let mut spans: Vec<(NaiveDateTime, NaiveDateTime)> = Vec::new();
        for p in &self.periods {
            match spans.last_mut() {
                Some(last) if last.1 == p.from => last.1 = p.to,
                _ => spans.push((p.from, p.to)),
            }
        }
        spans
    }
}

fn midnight(d: NaiveDate) -> NaiveDateTime {
    d.and_time(chrono::NaiveTime::MIN)
}

fn literal(t: NaiveDateTime) -> String {
    format!("'{}'", t.format("%Y-%m-%d %H:%M:%S"))
}

fn pg(db: &impl ConnectionTrait) -> Result<()> {
    match db.get_database_backend() {
        DbBackend::Postgres => Ok(()),
        _ => Err(Error::Config(
            "partitioned history needs PostgreSQL; MySQL/MariaDB and SQLite keep one history table and the batched purge".into(),
        )),
    }
}

async fn exec(db: &impl ConnectionTrait, sql: &str) -> std::result::Result<(), DbErr> {
    db.execute_unprepared(sql).await.map(drop)
}

async fn one_i64(db: &impl ConnectionTrait, sql: &str) -> std::result::Result<Option<i64>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await?;
    row.map(|r| r.try_get_by_index::<Option<i64>>(0))
        .transpose()
        .map(Option::flatten)
}

/// Whether `name` is partitioned (false when there is no such table).
async fn partitioned(db: &impl ConnectionTrait, name: &str) -> std::result::Result<bool, DbErr> {
    Ok(one_i64(
        db,
        &format!(
            "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = to_regclass('{name}')"
        ),
    )
    .await?
        == Some(1))
}

/// The partitions of `parent`, by name.
async fn children(
    db: &impl ConnectionTrait,
    parent: &str,
) -> std::result::Result<Vec<String>, DbErr> {
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = to_regclass('{parent}')"
            ),
        ))
        .await?;
    rows.iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect()
}

/// How history is partitioned; `None` when it is one table (or the
/// database is not PostgreSQL).
pub async fn layout(db: &impl ConnectionTrait) -> Result<Option<Layout>> {
    if db.get_database_backend() != DbBackend::Postgres || !partitioned(db, TABLE).await? {
        return Ok(None);
    }
    layout_of(db, TABLE).await.map(Some)
}

async fn layout_of(db: &impl ConnectionTrait, parent: &str) -> Result<Layout> {
    let mut found: Vec<(Period, NaiveDate)> = children(db, parent)
        .await?
        .iter()
        .filter_map(|n| Period::of_name(n))
        .collect();
    found.sort_by_key(|(_, start)| *start);
    let period = found.first().map_or(Period::Month, |(p, _)| *p);
    let periods = found
        .into_iter()
        .map(|(p, start)| PeriodPartition {
            name: p.name(start),
            from: midnight(start),
            to: midnight(p.next(start)),
        })
        .collect();
    Ok(Layout { period, periods })
}

/// Runs `body`'s statements in one transaction whose `lock_timeout` is
/// [`PARTITION_LOCK_TIMEOUT`].
async fn locked(db: &DatabaseConnection, body: &[String]) -> std::result::Result<(), DbErr> {
    let txn = db.begin().await?;
    exec(
        &txn,
        &format!(
            "SET LOCAL lock_timeout = '{}ms'",
            PARTITION_LOCK_TIMEOUT.as_millis()
        ),
    )
    .await?;
    for sql in body {
        exec(&txn, sql).await?;
    }
    txn.commit().await
}

/// Creates, under `parent`, the partitions of the periods from the one
/// holding `from` through `ahead` periods after the current one, those
/// missing. A period whose rows already went to the default partition is
/// left out (with a warning): they stay there and are purged in batches.
/// Returns the partitions made.
async fn make_periods(
    db: &DatabaseConnection,
    parent: &str,
    period: Period,
    from: NaiveDateTime,
    (behind, ahead): (u32, u32),
) -> Result<Vec<String>> {
    let have = children(db, parent).await?;
    let now = chrono::Utc::now().naive_utc();
    let mut last = period.start(now);
    for _ in 0..ahead {
        last = period.next(last);
    }
    // Never a period overlapping the kept partition (before 1970-01-02).
    let floor = NaiveDate::from_ymd_opt(1970, 2, 1).unwrap_or(NaiveDate::MIN);
    let earliest = period.back(period.start(now), behind).max(floor);
    let mut start = period.start(from.min(now)).max(earliest);
    let mut made = Vec::new();
    while start <= last {
        let name = period.name(start);
        let next = period.next(start);
        if !have.contains(&name) {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {name} PARTITION OF {parent} FOR VALUES FROM ({}) TO ({})",
                literal(midnight(start)),
                literal(midnight(next))
            );
            let one_at_a_time = format!("SELECT pg_advisory_xact_lock({UPKEEP_LOCK})");
            match locked(db, &[one_at_a_time, sql]).await {
                Ok(()) => made.push(name),
                // check_violation: the default partition holds rows of it.
                Err(e) if crate::db::sql_state(&e).as_deref() == Some("23514") => {
                    tracing::warn!(partition = %name, "the default history partition holds rows of this period; they stay there (purged in batches) and the period gets no partition of its own");
                }
                Err(e) => return Err(e.into()),
            }
        }
        if next == start {
            break;
        }
        start = next;
    }
    Ok(made)
}

/// Makes the partitions of the current period and [`DEFAULT_AHEAD`] after
/// it when history is partitioned and this role owns it (another role
/// leaves them to the owner's processes). Returns the partitions made.
pub async fn upkeep(db: &DatabaseConnection) -> Result<Vec<String>> {
    let Some(layout) = layout(db).await? else {
        return Ok(Vec::new());
    };
    if ownership(db).await? != Ownership::Mine {
        tracing::debug!(
            "this role does not own notify_msg_history: its owner makes the periods ahead"
        );
        return Ok(Vec::new());
    }
    let from = chrono::Utc::now().naive_utc();
    make_periods(db, TABLE, layout.period, from, (0, DEFAULT_AHEAD)).await
}

/// The predicate of [`KEEP_INDEX`]: rows that may have to be kept.
fn may_keep() -> String {
    format!("(status NOT IN ({DROPPED_STATUSES}) OR leased)")
}

/// The condition, on `notify_msg_history`, of the rows of a period a drop
/// must keep: anything but succeeded and cancelled, and a cancelled notice
/// whose lease is still live (it holds its ordering key until that lease
/// ends). Written as [`may_keep`] and a second clause, so that the planner
/// finds the rows by [`KEEP_INDEX`].
fn keep_condition() -> String {
    format!(
        "{} AND (status NOT IN ({DROPPED_STATUSES}) OR next_call_time > (now() AT TIME ZONE 'utc'))",
        may_keep()
    )
}

/// Moves the rows of `p` a drop must keep to the kept partition. Returns
/// how many moved.
pub(crate) async fn evacuate(
    db: &impl ConnectionTrait,
    p: &PeriodPartition,
) -> std::result::Result<u64, DbErr> {
    let sql = format!(
        "UPDATE {TABLE} SET finished_time = '{KEPT_TIME}' WHERE {} AND {}",
        in_range(p),
        keep_condition()
    );
    // A row an operator changed at the same moment: PostgreSQL's "moved to
    // another partition" (40001); the next try reads it again.
    let mut tries = 0;
    loop {
        tries += 1;
        match db.execute_unprepared(&sql).await {
            Err(e) if crate::db::is_conflict(&e) && tries < COPY_TRIES => continue,
            done => return Ok(done?.rows_affected()),
        }
    }
}

/// The condition, on `notify_msg_history`, of the rows in `p`'s range
/// (read through the parent: its grants suffice, and a period another purge
/// dropped has none).
fn in_range(p: &PeriodPartition) -> String {
    format!(
        "finished_time >= {} AND finished_time < {}",
        literal(p.from),
        literal(p.to)
    )
}

/// Rows of `p` a drop would take with it now, and, with
/// `include_failures`, the final failures and parked notices it moves aside
/// for the batches to purge.
pub(crate) async fn droppable(
    db: &impl ConnectionTrait,
    p: &PeriodPartition,
    include_failures: bool,
) -> std::result::Result<u64, DbErr> {
    let failures = match include_failures {
        true => {
            " OR (status IN (3, 6) AND NOT (leased AND next_call_time > (now() AT TIME ZONE 'utc')))"
        }
        false => "",
    };
    let n = one_i64(
        db,
        &format!(
            "SELECT count(*) FROM {TABLE} WHERE {} AND (NOT ({}){failures})",
            in_range(p),
            keep_condition()
        ),
    )
    .await?;
    Ok(n.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
}

/// Rows in `p` now.
pub(crate) async fn rows_in(
    db: &impl ConnectionTrait,
    p: &PeriodPartition,
) -> std::result::Result<u64, DbErr> {
    let n = one_i64(
        db,
        &format!("SELECT count(*) FROM {TABLE} WHERE {}", in_range(p)),
    )
    .await?;
    Ok(n.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
}

/// Drops `p`: counts it first (an ended period takes no new rows), then,
/// under the parent's lock (waited for at most [`PARTITION_LOCK_TIMEOUT`])
/// and the upkeep's advisory lock, moves out what it must keep (what
/// changed since [`evacuate`], by the partial index) and drops it: nothing
/// that scans the period runs under the lock. Returns how many rows went
/// with it, `None` when another purge dropped it first.
pub(crate) async fn drop_period(
    db: &DatabaseConnection,
    p: &PeriodPartition,
) -> std::result::Result<Option<u64>, DbErr> {
    let gone = rows_in(db, p).await?;
    let txn = db.begin().await?;
    exec(
        &txn,
        &format!(
            "SET LOCAL lock_timeout = '{}ms'",
            PARTITION_LOCK_TIMEOUT.as_millis()
        ),
    )
    .await?;
    exec(
        &txn,
        &format!("SELECT pg_advisory_xact_lock({UPKEEP_LOCK})"),
    )
    .await?;
    exec(
        &txn,
        &format!("LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE"),
    )
    .await?;
    let there = one_i64(
        &txn,
        &format!(
            "SELECT count(*) FROM pg_class WHERE oid = to_regclass('{}')",
            p.name
        ),
    )
    .await?;
    if there != Some(1) {
        txn.rollback().await?;
        return Ok(None);
    }
    let moved = evacuate(&txn, p).await?;
    exec(&txn, &format!("DROP TABLE {}", p.name)).await?;
    txn.commit().await?;
    Ok(Some(gone.saturating_sub(moved)))
}

/// The condition, as SQL, of history rows outside every period of `layout`
/// (in the kept or default partition).
pub(crate) fn outside_periods(layout: &Layout) -> String {
    let spans = layout.spans();
    if spans.is_empty() {
        return "TRUE".into();
    }
    spans
        .iter()
        .map(|(from, to)| {
            format!(
                "NOT (finished_time >= {} AND finished_time < {})",
                literal(*from),
                literal(*to)
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// How to partition history ([`convert`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// The length of one partition. Default [`Period::Month`].
    pub period: Period,
    /// Periods made ahead of the current one. Default [`DEFAULT_AHEAD`].
    pub ahead: u32,
    /// Periods made before the current one at most, back to the oldest
    /// row's; rows older still go to the default partition. Default
    /// [`MAX_PERIODS_BEHIND`].
    pub behind: u32,
    /// Ids copied per batch. Default [`DEFAULT_COPY_BATCH`].
    pub batch_size: u64,
}

impl Default for Partitioning {
    fn default() -> Self {
        Partitioning {
            period: Period::Month,
            ahead: DEFAULT_AHEAD,
            behind: MAX_PERIODS_BEHIND,
            batch_size: DEFAULT_COPY_BATCH,
        }
    }
}

/// What [`convert`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Converted {
    /// Whether history was partitioned already (then only periods ahead
    /// were made).
    pub already: bool,
    /// Rows copied by the batches (the trigger copied the others).
    pub copied: u64,
    /// Rows in history when it was swapped in.
    pub rows: u64,
    /// Partitions made.
    pub made: Vec<String>,
}

/// Partitions `notify_msg_history` online (see the module's docs). Run
/// again after an interruption, it resumes; on a partitioned history it
/// only makes the periods ahead.
pub async fn convert(db: &DatabaseConnection, how: &Partitioning) -> Result<Converted> {
    pg(db)?;
    if partitioned(db, TABLE).await? {
        let made = make_periods(
            db,
            TABLE,
            layout_of(db, TABLE).await?.period,
            chrono::Utc::now().naive_utc(),
            (0, how.ahead),
        )
        .await?;
        return Ok(Converted {
            already: true,
            made,
            ..Converted::default()
        });
    }
    owner_converts(db).await?;
    let mut made = build_copy(db, how).await?;
    start_sync(db).await?;
    let copied = copy_rows(db, how.batch_size).await?;
    let rows = same_rows(db).await?;
    swap(db).await?;
    // Made before the copy was filled already; a lock not taken now is
    // the workers' upkeep's to take.
    match make_periods(
        db,
        TABLE,
        how.period,
        chrono::Utc::now().naive_utc(),
        (0, how.ahead),
    )
    .await
    {
        Ok(more) => made.extend(more),
        Err(e) => {
            tracing::warn!(error = %e, "history is partitioned; making the periods ahead is left to the workers' upkeep")
        }
    }
    Ok(Converted {
        already: false,
        copied,
        rows,
        made,
    })
}

/// Refuses unless the session's role owns the table: the copy, its
/// partitions and the trigger's writes must be the owner's, or every
/// worker's move into history would be refused once the trigger is on.
async fn owner_converts(db: &DatabaseConnection) -> Result<()> {
    match ownership(db).await? {
        Ownership::Mine | Ownership::NoTable => Ok(()),
        Ownership::Elsewhere(schema) => Err(Error::Config(format!(
            "{TABLE} is in schema {schema}, not in the current schema (the first of search_path): set search_path so that {schema} comes first, then partition it"
        ))),
        Ownership::Theirs(owner) => Err(Error::Config(format!(
            "partition history as the role that owns {TABLE} ({owner}; connect as it or SET ROLE {owner}): the partitioned table must be its owner's for workers to write it"
        ))),
    }
}

/// Who owns history, as the session finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// The session's role owns it, in the current schema.
    Mine,
    /// Another role owns it (named).
    Theirs(String),
    /// It is in another schema than the current one (named).
    Elsewhere(String),
    /// There is no history table.
    NoTable,
}

/// Who owns `notify_msg_history` as `search_path` finds it, and whether it
/// is in the current schema (where the copy and the partitions are made).
pub(crate) async fn ownership(db: &impl ConnectionTrait) -> Result<Ownership> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT pg_get_userbyid(c.relowner)::text, c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user), \
                 n.nspname::text, n.nspname = current_schema() \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('{TABLE}')"
            ),
        ))
        .await?;
    let Some(row) = row else {
        return Ok(Ownership::NoTable);
    };
    let owner: String = row.try_get_by_index(0)?;
    let mine: bool = row.try_get_by_index(1)?;
    let schema: String = row.try_get_by_index(2)?;
    let here: bool = row.try_get_by_index(3)?;
    Ok(match (here, mine) {
        (false, _) => Ownership::Elsewhere(schema),
        (true, false) => Ownership::Theirs(owner),
        (true, true) => Ownership::Mine,
    })
}

/// Creates [`COPY`] (if it is not there from an interrupted run) with the
/// table's columns, defaults, checks, indexes and grants, plus
/// `finished_time`, its kept and default partitions and the periods from
/// the oldest row's through `how.ahead` ahead.
async fn build_copy(db: &DatabaseConnection, how: &Partitioning) -> Result<Vec<String>> {
    let mut ddl = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {COPY} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS, \
             finished_time timestamp without time zone NOT NULL DEFAULT (now() AT TIME ZONE 'utc')) \
             PARTITION BY RANGE (finished_time)"
        ),
        format!(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '{COPY}'::regclass AND contype = 'p') \
             THEN ALTER TABLE {COPY} ADD CONSTRAINT {COPY}_pkey PRIMARY KEY (id, finished_time); END IF; END $$"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEPT} PARTITION OF {COPY} FOR VALUES FROM (MINVALUE) TO ('1970-01-02')"
        ),
        format!("CREATE TABLE IF NOT EXISTS {DEFAULT} PARTITION OF {COPY} DEFAULT"),
        format!(
            "CREATE INDEX IF NOT EXISTS {KEEP_INDEX} ON {COPY} (finished_time) WHERE {}",
            may_keep()
        ),
    ];
    ddl.extend(copied_indexes(db).await?);
    ddl.extend(copied_grants(db).await?);
    retry_locked(db, &ddl).await?;
    let oldest = one_timestamp(
        db,
        &format!("SELECT min(coalesce(last_call_time, create_time)) FROM {TABLE}"),
    )
    .await?
    .unwrap_or_else(|| chrono::Utc::now().naive_utc());
    make_periods(db, COPY, how.period, oldest, (how.behind, how.ahead)).await
}

async fn one_timestamp(
    db: &impl ConnectionTrait,
    sql: &str,
) -> std::result::Result<Option<NaiveDateTime>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await?;
    row.map(|r| r.try_get_by_index::<Option<NaiveDateTime>>(0))
        .transpose()
        .map(Option::flatten)
}

/// The table's indexes but its primary key, made on [`COPY`] under names
/// ending `_p` (renamed at the swap), none unique (a unique index there
/// would have to hold `finished_time`).
async fn copied_indexes(db: &DatabaseConnection) -> Result<Vec<String>> {
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT c.relname::text, split_part(pg_get_indexdef(i.indexrelid), ' USING ', 2) \
                 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE i.indrelid = to_regclass('{TABLE}') AND NOT i.indisprimary"
            ),
        ))
        .await?;
    let mut ddl = Vec::new();
    for row in rows {
        let name: String = row.try_get_by_index(0)?;
        let using: String = row.try_get_by_index(1)?;
        if using.is_empty() {
            continue;
        }
        ddl.push(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {COPY} USING {using}",
            ident(&copy_name(&name))
        ));
    }
    Ok(ddl)
}

/// `name` quoted as an SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The name an index of the table has on [`COPY`] until the swap.
fn copy_name(name: &str) -> String {
    let mut base: String = name.chars().take(61).collect();
    base.push_str("_p");
    base
}

/// The grants on the table to roles other than its owner, made on [`COPY`].
async fn copied_grants(db: &DatabaseConnection) -> Result<Vec<String>> {
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT a.privilege_type::text, \
                        CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END, \
                        a.is_grantable \
                 FROM pg_class c, aclexplode(c.relacl) a \
                 WHERE c.oid = to_regclass('{TABLE}') AND a.grantee <> c.relowner"
            ),
        ))
        .await?;
    let mut ddl = Vec::new();
    for row in rows {
        let privilege: String = row.try_get_by_index(0)?;
        let grantee: String = row.try_get_by_index(1)?;
        let grantable: bool = row.try_get_by_index(2)?;
        let option = if grantable { " WITH GRANT OPTION" } else { "" };
        ddl.push(format!("GRANT {privilege} ON {COPY} TO {grantee}{option}"));
    }
    Ok(ddl)
}

/// Installs the trigger that mirrors every insert, update and delete of the
/// table into [`COPY`], in the writer's transaction: an inserted row enters
/// the current period, an updated one keeps the period it had there.
async fn start_sync(db: &DatabaseConnection) -> Result<()> {
    let function = format!(
        "CREATE OR REPLACE FUNCTION {SYNC}() RETURNS trigger LANGUAGE plpgsql AS $$ \
         DECLARE f timestamp; \
         BEGIN \
           IF TG_OP = 'INSERT' THEN \
             INSERT INTO {COPY} SELECT NEW.*, (now() AT TIME ZONE 'utc'); \
             RETURN NULL; \
           END IF; \
           DELETE FROM {COPY} WHERE id = OLD.id RETURNING finished_time INTO f; \
           IF TG_OP = 'UPDATE' THEN \
             INSERT INTO {COPY} SELECT NEW.*, coalesce(f, NEW.last_call_time, NEW.create_time); \
           END IF; \
           RETURN NULL; \
         END $$"
    );
    // Under the table's lock, so that a conversion swapped in meanwhile is
    // seen: a trigger on the partitioned table would point at no copy.
    let lock = format!("LOCK TABLE {TABLE} IN SHARE ROW EXCLUSIVE MODE");
    let trigger = format!(
        "DO $$ BEGIN \
         IF EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = '{TABLE}'::regclass) \
            OR to_regclass('{COPY}') IS NULL THEN \
           RAISE EXCEPTION 'another conversion of history finished meanwhile'; \
         END IF; \
         IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '{TABLE}'::regclass AND tgname = '{SYNC}') \
         THEN CREATE TRIGGER {SYNC} AFTER INSERT OR UPDATE OR DELETE ON {TABLE} FOR EACH ROW EXECUTE FUNCTION {SYNC}(); \
         END IF; END $$"
    );
    retry_locked(db, &[lock, function, trigger]).await
}

/// [`locked`], tried again while the lock could not be taken in time, up to
/// [`crate::schema::MIGRATION_LOCK_TRIES`] times.
async fn retry_locked(db: &DatabaseConnection, body: &[String]) -> Result<()> {
    let mut tries = 0;
    loop {
        tries += 1;
        match locked(db, body).await {
            Err(e)
                if crate::db::sql_state(&e).as_deref() == Some("55P03")
                    && tries < crate::schema::MIGRATION_LOCK_TRIES =>
            {
                tracing::warn!(
                    tries,
                    "history partitioning could not take its lock in time (a long transaction holds the table); trying again"
                );
                tokio::time::sleep(crate::schema::MIGRATION_LOCK_PAUSE).await;
            }
            done => return done.map_err(Error::from),
        }
    }
}

/// Copies the table's rows into [`COPY`] in batches of `batch` ids, each in
/// a REPEATABLE READ transaction that locks them (so a row changed since
/// the snapshot fails the batch, which is tried again, rather than being
/// copied as it was) and skips those the trigger copied. Returns how many
/// rows it copied.
async fn copy_rows(db: &DatabaseConnection, batch: u64) -> Result<u64> {
    let sql = format!(
        "WITH src AS (SELECT * FROM {TABLE} WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE), \
         ins AS (INSERT INTO {COPY} SELECT src.*, coalesce(src.last_call_time, src.create_time) FROM src \
                 WHERE NOT EXISTS (SELECT 1 FROM {COPY} c WHERE c.id = src.id) RETURNING 1) \
         SELECT (SELECT max(id) FROM src), (SELECT count(*) FROM ins)"
    );
    let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
    let mut after = i64::MIN;
    let mut copied = 0u64;
    loop {
        let mut tries = 0;
        let (last, n) = loop {
            tries += 1;
            match copy_batch(db, &sql, after, batch).await {
                Err(e) if crate::db::is_conflict(&e) && tries < COPY_TRIES => continue,
                done => break done?,
            }
        };
        let Some(last) = last else {
            return Ok(copied);
        };
        after = last;
        copied += n;
    }
}

async fn copy_batch(
    db: &DatabaseConnection,
    sql: &str,
    after: i64,
    batch: i64,
) -> std::result::Result<(Option<i64>, u64), DbErr> {
    let txn = db
        .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
        .await?;
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [after.into(), batch.into()],
        ))
        .await?;
    txn.commit().await?;
    let Some(row) = row else {
        return Ok((None, 0));
    };
    let last: Option<i64> = row.try_get_by_index(0)?;
    let n: i64 = row.try_get_by_index(1)?;
    Ok((last, u64::try_from(n).unwrap_or(0)))
}

/// Counts the table and [`COPY`] in one snapshot: the trigger writes the
/// copy in the writer's transaction, so they must agree. Returns the count.
async fn same_rows(db: &DatabaseConnection) -> Result<u64> {
    let txn = db
        .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
        .await?;
    let row = txn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT (SELECT count(*) FROM {TABLE}), (SELECT count(*) FROM {COPY})"),
        ))
        .await?;
    txn.commit().await?;
    let (table, copy): (i64, i64) = match row {
        Some(r) => (r.try_get_by_index(0)?, r.try_get_by_index(1)?),
        None => (0, 0),
    };
    if table != copy {
        return Err(Error::Config(format!(
            "the partitioned copy of history holds {copy} rows, the table {table}: not swapped (the copy and its trigger stay; run the conversion again)"
        )));
    }
    Ok(u64::try_from(table).unwrap_or(0))
}

/// Swaps [`COPY`] in for the table in one transaction under both tables'
/// locks (waited for at most [`PARTITION_LOCK_TIMEOUT`], tried again): the
/// old table and the trigger go, the copy and its indexes take their
/// names, and the table's own triggers are made on it.
async fn swap(db: &DatabaseConnection) -> Result<()> {
    let triggers = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = to_regclass('{TABLE}') \
                 AND NOT tgisinternal AND tgname <> '{SYNC}'"
            ),
        ))
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let indexes = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE i.indrelid = to_regclass('{TABLE}') AND NOT i.indisprimary"
            ),
        ))
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<String>(0))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut body = vec![
        format!("LOCK TABLE {TABLE}, {COPY} IN ACCESS EXCLUSIVE MODE"),
        format!("DROP TABLE {TABLE}"),
        format!("ALTER TABLE {COPY} RENAME TO {TABLE}"),
        format!("ALTER INDEX {COPY}_pkey RENAME TO {TABLE}_pkey"),
    ];
    body.extend(indexes.iter().map(|n| {
        format!(
            "ALTER INDEX IF EXISTS {} RENAME TO {}",
            ident(&copy_name(n)),
            ident(n)
        )
    }));
    body.extend(triggers);
    body.push(format!("DROP FUNCTION IF EXISTS {SYNC}()"));
    retry_locked(db, &body).await
}
