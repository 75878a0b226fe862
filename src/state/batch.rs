//! Batch: the transitions of many leases in one statement or one
//! transaction, for sweeps.

use std::collections::{HashMap, HashSet};

use sea_orm::{DbBackend, DbErr, sea_query::Expr};

use super::{
    Lease, Lost, Store, Written, clock,
    columns::{self, Column, Set, Table},
    errors_log,
    insert::{self, NewRow},
};
use crate::{db, entity::read::Unreadable, status::Status};

pub(crate) use super::columns::ClaimNext;

/// A batch transition that could not be written; the leases are still held.
pub(crate) struct HeldMany {
    /// The leases, as they were.
    pub leases: Vec<Lease>,
    /// Why the write failed.
    pub error: DbErr,
}

fn pairs(leases: &[Lease]) -> Vec<(i64, i32)> {
    leases.iter().map(|l| (l.id(), l.version())).collect()
}

/// What a batch of successes claimed ([`succeed_many`]).
#[derive(Default)]
pub(crate) struct Claims {
    /// One run per key: the next notice in turn first, then those claimed
    /// behind it, in order. Each may be sent only once the one before it
    /// is recorded.
    pub runs: Vec<Vec<Lease>>,
    /// Rows claimed that must not be sent: behind a row of their run that
    /// the statement could not claim, or in a run whose last row claimed
    /// does not hold its key (a race). To release.
    pub stray: Vec<Lease>,
}

impl Claims {
    /// The leases of rows claimed, sorted into runs ([`sort_runs`]); the
    /// rows claimed that cannot be read are parked.
    async fn of(
        store: &Store,
        claimed: Vec<columns::ClaimedNext>,
        unreadable: Vec<Unreadable>,
        started: std::time::Instant,
    ) -> Self {
        park_unreadable(store, unreadable).await;
        let rows = claimed.into_iter().map(|c| {
            let lease = Lease::new(store.clone(), c.row, started);
            (lease.id(), c.behind, c.holds, lease)
        });
        let (runs, stray) = sort_runs(rows.collect());
        Claims { runs, stray }
    }

    /// How many rows were claimed.
    pub fn len(&self) -> usize {
        self.runs.iter().map(Vec::len).sum::<usize>() + self.stray.len()
    }
}

/// A row claimed, as [`sort_runs`] takes it: `(id, behind, holds, item)`.
type ClaimedRow<T> = (i64, Option<(i64, i64)>, bool, T);

/// Sorts rows claimed, each `(id, behind, holds, item)` (see
/// [`columns::ClaimedNext`]), into runs and strays. A row behind a next
/// notice joins its run while every place before it is filled; then each
/// run is cut after its last row that holds the key, so that a lease holds
/// the key as long as any row of the run is left to send. The rest (after
/// a gap, after the last holder, behind a next notice not claimed) strays.
fn sort_runs<T>(rows: Vec<ClaimedRow<T>>) -> (Vec<Vec<T>>, Vec<T>) {
    let mut behind: HashMap<i64, Vec<(i64, bool, T)>> = HashMap::new();
    let mut heads = Vec::new();
    for (id, after, holds, item) in rows {
        match after {
            None => heads.push((id, holds, item)),
            Some((head, pos)) => behind.entry(head).or_default().push((pos, holds, item)),
        }
    }
    let mut runs = Vec::new();
    let mut stray = Vec::new();
    for (id, holds, head) in heads {
        let mut run = vec![(holds, head)];
        let mut rest = behind.remove(&id).unwrap_or_default();
        rest.sort_by_key(|(pos, ..)| *pos);
        for (place, (pos, holds, item)) in (1..).zip(rest) {
            if pos == place && run.len() as i64 == place {
                run.push((holds, item));
            } else {
                stray.push(item);
            }
        }
        while run.last().is_some_and(|(holds, _)| !holds) {
            stray.extend(run.pop().map(|(_, item)| item));
        }
        if !run.is_empty() {
            runs.push(run.into_iter().map(|(_, item)| item).collect());
        }
    }
    stray.extend(behind.into_values().flatten().map(|(.., item)| item));
    (runs, stray)
}

