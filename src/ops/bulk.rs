//! Bulk: requeue or cancel every notice a filter finds, in bounded batches,
//! each notice guarded by the version read and given an audit line.

use sea_orm::{EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect, sea_query::Expr};
use serde::Serialize;

use super::{
    Audit, Interrupted,
    find::{self, NoticeFilter, NoticeView, Place},
};
use crate::{
    Notifier, Status,
    entity::{notify_msg, notify_msg_history},
    error::{Error, Result},
    state::operator::{self, Seen},
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
    /// Whether this was a dry run.
    pub dry_run: bool,
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
            return Err(Interrupted::before(Error::WrongState {
                id: 0,
                status,
                problem: "only final failures, cancelled and parked notices can be requeued",
            }));
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
        let db = &self.inner.store.db;
        let place = match kind {
            Kind::Requeue => Place::History,
            Kind::Cancel => Place::InFlight,
        };
        let statuses: Vec<i16> = match kind {
            Kind::Requeue => [Status::FinalFailure, Status::Cancelled, Status::Parked].to_vec(),
            Kind::Cancel => Status::DUE.to_vec(),
        }
        .into_iter()
        .map(|s| s as i16)
        .collect();
        let base = find::condition(db, place, filter)
            .await?
            .add(Expr::col(Column::Status).is_in(statuses));
        let verb = kind.verb();
        let batch = action.batch_size.clamp(1, MAX_BATCH_SIZE);
        let note = format!("{verb} by {}", action.audit);
        let mut after = i64::MIN;
        loop {
            let cond = base.clone().add(Expr::col(Column::Id).gt(after));
            let rows: Vec<Seen> = match kind {
                Kind::Requeue => read_batch::<notify_msg_history::Entity>(db, cond, batch).await?,
                Kind::Cancel => read_batch::<notify_msg::Entity>(db, cond, batch).await?,
            };
            let Some(last) = rows.last() else {
                return Ok(());
            };
            after = last.id;
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

    /// Writes one batch, counting what changed and what was skipped.
    async fn apply(
        &self,
        kind: Kind,
        rows: &[Seen],
        note: &str,
        report: &mut BulkReport,
    ) -> Result<()> {
        let store = &self.inner.store;
        let mut rest = rows;
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
            let at = self.app_now();
            let done = match kind {
                Kind::Requeue => operator::requeue(store, part, note, at).await?,
                Kind::Cancel => operator::cancel(store, part, note, at).await?,
            };
            report.changed += done.len() as u64;
            report.skipped += (part.len() - done.len()) as u64;
            if matches!(kind, Kind::Requeue) && !done.is_empty() {
                self.wake_workers();
            }
        }
        Ok(())
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
/// columns are the same), lowest id first: what a guarded write needs.
async fn read_batch<E: EntityTrait>(
    db: &sea_orm::DatabaseConnection,
    cond: sea_orm::sea_query::Condition,
    limit: u64,
) -> Result<Vec<Seen>> {
    use notify_msg::Column;
    let rows: Vec<(i64, i32, String)> = E::find()
        .select_only()
        .expr(Expr::col(Column::Id))
        .expr(Expr::col(Column::Version))
        .expr(Expr::col(Column::Errors))
        .filter(cond)
        .order_by(Expr::col(Column::Id), sea_orm::Order::Asc)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, version, errors)| Seen {
            id,
            version,
            errors,
        })
        .collect())
}

impl Kind {
    fn verb(self) -> &'static str {
        match self {
            Kind::Requeue => "requeued",
            Kind::Cancel => "cancelled",
        }
    }
}
