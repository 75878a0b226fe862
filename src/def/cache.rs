//! Cache: validated definitions read from `notify_def`, refreshed on a short TTL.
//!
//! A snapshot older than the TTL is refreshed on next use, and a name or id
//! that is missing triggers a refresh too (at most one every
//! [`MISS_RELOAD_INTERVAL`]), so rows inserted or edited in place take effect
//! without a restart.
//!
//! A refresh reads only what changed: the rows whose `update_time` (set by the
//! database on every `UPDATE`, migration 18) is later than the previous
//! read's time less [`CHANGE_SLACK`], and those with an id above the
//! greatest seen, plus a count. When the count differs from the snapshot's (a row was
//! deleted, or one came late below the greatest id) and at least every
//! [`FULL_RELOAD_INTERVAL`], the whole table is read again. So at 100,000
//! definitions a refresh costs a count and a handful of rows, not 100,000
//! rows decoded and validated. The changed rows are found by their id and
//! time alone; only those whose time differs from the one held (or is
//! within `RECENT` of the previous read) are read whole and validated
//! again, so a refresh within [`CHANGE_SLACK`] of a bulk change (100,000
//! definitions synced at once) reads 100,000 ids and times, not 100,000
//! rows.
//!
//! Memory: each definition is held once, validated ([`Def`]: its name,
//! target, headers, steps and policy, about 1–2 KiB for a typical HTTP
//! definition), and indexed by id and by name.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering as AtomicOrdering},
    },
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, EntityTrait};

use super::{
    Def,
    store::{StoredRow, read},
};
use crate::{
    alert::ALERT_DEF,
    entity::notify_def,
    error::{DefinitionError, Error, Result},
};

/// Default time a snapshot of `notify_def` is trusted: 5 seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// Minimum time between two reloads caused by an unknown name or id: 250 ms.
pub const MISS_RELOAD_INTERVAL: Duration = Duration::from_millis(250);

/// The whole table is read again at least this often: 60 seconds (a row
/// whose change the incremental refresh could not see, e.g. a hand-edited
/// `update_time` in the past, takes effect within it).
pub const FULL_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// A refresh rereads the rows changed up to this long before the previous
/// refresh's time: 30 seconds (a transaction that changed a row and
/// committed up to that much later is still seen).
pub const CHANGE_SLACK: Duration = Duration::from_secs(30);

/// A definition as read: validated, or why not.
pub type Entry = Result<Arc<Def>, DefinitionError>;

#[derive(Default, Clone)]
struct Snapshot {
    loaded_at: Option<Instant>,
    /// When the whole table was last read.
    full_at: Option<Instant>,
    /// The database's time when the rows were last read, less
    /// [`CHANGE_SLACK`]: the next refresh reads the rows changed since.
    changed_since: Option<chrono::NaiveDateTime>,
    /// The greatest id read.
    max_id: i64,
    /// Id of each name.
    by_name: Arc<HashMap<String, i64>>,
    /// Every row, by id.
    by_id: Arc<HashMap<i64, Entry>>,
    /// The name of each id.
    names: Arc<HashMap<i64, String>>,
    /// The `update_time` of each id, as read.
    touched: Arc<HashMap<i64, chrono::NaiveDateTime>>,
    /// Whether `by_id` holds a valid ordered definition (worked out once
    /// per change of `by_id`, not on every claim).
    ordered: bool,
}

/// A TTL cache of validated definitions.
pub struct DefCache {
    ttl: Duration,
    snapshot: RwLock<Arc<Snapshot>>,
    reload: tokio::sync::Mutex<()>,
    full_reads: AtomicU64,
    rows_read: AtomicU64,
}

/// What a [`DefCache`] has read so far (see [`DefCache::reads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheReads {
    /// Reads of the whole table.
    pub full: u64,
    /// Rows read whole and validated, by full reads and refreshes.
    pub rows: u64,
}

#[derive(Clone, Copy)]
enum Key<'a> {
    Name(&'a str),
    Id(i64),
}

