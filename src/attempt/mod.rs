//! Attempt: the one path every attempt takes, whether it comes right after a
//! commit or from a sweeper.
//!
//! 1. **Claim** ([`crate::state::claim`]): the row's version is bumped and a
//!    lease taken from the database's clock. Losing the race sends nothing.
//! 2. **Check the lease**: the attempt starts only while `attempt_timeout`
//!    plus a safety margin ([`Config::lease_margin`](crate::Config::lease_margin))
//!    fits in what is left of the lease; otherwise the row is released.
//! 3. **Deliver** (`deliver`): the channel or handler runs with its own
//!    timeout; errors and panics become retryable failures. At the timeout
//!    (or when shutdown aborts it) the delivery is dropped, always before
//!    the lease can end, so no second sender can overlap it.
//! 4. **Record** (`record`): the outcome becomes the lease's transition,
//!    retried with backoff while the database cannot be reached. A recorder
//!    writes inline, or hands plain successes to a batch (`batch`) that
//!    moves many to history in one statement.
//!
//! Alert hooks run on their own tasks and never hold up delivery or
//! recording.

pub(crate) mod background;
pub(crate) mod batch;
pub(crate) mod breaker;
pub(crate) mod deliver;
pub(crate) mod engine;
pub(crate) mod events;
pub(crate) mod park;
pub(crate) mod pending;
pub(crate) mod plan;
pub(crate) mod recheck;
pub(crate) mod record;
pub(crate) mod runs;

use std::{sync::Arc, time::Instant};

use engine::Engine;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use crate::report::{AttemptReport, AttemptResult};
pub(crate) use batch::Recorder;
pub(crate) use deliver::{available, merged_target};
pub use pending::PendingNotice;

use crate::{
    def::DefRef,
    entity::notify_msg,
    handler::Outcome,
    state::{Lease, claim, rate},
};

/// How long a claim waits when the rate budget cannot be read (a database
/// error): one second, then it is due again.
const RATE_ERROR_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// When attempts must stop: `abort` drops running deliveries (their leases
/// are released), `give_up` stops retrying writes the database refuses
/// (their rows are left to their leases).
#[derive(Debug, Clone, Default)]
pub(crate) struct Stop {
    pub abort: CancellationToken,
    pub give_up: CancellationToken,
}

impl Stop {
    /// Tokens cancelled with these, or on their own.
    pub fn child(&self) -> Stop {
        Stop {
            abort: self.abort.child_token(),
            give_up: self.give_up.child_token(),
        }
    }
}

/// How [`run`] ended.
#[derive(Debug)]
pub(crate) enum Ran {
    /// Recorded (or not) here: how it ended.
    Done(AttemptResult),
    /// A plain success handed to the sweep's batch, which reports it.
    Batched,
}

impl Ran {
    /// The result of an attempt recorded inline (a batched success counts
    /// as succeeded: an inline recorder never batches).
    pub fn result(self) -> AttemptResult {
        match self {
            Ran::Done(result) => result,
            Ran::Batched => AttemptResult::Succeeded,
        }
    }
}

