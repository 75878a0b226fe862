//! Claim: take the current attempt of one row, or of a batch of due rows.
//!
//! A claim bumps `version`, sets `leased` and `last_call_time`, and pushes
//! `next_call_time` one lease ahead, all from the database's clock, in the
//! statement that selects the rows: only the claimant sends, and a claimant
//! that dies leaves a row that is due again when the lease ends. Rows
//! another sender holds are skipped (`FOR UPDATE SKIP LOCKED` on PostgreSQL
//! and MariaDB; SQLite has a single writer).

use std::time::Instant;

use chrono::NaiveDateTime;

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, IdenStatic, Iterable,
    QueryFilter, QueryOrder, QuerySelect, Select,
    sea_query::{
        Alias, CommonTableExpression, Condition, Expr, LockBehavior, LockType, Query,
        SelectStatement, SubQueryStatement, UnionType, WithClause,
    },
};

use super::{
    Lease, Store, batch, clock,
    columns::{self, Column, Set},
    floor::Floor,
};
use crate::{
    db,
    entity::{notify_msg, read::Unreadable},
    status::Status,
};

/// Which definitions a claim may take rows of.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DefSelect {
    /// Any definition.
    #[default]
    Any,
    /// Only these `notify_def` ids.
    Only(Vec<i64>),
    /// Every definition with an id from `from` through `through` but those
    /// of `ids`: the smaller form when a worker takes nearly every
    /// definition (a notice of a definition created after `through` waits
    /// for the next list).
    Except {
        /// Ids in the range not taken.
        ids: Vec<i64>,
        /// The least id taken.
        from: i64,
        /// The greatest id taken.
        through: i64,
    },
    /// Notices whose definition has no `notify_def` row, and those of these
    /// ids (invalid definitions): the rows the park check parks.
    Orphans(Vec<i64>),
}

/// Which due rows a claim may take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueFilter {
    /// Definitions.
    pub defs: DefSelect,
    /// Only rows of these `load_balance_num` partitions (empty: any).
    pub partitions: Vec<i32>,
    /// Rows of these definitions are taken from any partition, whatever
    /// `partitions` says (operational events' definitions: events are
    /// written to partition 0).
    pub any_partition: Vec<i64>,
    /// Rows of these definitions are taken whatever `defs` and `partitions`
    /// say (every worker sweeps the alert definition).
    pub always: Vec<i64>,
    /// The lower bound on due times a claim reads
    /// (`src/state/floor.rs`); by default none.
    pub floor: Floor,
}

impl DueFilter {
    /// Rows of these definitions, any partition.
    pub fn defs(ids: Vec<i64>) -> Self {
        DueFilter {
            defs: DefSelect::Only(ids),
            ..DueFilter::default()
        }
    }

    fn is_empty(&self) -> bool {
        matches!(&self.defs, DefSelect::Only(ids) if ids.is_empty()) && self.always.is_empty()
    }
}

/// The columns a claim sets.
fn claim_sets(store: &Store) -> Vec<Set> {
    let backend = store.backend();
    vec![
        (Column::Leased, Expr::val(true)),
        (Column::LastCallTime, clock::now(backend)),
        (Column::NextCallTime, clock::after(backend, store.lease)),
    ]
}

/// PostgreSQL: the `due_at` a claim sets. A notice without a key keeps
/// its own, so the claim rewrites no index entry (migration 16); a notice
/// with a key (whose claim writes `held_key`, and so every index, anyway)
/// moves it to the lease's end with `next_call_time`, out of the due scan's
/// way while it is held: ordered keys hold one notice each nearly all the
/// time, and the scan would read past every one of them.
fn claim_due_at(store: &Store) -> (Alias, Expr) {
    let lease_end = clock::after(store.backend(), store.lease);
    (
        columns::due_at(),
        Expr::case(
            Expr::col(Column::OrderingKey).is_null(),
            Expr::col(columns::due_at()),
        )
        .finally(lease_end)
        .into(),
    )
}

/// Rows in flight matching `filter` (due or not) and in their key's turn
/// ([`order`](super::order)), of definitions not paused right now by the
/// database's clock ([`pause`](super::pause)).
fn wanted(filter: &DueFilter, backend: DbBackend) -> Condition {
    selected(filter, backend)
        .add(not_paused(backend))
        .add(super::order::in_turn(backend))
}

/// Rows in flight matching `filter` (due or not) and in their turn, paused
/// or not.
fn wanted_paused_too(filter: &DueFilter, backend: DbBackend) -> Condition {
    selected(filter, backend).add(super::order::in_turn(backend))
}

fn not_paused(backend: DbBackend) -> Condition {
    Condition::all().add(Column::DefId.not_in_subquery(super::pause::paused_now(backend)))
}

/// Rows in flight matching `filter`, whatever their turn.
fn selected(filter: &DueFilter, backend: DbBackend) -> Condition {
    let mut wanted = Condition::all();
    match &filter.defs {
        DefSelect::Any => {}
        DefSelect::Only(ids) => wanted = wanted.add(def_in(backend, ids, false)),
        DefSelect::Except { ids, from, through } => {
            wanted = wanted
                .add(Column::DefId.gte(*from))
                .add(Column::DefId.lte(*through));
            if !ids.is_empty() {
                wanted = wanted.add(def_in(backend, ids, true));
            }
        }
        DefSelect::Orphans(ids) => {
            let mut orphans = Condition::any().add(
                Column::DefId.not_in_subquery(
                    sea_orm::sea_query::Query::select()
                        .column(crate::entity::notify_def::Column::Id)
                        .from(crate::entity::notify_def::Entity)
                        .to_owned(),
                ),
            );
            if !ids.is_empty() {
                orphans = orphans.add(def_in(backend, ids, false));
            }
            wanted = wanted.add(orphans);
        }
    }
    if !filter.partitions.is_empty() {
        let mut partitions =
            Condition::any().add(Column::LoadBalanceNum.is_in(filter.partitions.iter().copied()));
        if !filter.any_partition.is_empty() {
            partitions = partitions.add(def_in(backend, &filter.any_partition, false));
        }
        wanted = wanted.add(partitions);
    }
    if !filter.always.is_empty() {
        wanted = Condition::any()
            .add(wanted)
            .add(Column::DefId.is_in(filter.always.iter().copied()));
    }
    Condition::all()
        .add(wanted)
        .add(Column::Status.is_in(Status::DUE))
}

