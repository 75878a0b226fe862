//! Overview: per definition, what is in flight and how the last 24 hours
//! went; which workers are alive. Three cheap queries: one grouped count over
//! `notify_msg` (the metrics gauges use the same), one grouped count over the
//! last day of `notify_msg_history` by hour, and the heartbeats.

use std::collections::{BTreeMap, HashMap};

use chrono::{NaiveDateTime, Timelike};
use sea_orm::{
    ConnectionTrait, DbBackend, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, QuerySelect,
    sea_query::{Expr, ExprTrait, Func},
};
use serde::Serialize;

use crate::{
    entity::{notify_def, notify_msg, notify_msg_history, notify_worker, read},
    error::Result,
    status::Status,
};

/// A worker is shown as gone once its heartbeat is this many beats late.
pub const GONE_AFTER_BEATS: u32 = 3;

/// Notices in flight of one definition and status.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub def_id: i64,
    pub status: i16,
    pub n: i64,
    /// Earliest `next_call_time` of the group.
    pub oldest: Option<NaiveDateTime>,
}

impl FromQueryResult for Group {
    fn from_query_result(
        row: &sea_orm::QueryResult,
        pre: &str,
    ) -> std::result::Result<Self, sea_orm::DbErr> {
        Ok(Group {
            def_id: row.try_get(pre, "def_id")?,
            status: row.try_get(pre, "status")?,
            n: row.try_get(pre, "n")?,
            // A time no driver reads (a plain-SQL producer's, on SQLite)
            // leaves the group without its oldest, not out of the count.
            oldest: row.try_get(pre, "oldest").unwrap_or_default(),
        })
    }
}

/// One grouped query over `notify_msg`: count and earliest `next_call_time`
/// per definition and status. Groups whose definition or status cannot be
/// read (a plain-SQL producer's cell of another type) are left out.
pub(crate) async fn in_flight_groups<C: ConnectionTrait>(db: &C) -> Result<Vec<Group>> {
    use notify_msg::Column;
    let select = notify_msg::Entity::find()
        .select_only()
        .column(Column::DefId)
        .column(Column::Status)
        .expr_as(Expr::cust("COUNT(*)"), "n")
        .expr_as(Func::min(Expr::col(Column::NextCallTime)), "oldest")
        .group_by(Column::DefId)
        .group_by(Column::Status);
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    Ok(read::each(&rows))
}

/// Finished notices of one hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Hour {
    /// Start of the hour (UTC).
    pub hour: NaiveDateTime,
    /// Notices that succeeded in it.
    pub succeeded: i64,
    /// Notices that failed for good in it.
    pub failed: i64,
}

/// One definition at a glance.
#[derive(Debug, Clone, Serialize)]
pub struct DefSummary {
    /// `notify_def.id`.
    pub id: i64,
    /// The definition's name.
    pub name: String,
    /// Its channel.
    pub channel: String,
    /// Notices in flight by status (absent: none).
    pub in_flight: BTreeMap<String, i64>,
    /// All notices in flight.
    pub total: i64,
    /// In flight after at least one failed attempt (status `failed`).
    pub failing: i64,
    /// Sent, waiting for a confirmation.
    pub awaiting: i64,
    /// Paused until then (UTC), if paused now.
    pub paused_until: Option<NaiveDateTime>,
    /// Why it is paused.
    pub pause_reason: Option<String>,
    /// Whether the pause is its circuit breaker's.
    pub circuit_open: bool,
    /// How long its oldest due notice has waited, in seconds (0: none due).
    pub oldest_due_secs: f64,
    /// The last 24 hours, oldest first, one entry per hour.
    pub last_24h: Vec<Hour>,
}

/// A worker as its heartbeat shows it.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    #[doc(hidden)]
    /// Its heartbeat row.
    #[serde(flatten)]
    pub row: notify_worker::Model,
    /// Whether its heartbeat is fresh: at most [`GONE_AFTER_BEATS`] of its
    /// beats late, by the database's clock.
    pub alive: bool,
}

/// Most definitions the overview shows one by one by default: 50.
pub const OVERVIEW_DEFS: u64 = 50;

/// Which definitions the overview shows one by one.
#[derive(Debug, Clone, Default)]
pub struct OverviewQuery {
    /// Only definitions whose name contains this.
    pub search: Option<String>,
    /// At most this many (0: [`OVERVIEW_DEFS`]).
    pub limit: u64,
}

