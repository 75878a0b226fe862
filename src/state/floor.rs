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
//! On PostgreSQL, a worker's claims therefore read only rows due at or
//! after its floor:
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
//! that starts at the floor. SQLite has no such dead entries, and no floor;
//! MariaDB has no floor either (ADR 0017: it slowed claims there).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::NaiveDateTime;
use sea_orm::DbBackend;

use sea_orm::DbErr;

/// How far behind the database's now a floor stays at least: 1 s. Rows
/// whose producer committed more than this after their insert are below
/// it ([`Floor::lower_after_nothing`] and [`RESCAN`] find them). Each claim
/// reads the index entries of the notices sent in this span (and
/// [`REFRESH`]).
pub(crate) const GUARD: Duration = Duration::from_secs(1);

/// How often a worker raises its floor: every 250 ms, at its next claim.
pub(crate) const REFRESH: Duration = Duration::from_millis(250);

/// How often a worker computes its floor from the whole due index again,
/// finding rows written below it: every 10 s, at its next claim, or, when
/// that look-up is slow (a long reader's dead entries), no more than a
/// twentieth of the time ([`SLOW_SHARE`]). The longest a row below the
/// floor waits while claims keep finding others.
pub(crate) const RESCAN: Duration = Duration::from_secs(10);

/// Look-ups from the whole due index take at most a twentieth of a
/// worker's time: after one that took `t`, the next comes no sooner than
/// `20 t` later (and no sooner than [`REFRESH`]).
pub(crate) const SLOW_SHARE: u32 = 20;

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
    /// The rows it bounds: those of the filter it was computed for.
    of: Rows,
    /// The earliest due time a claim reads (`None`: none, claims read the
    /// whole index: a failed look-up, or a row due before 1970).
    at: Option<NaiveDateTime>,
    /// When it was last raised.
    refreshed: Instant,
    /// When it was last computed from the whole index, and how long that
    /// took (`None`: the next look-up reads the whole index).
    scanned: Option<(Instant, Duration)>,
    /// Whether a claim found nothing above it and could not look below
    /// yet ([`Floor::lower_after_nothing`]).
    owed: bool,
}

impl Known {
    /// How long after the last look-up from the whole index another may
    /// come: [`REFRESH`], or [`SLOW_SHARE`] times what it took.
    fn gap(&self) -> Duration {
        self.scanned
            .map_or(Duration::ZERO, |(_, took)| (took * SLOW_SHARE).max(REFRESH))
    }

    /// How long until another look-up from the whole index may come (zero:
    /// now).
    fn wait(&self) -> Duration {
        self.scanned.map_or(Duration::ZERO, |(at, _)| {
            self.gap().saturating_sub(at.elapsed())
        })
    }

    /// Whether the rescan is due.
    fn rescan_due(&self, rescan: Duration) -> bool {
        self.scanned
            .is_none_or(|(at, _)| at.elapsed() >= rescan.max(self.gap()))
    }
}

