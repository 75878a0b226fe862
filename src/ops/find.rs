//! Find: notices in flight or in history, by id, idempotency key or filter,
//! as [`NoticeView`]s. Reads only.

use std::{collections::HashMap, time::Duration};

use chrono::NaiveDateTime;
use sea_orm::{
    ConnectionTrait, EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect,
    sea_query::{Condition, Expr, Func},
};
use serde::Serialize;

use crate::{
    entity::{notify_def, notify_msg, notify_msg_history},
    error::{Error, Result},
    notifier::Notifier,
    status::Status,
};

/// Which table a notice is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// `notify_msg`: still being delivered.
    InFlight,
    /// `notify_msg_history`: finished (succeeded, final failure, cancelled
    /// or parked).
    History,
}

/// Which notices to find. Every field narrows; the default finds all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoticeFilter {
    /// Only this definition (by name).
    pub def: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only notices with at least one failed attempt (status `failed`, or
    /// `retry_times` > 0).
    pub failing: bool,
    /// Only notices due before this UTC time (`next_call_time`).
    pub due_before: Option<NaiveDateTime>,
    /// Only notices created more than this long ago (`create_time`).
    pub older_than: Option<Duration>,
    /// Only this `load_balance_num` partition.
    pub partition: Option<i32>,
    /// Only notices whose param text contains this (case-sensitive on
    /// PostgreSQL, as the column's collation elsewhere).
    pub param_contains: Option<String>,
    /// Only notices that finished (history) or were created (in flight) at
    /// or after this UTC time. A finished notice's time is its
    /// `last_call_time`, or `create_time` if it was never attempted.
    pub since: Option<NaiveDateTime>,
    /// Only notices that finished (or were created) before this UTC time.
    pub until: Option<NaiveDateTime>,
    /// Only these ids.
    pub ids: Option<Vec<i64>>,
    /// Only notices with this idempotency key.
    pub key: Option<String>,
}

impl NoticeFilter {
    /// Whether the filter leaves any notice out. A field that matches
    /// every notice counts as none: `older_than` zero, `since` before
    /// 1970, `until` now or later, an empty `param_contains`. A bulk
    /// action needs a filter that narrows (or says it means all).
    pub fn narrows(&self) -> bool {
        let now = chrono::Utc::now().naive_utc();
        let epoch = chrono::DateTime::UNIX_EPOCH.naive_utc();
        self.def.is_some()
            || self.status.is_some()
            || self.failing
            || self.due_before.is_some()
            || self.older_than.is_some_and(|d| !d.is_zero())
            || self.partition.is_some()
            || self.param_contains.as_deref().is_some_and(|p| !p.is_empty())
            || self.since.is_some_and(|t| t > epoch)
            // `until: "0s"` is read a moment before this check.
            || self.until.is_some_and(|t| {
                t.checked_add_signed(chrono::Duration::seconds(1))
                    .is_some_and(|t| t < now)
            })
            || self.ids.is_some()
            || self.key.is_some()
    }

    /// Whether the filter narrows only by what its value cannot tell the
    /// reach of: text (`param_contains`, `key`: `{` is in every JSON
    /// object) and times (`older_than: "1s"`, `due_before` in 2999). A bulk
    /// action counts such a filter in the database
    /// ([`Notifier::matches_every_notice`]); one that names a definition, a
    /// status, a partition, ids or failing notices says what it means.
    pub fn narrows_by_text_only(&self) -> bool {
        let named = NoticeFilter {
            def: self.def.clone(),
            status: self.status,
            failing: self.failing,
            partition: self.partition,
            ids: self.ids.clone(),
            ..NoticeFilter::default()
        };
        self.narrows() && !named.narrows()
    }
}