/// Most definition ids a claim lists one by one, a parameter each: 100.
/// More go as one parameter (an array on PostgreSQL, JSON elsewhere), so a
/// claim's size does not grow with the number of definitions (MySQL and
/// PostgreSQL take at most 65,535 parameters, SQLite 32,766).
pub const IDS_INLINE: usize = 100;

/// `def_id IN ids` (`NOT IN` with `negate`), as one parameter past
/// [`IDS_INLINE`] ids.
fn def_in(backend: DbBackend, ids: &[i64], negate: bool) -> Expr {
    if ids.len() <= IDS_INLINE {
        let ids = ids.iter().copied();
        return if negate {
            Column::DefId.is_not_in(ids)
        } else {
            Column::DefId.is_in(ids)
        };
    }
    let (sql, value): (&str, sea_orm::Value) = match backend {
        // As text, cast: an array value would be bound one element at a
        // time (100,000 ids failed as "too many arguments").
        DbBackend::Postgres => (
            "\"def_id\" = ANY(CAST($1 AS bigint[]))",
            json_ids(ids).replace('[', "{").replace(']', "}").into(),
        ),
        DbBackend::MySql => (
            "`def_id` IN (SELECT j.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j)",
            json_ids(ids).into(),
        ),
        _ => (
            "\"def_id\" IN (SELECT value FROM json_each(?))",
            json_ids(ids).into(),
        ),
    };
    let listed = Expr::cust_with_values(sql, [value]);
    if negate { listed.not() } else { listed }
}

/// `ids` as a JSON array.
fn json_ids(ids: &[i64]) -> String {
    let mut text = String::with_capacity(ids.len() * 8 + 2);
    text.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&id.to_string());
    }
    text.push(']');
    text
}

/// Which rows `filter` selects, for its [`floor`](super::floor).
fn rows_of(filter: &DueFilter) -> super::floor::Rows {
    let (kind, ids, range): (u8, &[i64], (i64, i64)) = match &filter.defs {
        DefSelect::Any => (0, &[], (0, 0)),
        DefSelect::Only(ids) => (1, ids, (0, 0)),
        DefSelect::Except { ids, from, through } => (2, ids, (*from, *through)),
        DefSelect::Orphans(ids) => (3, ids, (0, 0)),
    };
    super::floor::Rows::new(
        kind,
        ids,
        range,
        &filter.partitions,
        &filter.any_partition,
        &filter.always,
    )
}

/// Rows due at or after `floor` (by the due index's column), or all. On
/// PostgreSQL the floor is a subquery's value, unknown when the statement
/// is planned: as a constant past the newest due time in the table's
/// statistics, it made the planner expect one row and read the whole
/// range by a bitmap and sort it, instead of reading the index in order
/// up to the limit (a soak's claims then sorted the whole backlog each).
fn above_floor(backend: DbBackend, floor: Option<NaiveDateTime>) -> Condition {
    let mut above = Condition::all();
    match (floor, backend) {
        (None, _) => {}
        (Some(floor), DbBackend::Postgres) => {
            above = above.add(Expr::cust_with_values(
                r#""due_at" >= (SELECT CAST($1 AS timestamp))"#,
                [floor],
            ));
        }
        (Some(floor), _) => above = above.add(due_at(backend).gte(floor)),
    }
    above
}

/// The earliest due time (by the due index's column) of the rows in flight
/// `filter` selects, paused or not and in their turn or not, read from
/// `from` on (from the index's start with `None`), but no later than
/// `guard` before the database's now: the [`floor`](super::floor) of its
/// claims. `None`: no floor (a row is due before 1970).
pub(crate) async fn lowest_due(
    store: &Store,
    filter: &DueFilter,
    from: Option<NaiveDateTime>,
    guard: std::time::Duration,
) -> Result<Option<NaiveDateTime>, DbErr> {
    let backend = store.backend();
    // The first row in the due index's order, not `MIN`: MariaDB reads
    // every row of the range for a `MIN` under conditions the index lacks.
    // Clamped: PostgreSQL's `-infinity` (a row written with its triggers
    // off) cannot be read as a time.
    let lowest = due_first(
        backend,
        selected(filter, backend).add(above_floor(backend, from)),
    )
    .select_only()
    .expr(Expr::cust_with_exprs(
        match backend {
            DbBackend::Postgres => "GREATEST($1, $2)",
            _ => "GREATEST(?, ?)",
        },
        [due_at(backend), Expr::val(no_floor_below())],
    ))
    .limit(1);
    let mut both = Query::select();
    both.expr(Expr::SubQuery(
        None,
        Box::new(sea_orm::QueryTrait::into_query(lowest).into()),
    ))
    .expr(clock::before(backend, guard));
    let row = store
        .db
        .query_one(&both)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("no row from a select of values".into()))?;
    let lowest: Option<NaiveDateTime> = row.try_get_by_index(0)?;
    let latest: NaiveDateTime = row.try_get_by_index(1)?;
    Ok(match lowest {
        Some(lowest) if lowest <= no_floor_below() => None,
        lowest => Some(lowest.map_or(latest, |lowest| Ord::min(lowest, latest))),
    })
}

/// A row due at or before this time (1970-01-01: PostgreSQL's
/// `-infinity` of a row written with its triggers off) leaves no floor.
fn no_floor_below() -> NaiveDateTime {
    chrono::DateTime::UNIX_EPOCH.naive_utc()
}

/// The floor a claim of `filter`'s rows uses now.
#[cfg(test)]
pub(crate) async fn floor_of(store: &Store, filter: &DueFilter) -> Option<NaiveDateTime> {
    let look = |from| lowest_due(store, filter, from, super::floor::GUARD);
    filter
        .floor
        .for_claim(rows_of(filter), store.backend(), look)
        .await
}

/// The select of [`claim_due`] (without its turn's rows set aside) of
/// `filter`'s rows above `floor`.
#[cfg(test)]
pub(crate) fn due_select(
    store: &Store,
    filter: &DueFilter,
    floor: Option<NaiveDateTime>,
    limit: u64,
) -> Select<notify_msg::Entity> {
    let backend = store.backend();
    due_rows(
        store,
        wanted(filter, backend).add(above_floor(backend, floor)),
        limit,
    )
}

/// Due rows matching `wanted`, oldest first.
fn due_rows(store: &Store, wanted: Condition, limit: u64) -> Select<notify_msg::Entity> {
    due_first(store.backend(), due(store.backend()).add(wanted)).limit(limit)
}