impl DefCache {
    /// An empty cache trusting snapshots for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        DefCache {
            ttl,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            reload: tokio::sync::Mutex::new(()),
            full_reads: AtomicU64::new(0),
            rows_read: AtomicU64::new(0),
        }
    }

    /// What this cache has read so far: how a refresh's cost shows.
    pub fn reads(&self) -> CacheReads {
        CacheReads {
            full: self.full_reads.load(AtomicOrdering::Relaxed),
            rows: self.rows_read.load(AtomicOrdering::Relaxed),
        }
    }

    /// The definition named `name`.
    pub async fn by_name<C: ConnectionTrait>(&self, db: &C, name: &str) -> Result<Arc<Def>> {
        self.get(db, Key::Name(name)).await
    }

    /// The definition with `notify_def.id = id`.
    pub async fn by_id<C: ConnectionTrait>(&self, db: &C, id: i64) -> Result<Arc<Def>> {
        self.get(db, Key::Id(id)).await
    }

    /// The reserved alert definition. When its row is invalid the built-in
    /// policy stands in (logged at `error`); when the row is missing it is
    /// created again with the built-in policy.
    pub async fn alert_def<C>(&self, db: &C) -> Result<Arc<Def>>
    where
        C: ConnectionTrait + sea_orm::TransactionTrait,
    {
        match self.by_name(db, ALERT_DEF).await {
            Err(Error::UnknownDef(_)) => {
                tracing::error!(
                    "the alert definition row is missing; creating it with the built-in policy"
                );
                let spec = crate::alert::builtin_spec();
                if let Err(e) = super::store::sync(db, &[spec]).await {
                    // Another process may have created it meanwhile.
                    tracing::warn!(error = %e, "cannot create the alert definition");
                }
                self.invalidate();
                self.by_name(db, ALERT_DEF).await
            }
            other => other,
        }
    }

    /// Every valid definition (reloading when the snapshot is stale).
    pub async fn all<C: ConnectionTrait>(&self, db: &C) -> Result<Vec<Arc<Def>>> {
        let mut snap = self.current();
        if snap.loaded_at.is_none_or(|t| t.elapsed() >= self.ttl) {
            snap = self.reload(db, snap.loaded_at).await?;
        }
        Ok(snap.by_id.values().filter_map(|e| e.clone().ok()).collect())
    }

    /// Every row of `notify_def` by id, validated or not (refreshing when
    /// the snapshot is stale). Shared, not copied.
    pub async fn known<C: ConnectionTrait>(&self, db: &C) -> Result<Arc<HashMap<i64, Entry>>> {
        let mut snap = self.current();
        if snap.loaded_at.is_none_or(|t| t.elapsed() >= self.ttl) {
            snap = self.reload(db, snap.loaded_at).await?;
        }
        Ok(snap.by_id.clone())
    }

    /// Ids of the rows of `notify_def` that are not valid definitions,
    /// refreshed now.
    pub async fn invalid<C: ConnectionTrait>(&self, db: &C) -> Result<Vec<i64>> {
        let seen = self.current().loaded_at;
        let snap = self.reload(db, seen).await?;
        Ok(snap
            .by_id
            .iter()
            .filter(|(_, e)| e.is_err())
            .map(|(id, _)| *id)
            .collect())
    }

    /// The definition with id `id` in the current snapshot, without
    /// reloading (however old the snapshot is); `None` if absent or invalid.
    pub fn peek(&self, id: i64) -> Option<Arc<Def>> {
        self.current().by_id.get(&id).and_then(|e| e.clone().ok())
    }

    /// Whether the current snapshot (however old) holds a valid ordered
    /// definition (`ordering = "per_key"`): then sweeps set aside the
    /// notices that wait for their turn ([`crate::state::order`]).
    pub fn any_ordered(&self) -> bool {
        self.current().ordered
    }

    /// Marks the snapshot stale: the next use refreshes it, reading what
    /// changed since (see the module docs), not the whole table.
    pub fn invalidate(&self) {
        let mut snap = (*self.current()).clone();
        snap.loaded_at = None;
        self.replace(snap);
    }

    /// Forgets the snapshot so the next use reads the whole table.
    pub fn forget(&self) {
        self.replace(Snapshot::default());
    }

    async fn get<C: ConnectionTrait>(&self, db: &C, key: Key<'_>) -> Result<Arc<Def>> {
        let snap = self.current();
        let fresh = snap.loaded_at.is_some_and(|t| t.elapsed() < self.ttl);
        if fresh && let Some(found) = lookup(&snap, key) {
            return found;
        }
        let may_reload = !fresh
            || snap
                .loaded_at
                .is_none_or(|t| t.elapsed() >= MISS_RELOAD_INTERVAL);
        let snap = if may_reload {
            self.reload(db, snap.loaded_at).await?
        } else {
            snap
        };
        lookup(&snap, key).unwrap_or_else(|| {
            Err(match key {
                Key::Name(name) => Error::UnknownDef(name.to_string()),
                Key::Id(id) => Error::UnknownDefId(id),
            })
        })
    }

    fn current(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, mut snap: Snapshot) {
        let current = self.current();
        snap.ordered = match Arc::ptr_eq(&current.by_id, &snap.by_id) {
            true => current.ordered,
            false => snap.by_id.values().any(|e| {
                e.as_ref()
                    .is_ok_and(|d| matches!(d.ordering, super::Ordering::PerKey { .. }))
            }),
        };
        let snap = Arc::new(snap);
        match self.snapshot.write() {
            Ok(mut guard) => *guard = snap,
            Err(poisoned) => *poisoned.into_inner() = snap,
        }
    }

    /// Reloads unless another task already did since `seen` was loaded.
    async fn reload<C: ConnectionTrait>(
        &self,
        db: &C,
        seen: Option<Instant>,
    ) -> Result<Arc<Snapshot>> {
        let _single_flight = self.reload.lock().await;
        let current = self.current();
        if current.loaded_at != seen {
            return Ok(current);
        }
        let full = current
            .full_at
            .is_none_or(|t| t.elapsed() >= FULL_RELOAD_INTERVAL);
        let snap = match full {
            true => None,
            false => changed_since(db, &current, &self.rows_read).await?,
        };
        let snap = match snap {
            Some(snap) => snap,
            None => {
                let started = Instant::now();
                let since = since(db).await?;
                let mut snap = Snapshot {
                    full_at: Some(Instant::now()),
                    changed_since: Some(since),
                    ..Snapshot::default()
                };
                let rows = read(db, notify_def::Entity::find()).await?;
                let n = rows.len();
                self.full_reads.fetch_add(1, AtomicOrdering::Relaxed);
                self.rows_read.fetch_add(n as u64, AtomicOrdering::Relaxed);
                for row in rows {
                    put(&mut snap, row);
                }
                tracing::debug!(
                    rows = n,
                    ms = started.elapsed().as_millis() as u64,
                    "definitions read"
                );
                snap
            }
        };
        self.replace(Snapshot {
            loaded_at: Some(Instant::now()),
            ..snap
        });
        Ok(self.current())
    }
}

