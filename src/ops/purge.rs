//! Purge: delete old finished notices from `notify_msg_history` in bounded
//! batches, archiving each batch first when asked. Final failures and parked
//! notices stay unless asked for: they are what an operator may still
//! requeue. A notice cancelled while an attempt still held it stays until
//! that lease ends: the lease holds its ordering key meanwhile.

use std::{path::PathBuf, time::Duration};

use sea_orm::{
    ConnectionTrait, DatabaseConnection, EntityTrait, ExprTrait, QueryFilter, QueryOrder,
    QuerySelect,
    sea_query::{Expr, Func},
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::Interrupted;
use crate::{
    entity::{
        notify_msg,
        notify_msg_history::{self, Column},
        read,
    },
    error::{Error, Result},
    state::{partitions, retention},
    status::Status,
};

/// Default rows per purge batch: 1,000.
pub const DEFAULT_PURGE_BATCH: u64 = 1_000;

/// What to purge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Only notices that finished more than this long ago (their
    /// `last_call_time`, or `create_time` if never attempted), by this
    /// host's clock.
    #[serde(with = "humantime_serde")]
    pub older_than: Duration,
    /// Also delete final failures and parked notices. Default `false`:
    /// only succeeded and cancelled ones go.
    #[serde(default)]
    pub include_failures: bool,
    /// Append every row to this JSON Lines file (one `notify_msg_history`
    /// row per line), flushed to disk before the batch's delete runs.
    #[serde(default)]
    pub archive: Option<PathBuf>,
    /// Count, change nothing.
    #[serde(skip)]
    pub dry_run: bool,
    /// Rows per batch. Default [`DEFAULT_PURGE_BATCH`].
    #[serde(default = "default_batch")]
    pub batch_size: u64,
}

fn default_batch() -> u64 {
    DEFAULT_PURGE_BATCH
}

impl Purge {
    /// Succeeded and cancelled notices finished more than `older_than` ago,
    /// no archive.
    pub fn older_than(older_than: Duration) -> Self {
        Purge {
            older_than,
            include_failures: false,
            archive: None,
            dry_run: false,
            batch_size: DEFAULT_PURGE_BATCH,
        }
    }

    fn statuses(&self) -> Vec<i16> {
        let mut s = vec![Status::Succeeded, Status::Cancelled];
        if self.include_failures {
            s.extend([Status::FinalFailure, Status::Parked]);
        }
        s.into_iter().map(|s| s as i16).collect()
    }
}

/// What a purge did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PurgeReport {
    /// Rows found old enough.
    pub matched: u64,
    /// Rows written to the archive.
    pub archived: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// Rows archived but not deleted: requeued or changed meanwhile, or
    /// cancelled while an attempt held them and that lease has not ended.
    pub skipped: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Partitions of history dropped whole (PostgreSQL, partitioned
    /// history): their rows are counted in `deleted`.
    pub dropped_partitions: u64,
}

impl std::fmt::Display for PurgeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.dry_run {
            return write!(f, "{} would be deleted (dry run)", self.matched);
        }
        write!(
            f,
            "{} matched, {} archived, {} deleted, {} skipped (changed meanwhile)",
            self.matched, self.archived, self.deleted, self.skipped
        )?;
        if self.dropped_partitions > 0 {
            write!(f, ", {} partitions dropped", self.dropped_partitions)?;
        }
        Ok(())
    }
}

/// Runs `purge`. On an error, what was deleted stays deleted (and is in
/// the archive) and the error carries the report so far; a batch whose
/// archive could not be written is not deleted.
pub async fn purge(
    db: &DatabaseConnection,
    purge: &Purge,
) -> std::result::Result<PurgeReport, Interrupted<PurgeReport>> {
    let mut report = PurgeReport {
        dry_run: purge.dry_run,
        ..PurgeReport::default()
    };
    match run(db, purge, &mut report).await {
        Ok(()) => Ok(report),
        Err(error) => Err(Interrupted {
            done: report,
            error,
        }),
    }
}