/// The definitions the overview does not show one by one, summed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Others {
    /// How many.
    pub defs: u64,
    /// Their notices in flight.
    pub total: i64,
    /// Of those, failing.
    pub failing: i64,
    /// Of those, awaiting confirmation.
    pub awaiting: i64,
    /// Succeeded in the last 24 hours.
    pub succeeded_24h: i64,
    /// Failed for good in the last 24 hours.
    pub failed_24h: i64,
}

/// Everything the overview page shows.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// When it was read (UTC, the database's clock).
    pub at: NaiveDateTime,
    /// How many definitions there are.
    pub def_count: u64,
    /// The definitions that matter, by name: when there are more than the
    /// limit, those failing, paused, with notices in flight or finished in
    /// the last 24 hours (in that order of importance), or, with a search,
    /// those whose name matches. All of them when they fit.
    pub defs: Vec<DefSummary>,
    /// The definitions not in `defs`, summed.
    pub others: Others,
    /// Notices in flight whose definition row is gone.
    pub orphans: i64,
    /// Workers seen in the last day, most recent first.
    pub workers: Vec<WorkerView>,
}

#[derive(Debug, FromQueryResult)]
struct HourGroup {
    def_id: i64,
    status: i16,
    hour: String,
    n: i64,
}

/// The hour a history row finished in, in SQL: what to group by, and the
/// group's hour as text `YYYY-MM-DD HH` (on PostgreSQL formatted once per
/// group, not per row).
fn hour_of(backend: DbBackend) -> (Expr, Expr) {
    let col = "last_call_time";
    let text = |sql: String| Expr::cust(sql);
    match backend {
        DbBackend::Postgres => (
            text(format!("date_trunc('hour', {col})")),
            text(format!(
                "to_char(date_trunc('hour', {col}), 'YYYY-MM-DD HH24')"
            )),
        ),
        DbBackend::MySql => {
            let hour = format!("DATE_FORMAT({col}, '%Y-%m-%d %H')");
            (text(hour.clone()), text(hour))
        }
        _ => {
            let hour = format!("strftime('%Y-%m-%d %H', {col})");
            (text(hour.clone()), text(hour))
        }
    }
}

/// Reads the overview of every definition when there are at most
/// [`OVERVIEW_DEFS`], as [`overview_of`] otherwise. Times are the
/// database's.
pub async fn overview<C: ConnectionTrait>(db: &C) -> Result<Overview> {
    overview_of(db, &OverviewQuery::default()).await
}