/// One notice as an operator sees it, wherever it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoticeView {
    /// Notice id (kept across requeues).
    pub id: i64,
    /// Its table.
    pub place: Place,
    /// `notify_def.id`.
    pub def_id: i64,
    /// The definition's name; `None` if the row is gone.
    pub def: Option<String>,
    /// Life-cycle state.
    pub status: Status,
    /// Failed attempts so far (reset by a requeue).
    pub retry_times: i32,
    /// When the last attempt started (UTC).
    pub last_call_time: Option<NaiveDateTime>,
    /// When it is due next, or when the running attempt's lease ends (UTC).
    pub next_call_time: NaiveDateTime,
    /// When it was added (UTC).
    pub create_time: NaiveDateTime,
    /// Optimistic version: bumped by every transition.
    pub version: i32,
    /// Partition (`load_balance_num`).
    pub partition: i32,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// The producer's ordering key (`ordering = "per_key"` definitions).
    pub ordering_key: Option<String>,
    /// The param: JSON, or the stored text when it is not JSON (or, in a
    /// listing of [`list_excerpts`], when it was cut). A sealed param
    /// ([`crate::crypto`]) is the text `encrypted (key ID)`, never its
    /// content.
    pub param: serde_json::Value,
    /// Whether the param is stored sealed ([`crate::crypto`]).
    pub encrypted: bool,
    /// Whether `param` may be only the first characters of the stored
    /// param ([`list_excerpts`]; a notice's own view has it whole).
    pub param_cut: bool,
    /// The producer's description (plus handlers' success notes).
    pub description: String,
    /// Who wrote it: a producer, or the library (an alert, an event).
    pub origin: crate::status::Origin,
    /// The failure and audit log, one entry per line, oldest first.
    pub errors: Vec<String>,
    /// Per-notice target override, as stored.
    pub target_override: Option<String>,
    /// The trace id of the producer's span (32 hex digits), when it was
    /// traced ([`crate::trace`]).
    pub trace_id: Option<String>,
    /// Whether an attempt holds it right now: leased, and the lease has not
    /// ended by this host's clock.
    pub claim_live: bool,
    /// A delayed notice's earliest attempt (UTC); `None` when it was due
    /// when added (or a requeue cleared it).
    pub not_before: Option<NaiveDateTime>,
    /// Whether it is *scheduled*: in flight, never attempted, not held,
    /// and delayed until a time still ahead by this host's clock.
    pub scheduled: bool,
    /// The step it is on, 0-based (multi-step definitions; 0 otherwise).
    pub step: i32,
    /// Steps that succeeded: those before `step`, and `step` itself once
    /// the notice succeeded.
    pub steps_done: i32,
    /// The result the last step that succeeded passed on, as stored
    /// (`encrypted (key ID)` when sealed).
    pub step_result: Option<String>,
    /// Why the row cannot be read as a notice (a cell of another type, a
    /// time no driver reads: a plain-SQL producer's row), naming each such
    /// cell; `None` for a notice read whole. An unreadable row's other
    /// fields hold what could be read, defaults elsewhere. A claim parks
    /// such a row with this reason in its log.
    pub unreadable: Option<String>,
}

/// A stored param or step result as a viewer sees it: `encrypted (key ID)`
/// when sealed (whole, or cut short in a listing), else `None`.
fn hidden(stored: &str) -> Option<String> {
    if !stored.starts_with(crate::crypto::SEALED_PREFIX) {
        return None;
    }
    Some(crate::crypto::shown(stored).unwrap_or_else(|| "encrypted".into()))
}

impl NoticeView {
    /// The state to show: `unreadable` for a row that cannot be read,
    /// `scheduled` for a [scheduled](Self::scheduled) notice, else its
    /// status.
    pub fn state(&self) -> String {
        match (&self.unreadable, self.scheduled) {
            (Some(_), _) => "unreadable".into(),
            (None, true) => "scheduled".into(),
            (None, false) => self.status.to_string(),
        }
    }

    /// `row` of `place`, decoded on its own: a notice, or what can be read
    /// of a row that cannot ([`unreadable`](Self::unreadable)). Its param
    /// is cut to `chars` characters when given ([`list_excerpts`]).
    fn of_row(row: &sea_orm::QueryResult, place: Place, chars: Option<u32>) -> NoticeView {
        use crate::entity::read;
        // Both tables have the same columns: a history row reads as one.
        match read::notice::<notify_msg::Model>(row) {
            Ok(mut model) => {
                let cut = cut_to(&mut model.param, chars);
                NoticeView {
                    param_cut: cut,
                    ..NoticeView::from(model).placed(place)
                }
            }
            Err(unreadable) => {
                let mut model = read::lenient(row);
                let cut = cut_to(&mut model.param, chars);
                NoticeView {
                    param_cut: cut,
                    unreadable: Some(unreadable.reason()),
                    scheduled: false,
                    ..NoticeView::from(model).placed(place)
                }
            }
        }
    }