/// Moves the leased rows to history as succeeded, copying them server-side
/// (one statement on PostgreSQL, which also deals with the next notice of
/// each ordering key moved: [`order`](super::order)). With `next` (on
/// PostgreSQL) that next notice is claimed for the caller when it is in
/// turn ([`columns::ClaimNext`]), with the run behind it, else made due;
/// but not for the keys of `next`'s ids (leases whose caller holds the
/// next notices of their key already). Returns each notice's outcome, in
/// the leases' order (its id, or [`Lost`]: its claim was lost meanwhile,
/// nothing written for it), and what was claimed.
pub(crate) async fn succeed_many(
    store: &Store,
    leases: Vec<Lease>,
    next: Option<(&ClaimNext, &[i64])>,
) -> Result<(Vec<Written<i64>>, Claims), HeldMany> {
    if leases.is_empty() {
        return Ok((Vec::new(), Claims::default()));
    }
    let pairs = pairs(&leases);
    let guard = columns::at_versions(&pairs);
    let sets: Vec<Set> = vec![
        (Column::Leased, Expr::val(false)),
        (Column::Status, Expr::val(Status::Succeeded as i16)),
    ];
    // Only a batch with ordered notices has a next notice to claim.
    let next = next
        .filter(|_| leases.iter().any(|l| l.row().ordering_key.is_some()))
        .map(|(next, continuing)| (next, store.lease, continuing));
    // Before the statement: the in-process lease never outlives the row's.
    let started = std::time::Instant::now();
    let moved = db::on_conflict_retry(|| async {
        if store.backend() == DbBackend::Postgres {
            return columns::succeed_pairs_pg(&store.db, &pairs, next).await;
        }
        let txn = db::begin(&store.db).await?;
        let moved = columns::move_rows(
            &txn,
            Table::Live,
            Table::History,
            guard.clone(),
            sets.clone(),
        )
        .await?;
        txn.commit().await?;
        Ok((moved, Vec::new(), Vec::new()))
    })
    .await;
    match moved {
        Ok((moved, claimed, unreadable)) => {
            let claimed = Claims::of(store, claimed, unreadable, started).await;
            crate::counters::claimed(claimed.len() as u64);
            // On PostgreSQL the statement dealt with the next notices
            // already; this check, after its commit, catches a notice
            // committed (or a head cancelled) while the statement ran,
            // which it could not see. A key whose next notice was claimed,
            // now or before, is busy until that one finishes.
            let continuing: HashSet<i64> = next
                .map(|(_, _, ids)| ids.iter().copied().collect())
                .unwrap_or_default();
            let busy: HashSet<(i64, &Option<String>)> = claimed
                .runs
                .iter()
                .filter_map(|run| run.first().map(Lease::key))
                .chain(
                    leases
                        .iter()
                        .filter(|l| continuing.contains(&l.id()))
                        .map(Lease::key),
                )
                .collect();
            store
                .finished(leases.iter().map(Lease::key).filter(|k| !busy.contains(k)))
                .await;
            let results = leases
                .into_iter()
                .map(|lease| {
                    let (id, version) = (lease.id(), lease.version());
                    lease.settle();
                    if moved.contains(&id) {
                        Ok(id)
                    } else {
                        Err(Lost { id, version })
                    }
                })
                .collect();
            Ok((results, claimed))
        }
        Err(error) => Err(HeldMany { leases, error }),
    }
}

/// Makes the leased rows due again at once. Returns how many were released
/// (the rest were lost meanwhile).
pub(crate) async fn release_many(store: &Store, leases: Vec<Lease>) -> Result<u64, HeldMany> {
    if leases.is_empty() {
        return Ok(0);
    }
    let guard = columns::at_versions(&pairs(&leases));
    let sets = vec![
        (Column::Leased, Expr::val(false)),
        (Column::NextCallTime, clock::now(store.backend())),
    ];
    match db::on_conflict_retry(|| columns::update(&store.db, guard.clone(), sets.clone())).await {
        Ok(n) => {
            leases.into_iter().for_each(Lease::settle);
            Ok(n)
        }
        Err(error) => Err(HeldMany { leases, error }),
    }
}