/// Reads the overview: the definitions `query` asks for, the rest summed.
/// Its reads do not grow with idle definitions: grouped counts of what is
/// in flight and finished in the last day, the paused definitions, and the
/// rows of those shown.
pub async fn overview_of<C: ConnectionTrait>(db: &C, query: &OverviewQuery) -> Result<Overview> {
    use sea_orm::{ColumnTrait, PaginatorTrait};
    let limit = if query.limit == 0 {
        OVERVIEW_DEFS
    } else {
        query.limit
    };
    let now = crate::state::clock::db_now(db).await?;
    let first_hour = now
        .with_minute(0)
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(now)
        - chrono::Duration::hours(23);
    let (group, hour) = hour_of(db.get_database_backend());
    let hours = {
        use notify_msg_history::Column;
        let select = notify_msg_history::Entity::find()
            .select_only()
            .column(Column::DefId)
            .column(Column::Status)
            .expr_as(hour, "hour")
            .expr_as(Expr::cust("COUNT(*)"), "n")
            .filter(Expr::col(Column::LastCallTime).gte(first_hour))
            .group_by(Column::DefId)
            .group_by(Column::Status)
            .group_by(group);
        let query = sea_orm::QueryTrait::into_query(select);
        async move {
            // A finish time no driver reads (SQLite) has no hour: left out.
            let rows = db.query_all(&query).await?;
            Ok::<_, sea_orm::DbErr>(read::each::<HourGroup>(&rows))
        }
    };
    // The two grouped reads at once (two pooled connections).
    let (groups, hours) = futures::try_join!(in_flight_groups(db), async { Ok(hours.await?) })?;
    let def_count = notify_def::Entity::find().count(db).await?;
    let search = query.search.as_deref().filter(|s| !s.is_empty());
    let defs = if search.is_none() && def_count <= limit {
        crate::def::store::rows(db).await?
    } else if search.is_some() {
        crate::def::store::page(db, search, None, limit).await?
    } else {
        let paused = crate::def::store::read(
            db,
            notify_def::Entity::find()
                .filter(notify_def::Column::PausedUntil.gt(now))
                .order_by_asc(notify_def::Column::Name)
                .limit(limit),
        )
        .await?;
        let ids = busiest(&groups, &hours, paused.iter().map(|d| d.id), limit);
        let mut defs = crate::def::store::read(
            db,
            notify_def::Entity::find().filter(notify_def::Column::Id.is_in(ids)),
        )
        .await?;
        defs.sort_by(|a, b| a.name.cmp(&b.name));
        defs
    };
    let workers = notify_worker::Entity::find()
        .order_by_desc(notify_worker::Column::SeenAt)
        .all(db)
        .await?;
    let alive = crate::state::heartbeat::alive(db, GONE_AFTER_BEATS).await?;
    let gone = gone_defs(db).await?;
    let workers = workers
        .into_iter()
        .map(|row| WorkerView {
            alive: alive.contains(&row.id),
            row,
        })
        .collect();
    // An unreadable row shows with its id and name (its notices park).
    let defs = defs.into_iter().map(|stored| stored.row).collect();
    let mut o = assemble(now, first_hour, defs, groups, hours, workers, &gone);
    o.def_count = def_count;
    o.others.defs = def_count.saturating_sub(o.defs.len() as u64);
    Ok(o)
}

/// The definition ids of notices in flight that have no `notify_def` row.
async fn gone_defs<C: ConnectionTrait>(db: &C) -> Result<Vec<i64>> {
    use notify_msg::Column;
    use sea_orm::ColumnTrait;
    let select = notify_msg::Entity::find()
        .select_only()
        .column(Column::DefId)
        .distinct()
        .filter(
            Column::DefId.not_in_subquery(
                sea_orm::sea_query::Query::select()
                    .column(notify_def::Column::Id)
                    .from(notify_def::Entity)
                    .to_owned(),
            ),
        );
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    // A definition id that is no integer (SQLite) names no definition: such
    // rows are parked by the park check.
    Ok(rows
        .iter()
        .filter_map(|row| row.try_get_by_index(0).ok())
        .collect())
}

/// Up to `limit` definition ids, most important first: failing now or in
/// the last day, then paused, then by notices in flight, then by notices
/// finished in the last day.
fn busiest(
    groups: &[Group],
    hours: &[HourGroup],
    paused: impl Iterator<Item = i64>,
    limit: u64,
) -> Vec<i64> {
    #[derive(Default)]
    struct Score {
        failing: i64,
        paused: bool,
        in_flight: i64,
        finished: i64,
    }
    let mut scores: HashMap<i64, Score> = HashMap::new();
    for g in groups {
        let s = scores.entry(g.def_id).or_default();
        s.in_flight += g.n;
        if g.status == Status::Failed as i16 {
            s.failing += g.n;
        }
    }
    for h in hours {
        let s = scores.entry(h.def_id).or_default();
        s.finished += h.n;
        if h.status == Status::FinalFailure as i16 {
            s.failing += h.n;
        }
    }
    for id in paused {
        scores.entry(id).or_default().paused = true;
    }
    let mut ranked: Vec<(i64, Score)> = scores.into_iter().collect();
    ranked.sort_by_key(|(id, s)| {
        (
            std::cmp::Reverse(s.failing > 0),
            std::cmp::Reverse(s.paused),
            std::cmp::Reverse(s.in_flight),
            std::cmp::Reverse(s.finished),
            *id,
        )
    });
    ranked
        .into_iter()
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .map(|(id, _)| id)
        .collect()
}

