//! Cache: validated definitions read from `notify_def`, refreshed on a short TTL.
//!
//! The whole table is read at once (it holds one row per kind of notification,
//! not per notice). A snapshot older than the TTL is reloaded on next use, and a
//! name or id that is missing triggers a reload too (at most one every
//! [`MISS_RELOAD_INTERVAL`]), so rows inserted or edited in place take effect
//! without a restart.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, EntityTrait};

use super::{Def, store::validate_row};
use crate::{
    alert::ALERT_DEF,
    entity::notify_def,
    error::{DefinitionError, Error, Result},
};

/// Default time a snapshot of `notify_def` is trusted: 5 seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// Minimum time between two reloads caused by an unknown name or id: 250 ms.
pub const MISS_RELOAD_INTERVAL: Duration = Duration::from_millis(250);

type Entry = Result<Arc<Def>, DefinitionError>;

#[derive(Default)]
struct Snapshot {
    loaded_at: Option<Instant>,
    by_name: HashMap<String, Entry>,
    by_id: HashMap<i64, Entry>,
}

/// A TTL cache of validated definitions.
pub struct DefCache {
    ttl: Duration,
    snapshot: RwLock<Arc<Snapshot>>,
    reload: tokio::sync::Mutex<()>,
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

    /// The definition with id `id` in the current snapshot, without
    /// reloading (however old the snapshot is); `None` if absent or invalid.
    pub fn peek(&self, id: i64) -> Option<Arc<Def>> {
        self.current().by_id.get(&id).and_then(|e| e.clone().ok())
    }

    /// Whether the current snapshot (however old) holds a valid ordered
    /// definition (`ordering = "per_key"`): then sweeps set aside the
    /// notices that wait for their turn ([`crate::state::order`]).
    pub fn any_ordered(&self) -> bool {
        self.current().by_id.values().any(|e| {
            e.as_ref()
                .is_ok_and(|d| matches!(d.ordering, super::Ordering::PerKey { .. }))
        })
    }

    /// Forgets the snapshot so the next use reloads.
    pub fn invalidate(&self) {
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

    fn replace(&self, snap: Snapshot) {
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
        let rows = notify_def::Entity::find().all(db).await?;
        let mut snap = Snapshot {
            loaded_at: Some(Instant::now()),
            ..Snapshot::default()
        };
        for row in rows {
            let mut entry = validate_row(&row).map(Arc::new);
            if let Err(e) = &entry {
                if row.name == ALERT_DEF {
                    tracing::error!(error = %e, "the alert definition row is invalid; alerts use the built-in policy until it is fixed");
                    entry = crate::alert::builtin_def(row.id, &row.email).map(Arc::new);
                } else {
                    tracing::warn!(def = %row.name, error = %e, "invalid notify_def row");
                }
            }
            snap.by_id.insert(row.id, entry.clone());
            snap.by_name.insert(row.name, entry);
        }
        self.replace(snap);
        Ok(self.current())
    }
}

fn lookup(snap: &Snapshot, key: Key<'_>) -> Option<Result<Arc<Def>>> {
    let entry = match key {
        Key::Name(name) => snap.by_name.get(name),
        Key::Id(id) => snap.by_id.get(&id),
    }?;
    Some(entry.clone().map_err(Error::InvalidDef))
}