/// `due_at` on PostgreSQL (migration 16): the time a row fell or falls due,
/// equal to `next_call_time` unless the row is leased, and never later. The
/// due indexes are on it, so a claim (which moves only `next_call_time`)
/// rewrites no index entry. The other backends index `next_call_time`.
fn due_at(backend: DbBackend) -> Expr {
    match backend {
        DbBackend::Postgres => Expr::col(columns::due_at()),
        _ => Expr::col(Column::NextCallTime),
    }
}

/// Rows due now by the database's clock: on PostgreSQL, by the due index
/// (`due_at`), then by `next_call_time`, which a live claim holds ahead.
fn due(backend: DbBackend) -> Condition {
    let now = clock::now(backend);
    let mut due = Condition::all().add(Expr::col(Column::NextCallTime).lte(now.clone()));
    if backend == DbBackend::Postgres {
        due = due.add(due_at(backend).lte(now));
    }
    due
}

/// Rows matching `cond`, oldest due first, by the due index.
fn due_first(backend: DbBackend, cond: Condition) -> Select<notify_msg::Entity> {
    notify_msg::Entity::find()
        .filter(cond)
        .order_by(due_at(backend), sea_orm::Order::Asc)
}

/// How long until the earliest row in flight matching `filter` is due, by
/// the database's clock (zero when one is due already; `None` when none is
/// in flight). Leased rows count with their lease's end, except on
/// PostgreSQL ([`next_due_pg`]).
pub(crate) async fn next_due(
    store: &Store,
    filter: &DueFilter,
) -> Result<Option<std::time::Duration>, DbErr> {
    if filter.is_empty() {
        return Ok(None);
    }
    let backend = store.backend();
    if backend == DbBackend::Postgres {
        return next_due_pg(store, filter).await;
    }
    let floor = filter.floor.current(rows_of(filter), backend);
    let above = above_floor(backend, floor.at);
    let until = Expr::cust(match backend {
        DbBackend::MySql => {
            "CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(next_call_time)) AS DOUBLE) / 1000000"
        }
        _ => "(julianday(MIN(next_call_time)) - julianday('now')) * 86400.0",
    });
    let secs: Option<Option<f64>> = notify_msg::Entity::find()
        .select_only()
        .expr(until)
        .filter(wanted(filter, store.backend()).add(above))
        .into_tuple()
        .one(&store.db)
        .await?;
    Ok(by_floor(
        secs.flatten()
            .map(|s| std::time::Duration::from_secs_f64(s.clamp(0.0, 365.0 * 86_400.0))),
        floor,
    ))
}

/// The time until the next due row `found` above the floor, but no later
/// than when a claim may look below it, if one owes that look.
fn by_floor(
    found: Option<std::time::Duration>,
    floor: super::floor::Current,
) -> Option<std::time::Duration> {
    match (found, floor.by) {
        (Some(found), Some(by)) => Some(found.min(by)),
        (found, by) => found.or(by),
    }
}

/// [`next_due`] on PostgreSQL, by the due index: the first row in `due_at`
/// order that is due now or whose `due_at` is its `next_call_time`. Every
/// row's `due_at` is at most its `next_call_time` (migration 16), so that
/// row's `next_call_time` is the earliest of all such rows'. Left out: a
/// live claim whose `due_at` stayed behind (every claim of a notice
/// without a key; a keyed one taken by [`claim_one`] or whose lease was
/// renewed): no index has its end; an outcome of this process wakes its
/// workers, and a claim that died or was forgotten is found by the next
/// poll after its lease ends. Also left out: a row inserted with triggers
/// off and due later (found by the poll).
async fn next_due_pg(
    store: &Store,
    filter: &DueFilter,
) -> Result<Option<std::time::Duration>, DbErr> {
    let backend = store.backend();
    let now = clock::now(backend);
    let known = Condition::any()
        .add(Expr::col(columns::due_at()).equals(Column::NextCallTime))
        .add(Expr::col(Column::NextCallTime).lte(now));
    let until = Expr::cust(
        "CAST(EXTRACT(EPOCH FROM (next_call_time - (statement_timestamp() AT TIME ZONE 'UTC'))) AS DOUBLE PRECISION)",
    );
    let floor = filter.floor.current(rows_of(filter), backend);
    let above = above_floor(backend, floor.at);
    let secs: Option<f64> = due_first(backend, wanted(filter, backend).add(known).add(above))
        .select_only()
        .expr(until)
        .into_tuple()
        .one(&store.db)
        .await?;
    Ok(by_floor(
        secs.map(|s| std::time::Duration::from_secs_f64(s.clamp(0.0, 365.0 * 86_400.0))),
        floor,
    ))
}

/// What a claim of due rows did.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    /// The rows claimed.
    pub leases: Vec<Lease>,
    /// Due rows set aside: not in their key's turn
    /// ([`order`](super::order)).
    pub set_aside: u64,
    /// Whether the claim's params filled its bound in bytes: more may be
    /// due behind them.
    pub full_in_bytes: bool,
}

/// Whether `leases`' payloads add up to `bytes`.
fn full(leases: &[Lease], bytes: u64) -> bool {
    leases.iter().map(Lease::payload_bytes).sum::<u64>() >= bytes
}

impl Claimed {
    /// The due rows this claim dealt with; when that is its whole limit,
    /// more may be due.
    pub fn looked_at(&self) -> u64 {
        self.leases.len() as u64 + self.set_aside
    }
}

/// Claims up to `limit` due rows, oldest first. With `set_aside` (some
/// definition is ordered) it also sets aside, within the same limit, the
/// due rows that wait for their key's turn; without, it claims in one plain
/// statement (the turn is checked all the same, so a definition that has
/// just become ordered is never sent out of turn, only read more often).
///
/// At most `bytes` of params are claimed (their sum in bytes, oldest
/// first), and always at least one row: a sweep's memory is bounded in
/// bytes, and a notice larger than the bound still goes, alone. Rows in
/// turn but past the bound stay due, for the next claim.
///
/// Rows are read from the filter's [`floor`](super::floor) on; when that
/// finds nothing and rows lie below the floor, again from the lower floor.
pub(crate) async fn claim_due(
    store: &Store,
    filter: &DueFilter,
    limit: u64,
    set_aside: bool,
    bytes: u64,
) -> Result<Claimed, DbErr> {
    if filter.is_empty() || limit == 0 {
        return Ok(Claimed::default());
    }
    let began = Instant::now();
    let (rows, backend) = (rows_of(filter), store.backend());
    let look = |from| lowest_due(store, filter, from, super::floor::GUARD);
    let floor = filter.floor.for_claim(rows, backend, look).await;
    let claimed = claim_due_from(store, filter, floor, limit, set_aside, bytes).await?;
    let Some(floor) = floor.filter(|_| claimed.looked_at() == 0) else {
        return Ok(claimed);
    };
    match filter
        .floor
        .lower_after_nothing(rows, backend, floor, began, look)
        .await
    {
        Some(lower) => claim_due_from(store, filter, lower, limit, set_aside, bytes).await,
        None => Ok(claimed),
    }
}