/// The floor the due-time look-up reads from ([`Floor::current`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Current {
    /// Read from here (`None`: the whole index).
    pub at: Option<NaiveDateTime>,
    /// Answer no later than this: a claim owes a look below the floor, and
    /// may take it then.
    pub by: Option<Duration>,
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

    /// What is known of `filter`'s rows, with how often the whole index is
    /// read again; `None` on SQLite or without a kept floor.
    fn of(&self, rows: Rows, backend: DbBackend) -> Option<(Duration, Option<Known>)> {
        let rescan = self.0.as_ref()?.rescan;
        // PostgreSQL only: on MariaDB the first soak with a floor had p50
        // at 160-186 ms before any reader, against 5-7 ms without (ADR
        // 0017); SQLite has no dead entries.
        if backend != DbBackend::Postgres {
            return None;
        }
        Some((rescan, self.known().filter(|k| k.of == rows)))
    }

    /// The floor for `filter`'s rows as last computed (no look-up), for
    /// the due-time look-up: none (the whole index) once its rescan is due
    /// or a look below it is owed and may be taken, so an idle worker's
    /// due checks and the plan after a sweep find a row below it; while a
    /// look below is owed but may not be taken yet, the floor, answered no
    /// later than when it may.
    pub(crate) fn current(&self, rows: Rows, backend: DbBackend) -> Current {
        let Some((rescan, Some(known))) = self.of(rows, backend) else {
            return Current::default();
        };
        if known.rescan_due(rescan) {
            return Current::default();
        }
        match (known.owed, known.wait()) {
            (false, _) => Current {
                at: known.at,
                by: None,
            },
            (true, Duration::ZERO) => Current::default(),
            (true, wait) => Current {
                at: known.at,
                by: Some(wait),
            },
        }
    }

    /// The floor a claim of `filter`'s rows uses now: computed from the
    /// whole index when none bounds these rows or the rescan is due,
    /// raised when it is [`REFRESH`] old. `None` (the claim reads the
    /// whole index) on SQLite, for a filter without a kept floor, when a
    /// row is due before 1970, or for [`REFRESH`] after a look-up failed
    /// (logged).
    pub(crate) async fn for_claim<F, Fut>(
        &self,
        rows: Rows,
        backend: DbBackend,
        look: F,
    ) -> Option<NaiveDateTime>
    where
        F: FnOnce(Option<NaiveDateTime>) -> Fut,
        Fut: Future<Output = Result<Option<NaiveDateTime>, DbErr>>,
    {
        let (rescan, known) = self.of(rows, backend)?;
        let from = match &known {
            // A look below owed and due: from the whole index.
            Some(k) if k.owed && k.wait().is_zero() => None,
            Some(k) if k.refreshed.elapsed() < REFRESH => return k.at,
            Some(k) if !k.rescan_due(rescan) => k.at,
            _ => None,
        };
        self.look_up(rows, known, from, look).await
    }

    /// After a claim from `floor` took nothing: the floor computed from the
    /// whole index, if it is lower (`Some(None)`: none, claim from the
    /// whole index). A claim finds nothing when a wake-up or tick came for
    /// a row below the floor (a producer that committed late), so the
    /// caller claims again from the lower floor at once. Not while the
    /// last such look-up is recent ([`Known::gap`]): the look below is then
    /// owed, to the next claim or the due-time look-up
    /// ([`current`](Self::current)). Nor when the floor was read from the
    /// whole index after `began` (the claim's start, after the wake-up):
    /// nothing is below it.
    pub(crate) async fn lower_after_nothing<F, Fut>(
        &self,
        rows: Rows,
        backend: DbBackend,
        floor: NaiveDateTime,
        began: Instant,
        look: F,
    ) -> Option<Option<NaiveDateTime>>
    where
        F: FnOnce(Option<NaiveDateTime>) -> Fut,
        Fut: Future<Output = Result<Option<NaiveDateTime>, DbErr>>,
    {
        let (_, known) = self.of(rows, backend)?;
        if known
            .as_ref()
            .and_then(|k| k.scanned)
            .is_some_and(|(at, _)| at >= began)
        {
            return None;
        }
        if let Some(k) = known.as_ref().filter(|k| !k.wait().is_zero()) {
            self.set(Some(Known {
                owed: true,
                ..k.clone()
            }));
            return None;
        }
        match self.look_up(rows, known, None, look).await {
            Some(lower) if lower >= floor => None,
            lower => Some(lower),
        }
    }

    /// Looks the floor up by `look` from `from` (the whole index with
    /// `None`) and keeps it.
    async fn look_up<F, Fut>(
        &self,
        rows: Rows,
        known: Option<Known>,
        from: Option<NaiveDateTime>,
        look: F,
    ) -> Option<NaiveDateTime>
    where
        F: FnOnce(Option<NaiveDateTime>) -> Fut,
        Fut: Future<Output = Result<Option<NaiveDateTime>, DbErr>>,
    {
        let asked = Instant::now();
        let found = match look(from).await {
            Ok(found) => Some(found),
            Err(e) => {
                tracing::debug!(error = %e, "cannot compute the claim floor; claiming from the whole due index for {REFRESH:?}");
                None
            }
        };
        let (at, scanned, owed) = match (&known, from, found) {
            (Some(k), Some(_), Some(at)) => (at, k.scanned, k.owed),
            (_, None, Some(at)) => {
                if let (Some(before), Some(at)) = (known.as_ref().and_then(|k| k.at), at)
                    && at < before
                {
                    tracing::debug!(found = %at, "notices due below the claim floor (committed more than {GUARD:?} after their insert, or written due earlier): claimed now");
                }
                (at, Some((asked, asked.elapsed())), false)
            }
            (None, Some(_), Some(at)) => (at, None, false),
            // A failed look-up: no floor until the next, which reads the
            // whole index.
            (_, _, None) => (None, None, false),
        };
        self.set(Some(Known {
            of: rows,
            at,
            refreshed: asked,
            scanned,
            owed,
        }));
        at
    }
}

/// Which rows a filter selects, as a fingerprint that does not depend on
/// the order of its lists (a worker's list of definitions comes from a map
/// rebuilt every minute) and costs no copy of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows {
    defs: (u8, Ids, i64, i64),
    partitions: Ids,
    any_partition: Ids,
    always: Ids,
}

/// A list of ids, in any order: its length, and its sum, xor and sum of
/// squares (wrapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Ids(usize, u64, u64, u64);

impl Ids {
    fn of<T: Copy + Into<i64>>(ids: &[T]) -> Self {
        ids.iter()
            .fold(Ids(ids.len(), 0, 0, 0), |Ids(n, sum, xor, sq), id| {
                let v = Into::<i64>::into(*id).cast_unsigned();
                Ids(
                    n,
                    sum.wrapping_add(v),
                    xor ^ v,
                    sq.wrapping_add(v.wrapping_mul(v)),
                )
            })
    }
}

impl Rows {
    /// The rows of a filter: its kind of definition list (`kind`, with
    /// `from` and `through` for a range) and its lists of ids.
    pub(crate) fn new(
        kind: u8,
        defs: &[i64],
        range: (i64, i64),
        partitions: &[i32],
        any_partition: &[i64],
        always: &[i64],
    ) -> Self {
        Rows {
            defs: (kind, Ids::of(defs), range.0, range.1),
            partitions: Ids::of(partitions),
            any_partition: Ids::of(any_partition),
            always: Ids::of(always),
        }
    }
}

impl std::fmt::Debug for Floor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.known().and_then(|k| k.at) {
            Some(at) => write!(f, "Floor({at})"),
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

#[cfg(test)]
mod tests {
    use super::Rows;

    fn only(ids: &[i64]) -> Rows {
        Rows::new(1, ids, (0, 0), &[], &[], &[])
    }

    #[test]
    fn a_floor_bounds_the_same_rows_whatever_the_order_of_its_ids() {
        assert_eq!(only(&[1, 2, 3]), only(&[3, 1, 2]));
        assert_ne!(only(&[1, 2, 3]), only(&[1, 2, 4]));
        assert_ne!(only(&[1, 2]), only(&[1, 2, 0]));
        assert_ne!(Rows::new(2, &[2], (1, 9), &[], &[], &[]), only(&[2]));
        assert_ne!(Rows::new(1, &[1], (0, 0), &[], &[], &[7]), only(&[1]));
        assert_ne!(Rows::new(1, &[1], (0, 0), &[0], &[], &[]), only(&[1]));
    }
}