fn assemble(
    now: NaiveDateTime,
    first_hour: NaiveDateTime,
    defs: Vec<notify_def::Model>,
    groups: Vec<Group>,
    hours: Vec<HourGroup>,
    workers: Vec<WorkerView>,
    gone: &[i64],
) -> Overview {
    let mut summaries: Vec<DefSummary> = defs
        .into_iter()
        .map(|d| empty_summary(d, now, first_hour))
        .collect();
    let index: HashMap<i64, usize> = summaries
        .iter()
        .enumerate()
        .map(|(i, d)| (d.id, i))
        .collect();
    let mut orphans = 0;
    let mut others = Others::default();
    for g in groups {
        let Some(&i) = index.get(&g.def_id) else {
            if !gone.contains(&g.def_id) {
                count_other_in_flight(&mut others, &g);
            } else {
                orphans += g.n;
            }
            continue;
        };
        add_in_flight(&mut summaries[i], &g, now);
    }
    for h in hours {
        let Some(&i) = index.get(&h.def_id) else {
            count_other_finished(&mut others, &h);
            continue;
        };
        add_finished(&mut summaries[i], &h, first_hour);
    }
    Overview {
        at: now,
        def_count: 0,
        defs: summaries,
        others,
        orphans,
        workers,
    }
}

/// A definition's summary before its notices are counted: its pause (if
/// paused now) and 24 empty hours from `first_hour`.
fn empty_summary(
    d: notify_def::Model,
    now: NaiveDateTime,
    first_hour: NaiveDateTime,
) -> DefSummary {
    let paused = d.paused_until.filter(|until| *until > now);
    DefSummary {
        id: d.id,
        name: d.name,
        channel: d.channel,
        in_flight: BTreeMap::new(),
        total: 0,
        failing: 0,
        awaiting: 0,
        circuit_open: paused.is_some()
            && d.pause_reason
                .as_deref()
                .is_some_and(|r| r.starts_with(crate::state::pause::CIRCUIT_REASON)),
        pause_reason: paused.and(d.pause_reason),
        paused_until: paused,
        oldest_due_secs: 0.0,
        last_24h: (0..24)
            .map(|h| Hour {
                hour: first_hour + chrono::Duration::hours(h),
                ..Hour::default()
            })
            .collect(),
    }
}

/// Counts a group in flight of a definition not shown into `others`.
fn count_other_in_flight(others: &mut Others, g: &Group) {
    others.total += g.n;
    if g.status == Status::Failed as i16 {
        others.failing += g.n;
    } else if g.status == Status::AwaitingConfirm as i16 {
        others.awaiting += g.n;
    }
}

/// Counts a group in flight into its definition's summary (a status that
/// cannot be read is left out), and how long its oldest due notice waited.
fn add_in_flight(d: &mut DefSummary, g: &Group, now: NaiveDateTime) {
    let Some(status) = Status::parse(&g.status.to_string()) else {
        return;
    };
    *d.in_flight.entry(status.to_string()).or_default() += g.n;
    d.total += g.n;
    match status {
        Status::Failed => d.failing += g.n,
        Status::AwaitingConfirm => d.awaiting += g.n,
        _ => {}
    }
    // Leased rows carry their lease's end: a due row never waits past it.
    if let Some(at) = g.oldest.filter(|at| *at <= now) {
        let waited = (now - at).to_std().unwrap_or_default().as_secs_f64();
        d.oldest_due_secs = d.oldest_due_secs.max(waited);
    }
}

/// Counts an hour's finished notices of a definition not shown into
/// `others`.
fn count_other_finished(others: &mut Others, h: &HourGroup) {
    if h.status == Status::Succeeded as i16 {
        others.succeeded_24h += h.n;
    } else if h.status == Status::FinalFailure as i16 {
        others.failed_24h += h.n;
    }
}

/// Counts an hour's finished notices into its slot of the definition's
/// last 24 hours (an hour that cannot be read or is out of range: left out).
fn add_finished(d: &mut DefSummary, h: &HourGroup, first_hour: NaiveDateTime) {
    let Ok(at) = NaiveDateTime::parse_from_str(&format!("{}:00:00", h.hour), "%Y-%m-%d %H:%M:%S")
    else {
        return;
    };
    let slot = (at - first_hour).num_hours();
    let Some(hour) = usize::try_from(slot)
        .ok()
        .and_then(|s| d.last_24h.get_mut(s))
    else {
        return;
    };
    if h.status == Status::Succeeded as i16 {
        hour.succeeded += h.n;
    } else if h.status == Status::FinalFailure as i16 {
        hour.failed += h.n;
    }
}
