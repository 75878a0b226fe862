//! Background: the attempt right after a commit.
//!
//! A committed notice is reserved for its producer's process: written
//! `leased`, at version 0, with `next_call_time` one lease ahead (the
//! database's clock, from the insert). The reservation is the after-commit
//! attempt's claim: the attempt starts at once, and sweepers take the row
//! only if the reservation runs out. A notice that will not be attempted here after all
//! (no free background slot, shutdown under way, a handler this process
//! lacks) has its reservation released at once: it is due for any sweeper
//! immediately, never after a whole lease.

use std::time::Instant;

use chrono::NaiveDateTime;

use super::{AttemptReport, AttemptResult, Recorder, available, deliver, record};
use crate::{
    Notifier, Status,
    def::DefRef,
    entity::notify_msg,
    state::{Lease, claim, clock::Due, insert::NewRow},
};

/// A notice written in a transaction, to be attempted after its commit.
///
/// Deliberately not `Clone`: one pending notice is one attempt.
#[derive(Debug)]
pub struct PendingNotice {
    pub(crate) id: i64,
    pub(crate) row: NewRow,
    pub(crate) def: DefRef,
    /// Taken before the statement that wrote the row: its reservation
    /// (lease) cannot have begun earlier.
    pub(crate) written: Instant,
    /// How its after-commit attempt gets hold of the row.
    start: Start,
    /// PostgreSQL, [`Notifier::begin`](crate::Notifier::begin): the row is
    /// buffered and written with the `COMMIT`.
    pub(crate) on_commit: bool,
    /// Claim the reservation even after a commit the library saw.
    claim_after_commit: bool,
}

/// How an after-commit attempt gets hold of its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The row was written reserved for this attempt and the library itself
    /// saw its transaction commit ([`NoticeTx`](crate::NoticeTx) from
    /// [`Notifier::begin`]): the reservation is the attempt's lease.
    Held,
    /// Written reserved, in a transaction whose commit the library did not
    /// see ([`Notifier::add`], a wrapped transaction that may be nested):
    /// the attempt first claims the reservation, so that a transaction that
    /// did not commit, or a second dispatch, sends nothing.
    ClaimReservation,
    /// Written due now (an alert): claimed like any due row, so a sweeper
    /// may take it first, and an ambiguous commit never leaves it waiting.
    ClaimDue,
    /// Written due now with an ordering key: claimed only if no older notice
    /// of its key is unfinished (else a sweeper takes it in its turn).
    ClaimInTurn,
    /// Not attempted after commit (after-commit attempts are off, or the
    /// notifier is shutting down): due now for a sweeper.
    Sweeper,
    /// Nothing was written: an idempotent add found this existing notice.
    Existing,
}

impl PendingNotice {
    /// A notice whose row was written by a statement sent after `written`,
    /// in a transaction whose commit the library has not seen.
    pub(crate) fn new(id: i64, row: NewRow, def: DefRef, written: Instant) -> Self {
        let start = match row.due {
            Due::Reserved(_) => Start::ClaimReservation,
            Due::InTurn => Start::ClaimInTurn,
            Due::Now => Start::Sweeper,
        };
        PendingNotice {
            id,
            row,
            def,
            written,
            start,
            on_commit: false,
            claim_after_commit: false,
        }
    }

    /// An idempotent add that found notice `id` with the same key: nothing
    /// was written, nothing is attempted.
    pub(crate) fn existing(id: i64, row: NewRow, def: DefRef) -> Self {
        PendingNotice {
            start: Start::Existing,
            ..PendingNotice::new(id, row, def, Instant::now())
        }
    }

    /// An alert notice written due now; attempted after its commit when
    /// `attempt_here`, else left to sweepers.
    pub(crate) fn alert(id: i64, row: NewRow, def: DefRef, attempt_here: bool) -> Self {
        PendingNotice {
            start: if attempt_here {
                Start::ClaimDue
            } else {
                Start::Sweeper
            },
            ..PendingNotice::new(id, row, def, Instant::now())
        }
    }

    /// The same notice, its transaction seen to commit by the library.
    pub(crate) fn committed(self) -> Self {
        let start = match self.start {
            Start::ClaimReservation if !self.claim_after_commit => Start::Held,
            other => other,
        };
        PendingNotice { start, ..self }
    }

    /// The same notice, whose row the caller could still roll back to a
    /// savepoint of its own: its attempt claims the reservation even after
    /// a commit the library saw.
    pub(crate) fn claim_after_commit(self) -> Self {
        PendingNotice {
            claim_after_commit: true,
            ..self
        }
    }