/// Runs the attempt held by `lease`: check the lease, deliver, record.
/// `permit` (a delivery slot) is given back as soon as the delivery ends.
pub(crate) async fn run(
    engine: &Arc<Engine>,
    def: DefRef,
    lease: Lease,
    recorder: &Recorder,
    stop: &Stop,
    permit: Option<OwnedSemaphorePermit>,
) -> Ran {
    let span = tracing::info_span!(
        "attempt",
        notice_id = lease.id(),
        def = %def.name,
        attempt = lease.attempt(),
        outcome = tracing::field::Empty,
        ms = tracing::field::Empty,
    );
    crate::trace::link(&span, lease.row().trace_context.as_deref());
    let started = Instant::now();
    let result = async {
        let timeout = engine.config.attempt_timeout;
        let needed = timeout + engine.config.lease_margin();
        // A pause that began after the claim (as this process last read
        // the definition): released uncharged, like the circuit's.
        if let Some(reason) = held_back(engine, &def, &lease, stop) {
            return Ran::Done(
                Box::pin(record::release(engine, lease, reason, &stop.give_up)).await,
            );
        }
        // Never sent garbled, never failed for good on what a fix of the
        // definition or the keys mends: such a notice is parked.
        if let Some(reason) = deliver::unusable(engine, &def, &lease) {
            drop(permit);
            return Ran::Done(
                Box::pin(park::park_one(engine, &def, lease, reason, &stop.give_up)).await,
            );
        }
        let mut lease = lease;
        // A failed try to be tried again: logged once the next try starts,
        // else it is the attempt's outcome.
        let mut retrying: Option<(chrono::NaiveDateTime, Outcome)> = None;
        let outcome = loop {
            // Every try takes a unit of the definition's rate budget. Over
            // the limit, the first try is released uncharged until the next
            // window; an immediate retry ends the attempt with the failure
            // it retried.
            if let Some(limit) = def.rate_limit {
                let refused = match crate::state::rate::take(&engine.store, def.id, limit).await {
                    Ok(rate::Take::Granted) => None,
                    Ok(rate::Take::Full(wait)) => Some((
                        wait,
                        format!("rate limit {limit} of `{}` reached", def.name),
                    )),
                    // Not at once: the error would come back at once too.
                    Err(e) => Some((
                        RATE_ERROR_WAIT,
                        format!("cannot take from the rate budget of `{}`: {e}", def.name),
                    )),
                };
                if let Some((wait, reason)) = refused {
                    if let Some((_, failure)) = retrying.take() {
                        break Some(failure);
                    }
                    drop(permit);
                    return Ran::Done(
                        Box::pin(record::release_for(
                            engine,
                            lease,
                            wait,
                            reason,
                            &stop.give_up,
                        ))
                        .await,
                    );
                }
            }
            // The checks above took round trips: the try must still fit.
            if lease.remaining() < needed {
                if let Some((_, failure)) = retrying.take() {
                    break Some(failure);
                }
                drop(permit);
                let reason = format!(
                    "only {:?} of the lease left; an attempt needs {needed:?}",
                    lease.remaining()
                );
                return Ran::Done(
                    Box::pin(record::release(engine, lease, reason, &stop.give_up)).await,
                );
            }
            if let Some((at, Outcome::Retry { reason })) = retrying.take() {
                tracing::debug!(notice_id = lease.id(), tries = lease.tries() + 1, %reason, "retrying at once");
                lease.failed_try(at, &reason);
            }
            // Boxed: the delivery's state (any channel's) is freed as soon
            // as it ends, while the attempt may still wait for its recording.
            let delivery = Box::pin(deliver::deliver(engine, &def, &lease, timeout));
            let outcome = tokio::select! {
                outcome = delivery => outcome,
                _ = stop.abort.cancelled() => break None,
            };
            let more_steps = lease.has_next_step(def.steps.len());
            // Right at delivery, before the slot frees: deliveries may run
            // ahead of their recording, and the next one must see a circuit
            // this one opened. A step before the last is no success of the
            // notice: it counts for the circuit only when it fails.
            if !(more_steps && matches!(outcome, Outcome::Success { .. })) {
                engine.observe(&def, &outcome);
            }
            // A step that succeeded and is not the last: recorded, and the
            // next one runs at once in this claim, unless the attempt must
            // stop now (released then, at the next step).
            let outcome = match outcome {
                Outcome::Success { result, note } if more_steps => {
                    match step_result(engine, &def, &lease, result) {
                        Ok(result) => {
                            match record::persist(lease, &stop.give_up, |l| {
                                l.advance(result.clone(), note.as_deref())
                            })
                            .await
                            {
                                Ok(Ok(next)) => {
                                    if let Some(reason) = held_back(engine, &def, &next, stop) {
                                        drop(permit);
                                        return Ran::Done(
                                            Box::pin(record::release(
                                                engine,
                                                next,
                                                reason,
                                                &stop.give_up,
                                            ))
                                            .await,
                                        );
                                    }
                                    lease = next;
                                    continue;
                                }
                                Ok(Err(_lost)) => {
                                    drop(permit);
                                    return Ran::Done(AttemptResult::LostClaim);
                                }
                                Err(e) => {
                                    drop(permit);
                                    return Ran::Done(e.into_result());
                                }
                            }
                        }
                        Err(failure) => failure,
                    }
                }
                other => other,
            };
            if !matches!(outcome, Outcome::Retry { .. }) {
                break Some(outcome);
            }
            // Immediate retries: only while the next try (its delay, the
            // timeout, the margin) fits in the lease, and never into an
            // open circuit or after a probe.
            let immediate = def.immediate;
            if lease.tries() >= immediate.count
                || lease.remaining() < immediate.delay + needed
                || engine.breakers.is_open(def.id, lease.claimed_at())
                || engine.breakers.is_probing(def.id)
            {
                break Some(outcome);
            }
            let failed_at = engine.app_now();
            let waited = tokio::select! {
                _ = tokio::time::sleep(immediate.delay) => true,
                _ = stop.abort.cancelled() => false,
            };
            // Shutting down between tries, a sleep that overran, or a claim
            // lost meanwhile (an operator cancelled the notice): this
            // failure is the attempt's.
            if !waited
                || lease.remaining() < needed
                || !matches!(claim::still_held(&engine.store, &lease).await, Ok(true))
            {
                break Some(outcome);
            }
            retrying = Some((failed_at, outcome));
        };
        drop(permit);
        // Delivered: a success (and a release) needs its payload no more;
        // a failure keeps it (once) for its alert, until it is recorded.
        match &outcome {
            Some(Outcome::Retry { .. } | Outcome::Permanent { .. }) => lease.recount_payload(1),
            _ => lease.drop_payload(),
        }
        // A success after failed tries writes their lines, and one after
        // failed attempts may write its `notice.recovered` event: recorded
        // inline.
        let failures = u32::try_from(lease.row().retry_times).unwrap_or(0);
        let recovers = def.events_to.is_some() && def.alert.reported_failing(failures);
        let recorder = if lease.tries() > 0 || recovers {
            &Recorder::Inline
        } else {
            recorder
        };
        match outcome {
            Some(outcome) => match batch::batchable(&def, outcome, recorder) {
                Ok(batch) => match batch.hand_over(lease) {
                    None => Ran::Batched,
                    Some(lease) => Ran::Done(
                        Box::pin(record::succeed_inline(lease, None, &stop.give_up)).await,
                    ),
                },
                Err(outcome) => {
                    let recorded = Box::pin(record::record(
                        engine,
                        &def,
                        lease,
                        outcome,
                        &stop.give_up,
                    ))
                    .await;
                    Ran::Done(background::follow_up(engine, recorded))
                }
            },
            None => {
                let reason = "shutting down: delivery abandoned".to_string();
                Ran::Done(Box::pin(record::release(engine, lease, reason, &stop.give_up)).await)
            }
        }
    }
    .instrument(span.clone())
    .await;
    span.record("outcome", tracing::field::debug(&result));
    span.record("ms", started.elapsed().as_millis() as u64);
    let counted = match &result {
        Ran::Done(result) => result,
        Ran::Batched => &AttemptResult::Succeeded,
    };
    crate::counters::attempt_finished(&def.name, counted, started.elapsed());
    tracing::debug!(parent: &span, "attempt finished");
    result
}