    /// This view of a row of `place`'s table.
    fn placed(mut self, place: Place) -> NoticeView {
        if place == Place::History {
            self.place = place;
            self.scheduled = false;
        }
        self
    }
}

macro_rules! view_from {
    ($model:ty, $place:expr) => {
        impl From<$model> for NoticeView {
            fn from(row: $model) -> Self {
                let now = chrono::Utc::now().naive_utc();
                NoticeView {
                    id: row.id,
                    place: $place,
                    def_id: row.def_id,
                    def: None,
                    status: row.status,
                    retry_times: row.retry_times,
                    last_call_time: row.last_call_time,
                    next_call_time: row.next_call_time,
                    create_time: row.create_time,
                    version: row.version,
                    partition: row.load_balance_num,
                    idempotency_key: row.idempotency_key,
                    ordering_key: row.ordering_key,
                    encrypted: row.param.starts_with(crate::crypto::SEALED_PREFIX),
                    param: match hidden(&row.param) {
                        Some(shown) => serde_json::Value::String(shown),
                        None => serde_json::from_str(&row.param)
                            .unwrap_or(serde_json::Value::String(row.param)),
                    },
                    param_cut: false,
                    description: row.description,
                    origin: row.origin,
                    errors: row
                        .errors
                        .lines()
                        .filter(|l| !l.is_empty())
                        .map(str::to_string)
                        .collect(),
                    // A producer's override may carry headers or keys.
                    target_override: row.target_override.map(|t| crate::redact::target_text(&t)),
                    trace_id: row
                        .trace_context
                        .as_deref()
                        .and_then(crate::trace::trace_id),
                    claim_live: row.leased && row.next_call_time > now,
                    scheduled: $place == Place::InFlight
                        && row.status == Status::NotSent
                        && !row.leased
                        && row.not_before.is_some_and(|t| t > now),
                    not_before: row.not_before,
                    step: row.step,
                    steps_done: row
                        .step
                        .saturating_add(i32::from(row.status == Status::Succeeded)),
                    step_result: row.step_result.map(|r| hidden(&r).unwrap_or(r)),
                    unreadable: None,
                }
            }
        }
    };
}
view_from!(notify_msg::Model, Place::InFlight);

/// Definition names by id (the ids and names only: a definition row that
/// cannot be read whole still names its notices).
pub(crate) async fn def_names<C: ConnectionTrait>(db: &C) -> Result<HashMap<i64, String>> {
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(
            notify_def::Entity::find()
                .select_only()
                .column(notify_def::Column::Id)
                .column(notify_def::Column::Name),
        ))
        .await?;
    Ok(rows
        .iter()
        .filter_map(|row| Some((row.try_get_by_index(0).ok()?, row.try_get_by_index(1).ok()?)))
        .collect())
}

/// The id of definition `name`.
pub(crate) async fn def_id<C: ConnectionTrait>(db: &C, name: &str) -> Result<i64> {
    use sea_orm::ColumnTrait;
    crate::error::check_text("def", name)?;
    notify_def::Entity::find()
        .filter(notify_def::Column::Name.eq(name))
        .one(db)
        .await?
        .map(|d| d.id)
        .ok_or_else(|| Error::UnknownDef(name.to_string()))
}

fn named(mut views: Vec<NoticeView>, names: &HashMap<i64, String>) -> Vec<NoticeView> {
    for v in &mut views {
        v.def = names.get(&v.def_id).cloned();
    }
    views
}