    /// The notice's id: the new notice's, or for an idempotent add that
    /// found one, the existing notice's.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Whether the add wrote a new notice (`false`: an idempotent add found
    /// an existing notice with its key and wrote nothing).
    pub fn is_new(&self) -> bool {
        self.start != Start::Existing
    }

    /// Whether the row was written reserved for an after-commit attempt.
    pub(crate) fn reserved(&self) -> bool {
        self.is_new() && self.row.due.reserved()
    }

    /// Whether an after-commit attempt may run in this process.
    fn attempted_here(&self) -> bool {
        !matches!(self.start, Start::Sweeper | Start::Existing)
    }

    /// The row as inserted (times are not known here and are not used),
    /// its param moved out of this pending notice, which keeps no copy of
    /// it while the attempt runs.
    fn take_model(&mut self) -> notify_msg::Model {
        let leased = self.reserved();
        let r = &mut self.row;
        notify_msg::Model {
            id: self.id,
            def_id: r.def_id,
            param: std::mem::take(&mut r.param),
            description: r.description.clone(),
            errors: String::new(),
            status: Status::NotSent,
            retry_times: 0,
            last_call_time: None,
            next_call_time: NaiveDateTime::MIN,
            create_time: NaiveDateTime::MIN,
            version: 0,
            load_balance_num: r.load_balance_num,
            idempotency_key: r.idempotency_key.clone(),
            target_override: r.target_override.clone(),
            leased,
            trace_context: r.trace_context.clone(),
            ordering_key: r.ordering_key.clone(),
            step: 0,
            step_result: None,
        }
    }
}

/// Starts background attempts of committed notices, as far as free slots
/// allow; the rest are released, due at once for a sweeper.
pub(crate) fn after_commit(notifier: &Notifier, pending: Vec<PendingNotice>) {
    let inner = &notifier.inner;
    let mut left = Vec::new();
    for p in pending {
        if !p.attempted_here() || inner.tasks.is_closed() {
            left.push(p);
            continue;
        }
        let Ok(permit) = inner.background.clone().try_acquire_owned() else {
            tracing::debug!(
                notice_id = p.id,
                "no background slot; due now for a sweeper"
            );
            left.push(p);
            continue;
        };
        let notifier = notifier.clone();
        inner.tasks.spawn(async move {
            attempt_boxed(notifier, p).await;
            drop(permit);
        });
    }
    not_attempted(notifier, left);
}

/// Boxed, hence `Send` by its type: a failure's alert is itself attempted
/// after commit, so this future contains itself.
fn attempt_boxed(
    notifier: Notifier,
    p: PendingNotice,
) -> futures::future::BoxFuture<'static, AttemptReport> {
    Box::pin(async move { attempt(&notifier, p).await })
}

/// Attempts committed notices now and waits for each outcome.
pub(crate) async fn wait_for(
    notifier: &Notifier,
    pending: Vec<PendingNotice>,
) -> Vec<AttemptReport> {
    let inner = &notifier.inner;
    if inner.tasks.is_closed() {
        let ids: Vec<i64> = pending.iter().map(PendingNotice::id).collect();
        not_attempted(notifier, pending);
        return ids
            .into_iter()
            .map(|notice_id| AttemptReport {
                notice_id,
                result: AttemptResult::Released {
                    reason: "shutting down".into(),
                },
            })
            .collect();
    }
    // Counted as running, so that shutdown waits for them.
    let _running = inner.tasks.token();
    let attempts = pending
        .into_iter()
        .map(|p| attempt_boxed(notifier.clone(), p));
    futures::future::join_all(attempts).await
}