/// Why the attempt held by `lease` must not start (or go on to its next
/// step) now: shutting down, the definition's circuit open or the
/// definition paused since the claim (as this process last read it), or
/// too little of the lease left. It is released uncharged then.
fn held_back(engine: &Arc<Engine>, def: &DefRef, lease: &Lease, stop: &Stop) -> Option<String> {
    let needed = engine.config.attempt_timeout + engine.config.lease_margin();
    let paused = || {
        !engine.breakers.is_probing(def.id)
            && engine
                .defs
                .peek(def.id)
                .is_some_and(|d| d.is_paused_at(chrono::Utc::now().naive_utc()))
    };
    if stop.abort.is_cancelled() {
        Some("shutting down".to_string())
    } else if engine.breakers.is_open(def.id, lease.claimed_at()) {
        Some(format!("the circuit of `{}` is open", def.name))
    } else if paused() {
        Some(format!("`{}` is paused", def.name))
    } else if lease.remaining() < needed {
        Some(format!(
            "only {:?} of the lease left; an attempt needs {needed:?}",
            lease.remaining()
        ))
    } else {
        None
    }
}

/// The result a step passes on to the next, as stored (JSON text); a
/// permanent failure of the step when it is larger than
/// [`Config::max_param_bytes`](crate::Config::max_param_bytes).
fn step_result(
    engine: &Engine,
    def: &DefRef,
    lease: &Lease,
    result: Option<serde_json::Value>,
) -> Result<Option<String>, Outcome> {
    let Some(result) = result else {
        return Ok(None);
    };
    let text = result.to_string();
    let max = engine.config.max_param_bytes;
    let step = || {
        format!(
            "step {} of {}",
            i64::from(lease.row().step) + 1,
            def.steps.len()
        )
    };
    if text.len() > max {
        return Err(Outcome::permanent(format!(
            "{}: its result is {} bytes, over max_param_bytes ({max})",
            step(),
            text.len()
        )));
    }
    if !def.encrypt {
        return Ok(Some(text));
    }
    // Derived from the param: sealed like it.
    match engine.config.keys.seal(&text, def.id) {
        Ok(sealed) => Ok(Some(sealed)),
        Err(e) => Err(Outcome::retry(format!(
            "{}: cannot encrypt its result: {e}",
            step()
        ))),
    }
}

/// Attempts one notice as read from `notify_msg` (its `version` is the one
/// the claim expects), recording the outcome inline. Safe to call from any
/// number of tasks or processes at once: at most one of them sends. A
/// notice whose definition is unknown or invalid is parked.
pub(crate) async fn attempt_row(engine: &Arc<Engine>, row: notify_msg::Model) -> AttemptReport {
    let notice_id = row.id;
    let report = |result| AttemptReport { notice_id, result };
    let def = engine.defs.by_id(&engine.store.db, row.def_id).await;
    if let Err(crate::error::Error::Db(e)) = &def {
        return report(AttemptResult::Error {
            error: e.to_string(),
        });
    }
    if let Ok(def) = &def
        && let Err(reason) = available(engine, def)
    {
        return report(AttemptResult::Skipped { reason });
    }
    let lease = match claim::claim_one(&engine.store, &row).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return report(AttemptResult::LostClaim),
        Err(e) => {
            return report(AttemptResult::Error {
                error: e.to_string(),
            });
        }
    };
    let _running = engine.tasks.token();
    match def {
        Ok(def) => report(
            run(engine, def, lease, &Recorder::Inline, &engine.stop, None)
                .await
                .result(),
        ),
        Err(_) => park::park(engine, vec![lease], &engine.stop.give_up)
            .await
            .pop()
            .unwrap_or_else(|| report(AttemptResult::LostClaim)),
    }
}