/// [`claim_due`] of rows due at or after `floor`.
async fn claim_due_from(
    store: &Store,
    filter: &DueFilter,
    floor: Option<NaiveDateTime>,
    limit: u64,
    set_aside: bool,
    bytes: u64,
) -> Result<Claimed, DbErr> {
    let above = above_floor(store.backend(), floor);
    if !set_aside {
        let leases = claim_rows(
            store,
            due_rows(store, wanted(filter, store.backend()).add(above), limit),
            Some(bytes),
        )
        .await?;
        return Ok(Claimed {
            full_in_bytes: full(&leases, bytes),
            leases,
            set_aside: 0,
        });
    }
    let started = Instant::now();
    let backend = store.backend();
    let found = selected(filter, backend)
        .add(not_paused(backend))
        .add(above)
        .add(
            Condition::any()
                .add(super::order::may_wait(backend))
                .add(super::order::in_turn(backend)),
        );
    let candidates = due_rows(store, found, limit);
    let (rows, aside) = match backend {
        DbBackend::Postgres => claim_due_pg(store, candidates, bytes).await?,
        _ => claim_due_locked(store, candidates, bytes).await?,
    };
    crate::counters::claimed(rows.len() as u64);
    let leases: Vec<Lease> = rows
        .into_iter()
        .map(|row| Lease::new(store.clone(), row, started))
        .collect();
    let claimed = Claimed {
        full_in_bytes: full(&leases, bytes),
        leases,
        set_aside: aside.len() as u64,
    };
    // Now that the claim has committed: a notice that finished after its
    // snapshot may have let one of these take its turn.
    if !aside.is_empty() {
        match super::order::promote(&store.db, &aside).await {
            // Due now: this process's workers claim them at once (the
            // sweep that called may believe nothing more is due).
            Ok(due) if due > 0 => store.wake_workers(),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot recheck notices set aside for their turn; they are due within {:?}", super::order::TURN_RECHECK);
            }
        }
    }
    Ok(claimed)
}

/// The name of the candidates' turn column.
const TURN: &str = "turn";

/// The size of a row's payload in bytes (its param and the previous step's
/// result: what a claim holds, [`Lease::payload_bytes`]), as SQL, read
/// without their content: PostgreSQL's and SQLite's `octet_length` read
/// only a value's header, MySQL/MariaDB keep the size in a column set by
/// triggers (migrations 18 and 23; naming `param` here would make MariaDB
/// read it whole).
pub(crate) fn param_bytes(backend: DbBackend) -> Expr {
    Expr::cust(match backend {
        DbBackend::MySql => "COALESCE(param_bytes, 0)",
        _ => "octet_length(param) + COALESCE(octet_length(step_result), 0)",
    })
}

/// How many of `sizes` (in claim order) fit in `bytes`: those whose
/// params before them add up to less than `bytes`, at least one.
fn fitting(sizes: impl IntoIterator<Item = i64>, bytes: u64) -> usize {
    let mut before: u64 = 0;
    let mut n = 0;
    for size in sizes {
        if n > 0 && before >= bytes {
            break;
        }
        before = before.saturating_add(u64::try_from(size).unwrap_or(0));
        n += 1;
    }
    n
}

/// PostgreSQL and SQLite: the ids of the rows `due` selects (locked on
/// PostgreSQL), cut where their params add up to `bytes` (at least one),
/// as a subquery: `SUM(sz) OVER (ORDER BY due, id)` over the candidates.
fn ids_within(backend: DbBackend, due: Select<notify_msg::Entity>, bytes: u64) -> SelectStatement {
    let mut cand = due
        .select_only()
        .column(Column::Id)
        .expr_as(param_bytes(backend), "sz")
        .expr_as(due_at(backend), "d");
    if backend == DbBackend::Postgres {
        cand = cand.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    let mut sized = Query::select();
    sized
        .columns([Alias::new("id"), Alias::new("sz")])
        .expr_as(
            Expr::cust("SUM(sz) OVER (ORDER BY d, id)"),
            Alias::new("upto"),
        )
        .from_subquery(sea_orm::QueryTrait::into_query(cand), Alias::new("c"));
    let mut within = Query::select();
    within
        .column(Alias::new("id"))
        .from_subquery(sized, Alias::new("w"))
        .and_where(Expr::cust_with_values(
            format!("upto - sz < {}", placeholder(backend)),
            [i64::try_from(bytes).unwrap_or(i64::MAX)],
        ));
    within
}

/// sea-query's placeholder for a value of a custom expression.
fn placeholder(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "$1",
        _ => "?",
    }
}

/// `(def_id, ordering_key)` of a row set aside.
type Key = (i64, String);

/// The ids [`claim_due_pg`] claims (`in_turn`: those in turn, while
/// their params fit in `bytes`) or sets aside (the others), of the
/// candidates `cand`.
fn pg_ids_of(cand: &Alias, in_turn: bool, bytes: u64) -> sea_orm::sea_query::SimpleExpr {
    let mut ids = Query::select();
    let turn = Expr::col(Alias::new(TURN));
    if in_turn {
        // Those in turn, while their params fit in `bytes`.
        let mut sized = Query::select();
        sized
            .columns([Alias::new("id"), Alias::new("sz"), Alias::new(TURN)])
            .expr_as(
                Expr::cust("SUM(CASE WHEN turn THEN sz ELSE 0 END) OVER (ORDER BY d, id)"),
                Alias::new("upto"),
            )
            .from(cand.clone());
        ids.column(Alias::new("id"))
            .from_subquery(sized, Alias::new("w"))
            .and_where(turn)
            .and_where(Expr::cust(format!(
                "upto - sz < {}",
                i64::try_from(bytes).unwrap_or(i64::MAX)
            )));
    } else {
        ids.column(Column::Id)
            .from(cand.clone())
            .and_where(turn.not());
    }
    Expr::cust_with_expr(
        r#""id" = ANY(ARRAY($1))"#,
        Expr::SubQuery(None, Box::new(ids.into())),
    )
}

