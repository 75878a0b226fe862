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

use std::sync::Arc;

use super::engine::Engine;
use super::{
    AttemptReport, AttemptResult, Recorder, available, deliver,
    pending::{PendingNotice, Start},
    record::Recorded,
};
use crate::state::{Lease, claim};

/// Starts background attempts of committed notices, as far as free slots
/// allow; the rest are released, due at once for a sweeper.
pub(crate) fn after_commit(engine: &Arc<Engine>, pending: Vec<PendingNotice>) {
    let mut left = Vec::new();
    for p in pending {
        if p.is_later() {
            // Delayed: a sweeper takes it when it is due.
            continue;
        }
        if !p.attempted_here() || engine.lifecycle.tasks.is_closed() {
            left.push(p);
            continue;
        }
        let Ok(permit) = engine.lifecycle.background.clone().try_acquire_owned() else {
            tracing::debug!(
                notice_id = p.id,
                "no background slot; due now for a sweeper"
            );
            left.push(p);
            continue;
        };
        let task = engine.clone();
        engine.lifecycle.tasks.spawn(async move {
            attempt_boxed(task, p).await;
            drop(permit);
        });
    }
    not_attempted(engine, left);
}

/// Boxed, hence `Send` by its type: a failure's alert is itself attempted
/// after commit, so this future contains itself.
fn attempt_boxed(
    engine: Arc<Engine>,
    p: PendingNotice,
) -> futures::future::BoxFuture<'static, AttemptReport> {
    Box::pin(async move { attempt(&engine, p).await })
}

/// Attempts committed notices now and waits for each outcome.
pub(crate) async fn wait_for(
    engine: &Arc<Engine>,
    pending: Vec<PendingNotice>,
) -> Vec<AttemptReport> {
    if engine.lifecycle.tasks.is_closed() {
        let reports = pending
            .iter()
            .map(|p| AttemptReport {
                notice_id: p.id(),
                result: match p.is_later() {
                    true => AttemptResult::Scheduled,
                    false => AttemptResult::Released {
                        reason: "shutting down".into(),
                    },
                },
            })
            .collect();
        not_attempted(
            engine,
            pending.into_iter().filter(|p| !p.is_later()).collect(),
        );
        return reports;
    }
    // Counted as running, so that shutdown waits for them.
    let _running = engine.lifecycle.tasks.token();
    let attempts = pending
        .into_iter()
        .map(|p| attempt_boxed(engine.clone(), p));
    futures::future::join_all(attempts).await
}

/// One after-commit attempt: get hold of the row, then the one path.
async fn attempt(engine: &Arc<Engine>, mut p: PendingNotice) -> AttemptReport {
    let notice_id = p.id;
    let report = |result| AttemptReport { notice_id, result };
    if !p.is_new() {
        return report(AttemptResult::AlreadyAdded);
    }
    if p.is_later() {
        return report(AttemptResult::Scheduled);
    }
    if !p.attempted_here() {
        not_attempted(engine, vec![p]);
        let reason = if engine.settings.immediate_attempt {
            "committed during shutdown: due now for a sweeper"
        } else {
            "after-commit attempts are off (Config::immediate_attempt): due now for a sweeper"
        };
        return report(AttemptResult::Skipped {
            reason: reason.into(),
        });
    }
    if let Err(reason) = available(engine, &p.def).and_then(|()| deliver::paused(&p.def)) {
        not_attempted(engine, vec![p]);
        return report(AttemptResult::Skipped { reason });
    }
    let in_turn = p.start == Start::ClaimInTurn;
    // The param moves into the lease: no copy stays here.
    let claimed = match p.start {
        // The reservation is this attempt's lease (version 0, from the insert).
        Start::Held => {
            crate::counters::claimed(1);
            let model = p.take_model();
            Ok(Some(Lease::new(engine.store.clone(), model, p.written)))
        }
        Start::ClaimReservation => {
            let model = p.take_model();
            claim::claim_reserved(&engine.store, &model, p.written).await
        }
        Start::ClaimInTurn => claim::claim_in_turn(&engine.store, p.id).await,
        Start::ClaimDue | Start::Sweeper | Start::Later | Start::Existing => {
            let model = p.take_model();
            claim::claim_one(&engine.store, &model).await
        }
    };
    if in_turn && !matches!(claimed, Ok(Some(_))) {
        // Not taken here: its key is checked now that this claim has ended
        // (checked while it ran, the check's lock would have made the claim
        // skip the row, and nothing would attempt it before a poll).
        recheck_turns(engine, &[&p]);
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
    let result = super::run(
        engine,
        p.def,
        lease,
        &Recorder::Inline,
        &engine.lifecycle.stop,
        None,
    )
    .await
    .result();
    report(result)
}

/// Starts what a recorded outcome asks for next (the alert and event
/// notices it queued, attempted after their commit) and gives its result.
/// The only way to read a [`Recorded`] outside the attempt layer.
pub(crate) fn follow_up(engine: &Arc<Engine>, recorded: Recorded) -> AttemptResult {
    if !recorded.follow.is_empty() {
        after_commit(engine, recorded.follow);
    }
    recorded.result
}

/// Notices that are not attempted here after all (or whose commit is in
/// doubt): reserved rows are released, due at once for a sweeper, and the
/// keys of ordered ones are checked ([`recheck_turns`]).
pub(crate) fn not_attempted(engine: &Arc<Engine>, pending: Vec<PendingNotice>) {
    recheck_turns(engine, &pending.iter().collect::<Vec<_>>());
    release_reservations(engine, pending);
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
fn recheck_turns(engine: &Arc<Engine>, pending: &[&PendingNotice]) {
    if engine.store.backend() != sea_orm::DbBackend::Postgres {
        return;
    }
    let keys = pending
        .iter()
        .filter(|p| p.is_new())
        .filter_map(|p| Some((p.def.id, p.row.ordering_key.clone()?)));
    // On the tracked tasks, so that shutdown waits for the check (it only
    // moves a waiting notice's next check earlier).
    engine
        .delivery
        .rechecks
        .queue(&engine.store, &engine.lifecycle.tasks, keys);
}

/// Makes reserved rows due at once (retrying while the database is away,
/// until shutdown gives up: then they are due when the reservation ends).
fn release_reservations(engine: &Arc<Engine>, pending: Vec<PendingNotice>) {
    let rows: Vec<(i64, i64, String)> = pending
        .iter()
        .filter(|p| p.reserved())
        .map(|p| (p.id, p.row.def_id, p.row.param.clone()))
        .collect();
    if rows.is_empty() {
        return;
    }
    let task = engine.clone();
    engine.lifecycle.tasks.spawn(async move {
        let store = task.store.clone();
        let released = crate::db::retry_db(&task.lifecycle.stop.give_up, || async {
            Ok(claim::release_reserved(&store, &rows).await?)
        })
        .await;
        match released {
            Ok(n) => task.count_released(n),
            Err(e) => {
                tracing::warn!(error = %e, n = rows.len(), "cannot release reserved notices; due when their reservation ends");
            }
        }
    });
}