/// `filter` as a condition on either notice table (their columns are the
/// same), for rows in `place`.
pub(crate) async fn condition<C: ConnectionTrait>(
    db: &C,
    place: Place,
    filter: &NoticeFilter,
) -> Result<Condition> {
    use notify_msg::Column;
    for (field, text) in [
        ("def", &filter.def),
        ("param_contains", &filter.param_contains),
        ("key", &filter.key),
    ] {
        if let Some(text) = text {
            crate::error::check_text(field, text)?;
        }
    }
    let mut cond = Condition::all();
    if let Some(name) = &filter.def {
        cond = cond.add(Expr::col(Column::DefId).eq(def_id(db, name).await?));
    }
    if let Some(status) = filter.status {
        cond = cond.add(Expr::col(Column::Status).eq(status as i16));
    }
    if filter.failing {
        cond = cond.add(
            Condition::any()
                .add(Expr::col(Column::Status).eq(Status::Failed as i16))
                .add(Expr::col(Column::RetryTimes).gt(0)),
        );
    }
    if let Some(at) = filter.due_before {
        cond = cond.add(Expr::col(Column::NextCallTime).lt(at));
    }
    if let Some(age) = filter.older_than {
        cond = cond.add(Expr::col(Column::CreateTime).lt(super::ago(age)));
    }
    if let Some(p) = filter.partition {
        cond = cond.add(Expr::col(Column::LoadBalanceNum).eq(p));
    }
    if let Some(text) = &filter.param_contains {
        cond = cond.add(Expr::col(Column::Param).like(crate::db::containing(text)));
    }
    let when = match place {
        Place::InFlight => Expr::col(Column::CreateTime),
        Place::History => Func::coalesce([
            Expr::col(Column::LastCallTime),
            Expr::col(Column::CreateTime),
        ])
        .into(),
    };
    if let Some(at) = filter.since {
        cond = cond.add(when.clone().gte(at));
    }
    if let Some(at) = filter.until {
        cond = cond.add(when.lt(at));
    }
    if let Some(ids) = &filter.ids {
        cond = cond.add(Expr::col(Column::Id).is_in(ids.iter().copied()));
    }
    if let Some(key) = &filter.key {
        cond = cond.add(Expr::col(Column::IdempotencyKey).eq(key.as_str()));
    }
    Ok(cond)
}

/// Which page of a listing: newest first, keyset by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Only ids below this one (the last id of the previous page).
    pub before_id: Option<i64>,
    /// At most this many notices.
    pub limit: u64,
}

impl Default for Page {
    /// The first 50.
    fn default() -> Self {
        Page {
            before_id: None,
            limit: 50,
        }
    }
}

/// Largest [`Page::limit`] a listing takes: 100,000 notices.
pub const MAX_PAGE_LIMIT: u64 = 100_000;

/// Notices in `place` matching `filter`, newest (highest id) first.
///
/// # Errors
/// [`Error::Config`] naming `limit` when it is 0 or
/// more than [`MAX_PAGE_LIMIT`]; database errors.
pub async fn list<C: ConnectionTrait>(
    db: &C,
    place: Place,
    filter: &NoticeFilter,
    page: Page,
) -> Result<Vec<NoticeView>> {
    list_with(db, place, filter, page, None).await
}

/// [`list`], each notice's param cut to its first `chars` characters by
/// the database: a page of notices with 1 MB params reads and holds
/// `chars` of each (a listing's excerpt; [`show`] has the whole).
pub async fn list_excerpts<C: ConnectionTrait>(
    db: &C,
    place: Place,
    filter: &NoticeFilter,
    page: Page,
    chars: u32,
) -> Result<Vec<NoticeView>> {
    list_with(db, place, filter, page, Some(chars)).await
}

/// `select` with its `param` column cut to `chars` characters, when given.
fn excerpt<E: EntityTrait>(select: sea_orm::Select<E>, chars: Option<u32>) -> sea_orm::Select<E> {
    use sea_orm::{IdenStatic, Iterable};
    let Some(chars) = chars else {
        return select;
    };
    let others = E::Column::iter().filter(|c| c.as_str() != "param");
    // Typed as INTEGER: PostgreSQL has no substr(text, bigint, bigint).
    let chars = i32::try_from(chars).unwrap_or(i32::MAX);
    let cut = Func::cust("SUBSTR")
        .arg(Expr::col("param"))
        .arg(1i32)
        .arg(chars);
    select.select_only().columns(others).expr_as(cut, "param")
}

/// Cuts `param` to `chars` characters (when given); whether it was longer.
fn cut_to(param: &mut String, chars: Option<u32>) -> bool {
    let Some(chars) = chars else {
        return false;
    };
    let keep = usize::try_from(chars).unwrap_or(usize::MAX);
    match param.char_indices().nth(keep) {
        Some((at, _)) => {
            param.truncate(at);
            true
        }
        None => false,
    }
}