/// [`claim_due_pg`]'s statement.
fn claim_due_pg_statement(
    store: &Store,
    candidates: Select<notify_msg::Entity>,
    bytes: u64,
) -> sea_orm::sea_query::WithQuery {
    let backend = store.backend();
    let (cand, aside, claimed) = (
        Alias::new("cand"),
        Alias::new("aside"),
        Alias::new("claimed"),
    );
    let candidates = candidates
        .select_only()
        .column(Column::Id)
        .expr_as(super::order::in_turn(backend), TURN)
        .expr_as(param_bytes(backend), "sz")
        .expr_as(due_at(backend), "d")
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    let ids_of = |in_turn: bool| pg_ids_of(&cand, in_turn, bytes);
    let mut set_aside = Query::update();
    set_aside
        .table(notify_msg::Entity)
        .value(Column::NextCallTime, super::order::aside_until(backend))
        .value(columns::due_at(), super::order::aside_until(backend))
        .and_where(ids_of(false))
        .returning(Query::returning().columns([Column::Id, Column::DefId, Column::OrderingKey]));
    let mut claim = Query::update();
    claim.table(notify_msg::Entity);
    for (c, value) in claim_sets(store).into_iter().chain([columns::bump()]) {
        claim.value(c, value);
    }
    let (due_at, value) = claim_due_at(store);
    claim.value(due_at, value);
    claim
        .and_where(ids_of(true))
        .returning(Query::returning().columns(Column::iter()));
    let mut rows = Query::select();
    rows.expr_as(Expr::val(false), aside.clone())
        .columns(Column::iter())
        .from(claimed.clone());
    let mut aside_rows = Query::select();
    aside_rows.expr(Expr::val(true));
    for c in Column::iter() {
        match c {
            Column::Id | Column::DefId | Column::OrderingKey => aside_rows.column(c),
            _ => aside_rows.expr(Expr::cust("NULL")),
        };
    }
    aside_rows.from(aside.clone());
    rows.union(UnionType::All, aside_rows);
    let cte = |name: &Alias, query: SubQueryStatement| {
        CommonTableExpression::new()
            .table_name(name.clone())
            .query(query)
            .to_owned()
    };
    rows.with(
        WithClause::new()
            .cte(cte(
                &cand,
                sea_orm::QueryTrait::into_query(candidates).into(),
            ))
            .cte(cte(&aside, set_aside.into()))
            .cte(cte(&claimed, claim.into()))
            .to_owned(),
    )
}

/// PostgreSQL: the claim and the setting aside in one statement: the
/// candidates are locked (`SKIP LOCKED`), those in turn are claimed and
/// returned in full, the others are pushed out and returned as their key
/// (the `aside` column tells which is which).
async fn claim_due_pg(
    store: &Store,
    candidates: Select<notify_msg::Entity>,
    bytes: u64,
) -> Result<(Vec<notify_msg::Model>, Vec<Key>), DbErr> {
    let statement = claim_due_pg_statement(store, candidates, bytes);
    let mut taken = Vec::new();
    let mut keys = Vec::new();
    let mut unreadable = Vec::new();
    for row in store.db.query_all(&statement).await? {
        if row.try_get::<bool>("", "aside")? {
            if let Some(key) = row.try_get::<Option<String>>("", Column::OrderingKey.as_str())? {
                keys.push((row.try_get("", Column::DefId.as_str())?, key));
            }
        } else {
            match crate::entity::read::notice::<notify_msg::Model>(&row) {
                Ok(model) => taken.push(model),
                Err(u) => unreadable.push(u),
            }
        }
    }
    // Claimed (the statement has committed), never sent.
    batch::park_unreadable(store, unreadable).await;
    taken.sort_by_key(|r| r.id);
    Ok((taken, keys))
}

/// Rows `select` reads whole, each decoded on its own: those read, and
/// those that cannot be read as notices.
async fn read_rows<C: ConnectionTrait>(
    db: &C,
    select: Select<notify_msg::Entity>,
) -> Result<(Vec<notify_msg::Model>, Vec<Unreadable>), DbErr> {
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    Ok(crate::entity::read::notices(&rows))
}

/// The rows with these ids (none asked: no statement), as [`read_rows`].
async fn rows_by_id<C: ConnectionTrait>(
    db: &C,
    ids: Vec<i64>,
) -> Result<(Vec<notify_msg::Model>, Vec<Unreadable>), DbErr> {
    if ids.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    read_rows(db, notify_msg::Entity::find().filter(Column::Id.is_in(ids))).await
}

/// A candidate of a claim: its turn and its param's size.
struct Candidate {
    id: i64,
    def_id: i64,
    key: Option<String>,
    turn: bool,
    size: i64,
}