/// `current` with the rows changed since it was read, or `None` when the
/// count shows that rows went missing or came late (read the whole table).
async fn changed_since<C: ConnectionTrait>(
    db: &C,
    current: &Snapshot,
    rows_read: &AtomicU64,
) -> Result<Option<Snapshot>> {
    use notify_def::Column;
    use sea_orm::{
        ColumnTrait, PaginatorTrait, QueryFilter, QuerySelect,
        sea_query::{Condition, Expr, ExprTrait},
    };
    let Some(changed_since) = current.changed_since else {
        return Ok(None);
    };
    let next_since = since(db).await?;
    let changed = Condition::any()
        .add(Expr::col(Column::Id).gt(current.max_id))
        .add(Expr::col(Column::UpdateTime).gte(changed_since));
    // Each row decoded on its own: a time that does not decode (a
    // hand-edited SQLite cell) has the row read whole again, where it is
    // found unreadable, instead of failing the refresh of every row.
    let select = notify_def::Entity::find()
        .select_only()
        .column(Column::Id)
        .column(Column::UpdateTime)
        .filter(changed);
    let touched: Vec<(i64, Option<chrono::NaiveDateTime>)> = db
        .query_all_raw(sea_orm::QueryTrait::build(
            &select,
            db.get_database_backend(),
        ))
        .await?
        .iter()
        .filter_map(|r| {
            let id = r.try_get::<i64>("", "id").ok()?;
            Some((id, r.try_get("", "update_time").ok()))
        })
        .collect();
    // A row is read whole again when its time is not the one held, or when
    // it is recent: a second change within the same clock tick (SQLite's
    // is a millisecond) committed after the previous read keeps the time.
    let recent =
        changed_since + chrono::Duration::from_std(CHANGE_SLACK - RECENT).unwrap_or_default();
    let stale: Vec<i64> = touched
        .into_iter()
        .filter(|(id, time)| match time {
            Some(time) => current.touched.get(id) != Some(time) || *time >= recent,
            None => true,
        })
        .map(|(id, _)| id)
        .collect();
    let mut rows = Vec::new();
    for ids in stale.chunks(REREAD_PAGE) {
        rows.extend(
            read(
                db,
                notify_def::Entity::find().filter(Column::Id.is_in(ids.iter().copied())),
            )
            .await?,
        );
    }
    rows_read.fetch_add(rows.len() as u64, AtomicOrdering::Relaxed);
    let count = notify_def::Entity::find().count(db).await?;
    // Shares the maps with `current` unless a row changed.
    let mut snap = current.clone();
    snap.changed_since = Some(next_since);
    for row in rows {
        put(&mut snap, row);
    }
    Ok((snap.by_id.len() as u64 == count).then_some(snap))
}

