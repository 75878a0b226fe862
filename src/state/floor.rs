//! Floor: a lower bound on the due times a worker's claims read, so that a
//! claim does not walk the due index's dead entries (ADR 0017).
//!
//! A claim reads the due index from its start (`due_at <= now ORDER BY
//! due_at`). Every notice sent leaves an entry at that start, which the
//! database removes only once no snapshot can see its row: on PostgreSQL
//! (index entries of dead tuples) and MariaDB (delete-marked records its
//! purge has not reached), a transaction held open for minutes makes every
//! claim walk every row sent since it began (ADR 0016: on PostgreSQL,
//! throughput fell to 64% and p50 rose to 55 s after 6 minutes of such a
//! reader).
//!
//! A worker's claims therefore read only rows due at or after its floor:
//! the earliest due time of the rows in flight it may take (any status a
//! claim takes, paused definitions and rows waiting for their key's turn
//! included, leased rows included), but never later than [`GUARD`] before
//! the database's now. Rows written later are due at or after their insert
//! (the database's clock sets `next_call_time`), so above the floor, but
//! for two kinds:
//! - rows of a producer transaction that committed more than [`GUARD`]
//!   after its insert (or, for plain SQL relying on the column default,
//!   after its transaction began);
//! - rows written with an explicit earlier due time.
//!
//! Those are not lost: every [`RESCAN`] the floor is computed again from
//! the whole index, which finds them, and the next claim takes them.
//! Between two rescans the floor only rises, each [`REFRESH`], by a look-up
//! that starts at the floor. SQLite has no such dead entries, and no floor.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::NaiveDateTime;
use sea_orm::DbBackend;

use super::{Store, claim::DueFilter};

/// How far behind the database's now a floor stays at least: 1 s. Rows
/// whose producer committed more than this after their insert are claimed
/// after the next [`RESCAN`] instead of at once. Each claim reads the index
/// entries of the notices sent in this span (and [`REFRESH`]).
pub const GUARD: Duration = Duration::from_secs(1);

/// How often a worker raises its floor: every 250 ms, at its next claim.
pub const REFRESH: Duration = Duration::from_millis(250);

/// How often a worker computes its floor from the whole due index again,
/// finding rows written below it: every 10 s, at its next claim. The
/// longest a row below the floor waits (plus the time to the next claim:
/// at most the worker's tick).
pub const RESCAN: Duration = Duration::from_secs(10);

/// A worker's floor, shared by the filters it builds. The default has
/// none: its claims read the whole due index.
#[derive(Clone, Default)]
pub struct Floor(Option<Arc<Kept>>);

/// A kept floor: how often it is computed again from the whole index, and
/// what is known.
struct Kept {
    rescan: Duration,
    known: Mutex<Option<Known>>,
}

/// A floor computed for one selection of rows.
#[derive(Clone)]
struct Known {
    /// The rows it bounds (the filter it was computed for).
    of: DueFilter,
    /// The earliest due time a claim reads.
    at: NaiveDateTime,
    /// When it was last raised.
    refreshed: Instant,
    /// When it was last computed from the whole index.
    scanned: Instant,
}

impl Floor {
    /// A floor that is kept, for a worker's claims.
    pub fn kept() -> Self {
        Self::rescanning(RESCAN)
    }

    /// A kept floor computed from the whole index every `rescan`.
    pub(crate) fn rescanning(rescan: Duration) -> Self {
        Floor(Some(Arc::new(Kept {
            rescan,
            known: Mutex::new(None),
        })))
    }

    fn known(&self) -> Option<Known> {
        let kept = self.0.as_ref()?;
        kept.known.lock().ok().and_then(|known| known.clone())
    }

    fn set(&self, known: Option<Known>) {
        if let Some(kept) = &self.0
            && let Ok(mut slot) = kept.known.lock()
        {
            *slot = known;
        }
    }

    /// The floor for `filter`'s rows as last computed, if it still bounds
    /// them (no look-up): for the due-time look-up.
    pub(crate) fn current(&self, filter: &DueFilter, backend: DbBackend) -> Option<NaiveDateTime> {
        if backend == DbBackend::Sqlite {
            return None;
        }
        self.known()
            .filter(|k| same_rows(&k.of, filter))
            .map(|k| k.at)
    }

    /// The floor a claim of `filter`'s rows uses now: computed from the
    /// whole index when none bounds these rows or the last such look-up
    /// is [`RESCAN`] old, raised when it is [`REFRESH`] old. `None` (the
    /// claim reads the whole index) on SQLite, for a filter without a kept
    /// floor, or when the look-up fails (logged).
    pub(crate) async fn for_claim(
        &self,
        store: &Store,
        filter: &DueFilter,
    ) -> Option<NaiveDateTime> {
        let rescan = self.0.as_ref()?.rescan;
        if store.backend() == DbBackend::Sqlite {
            return None;
        }
        let known = self.known().filter(|k| same_rows(&k.of, filter));
        let from = match &known {
            Some(k) if k.scanned.elapsed() < rescan => {
                if k.refreshed.elapsed() < REFRESH {
                    return Some(k.at);
                }
                Some(k.at)
            }
            _ => None,
        };
        let asked = Instant::now();
        match super::claim::lowest_due(store, filter, from, GUARD).await {
            Ok(at) => {
                let scanned = match (&known, from) {
                    (Some(k), Some(_)) => k.scanned,
                    (Some(k), None) => {
                        if at < k.at {
                            tracing::debug!(floor = %k.at, found = %at, "notices due below the claim floor (committed more than {GUARD:?} after their insert, or written due earlier): claimed now");
                        }
                        asked
                    }
                    (None, _) => asked,
                };
                self.set(Some(Known {
                    of: without_floor(filter),
                    at,
                    refreshed: asked,
                    scanned,
                }));
                Some(at)
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot compute the claim floor; claiming from the whole due index");
                self.set(None);
                None
            }
        }
    }
}

/// `filter` with no floor of its own, to remember which rows a floor bounds.
fn without_floor(filter: &DueFilter) -> DueFilter {
    DueFilter {
        floor: Floor::default(),
        ..filter.clone()
    }
}

/// Whether `a` and `b` select the same rows.
fn same_rows(a: &DueFilter, b: &DueFilter) -> bool {
    a.defs == b.defs
        && a.partitions == b.partitions
        && a.any_partition == b.any_partition
        && a.always == b.always
}

impl std::fmt::Debug for Floor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.known() {
            Some(k) => write!(f, "Floor({})", k.at),
            None => write!(f, "Floor(none)"),
        }
    }
}

/// Floors never make filters differ: equal filters select the same rows.
impl PartialEq for Floor {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Floor {}
