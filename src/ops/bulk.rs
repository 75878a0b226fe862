//! Bulk: requeue or cancel every notice a filter finds, in bounded batches,
//! each notice guarded by the version read and given an audit line.
//!
//! **Pinned actions.** An operator who confirms what a count showed must
//! get that and nothing more: ids are not in time order across producers
//! (PostgreSQL hands them out in blocks), and a filter read again later
//! matches what changed since. [`Notifier::pin`] reads the exact notices a
//! filter matches, each with its version ([`Pinned`]); [`Notifier::apply_pinned`]
//! then changes each one only if it is still at that version and in a
//! state the action takes. One that moved on is skipped and reported
//! ([`BulkReport::skipped_ids`]), never looked up again by the filter. The
//! dashboard, the JSON API and the CLI confirm through pins.

use sea_orm::{
    EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect,
    sea_query::{Condition, Expr},
};
use serde::{Deserialize, Serialize};

use super::{
    Audit, Interrupted,
    find::{self, NoticeFilter, NoticeView, Place},
};
use crate::{
    entity::{notify_msg, notify_msg_history},
    error::{Error, Result},
    notifier::Notifier,
    state::operator::{self, Seen},
    status::Status,
};

/// Default rows read and written per batch of a bulk action: 500.
pub const DEFAULT_BATCH_SIZE: u64 = 500;

/// Largest batch a bulk action or purge reads at once (each row costs up to
/// four statement parameters; SQLite allows 32,766): 2,000.
pub const MAX_BATCH_SIZE: u64 = 2_000;

/// Ids of an id list put in one query: 1,000.
pub const IDS_PER_QUERY: usize = 1_000;

/// Failure-log bytes sent in one write (each row's log travels with its
/// audit line; MySQL 5.7's default `max_allowed_packet` is 4 MiB): 2 MiB.
pub const MAX_WRITE_LOG_BYTES: usize = 2 * 1024 * 1024;

/// How many ids a report lists.
pub const SAMPLE_IDS: usize = 10;

/// Default most notices one pin may hold ([`Notifier::pin`]): 100,000
/// (1.6 MB of ids and versions).
pub const DEFAULT_MAX_PINNED: usize = 100_000;

/// A bulk requeue or cancel.
#[derive(Debug, Clone)]
pub struct BulkAction {
    /// Which notices. A requeue looks in history (final failures, cancelled
    /// and parked; `status` narrows to one of those); a cancel looks at
    /// notices in flight.
    pub filter: NoticeFilter,
    /// Who and why, written into each notice's log.
    pub audit: Audit,
    /// Count and list, change nothing.
    pub dry_run: bool,
    /// Rows per batch (each batch is one guarded statement, or one short
    /// transaction). Default [`DEFAULT_BATCH_SIZE`].
    pub batch_size: u64,
}