/// MariaDB: locks rows of `ready` (ids and sizes, in claim order) whose
/// params fit in `bytes` through `lock` (which reads the ids it is given
/// again, `FOR UPDATE SKIP LOCKED`, with their conditions), the next
/// bite each time until `bytes` are held or `ready` is spent: rows
/// another claim holds are skipped and the next ones tried. `lock` is
/// called at least once (with no ids when `ready` is empty). Returns
/// what `lock` returned.
async fn lock_fitting<T, F, Fut>(
    ready: &[(i64, i64)],
    bytes: u64,
    mut lock: F,
) -> Result<Vec<T>, DbErr>
where
    T: Sized,
    F: FnMut(Vec<i64>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, DbErr>>,
    T: Sized + HasSize,
{
    let mut held = Vec::new();
    let mut used: u64 = 0;
    let mut next = 0;
    let mut called = false;
    while (next < ready.len() && used < bytes) || !called {
        called = true;
        let n = match next < ready.len() {
            true => fitting(ready[next..].iter().map(|(_, size)| *size), bytes - used),
            false => 0,
        };
        let ids = ready[next..next + n].iter().map(|(id, _)| *id).collect();
        next += n;
        for row in lock(ids).await? {
            used = used.saturating_add(row.size());
            held.push(row);
        }
    }
    Ok(held)
}

/// A locked row's size in the byte budget (0: does not count).
trait HasSize {
    fn size(&self) -> u64;
}

impl HasSize for Candidate {
    fn size(&self) -> u64 {
        match self.turn {
            true => u64::try_from(self.size).unwrap_or(0),
            false => 0,
        }
    }
}

impl HasSize for (i64, i64) {
    fn size(&self) -> u64 {
        u64::try_from(self.1).unwrap_or(0)
    }
}

/// The candidates' ids, keys, turns and sizes (no param read yet).
fn candidate_columns(
    backend: DbBackend,
    select: Select<notify_msg::Entity>,
) -> Select<notify_msg::Entity> {
    select
        .select_only()
        .columns([Column::Id, Column::DefId, Column::OrderingKey])
        .expr_as(super::order::in_turn(backend), TURN)
        .expr_as(param_bytes(backend), "sz")
}

/// The candidates `select` (of [`candidate_columns`]) reads in `txn`.
async fn read_candidates(
    txn: &crate::db::Txn,
    select: Select<notify_msg::Entity>,
) -> Result<Vec<Candidate>, DbErr> {
    let mut found = Vec::new();
    for row in txn
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?
    {
        let turn = match row.try_get::<bool>("", TURN) {
            Ok(flag) => flag,
            Err(_) => row.try_get::<i64>("", TURN)? != 0,
        };
        // A key or definition that cannot be read promotes
        // nothing: the row itself is parked when read whole.
        found.push(Candidate {
            id: row.try_get("", Column::Id.as_str())?,
            def_id: row.try_get("", Column::DefId.as_str()).unwrap_or_default(),
            key: row
                .try_get("", Column::OrderingKey.as_str())
                .unwrap_or_default(),
            turn,
            size: row.try_get("", "sz").unwrap_or_default(),
        });
    }
    Ok(found)
}

/// MariaDB: the candidates, locked `SKIP LOCKED` in `txn`, those in turn
/// while they fit in `bytes`.
async fn lock_candidates_mysql(
    txn: &crate::db::Txn,
    candidates: Select<notify_msg::Entity>,
    bytes: u64,
) -> Result<Vec<Candidate>, DbErr> {
    let backend = DbBackend::MySql;
    // A locking read makes InnoDB read each row whole, params
    // included: 1,000 candidates of 1 MiB took 11 s. So the
    // candidates are read without locks, and only those that fit are
    // locked (read again with their conditions, skipping those another
    // claim holds), a bite at a time until `bytes` are held.
    let preview = read_candidates(txn, candidate_columns(backend, candidates.clone())).await?;
    if preview.iter().map(HasSize::size).sum::<u64>() <= bytes {
        // Small rows: one locking read, which moves on past rows other
        // claims hold (what does not fit is cut below).
        read_candidates(
            txn,
            candidate_columns(backend, candidates.clone())
                .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked),
        )
        .await
    } else {
        let waiting: Vec<i64> = preview.iter().filter(|c| !c.turn).map(|c| c.id).collect();
        let ready: Vec<(i64, i64)> = preview
            .iter()
            .filter(|c| c.turn)
            .map(|c| (c.id, c.size))
            .collect();
        let mut first = Some(waiting);
        lock_fitting(&ready, bytes, |ids: Vec<i64>| {
            let ids: Vec<i64> = first
                .take()
                .unwrap_or_default()
                .into_iter()
                .chain(ids)
                .collect();
            read_candidates(
                txn,
                candidate_columns(backend, candidates.clone().filter(Column::Id.is_in(ids)))
                    .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked),
            )
        })
        .await
    }
}

/// MariaDB and SQLite: in one transaction, read the candidates with their
/// turn (locked `SKIP LOCKED` on MariaDB; SQLite's write lock is held from
/// the start), claim those in turn and push out the others.
async fn claim_due_locked(
    store: &Store,
    candidates: Select<notify_msg::Entity>,
    bytes: u64,
) -> Result<(Vec<notify_msg::Model>, Vec<Key>), DbErr> {
    let backend = store.backend();
    let txn = db::begin(&store.db).await?;
    let found = if backend == DbBackend::MySql {
        lock_candidates_mysql(&txn, candidates, bytes).await?
    } else {
        read_candidates(&txn, candidate_columns(backend, candidates)).await?
    };
    let mut in_turn = Vec::new();
    let mut waiting: Vec<(i64, i64, Option<String>)> = Vec::new();
    for c in found {
        if c.turn {
            in_turn.push((c.id, c.size));
        } else {
            waiting.push((c.id, c.def_id, c.key));
        }
    }
    // Then, of those in turn, the rows whose params fit in `bytes`.
    let fit = fitting(in_turn.iter().map(|(_, size)| *size), bytes);
    let chosen: Vec<i64> = in_turn.iter().take(fit).map(|(id, _)| *id).collect();
    let (mut taken, unreadable) = rows_by_id(&txn, chosen).await?;
    if !taken.is_empty() {
        let ids = taken.iter().map(|r| r.id);
        columns::update(&txn, Column::Id.is_in(ids), claim_sets(store)).await?;
    }
    if !waiting.is_empty() {
        notify_msg::Entity::update_many()
            .col_expr(Column::NextCallTime, super::order::aside_until(backend))
            .filter(Column::Id.is_in(waiting.iter().map(|(id, ..)| *id)))
            .exec(&txn)
            .await?;
    }
    // Held by this transaction (locked, or SQLite's write lock): parked
    // as read.
    let now = chrono::Utc::now().naive_utc();
    let parked = batch::park_unreadable_in(&txn, &unreadable, now).await?;
    txn.commit().await?;
    batch::parked_unreadable(store, &unreadable, &parked).await;
    for row in &mut taken {
        row.version = row.version.wrapping_add(1);
        row.leased = true;
    }
    taken.sort_by_key(|r| r.id);
    let keys = waiting
        .into_iter()
        .filter_map(|(_, def_id, key)| key.map(|key| (def_id, key)))
        .collect();
    Ok((taken, keys))
}

/// Claims up to `limit` due rows matching `filter` whatever their key's
/// turn: the rows of unknown or invalid definitions, to park them (parking
/// sends nothing). Without the turn's probes, PostgreSQL's estimate of a
/// scan that finds nothing stays small: with them it crossed
/// `jit_above_cost` on a 20,000-row backlog, and compiling the statement
/// took 0.7 s of a core on every call.
/// At most `bytes` of params, as [`claim_due`].
pub(crate) async fn claim_any_turn(
    store: &Store,
    filter: &DueFilter,
    limit: u64,
    bytes: u64,
) -> Result<Vec<Lease>, DbErr> {
    if filter.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let wanted = selected(filter, store.backend()).add(not_paused(store.backend()));
    claim_rows(store, due_rows(store, wanted, limit), Some(bytes)).await
}