/// One after-commit attempt: get hold of the row, then the one path.
async fn attempt(notifier: &Notifier, mut p: PendingNotice) -> AttemptReport {
    let inner = &notifier.inner;
    let notice_id = p.id;
    let report = |result| AttemptReport { notice_id, result };
    if !p.is_new() {
        return report(AttemptResult::AlreadyAdded);
    }
    if !p.attempted_here() {
        not_attempted(notifier, vec![p]);
        let reason = if inner.config.immediate_attempt {
            "committed during shutdown: due now for a sweeper"
        } else {
            "after-commit attempts are off (Config::immediate_attempt): due now for a sweeper"
        };
        return report(AttemptResult::Skipped {
            reason: reason.into(),
        });
    }
    if let Err(reason) = available(inner, &p.def).and_then(|()| deliver::paused(&p.def)) {
        not_attempted(notifier, vec![p]);
        return report(AttemptResult::Skipped { reason });
    }
    let in_turn = p.start == Start::ClaimInTurn;
    // The param moves into the lease: no copy stays here.
    let claimed = match p.start {
        // The reservation is this attempt's lease (version 0, from the insert).
        Start::Held => {
            crate::telemetry::claimed(1);
            let model = p.take_model();
            Ok(Some(Lease::new(inner.store.clone(), model, p.written)))
        }
        Start::ClaimReservation => {
            let model = p.take_model();
            claim::claim_reserved(&inner.store, &model, p.written).await
        }
        Start::ClaimInTurn => claim::claim_in_turn(&inner.store, p.id).await,
        Start::ClaimDue | Start::Sweeper | Start::Existing => {
            let model = p.take_model();
            claim::claim_one(&inner.store, &model).await
        }
    };
    if in_turn && !matches!(claimed, Ok(Some(_))) {
        // Not taken here: its key is checked now that this claim has ended
        // (checked while it ran, the check's lock would have made the claim
        // skip the row, and nothing would attempt it before a poll).
        recheck_turns(notifier, &[&p]);
    }
    let lease = match claimed {
        Ok(Some(lease)) => lease,
        Ok(None) if in_turn => {
            return report(AttemptResult::Skipped {
                reason: "not its turn: an older notice of its ordering key is unfinished (or a sweeper took it); sent in its turn".into(),
            });
        }
        Ok(None) => return report(AttemptResult::LostClaim),
        Err(e) => {
            return report(AttemptResult::Error {
                error: format!("{e}; left for a sweeper (due when its reservation, if any, ends)"),
            });
        }
    };
    let result = super::run(notifier, p.def, lease, &Recorder::Inline, &inner.stop, None)
        .await
        .result();
    report(result)
}

/// Notices that are not attempted here after all (or whose commit is in
/// doubt): reserved rows are released, due at once for a sweeper, and the
/// keys of ordered ones are checked ([`recheck_turns`]).
pub(crate) fn not_attempted(notifier: &Notifier, pending: Vec<PendingNotice>) {
    recheck_turns(notifier, &pending.iter().collect::<Vec<_>>());
    release_reservations(notifier, pending);
}

/// PostgreSQL: a notice with an ordering key may have been set aside at
/// its insert (migration 14) behind notices that finished before its
/// commit, when no finish could see it yet. Once its after-commit attempt
/// has not taken it (no handler or slot here, shutting down, paused,
/// attempts off, or not its turn), its key is checked again
/// ([`Store::finished`](crate::state::Store)), in the background, one check
/// at a time for all such keys ([`recheck`](super::recheck)): without this
/// it would wait for its recheck (`order::TURN_RECHECK`). Never while its
/// own claim runs: the check's row lock would make that claim skip it.
fn recheck_turns(notifier: &Notifier, pending: &[&PendingNotice]) {
    let inner = &notifier.inner;
    if inner.store.backend() != sea_orm::DbBackend::Postgres {
        return;
    }
    let keys = pending
        .iter()
        .filter(|p| p.is_new())
        .filter_map(|p| Some((p.def.id, p.row.ordering_key.clone()?)));
    // On the tracked tasks, so that shutdown waits for the check (it only
    // moves a waiting notice's next check earlier).
    inner.rechecks.queue(&inner.store, &inner.tasks, keys);
}

/// Makes reserved rows due at once (retrying while the database is away,
/// until shutdown gives up: then they are due when the reservation ends).
fn release_reservations(notifier: &Notifier, pending: Vec<PendingNotice>) {
    let rows: Vec<(i64, i64, String)> = pending
        .iter()
        .filter(|p| p.reserved())
        .map(|p| (p.id, p.row.def_id, p.row.param.clone()))
        .collect();
    if rows.is_empty() {
        return;
    }
    let inner = notifier.inner.clone();
    notifier.inner.tasks.spawn(async move {
        let store = inner.store.clone();
        let released = record::retry_db(&inner.stop.give_up, || async {
            Ok(claim::release_reserved(&store, &rows).await?)
        })
        .await;
        match released {
            Ok(n) => inner.count_released(n),
            Err(e) => {
                tracing::warn!(error = %e, n = rows.len(), "cannot release reserved notices; due when their reservation ends");
            }
        }
    });
}