impl BulkAction {
    /// An action on the notices `filter` finds, batches of
    /// [`DEFAULT_BATCH_SIZE`], not a dry run.
    pub fn new(filter: NoticeFilter, audit: Audit) -> Self {
        BulkAction {
            filter,
            audit,
            dry_run: false,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BulkReport {
    /// Notices the filter found.
    pub matched: u64,
    /// Notices changed (0 on a dry run).
    pub changed: u64,
    /// Notices skipped because they changed between the read and the write
    /// (finished, requeued, claimed by an attempt or by another operator).
    pub skipped: u64,
    /// The first [`SAMPLE_IDS`] ids found.
    pub first_ids: Vec<i64>,
    /// The first [`SAMPLE_IDS`] ids skipped (a pinned action's notices that
    /// moved on since they were counted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped_ids: Vec<i64>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

/// What a pinned bulk action does: it follows from where the notices are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PinnedAction {
    /// Requeue finished notices (final failures, cancelled, parked).
    Requeue,
    /// Cancel notices in flight.
    Cancel,
}

impl PinnedAction {
    /// Where the action's notices are.
    pub fn place(self) -> Place {
        match self {
            PinnedAction::Requeue => Place::History,
            PinnedAction::Cancel => Place::InFlight,
        }
    }

    /// The action on notices in `place`.
    pub fn at(place: Place) -> Self {
        match place {
            Place::History => PinnedAction::Requeue,
            Place::InFlight => PinnedAction::Cancel,
        }
    }

    fn kind(self) -> Kind {
        match self {
            PinnedAction::Requeue => Kind::Requeue,
            PinnedAction::Cancel => Kind::Cancel,
        }
    }
}

/// The notices a bulk action counted, each at the version it was counted
/// at: all that [`Notifier::apply_pinned`] may change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pinned {
    /// Requeue or cancel.
    pub action: PinnedAction,
    /// `(id, version)` of each notice counted, lowest id first.
    pub notices: Vec<(i64, i32)>,
}

impl Pinned {
    /// How many notices are pinned.
    pub fn len(&self) -> usize {
        self.notices.len()
    }

    /// Whether no notice is pinned.
    pub fn is_empty(&self) -> bool {
        self.notices.is_empty()
    }

    /// The first [`SAMPLE_IDS`] ids.
    pub fn first_ids(&self) -> Vec<i64> {
        self.notices
            .iter()
            .take(SAMPLE_IDS)
            .map(|(id, _)| *id)
            .collect()
    }
}

impl std::fmt::Display for BulkReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.dry_run {
            write!(f, "{} matched (dry run: nothing changed)", self.matched)
        } else {
            write!(
                f,
                "{} matched, {} changed, {} skipped (changed meanwhile)",
                self.matched, self.changed, self.skipped
            )
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Requeue,
    Cancel,
}

impl Notifier {
    /// Requeues every finished notice `action.filter` finds among final
    /// failures, cancelled and parked notices: back in flight, due now, a
    /// fresh retry budget, an audit line `requeued by ACTOR: REASON`.
    ///
    /// Works in batches of `action.batch_size`, oldest id first. On an
    /// error, the batches already written stay written and the error
    /// carries the report so far.
    pub async fn requeue_where(
        &self,
        action: &BulkAction,
    ) -> std::result::Result<BulkReport, Interrupted<BulkReport>> {
        if let Some(status) = action.filter.status
            && !status.is_requeueable()
        {
            return Err(Interrupted::before(not_requeueable(status)));
        }
        self.bulk(Kind::Requeue, action).await
    }

    /// Cancels every notice in flight `action.filter` finds: each moves to
    /// history with status `cancelled` and an audit line
    /// `cancelled by ACTOR: REASON`. An attempt running meanwhile loses its
    /// claim (its outcome is not recorded). Batches and errors as
    /// [`requeue_where`](Self::requeue_where).
    pub async fn cancel_where(
        &self,
        action: &BulkAction,
    ) -> std::result::Result<BulkReport, Interrupted<BulkReport>> {
        self.bulk(Kind::Cancel, action).await
    }

    /// Whether `filter` matches every notice a bulk action on `place` looks
    /// at (a requeue: history's final failures, cancelled and parked; a
    /// cancel: those in flight), and there is at least one: a filter that
    /// narrows on paper (`param_contains: "{"`, an odd value) but leaves
    /// nothing out, which a caller should refuse without a plain "all".
    /// At most two reads of one row each; the first stops at the first
    /// notice the filter leaves out.
    pub async fn matches_every_notice(&self, place: Place, filter: &NoticeFilter) -> Result<bool> {
        let db = &self.store().db;
        let kind = match place {
            Place::History => Kind::Requeue,
            Place::InFlight => Kind::Cancel,
        };
        let cond = find::condition(db, place, filter).await?;
        // NULL-safe: a row for which the filter is NULL is left out too.
        let left_out = Expr::case(cond, 0).finally(1).eq(1);
        let any = |cond: Condition| async move {
            let found: Option<i64> = match place {
                Place::History => first_id::<notify_msg_history::Entity>(db, cond).await?,
                Place::InFlight => first_id::<notify_msg::Entity>(db, cond).await?,
            };
            Ok::<_, Error>(found.is_some())
        };
        if any(kind.takes().add(left_out)).await? {
            return Ok(false);
        }
        any(kind.takes()).await
    }

    async fn bulk(
        &self,
        kind: Kind,
        action: &BulkAction,
    ) -> std::result::Result<BulkReport, Interrupted<BulkReport>> {
        let mut report = BulkReport {
            dry_run: action.dry_run,
            ..BulkReport::default()
        };
        // A long id list goes in slices, each a filter of its own.
        let slices: Vec<NoticeFilter> = match &action.filter.ids {
            Some(ids) if ids.len() > IDS_PER_QUERY => ids
                .chunks(IDS_PER_QUERY)
                .map(|chunk| NoticeFilter {
                    ids: Some(chunk.to_vec()),
                    ..action.filter.clone()
                })
                .collect(),
            _ => vec![action.filter.clone()],
        };
        let mut done = Ok(());
        for filter in &slices {
            done = self.bulk_batches(kind, action, filter, &mut report).await;
            if done.is_err() {
                break;
            }
        }
        match done {
            Ok(()) => Ok(report),
            Err(error) => Err(Interrupted {
                done: report,
                error,
            }),
        }
    }

    async fn bulk_batches(
        &self,
        kind: Kind,
        action: &BulkAction,
        filter: &NoticeFilter,
        report: &mut BulkReport,
    ) -> Result<()> {
        use notify_msg::Column;
        let db = &self.store().db;
        let base = find::condition(db, kind.place(), filter)
            .await?
            .add(kind.takes());
        let verb = kind.verb();
        let batch = action.batch_size.clamp(1, MAX_BATCH_SIZE);
        let note = format!("{verb} by {}", action.audit);
        let mut after = i64::MIN;
        loop {
            let cond = base.clone().add(Expr::col(Column::Id).gt(after));
            let (rows, last) = match kind {
                Kind::Requeue => read_batch::<notify_msg_history::Entity>(db, cond, batch).await?,
                Kind::Cancel => read_batch::<notify_msg::Entity>(db, cond, batch).await?,
            };
            let Some(last) = last else {
                return Ok(());
            };
            after = last;
            report.matched += rows.len() as u64;
            let room = SAMPLE_IDS.saturating_sub(report.first_ids.len());
            report
                .first_ids
                .extend(rows.iter().take(room).map(|r| r.id));
            if action.dry_run {
                continue;
            }
            self.apply(kind, &rows, &note, report).await?;
        }
    }

    /// Counts the notices a requeue (`place` history) or a cancel (in
    /// flight) of `filter` would change, and pins them: each one's id and
    /// version. [`Error::Config`] when more than `max` match (narrow the
    /// filter). Reads only.
    pub async fn pin(&self, place: Place, filter: &NoticeFilter, max: usize) -> Result<Pinned> {
        use notify_msg::Column;
        let action = PinnedAction::at(place);
        if action == PinnedAction::Requeue
            && let Some(status) = filter.status
            && !status.is_requeueable()
        {
            return Err(not_requeueable(status));
        }
        let db = &self.store().db;
        let base = find::condition(db, place, filter)
            .await?
            .add(action.kind().takes());
        let mut notices = Vec::new();
        let mut after = i64::MIN;
        loop {
            let cond = base.clone().add(Expr::col(Column::Id).gt(after));
            let (rows, last) = match place {
                Place::History => read_pairs::<notify_msg_history::Entity>(db, cond).await?,
                Place::InFlight => read_pairs::<notify_msg::Entity>(db, cond).await?,
            };
            let Some(last) = last else {
                return Ok(Pinned { action, notices });
            };
            after = last;
            notices.extend(rows);
            if notices.len() > max {
                return Err(Error::Config(format!(
                    "more than {max} notices match: narrow the filter"
                )));
            }
        }
    }

    /// Requeues or cancels exactly the notices `pinned` holds, each only if
    /// it is still at the version pinned and in a state the action takes
    /// (the others are skipped, and the first of them listed); in batches
    /// of `batch_size`, each notice given the audit line. A dry run counts
    /// what would change now. On an error, the batches already written stay
    /// written and the error carries the report so far.
    pub async fn apply_pinned(
        &self,
        pinned: &Pinned,
        audit: &Audit,
        batch_size: u64,
        dry_run: bool,
    ) -> std::result::Result<BulkReport, Interrupted<BulkReport>> {
        let mut report = BulkReport {
            dry_run,
            matched: pinned.len() as u64,
            first_ids: pinned.first_ids(),
            ..BulkReport::default()
        };
        let kind = pinned.action.kind();
        let note = format!("{} by {audit}", kind.verb());
        let batch = usize::try_from(batch_size.clamp(1, MAX_BATCH_SIZE)).unwrap_or(1);
        for chunk in pinned.notices.chunks(batch) {
            let done = self
                .apply_chunk(kind, chunk, &note, dry_run, &mut report)
                .await;
            if let Err(error) = done {
                return Err(Interrupted {
                    done: report,
                    error,
                });
            }
        }
        Ok(report)
    }

    /// One batch of a pinned action: the rows still as pinned, written.
    async fn apply_chunk(
        &self,
        kind: Kind,
        chunk: &[(i64, i32)],
        note: &str,
        dry_run: bool,
        report: &mut BulkReport,
    ) -> Result<()> {
        let db = &self.store().db;
        let cond = Condition::all()
            .add(
                Expr::tuple([
                    Expr::col(notify_msg::Column::Id),
                    Expr::col(notify_msg::Column::Version),
                ])
                .in_tuples(chunk.iter().copied()),
            )
            .add(kind.takes());
        let limit = chunk.len() as u64;
        let (rows, _) = match kind {
            Kind::Requeue => read_batch::<notify_msg_history::Entity>(db, cond, limit).await?,
            Kind::Cancel => read_batch::<notify_msg::Entity>(db, cond, limit).await?,
        };
        let done: Vec<i64> = if dry_run {
            rows.iter().map(|r| r.id).collect()
        } else {
            self.apply(kind, &rows, note, report).await?
        };
        let done: std::collections::HashSet<i64> = done.into_iter().collect();
        let gone = chunk.iter().filter(|(id, _)| !done.contains(id));
        let room = SAMPLE_IDS.saturating_sub(report.skipped_ids.len());
        report
            .skipped_ids
            .extend(gone.clone().take(room).map(|(id, _)| *id));
        // `apply` counted the rows it read and did not change.
        let unread = chunk.len() - rows.len();
        report.skipped += unread as u64;
        if dry_run {
            report.skipped += (rows.len() - done.len()) as u64;
        }
        Ok(())
    }

    /// Writes one batch, counting what changed and what was skipped;
    /// returns the ids changed.
    async fn apply(
        &self,
        kind: Kind,
        rows: &[Seen],
        note: &str,
        report: &mut BulkReport,
    ) -> Result<Vec<i64>> {
        let store = &self.store();
        let mut rest = rows;
        let mut changed = Vec::new();
        let keys = match kind {
            Kind::Requeue if !rows.is_empty() => self.key_events(note).await?,
            _ => None,
        };
        let on_release = keys
            .as_ref()
            .map(|k| move |d: i64, key: &str| k.row(d, key));
        while !rest.is_empty() {
            // Each row's log travels with its audit line: bound the bytes.
            let mut take = 0;
            let mut bytes = 0;
            while take < rest.len()
                && (take == 0 || bytes + rest[take].errors.len() <= MAX_WRITE_LOG_BYTES)
            {
                bytes += rest[take].errors.len();
                take += 1;
            }
            let (part, after) = rest.split_at(take);
            rest = after;
            let at = crate::state::clock::app_now();
            let done = match kind {
                Kind::Requeue => {
                    let on_release = on_release.as_ref().map(|f| f as _);
                    let (done, events) =
                        operator::requeue(store, part, note, at, on_release).await?;
                    self.events_written(events).await;
                    done
                }
                Kind::Cancel => operator::cancel(store, part, note, at).await?,
            };
            report.changed += done.len() as u64;
            report.skipped += (part.len() - done.len()) as u64;
            if matches!(kind, Kind::Requeue) && !done.is_empty() {
                self.wake_workers();
            }
            changed.extend(done);
        }
        Ok(changed)
    }

    /// Requeues exactly the notices an operator looked at (`seen`, as
    /// [`find`] returned them, say on a confirmation page), each only if it
    /// has not changed since (same version, still finished and requeueable);
    /// the others are counted as skipped. One batch per
    /// [`DEFAULT_BATCH_SIZE`] notices.
    pub async fn requeue_seen(&self, seen: &[NoticeView], audit: &Audit) -> Result<BulkReport> {
        self.apply_seen(Kind::Requeue, Place::History, seen, audit)
            .await
    }

    /// Cancels exactly the notices in flight an operator looked at, each only
    /// if it has not changed since; as [`requeue_seen`](Self::requeue_seen).
    pub async fn cancel_seen(&self, seen: &[NoticeView], audit: &Audit) -> Result<BulkReport> {
        self.apply_seen(Kind::Cancel, Place::InFlight, seen, audit)
            .await
    }

    async fn apply_seen(
        &self,
        kind: Kind,
        place: Place,
        seen: &[NoticeView],
        audit: &Audit,
    ) -> Result<BulkReport> {
        let mut report = BulkReport::default();
        let note = format!("{} by {audit}", kind.verb());
        for chunk in seen.chunks(DEFAULT_BATCH_SIZE as usize) {
            report.matched += chunk.len() as u64;
            let room = SAMPLE_IDS.saturating_sub(report.first_ids.len());
            report
                .first_ids
                .extend(chunk.iter().take(room).map(|v| v.id));
            // A notice seen in the other table cannot be acted on here.
            let rows: Vec<Seen> = chunk
                .iter()
                .filter(|v| v.place == place)
                .map(|v| Seen {
                    id: v.id,
                    version: v.version,
                    errors: v.errors.join("\n"),
                })
                .collect();
            report.skipped += (chunk.len() - rows.len()) as u64;
            self.apply(kind, &rows, &note, &mut report).await?;
        }
        Ok(report)
    }
}

/// The next `limit` rows matching `cond` of either notice table (their
/// columns are the same), lowest id first: what a guarded write needs;
/// and the last id read (`None`: no row left).
async fn read_batch<E: EntityTrait>(
    db: &impl sea_orm::ConnectionTrait,
    cond: sea_orm::sea_query::Condition,
    limit: u64,
) -> Result<(Vec<Seen>, Option<i64>)> {
    use notify_msg::Column;
    let select = E::find()
        .select_only()
        .expr(Expr::col(Column::Id))
        .expr(Expr::col(Column::Version))
        .expr(Expr::col(Column::Errors))
        .filter(cond)
        .order_by(Expr::col(Column::Id), sea_orm::Order::Asc)
        .limit(limit);
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    // Each row on its own (a plain-SQL producer's cell may be of any type
    // on SQLite): a failure log that cannot be read starts afresh with the
    // audit line; a version that cannot be read cannot guard a write, so
    // that row is left out.
    let seen = rows
        .iter()
        .filter_map(|row| {
            Some(Seen {
                id: row.try_get_by_index(0).ok()?,
                version: row.try_get_by_index(1).ok()?,
                errors: row.try_get_by_index(2).unwrap_or_default(),
            })
        })
        .collect();
    Ok((seen, last_id(&rows)))
}

/// The id of the last of `rows` (ids first in each), to read on after.
fn last_id(rows: &[sea_orm::QueryResult]) -> Option<i64> {
    rows.last().and_then(|row| row.try_get_by_index(0).ok())
}

/// The id of one row of either notice table matching `cond`, if any.
async fn first_id<E: EntityTrait>(
    db: &impl sea_orm::ConnectionTrait,
    cond: Condition,
) -> Result<Option<i64>> {
    use notify_msg::Column;
    Ok(E::find()
        .select_only()
        .expr(Expr::col(Column::Id))
        .filter(cond)
        .limit(1)
        .into_tuple()
        .one(db)
        .await?)
}

/// A requeue filtered on a status that cannot be requeued.
fn not_requeueable(status: Status) -> Error {
    Error::Config(format!(
        "status {status}: only final failures, cancelled and parked notices can be requeued"
    ))
}

/// The next [`MAX_BATCH_SIZE`] `(id, version)` pairs matching `cond` of
/// either notice table, lowest id first; and the last id read (`None`: no
/// row left).
async fn read_pairs<E: EntityTrait>(
    db: &impl sea_orm::ConnectionTrait,
    cond: Condition,
) -> Result<(Vec<(i64, i32)>, Option<i64>)> {
    use notify_msg::Column;
    let select = E::find()
        .select_only()
        .expr(Expr::col(Column::Id))
        .expr(Expr::col(Column::Version))
        .filter(cond)
        .order_by(Expr::col(Column::Id), sea_orm::Order::Asc)
        .limit(MAX_BATCH_SIZE);
    let rows = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    // A version that cannot be read (SQLite) guards nothing: left out.
    let pairs = rows
        .iter()
        .filter_map(|row| Some((row.try_get_by_index(0).ok()?, row.try_get_by_index(1).ok()?)))
        .collect();
    Ok((pairs, last_id(&rows)))
}

impl Kind {
    fn verb(self) -> &'static str {
        match self {
            Kind::Requeue => "requeued",
            Kind::Cancel => "cancelled",
        }
    }

    fn place(self) -> Place {
        match self {
            Kind::Requeue => Place::History,
            Kind::Cancel => Place::InFlight,
        }
    }

    /// The statuses the action takes.
    fn takes(self) -> Condition {
        let statuses: Vec<i16> = match self {
            Kind::Requeue => [Status::FinalFailure, Status::Cancelled, Status::Parked].to_vec(),
            Kind::Cancel => Status::DUE.to_vec(),
        }
        .into_iter()
        .map(|s| s as i16)
        .collect();
        Condition::all().add(Expr::col(notify_msg::Column::Status).is_in(statuses))
    }
}