/// Appends `rows` to the archive `file` (at `path`), one JSON object a
/// line (a row that cannot be read as far as it reads, with why), and
/// syncs it.
async fn archive_rows(
    file: &mut tokio::fs::File,
    path: &std::path::Path,
    rows: &[(notify_msg::Model, Option<String>)],
) -> Result<()> {
    let mut text = String::new();
    for (row, unreadable) in rows {
        let mut line =
            serde_json::to_value(row).map_err(|e| archive_error(path, std::io::Error::other(e)))?;
        if let (Some(why), Some(fields)) = (unreadable, line.as_object_mut()) {
            fields.insert("unreadable".into(), why.clone().into());
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    file.write_all(text.as_bytes())
        .await
        .map_err(|e| archive_error(path, e))?;
    file.flush().await.map_err(|e| archive_error(path, e))?;
    file.sync_data().await.map_err(|e| archive_error(path, e))
}

async fn run(db: &DatabaseConnection, purge: &Purge, report: &mut PurgeReport) -> Result<()> {
    let cutoff = super::ago(purge.older_than);
    let finished: Expr = Func::coalesce([
        Expr::col(Column::LastCallTime),
        Expr::col(Column::CreateTime),
    ])
    .into();
    // A notice cancelled while an attempt held it keeps that lease in
    // history until it ends: it is left for a later purge (the delete
    // checks again).
    let mut base = sea_orm::sea_query::Condition::all()
        .add(Expr::col(Column::Status).is_in(purge.statuses()))
        .add(finished.lt(cutoff))
        .add(retention::lease_live(db.get_database_backend()).not());
    let mut archive = match (&purge.archive, purge.dry_run) {
        (Some(path), false) => Some(
            tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .await
                .map_err(|e| archive_error(path, e))?,
        ),
        _ => None,
    };
    let mut archive = archive
        .as_mut()
        .zip(purge.archive.as_deref())
        .map(|(file, path)| Archive { file, path });
    if let Some(layout) = partitions::layout(db).await? {
        if partitions::ownership(db).await? == partitions::Ownership::Mine {
            drop_periods(db, purge, &layout, cutoff, archive.as_mut(), report).await?;
            // What is left in a period goes with it; the batches purge the
            // kept and default partitions.
            base = base.add(Expr::cust(partitions::outside_periods(&layout)));
        } else {
            tracing::warn!(
                "this role does not own notify_msg_history, so it cannot drop its periods: purging in batches (run the purge as the table's owner)"
            );
        }
    }
    let mut after = i64::MIN;
    loop {
        let rows = batch_after(db, base.clone(), after, purge.batch_size).await?;
        let Some((last, _)) = rows.last() else {
            return Ok(());
        };
        after = last.id;
        report.matched += rows.len() as u64;
        if purge.dry_run {
            continue;
        }
        if let Some(archive) = archive.as_mut() {
            archive_rows(archive.file, archive.path, &rows).await?;
            report.archived += rows.len() as u64;
        }
        let rows: Vec<notify_msg::Model> = rows.into_iter().map(|(row, _)| row).collect();
        let pairs: Vec<(i64, i32)> = rows.iter().map(|r| (r.id, r.version)).collect();
        let deleted = retention::delete_history(db, &pairs).await?;
        report.deleted += deleted;
        // A purged final failure no longer holds its ordering key back.
        let keys: Vec<(i64, String)> = rows
            .iter()
            .filter(|r| matches!(r.status, Status::FinalFailure | Status::Parked))
            .filter_map(|r| r.ordering_key.clone().map(|key| (r.def_id, key)))
            .collect();
        if deleted > 0
            && !keys.is_empty()
            && let Err(e) = crate::state::order::promote(db, &keys).await
        {
            tracing::warn!(error = %e, "cannot promote the notices waiting behind purged failures; they are due within {:?}", crate::state::order::TURN_RECHECK);
        }
        report.skipped += rows.len() as u64 - deleted;
    }
}

/// The archive file a purge appends to, and its path (for errors).
struct Archive<'a> {
    file: &'a mut tokio::fs::File,
    path: &'a std::path::Path,
}

/// Up to `size` rows of history matching `cond` with ids above `after`, in
/// id order. Each row on its own: one a plain-SQL producer wrote with a
/// cell that cannot be read is read as far as it reads, with why (both
/// tables have the same columns: a history row reads as one).
async fn batch_after(
    db: &DatabaseConnection,
    cond: sea_orm::sea_query::Condition,
    after: i64,
    size: u64,
) -> Result<Vec<(notify_msg::Model, Option<String>)>> {
    let select = notify_msg_history::Entity::find()
        .filter(cond.add(Expr::col(Column::Id).gt(after)))
        .order_by_asc(Column::Id)
        .limit(size.clamp(1, super::bulk::MAX_BATCH_SIZE));
    let raw = db
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    Ok(raw
        .iter()
        .map(|row| match read::notice(row) {
            Ok(model) => (model, None),
            Err(u) => (read::lenient(row), Some(u.reason())),
        })
        .collect())
}

/// Partitioned history (PostgreSQL): drops each period that ended before
/// `cutoff`, after moving out what it must keep (final failures and parked
/// notices unless `include_failures`, which the batches then purge; a live
/// lease) and archiving the rest. A period whose lock could not be taken in
/// time stays for the next purge (logged); the others go on.
async fn drop_periods(
    db: &DatabaseConnection,
    purge: &Purge,
    layout: &partitions::Layout,
    cutoff: chrono::NaiveDateTime,
    mut archive: Option<&mut Archive<'_>>,
    report: &mut PurgeReport,
) -> Result<()> {
    for period in layout.ended_by(cutoff) {
        if purge.dry_run {
            report.matched += partitions::droppable(db, period, purge.include_failures).await?;
            continue;
        }
        partitions::evacuate(db, period).await?;
        if let Some(archive) = archive.as_mut() {
            let all = Expr::cust(format!(
                "finished_time >= '{}' AND finished_time < '{}'",
                period.from.format("%Y-%m-%d %H:%M:%S"),
                period.to.format("%Y-%m-%d %H:%M:%S")
            ));
            let mut after = i64::MIN;
            loop {
                let cond = sea_orm::sea_query::Condition::all().add(all.clone());
                let rows = batch_after(db, cond, after, purge.batch_size).await?;
                let Some((last, _)) = rows.last() else { break };
                after = last.id;
                archive_rows(archive.file, archive.path, &rows).await?;
                report.archived += rows.len() as u64;
            }
        }
        match partitions::drop_period(db, period).await {
            Ok(None) => {}
            Ok(Some(gone)) => {
                report.matched += gone;
                report.deleted += gone;
                report.dropped_partitions += 1;
                tracing::info!(partition = %period.name, rows = gone, "dropped a period of history");
            }
            Err(e) if crate::db::sql_state(&e).as_deref() == Some("55P03") => {
                tracing::warn!(partition = %period.name, "could not take history's lock within {:?} to drop a period (a long transaction holds it, or another purge is dropping); the next purge tries again", partitions::PARTITION_LOCK_TIMEOUT);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn archive_error(path: &std::path::Path, e: std::io::Error) -> Error {
    Error::Archive {
        path: path.display().to_string(),
        problem: e.to_string(),
    }
}

/// Default time between two scheduled purges: 1 hour.
pub const DEFAULT_RETENTION_EVERY: Duration = Duration::from_secs(3_600);

/// A purge a worker runs on a schedule: the `[retention]` table of
/// `solid-notify worker --config`. Off unless configured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Notices finished more than this long ago go (e.g. `"30d"`).
    #[serde(with = "humantime_serde")]
    pub older_than: Duration,
    /// Also final failures and parked notices. Default `false`.
    #[serde(default)]
    pub include_failures: bool,
    /// JSON Lines archive written before each delete. Default none.
    #[serde(default)]
    pub archive: Option<PathBuf>,
    /// Rows per batch. Default [`DEFAULT_PURGE_BATCH`].
    #[serde(default = "default_batch")]
    pub batch_size: u64,
    /// Time between purges (the first runs at start). Default
    /// [`DEFAULT_RETENTION_EVERY`].
    #[serde(default = "default_every", with = "humantime_serde")]
    pub every: Duration,
}

fn default_every() -> Duration {
    DEFAULT_RETENTION_EVERY
}

impl Retention {
    /// The purge each run makes.
    pub fn purge(&self) -> Purge {
        Purge {
            older_than: self.older_than,
            include_failures: self.include_failures,
            archive: self.archive.clone(),
            dry_run: false,
            batch_size: self.batch_size,
        }
    }
}

/// Runs `retention` at start and then every `retention.every` until
/// `shutdown`, logging what each run did. Several workers may run it at
/// once: each row is deleted once (the others skip it), though it may be
/// archived by more than one of them.
pub fn spawn_retention(
    db: DatabaseConnection,
    retention: Retention,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(retention.every.max(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if let Err(e) = partitions::upkeep(&db).await {
                tracing::warn!(error = %e, "cannot make the periods of history ahead");
            }
            match purge(&db, &retention.purge()).await {
                Ok(report) => tracing::info!(%report, "retention purge"),
                Err(e) => tracing::warn!(error = %e, "retention purge stopped"),
            }
        }
    })
}