/// Parks the leased rows (history, status 6) with `reason` in each failure
/// log (a line dated `at`), and queues `alert` once for all of them, in one
/// transaction.
/// Returns the ids parked.
pub(crate) async fn park_many(
    store: &Store,
    leases: Vec<Lease>,
    reason: &str,
    at: chrono::NaiveDateTime,
    alert: Option<&NewRow>,
) -> Result<Vec<i64>, HeldMany> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let parked = db::on_conflict_retry(|| async {
        let txn = db::begin(&store.db).await?;
        let mut parked = Vec::new();
        for lease in &leases {
            let errors =
                errors_log::append_note(&lease.row().errors, at, &format!("parked: {reason}"));
            let sets: Vec<Set> = vec![
                (Column::Leased, Expr::val(false)),
                (Column::Status, Expr::val(Status::Parked as i16)),
                (Column::Errors, Expr::val(errors)),
            ];
            let guard = columns::at_version(lease.id(), lease.version());
            parked
                .extend(columns::move_rows(&txn, Table::Live, Table::History, guard, sets).await?);
        }
        if !parked.is_empty()
            && let Some(alert) = alert
        {
            insert::insert_plain(&txn, alert).await?;
        }
        txn.commit().await?;
        Ok(parked)
    })
    .await;
    match parked {
        Ok(parked) => {
            store.finished(leases.iter().map(Lease::key)).await;
            leases.into_iter().for_each(Lease::settle);
            Ok(parked)
        }
        Err(error) => Err(HeldMany { leases, error }),
    }
}

/// Parks, in `conn` (a transaction except on PostgreSQL), notice rows
/// that cannot be read as notices: each to history, status 6, with why in
/// its failure log (a fresh log when the old one is what cannot be read).
/// Each is guarded by its id and the version read, or by its id alone
/// when even the version cannot be read (SQLite): the caller must hold the
/// rows (its transaction's lock, SQLite's write lock, or its fresh
/// claim). Their cells are copied as they are (the evidence stays), but a
/// version no reader can use, which is 0 then. Returns the ids parked.
pub(crate) async fn park_unreadable_in<C: sea_orm::ConnectionTrait>(
    conn: &C,
    rows: &[Unreadable],
    at: chrono::NaiveDateTime,
) -> Result<Vec<i64>, DbErr> {
    use sea_orm::{ExprTrait, sea_query::Condition};
    let mut parked = Vec::new();
    for row in rows {
        let log = row.errors.as_deref().unwrap_or_default();
        let errors = errors_log::append_note(log, at, &format!("parked: {}", row.reason()));
        let mut sets: Vec<Set> = vec![
            (Column::Leased, Expr::val(false)),
            (Column::Status, Expr::val(Status::Parked as i16)),
            (Column::Errors, Expr::val(errors)),
        ];
        // A version no reader can use (SQLite: a real, or past 32 bits)
        // starts again at 0 in history, so an operator can requeue,
        // cancel or purge the row.
        if row.version.and_then(|v| i32::try_from(v).ok()).is_none() {
            sets.push((Column::Version, Expr::val(0)));
        }
        // Bound as the other guards bind it (`columns::at_version`: INT4)
        // when it fits: PostgreSQL's prepared statements are cached by
        // their text, and one cached with an INT4 parameter refuses the
        // 8 bytes of an INT8 ("incorrect binary data format"). Only
        // SQLite holds a version past 32 bits.
        let mut guard = Condition::all().add(Expr::col(Column::Id).eq(row.id));
        match row.version.map(|v| (v, i32::try_from(v))) {
            Some((_, Ok(version))) => guard = guard.add(Expr::col(Column::Version).eq(version)),
            Some((version, Err(_))) => guard = guard.add(Expr::col(Column::Version).eq(version)),
            None => {}
        }
        parked.extend(columns::move_rows(conn, Table::Live, Table::History, guard, sets).await?);
    }
    Ok(parked)
}