/// How long before the previous refresh a row's `update_time` must lie for
/// an unchanged time to mean an unchanged row: 1 second (see
/// [`changed_since`]).
const RECENT: Duration = Duration::from_secs(1);

/// Ids a refresh reads whole per query: 1,000.
const REREAD_PAGE: usize = 1_000;

/// The time from which the next refresh reads changed rows: the
/// database's time now, less [`CHANGE_SLACK`] (a change made before now
/// and committed later is still seen).
async fn since<C: ConnectionTrait>(db: &C) -> Result<chrono::NaiveDateTime> {
    let slack = chrono::Duration::from_std(CHANGE_SLACK).unwrap_or_default();
    Ok(crate::state::clock::db_now(db).await? - slack)
}

/// Validates `row` and puts it in the maps, in place of what they held
/// under its id (and its former name).
fn put(snap: &mut Snapshot, stored: StoredRow) {
    let mut entry = stored.validate().map(Arc::new);
    let StoredRow { row, unreadable } = stored;
    if let Err(e) = &entry {
        if row.name == ALERT_DEF {
            tracing::error!(error = %e, "the alert definition row is invalid; alerts use the built-in policy until it is fixed");
            entry = crate::alert::builtin_def(row.id, &row.email).map(Arc::new);
        } else {
            tracing::warn!(def = %row.name, error = %e, "invalid notify_def row");
        }
    }
    let by_name = Arc::make_mut(&mut snap.by_name);
    if let Some(former) = Arc::make_mut(&mut snap.names).insert(row.id, row.name.clone())
        && former != row.name
        && by_name.get(&former) == Some(&row.id)
    {
        by_name.remove(&former);
    }
    snap.max_id = Ord::max(snap.max_id, row.id);
    // An unreadable row has no time held: every refresh reads it again.
    match unreadable {
        None => Arc::make_mut(&mut snap.touched).insert(row.id, row.update_time),
        Some(_) => Arc::make_mut(&mut snap.touched).remove(&row.id),
    };
    Arc::make_mut(&mut snap.by_id).insert(row.id, entry);
    by_name.insert(row.name, row.id);
}

fn lookup(snap: &Snapshot, key: Key<'_>) -> Option<Result<Arc<Def>>> {
    let entry = match key {
        Key::Name(name) => snap.by_name.get(name).and_then(|id| snap.by_id.get(id)),
        Key::Id(id) => snap.by_id.get(&id),
    }?;
    Some(entry.clone().map_err(Error::InvalidDef))
}