async fn list_with<C: ConnectionTrait>(
    db: &C,
    place: Place,
    filter: &NoticeFilter,
    page: Page,
    chars: Option<u32>,
) -> Result<Vec<NoticeView>> {
    if !(1..=MAX_PAGE_LIMIT).contains(&page.limit) {
        return Err(crate::error::Error::Config(format!(
            "limit: {} is not between 1 and {MAX_PAGE_LIMIT}",
            page.limit
        )));
    }
    let mut cond = condition(db, place, filter).await?;
    if let Some(before) = page.before_id {
        cond = cond.add(Expr::col(notify_msg::Column::Id).lt(before));
    }
    // One character more than shown: whether the param goes on is known.
    let asked = chars.map(|n| n.saturating_add(1));
    let rows = match place {
        Place::InFlight => {
            let select = excerpt(notify_msg::Entity::find(), asked)
                .filter(cond)
                .order_by_desc(notify_msg::Column::Id)
                .limit(page.limit);
            db.query_all(&sea_orm::QueryTrait::into_query(select))
                .await?
        }
        Place::History => {
            let select = excerpt(notify_msg_history::Entity::find(), asked)
                .filter(cond)
                .order_by_desc(notify_msg_history::Column::Id)
                .limit(page.limit);
            db.query_all(&sea_orm::QueryTrait::into_query(select))
                .await?
        }
    };
    let views: Vec<NoticeView> = rows
        .iter()
        .map(|row| NoticeView::of_row(row, place, chars))
        .collect();
    Ok(named(views, &def_names(db).await?))
}

/// Notice `id`, in flight or in history (a row that cannot be read as a
/// notice is shown as [unreadable](NoticeView::unreadable)).
pub async fn show<C: ConnectionTrait>(db: &C, id: i64) -> Result<NoticeView> {
    use sea_orm::QueryTrait;
    // A notice moves between the tables (finishing, requeue): read the live
    // table again after history, so a row moving meanwhile is still found.
    for _ in 0..2 {
        let live = notify_msg::Entity::find_by_id(id).into_query();
        if let Some(row) = db.query_one(&live).await? {
            let view = NoticeView::of_row(&row, Place::InFlight, None);
            return Ok(named(vec![view], &def_names(db).await?).remove(0));
        }
        let history = notify_msg_history::Entity::find_by_id(id).into_query();
        if let Some(row) = db.query_one(&history).await? {
            let view = NoticeView::of_row(&row, Place::History, None);
            return Ok(named(vec![view], &def_names(db).await?).remove(0));
        }
    }
    Err(Error::NoticeNotFound(id))
}

/// Notices with idempotency key `key` (of definition `def` when given), in
/// flight first, then in history, newest first in each.
pub async fn by_key<C: ConnectionTrait>(
    db: &C,
    key: &str,
    def: Option<&str>,
) -> Result<Vec<NoticeView>> {
    use sea_orm::QueryTrait;
    crate::error::check_text("key", key)?;
    let mut cond = Condition::all().add(Expr::col(notify_msg::Column::IdempotencyKey).eq(key));
    if let Some(name) = def {
        cond = cond.add(Expr::col(notify_msg::Column::DefId).eq(def_id(db, name).await?));
    }
    let live = notify_msg::Entity::find()
        .filter(cond.clone())
        .order_by_desc(notify_msg::Column::Id)
        .into_query();
    let history = notify_msg_history::Entity::find()
        .filter(cond)
        .order_by_desc(notify_msg_history::Column::Id)
        .into_query();
    let mut views: Vec<NoticeView> = db
        .query_all(&live)
        .await?
        .iter()
        .map(|row| NoticeView::of_row(row, Place::InFlight, None))
        .collect();
    views.extend(
        db.query_all(&history)
            .await?
            .iter()
            .map(|row| NoticeView::of_row(row, Place::History, None)),
    );
    Ok(named(views, &def_names(db).await?))
}

impl Notifier {
    /// What became of notice `id`: in flight (status, attempts, next call)
    /// or finished (how). [`Error::NoticeNotFound`] if it never existed or
    /// was purged.
    pub async fn status(&self, id: i64) -> Result<NoticeView> {
        show(&self.store().db, id).await
    }

    /// What became of the newest notice of definition `def` added with
    /// idempotency key `key`; `None` if there is none.
    pub async fn status_by_key(&self, def: &str, key: &str) -> Result<Option<NoticeView>> {
        let views = by_key(&self.store().db, key, Some(def)).await?;
        Ok(views.into_iter().max_by_key(|v| v.id))
    }
}