/// Claims notice `id` if it is in its key's turn and due, or set aside for
/// its turn (its insert may have set it aside behind notices that finished
/// before its producer committed): the after-commit attempt of a notice
/// with an ordering key. `None`: not its turn yet (or another attempt took
/// it, or its definition is paused); a sweeper sends it in its turn.
pub(crate) async fn claim_in_turn(store: &Store, id: i64) -> Result<Option<Lease>, DbErr> {
    let backend = store.backend();
    let due_or_aside = Condition::any()
        .add(Expr::col(Column::NextCallTime).lte(clock::now(backend)))
        .add(super::order::may_wait(backend));
    let row = notify_msg::Entity::find()
        .filter(Expr::col(Column::Id).eq(id))
        .filter(due_or_aside)
        .filter(wanted(&DueFilter::default(), backend));
    Ok(claim_rows(store, row, None).await?.pop())
}

/// [`claim_rows`] on MariaDB, which has no `UPDATE … RETURNING`: lock,
/// then bump, in one transaction (the sizes first, when bounded in bytes).
async fn claim_rows_mysql(
    store: &Store,
    due: Select<notify_msg::Entity>,
    bytes: Option<u64>,
) -> Result<Vec<notify_msg::Model>, DbErr> {
    // MariaDB has no UPDATE … RETURNING: lock, then bump, in one
    // transaction (the sizes first, when bounded in bytes).
    let txn = db::begin(&store.db).await?;
    let locked = due
        .clone()
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    let (mut rows, unreadable) = match bytes {
        None => read_rows(&txn, locked).await?,
        Some(bytes) => {
            // As in claim_due_locked: sizes without locks, then
            // lock what fits (a locking read reads params).
            let sized = |select: Select<notify_msg::Entity>| {
                select
                    .select_only()
                    .column(Column::Id)
                    .expr(param_bytes(DbBackend::MySql))
                    .into_tuple::<(i64, i64)>()
            };
            let preview = sized(due.clone()).all(&txn).await?;
            let small = preview.iter().map(HasSize::size).sum::<u64>() <= bytes;
            let chosen: Vec<i64> = if small {
                // One locking read moves on past rows others hold.
                let sizes = sized(
                    due.clone()
                        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked),
                )
                .all(&txn)
                .await?;
                let fit = fitting(sizes.iter().map(|(_, size)| *size), bytes);
                sizes.into_iter().take(fit).map(|(id, _)| id).collect()
            } else {
                lock_fitting(&preview, bytes, |ids: Vec<i64>| {
                    let select = sized(
                        due.clone()
                            .filter(Column::Id.is_in(ids))
                            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked),
                    );
                    let txn = &txn;
                    async move { select.all(txn).await }
                })
                .await?
                .into_iter()
                .map(|(id, _)| id)
                .collect()
            };
            rows_by_id(&txn, chosen).await?
        }
    };
    if !rows.is_empty() {
        let ids = rows.iter().map(|r| r.id);
        columns::update(&txn, Column::Id.is_in(ids), claim_sets(store)).await?;
    }
    // Locked by this transaction: parked as read.
    let now = chrono::Utc::now().naive_utc();
    let parked = batch::park_unreadable_in(&txn, &unreadable, now).await?;
    txn.commit().await?;
    batch::parked_unreadable(store, &unreadable, &parked).await;
    for row in &mut rows {
        row.version = row.version.wrapping_add(1);
        row.leased = true;
    }
    Ok(rows)
}