/// Parks rows a claim took that cannot be read as notices
/// ([`park_unreadable_in`], in a transaction of its own, retried on
/// conflicts), counts them (`solid_notify_notices_unreadable_total`),
/// logs each, and promotes the next notice of their keys. One that cannot
/// be parked now stays leased until its lease ends; the next claim parks
/// it then.
pub(crate) async fn park_unreadable(store: &Store, rows: Vec<Unreadable>) {
    if rows.is_empty() {
        return;
    }
    let at = chrono::Utc::now().naive_utc();
    let parked = db::on_conflict_retry(|| async {
        let txn = db::begin(&store.db).await?;
        let parked = park_unreadable_in(&txn, &rows, at).await?;
        txn.commit().await?;
        Ok(parked)
    })
    .await;
    match parked {
        Ok(parked) => parked_unreadable(store, &rows, &parked).await,
        Err(e) => {
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            tracing::error!(error = %e, ?ids, "cannot park notices that cannot be read; they are claimed again when their leases end");
        }
    }
}

/// After unreadable rows were parked (`parked`, their ids): counted,
/// logged, and the next notice of their keys promoted.
pub(crate) async fn parked_unreadable(store: &Store, rows: &[Unreadable], parked: &[i64]) {
    let done: Vec<&Unreadable> = rows.iter().filter(|r| parked.contains(&r.id)).collect();
    crate::counters::unreadable(done.len() as u64);
    for row in &done {
        tracing::error!(notice_id = row.id, def_id = ?row.def_id, reason = %row.reason(), "parked a notice row that cannot be read");
    }
    let keys: Vec<(i64, String)> = done
        .iter()
        .filter_map(|r| r.def_id.zip(r.ordering_key.clone()))
        .collect();
    store.finished_keys(keys).await;
}

#[cfg(test)]
mod tests {
    use super::{ClaimedRow, sort_runs};

    /// Rows whose items are their ids.
    fn sorted(rows: &[ClaimedRow<()>]) -> (Vec<Vec<i64>>, Vec<i64>) {
        let (mut runs, mut stray) =
            sort_runs(rows.iter().map(|&(id, b, h, ())| (id, b, h, id)).collect());
        runs.sort();
        stray.sort();
        (runs, stray)
    }

    #[test]
    fn a_whole_run_keeps_its_order_whatever_the_order_rows_come_in() {
        let rows = [
            (12, Some((10, 2)), true, ()),
            (10, None, true, ()),
            (11, Some((10, 1)), false, ()),
            (20, None, true, ()),
        ];
        assert_eq!(sorted(&rows), (vec![vec![10, 11, 12], vec![20]], vec![]));
    }

    #[test]
    fn a_gap_cuts_the_run_back_to_its_last_holder() {
        // Place 2 was not claimed: 11 does not hold, so only the head goes.
        let rows = [
            (10, None, true, ()),
            (11, Some((10, 1)), false, ()),
            (13, Some((10, 3)), true, ()),
        ];
        assert_eq!(sorted(&rows), (vec![vec![10]], vec![11, 13]));
    }

    #[test]
    fn a_run_whose_last_row_does_not_hold_is_cut() {
        let rows = [
            (10, None, true, ()),
            (11, Some((10, 1)), true, ()),
            (12, Some((10, 2)), false, ()),
        ];
        assert_eq!(sorted(&rows), (vec![vec![10, 11]], vec![12]));
    }

    #[test]
    fn rows_behind_a_next_notice_not_claimed_stray() {
        let rows = [
            (11, Some((10, 1)), false, ()),
            (12, Some((10, 2)), true, ()),
        ];
        assert_eq!(sorted(&rows), (vec![], vec![11, 12]));
    }

    #[test]
    fn a_head_that_does_not_hold_is_not_sent() {
        let rows = [(10, None, false, ())];
        assert_eq!(sorted(&rows), (vec![], vec![10]));
    }
}
