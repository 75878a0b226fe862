//! Batch: the transitions of many leases in one statement or one
//! transaction, for sweeps.

use std::collections::HashSet;

use sea_orm::{DbBackend, DbErr, sea_query::Expr};

use super::{
    Lease, Store, clock,
    columns::{self, Column, Set, Table},
    errors_log,
    insert::{self, NewRow},
};
use crate::{Status, db};

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

/// Moves the leased rows to history as succeeded, copying them server-side
/// (one statement on PostgreSQL, which also deals with the next notice of
/// each ordering key moved: [`order`](super::order)). With `next` (on
/// PostgreSQL) that next notice is claimed for the caller when it is in
/// turn ([`columns::ClaimNext`]), else made due. Returns each notice id
/// with whether it moved (`false`: its claim was lost meanwhile), and the
/// leases of the notices claimed.
pub(crate) async fn succeed_many(
    store: &Store,
    leases: Vec<Lease>,
    next: Option<&ClaimNext>,
) -> Result<(Vec<(i64, bool)>, Vec<Lease>), HeldMany> {
    if leases.is_empty() {
        return Ok((Vec::new(), Vec::new()));
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
        .map(|next| (next, store.lease));
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
        Ok((moved, Vec::new()))
    })
    .await;
    match moved {
        Ok((moved, claimed)) => {
            let claimed: Vec<Lease> = claimed
                .into_iter()
                .map(|row| Lease::new(store.clone(), row, started))
                .collect();
            crate::telemetry::claimed(claimed.len() as u64);
            // On PostgreSQL the statement dealt with the next notices
            // already; this check, after its commit, catches a notice
            // committed (or a head cancelled) while the statement ran,
            // which it could not see. A key whose next notice was claimed
            // is busy until that one finishes.
            let busy: HashSet<(i64, &Option<String>)> = claimed.iter().map(Lease::key).collect();
            store
                .finished(leases.iter().map(Lease::key).filter(|k| !busy.contains(k)))
                .await;
            let results = leases
                .into_iter()
                .map(|lease| {
                    let id = lease.id();
                    lease.settle();
                    (id, moved.contains(&id))
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