/// [`claim_rows`] on PostgreSQL and SQLite: one `UPDATE … RETURNING`.
async fn claim_rows_returning(
    store: &Store,
    backend: DbBackend,
    due: Select<notify_msg::Entity>,
    bytes: Option<u64>,
) -> Result<Vec<notify_msg::Model>, DbErr> {
    let ids = match bytes {
        Some(bytes) => ids_within(backend, due, bytes),
        None => {
            let mut ids = due.select_only().column(Column::Id);
            if backend == DbBackend::Postgres {
                ids = ids.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
            }
            sea_orm::QueryTrait::into_query(ids)
        }
    };
    // PostgreSQL: `id = ANY(ARRAY(…))` probes the primary key for
    // each claimed id; `id IN (…)` may be planned as a hash join
    // over the whole table. SQLite probes its key either way.
    let claimed = if backend == DbBackend::Postgres {
        let ids = Expr::SubQuery(None, Box::new(ids.into()));
        Expr::cust_with_expr(r#""id" = ANY(ARRAY($1))"#, ids)
    } else {
        Expr::col(Column::Id).in_subquery(ids)
    };
    let mut update = notify_msg::Entity::update_many().filter(claimed);
    for (c, value) in claim_sets(store).into_iter().chain([columns::bump()]) {
        update = update.col_expr(c, value);
    }
    if backend == DbBackend::Postgres {
        let (due_at, value) = claim_due_at(store);
        update = update.col_expr(due_at, value);
    }
    let mut update = sea_orm::QueryTrait::into_query(update);
    update.returning(columns::returning_all());
    let rows = store.db.query_all(&update).await?;
    let (mut rows, unreadable) = columns::claimed_rows(backend, &rows);
    // Claimed (the statement has committed), never sent.
    batch::park_unreadable(store, unreadable).await;
    rows.sort_by_key(|r| r.id);
    Ok(rows)
}

/// Claims the rows `due` selects (due rows, oldest first, up to a limit).
/// With `bytes`, at most that many bytes of params (oldest first, at
/// least one row).
async fn claim_rows(
    store: &Store,
    due: Select<notify_msg::Entity>,
    bytes: Option<u64>,
) -> Result<Vec<Lease>, DbErr> {
    let started = Instant::now();
    let mut rows = match store.backend() {
        DbBackend::MySql => claim_rows_mysql(store, due, bytes).await?,
        backend => claim_rows_returning(store, backend, due, bytes).await?,
    };
    crate::counters::claimed(rows.len() as u64);
    Ok(rows
        .drain(..)
        .map(|row| Lease::new(store.clone(), row, started))
        .collect())
}

/// Claims the oldest due notice of definition `def_id` even though the
/// definition is paused: the circuit breaker's probe
/// ([`crate::circuit`]). `None`: nothing of it is due.
pub(crate) async fn claim_probe(store: &Store, def_id: i64) -> Result<Option<Lease>, DbErr> {
    let backend = store.backend();
    let wanted = wanted_paused_too(&DueFilter::defs(vec![def_id]), backend);
    let (mut oldest, unreadable) = read_rows(
        &store.db,
        due_first(backend, due(backend).add(wanted)).limit(1),
    )
    .await?;
    // Not held here: parked only where the version read guards the park
    // (a claim meanwhile changes it, and the park finds nothing); another
    // is parked by the sweep that claims it.
    let guarded = unreadable
        .into_iter()
        .filter(|u| u.version.is_some_and(|v| i32::try_from(v).is_ok()))
        .collect();
    batch::park_unreadable(store, guarded).await;
    match oldest.pop() {
        Some(row) => claim_one(store, &row).await,
        None => Ok(None),
    }
}

/// Claims `row` if it is still at the version read, in flight, in its
/// key's turn ([`order`](super::order)), and not held by a live lease (a
/// claim or an after-commit reservation whose end has not passed, by the
/// database's clock). It need not be due: a rejection claims a row awaiting
/// confirmation. But a delayed notice is claimed only once its
/// `not_before` has come. `None`: someone else holds or finished it, it is
/// not its turn, or not its time.
pub(crate) async fn claim_one(
    store: &Store,
    row: &notify_msg::Model,
) -> Result<Option<Lease>, DbErr> {
    let started = Instant::now();
    let backend = store.backend();
    let free = Condition::any()
        .add(Expr::col(Column::Leased).eq(false))
        .add(Expr::col(Column::NextCallTime).lte(clock::now(backend)));
    let timely = Condition::any()
        .add(Expr::col(Column::NotBefore).is_null())
        .add(Expr::col(Column::NotBefore).lte(clock::now(backend)));
    let guard = columns::at_version(row.id, row.version)
        .add(Expr::col(Column::Status).is_in(Status::DUE.map(|s| s as i16)))
        .add(free)
        .add(timely)
        .add(super::order::in_turn(backend));
    let claimed = if backend == DbBackend::MySql {
        // MySQL refuses a subquery on the table an UPDATE changes: lock the
        // row through a SELECT carrying the guard, then claim it.
        let txn = db::begin(&store.db).await?;
        let found = notify_msg::Entity::find()
            .select_only()
            .column(Column::Id)
            .filter(guard)
            .lock(LockType::Update)
            .into_tuple::<i64>()
            .one(&txn)
            .await?;
        let n = match found {
            Some(_) => {
                let guard = columns::at_version(row.id, row.version);
                columns::update(&txn, guard, claim_sets(store)).await?
            }
            None => 0,
        };
        txn.commit().await?;
        n
    } else {
        columns::update(&store.db, guard, claim_sets(store)).await?
    };
    if claimed != 1 {
        return Ok(None);
    }
    crate::counters::claimed(1);
    let claimed = notify_msg::Model {
        version: row.version.wrapping_add(1),
        leased: true,
        ..row.clone()
    };
    Ok(Some(Lease::new(store.clone(), claimed, started)))
}

/// Whether `lease`'s row is still in flight at the claimed version (checked
/// before an immediate retry: an operator may have cancelled it).
pub(crate) async fn still_held(store: &Store, lease: &Lease) -> Result<bool, DbErr> {
    Ok(notify_msg::Entity::find()
        .select_only()
        .column(Column::Id)
        .filter(columns::at_version(lease.id(), lease.version()))
        .into_tuple::<i64>()
        .one(&store.db)
        .await?
        .is_some())
}

/// Claims the reservation of a new notice (version 0, written `leased` for
/// its after-commit attempt) for an attempt that cannot know the row was
/// committed: bumps the version and stamps `last_call_time`, keeping the
/// reservation's end as the lease's end. `started` must be taken before the
/// statement that wrote the row. `None`: no such committed reservation (the
/// transaction rolled back or has not committed yet, or another attempt
/// took it).
///
/// The row must also be the one written: same definition, same param. An
/// id alone is not enough where a rolled-back insert's id can be given to
/// another notice (SQLite takes the largest rowid plus one). A producer on
/// SQLite whose savepoints took rows back also drops them from what it
/// claims before its commit (under the write lock), which covers another
/// notice alike in definition and param.
pub(crate) async fn claim_reserved(
    store: &Store,
    row: &notify_msg::Model,
    started: Instant,
) -> Result<Option<Lease>, DbErr> {
    let guard = columns::at_version(row.id, 0)
        .add(Expr::col(Column::DefId).eq(row.def_id))
        .add(Expr::col(Column::Param).eq(row.param.as_str()))
        .add(Expr::col(Column::Leased).eq(true))
        .add(Expr::col(Column::Status).eq(Status::NotSent as i16))
        .add(Expr::col(Column::NextCallTime).gt(clock::now(store.backend())));
    let sets = vec![(Column::LastCallTime, clock::now(store.backend()))];
    if columns::update(&store.db, guard, sets).await? != 1 {
        return Ok(None);
    }
    crate::counters::claimed(1);
    let claimed = notify_msg::Model {
        version: 1,
        leased: true,
        last_call_time: Some(chrono::NaiveDateTime::MIN),
        ..row.clone()
    };
    Ok(Some(Lease::new(store.clone(), claimed, started)))
}

/// Claims rows reserved for after-commit attempts that will not run here
/// (no slot, shutting down, not deliverable in this process) and makes them
/// due at once for any worker. Each is given as written (`id`, `def_id`,
/// `param`): as for [`claim_reserved`], another notice that took a
/// rolled-back row's id is left alone. Returns how many were released.
pub(crate) async fn release_reserved(
    store: &Store,
    rows: &[(i64, i64, String)],
) -> Result<u64, DbErr> {
    if rows.is_empty() {
        return Ok(0);
    }
    let sets = vec![
        (Column::Leased, Expr::val(false)),
        (Column::NextCallTime, clock::now(store.backend())),
    ];
    let mut guard = Condition::any();
    for (id, def_id, param) in rows {
        guard = guard.add(
            columns::at_version(*id, 0)
                .add(Expr::col(Column::DefId).eq(*def_id))
                .add(Expr::col(Column::Param).eq(param.as_str())),
        );
    }
    db::on_conflict_retry(|| columns::update(&store.db, guard.clone(), sets.clone())).await
}
