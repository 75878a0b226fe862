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
    let result = attempt(engine, &def, lease, recorder, stop, permit)
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

/// [`run`]'s stages: the checks before any delivery, the tries, the record.
async fn attempt(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: Lease,
    recorder: &Recorder,
    stop: &Stop,
    permit: Option<OwnedSemaphorePermit>,
) -> Ran {
    // A pause that began after the claim (as this process last read the
    // definition): released uncharged, like the circuit's.
    if let Some(reason) = held_back(engine, def, &lease, stop) {
        return Ran::Done(Box::pin(record::release(engine, lease, reason, &stop.give_up)).await);
    }
    // Never sent garbled, never failed for good on what a fix of the
    // definition or the keys mends: such a notice is parked.
    if let Some(reason) = deliver::unusable(engine, def, &lease) {
        drop(permit);
        return Ran::Done(
            Box::pin(park::park_one(engine, def, lease, reason, &stop.give_up)).await,
        );
    }
    match tries(engine, def, lease, stop, permit).await {
        Tried::Ended(ran) => ran,
        Tried::Delivered(lease, outcome) => {
            finish(engine, def, lease, outcome, recorder, stop).await
        }
    }
}

/// What the tries of an attempt came to.
// Returned once per attempt and taken apart at once: a box would cost an
// allocation per attempt for nothing.
#[allow(clippy::large_enum_variant)]
enum Tried {
    /// Delivered, to be recorded; `None`: abandoned at shutdown.
    Delivered(Lease, Option<Outcome>),
    /// Ended with nothing to record: released, the claim lost, an error.
    Ended(Ran),
}

/// Delivers, step after step of a multi-step notice, and again at once
/// while the definition's immediate retries allow; gives the delivery slot
/// back as soon as the last delivery ends.
async fn tries(
    engine: &Arc<Engine>,
    def: &DefRef,
    mut lease: Lease,
    stop: &Stop,
    permit: Option<OwnedSemaphorePermit>,
) -> Tried {
    let needed = engine.settings.attempt_timeout + engine.settings.lease_margin;
    // A failed try to be tried again: logged once the next try starts,
    // else it is the attempt's outcome.
    let mut retrying: Option<(chrono::NaiveDateTime, Outcome)> = None;
    let outcome = loop {
        // Over the rate budget, or too little of the lease left: the first
        // try is released uncharged; an immediate retry ends the attempt
        // with the failure it retried.
        if let Some((wait, reason)) = gate(engine, def, &lease, needed).await {
            if let Some((_, failure)) = retrying.take() {
                break Some(failure);
            }
            drop(permit);
            let released = match wait {
                Some(wait) => {
                    Box::pin(record::release_for(
                        engine,
                        lease,
                        wait,
                        reason,
                        &stop.give_up,
                    ))
                    .await
                }
                None => Box::pin(record::release(engine, lease, reason, &stop.give_up)).await,
            };
            return Tried::Ended(Ran::Done(released));
        }
        if let Some((at, Outcome::Retry { reason })) = retrying.take() {
            tracing::debug!(notice_id = lease.id(), tries = lease.tries() + 1, %reason, "retrying at once");
            lease.failed_try(at, &reason);
        }
        let Some((outcome, more_steps)) = deliver_once(engine, def, &lease, stop).await else {
            break None;
        };
        // A step that succeeded and is not the last: recorded, and the
        // next one runs at once in this claim, unless the attempt must
        // stop now (released then, at the next step).
        let outcome = match outcome {
            Outcome::Success { result, note } if more_steps => {
                match advance(engine, def, lease, result, note, stop).await {
                    Advanced::Next(next) => {
                        lease = next;
                        continue;
                    }
                    Advanced::HeldBack(next, reason) => {
                        drop(permit);
                        let released = record::release(engine, next, reason, &stop.give_up);
                        return Tried::Ended(Ran::Done(Box::pin(released).await));
                    }
                    Advanced::Ended(ran) => {
                        drop(permit);
                        return Tried::Ended(ran);
                    }
                    Advanced::Failed(back, failure) => {
                        lease = back;
                        failure
                    }
                }
            }
            other => other,
        };
        if !matches!(outcome, Outcome::Retry { .. }) {
            break Some(outcome);
        }
        match retry_at_once(engine, def, &lease, stop).await {
            Some(failed_at) => retrying = Some((failed_at, outcome)),
            None => break Some(outcome),
        }
    };
    drop(permit);
    Tried::Delivered(lease, outcome)
}

/// One delivery of the lease's step, within the attempt timeout, and
/// whether more steps follow; `None` when shutdown aborts it. Boxed: the
/// delivery's state (any channel's) is freed as soon as it ends, while the
/// attempt may still wait for its recording.
async fn deliver_once(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: &Lease,
    stop: &Stop,
) -> Option<(Outcome, bool)> {
    let timeout = engine.settings.attempt_timeout;
    let delivery = Box::pin(deliver::deliver(engine, def, lease, timeout));
    let outcome = tokio::select! {
        outcome = delivery => outcome,
        _ = stop.abort.cancelled() => return None,
    };
    let more_steps = lease.has_next_step(def.steps.len());
    // Right at delivery, before the slot frees: deliveries may run ahead
    // of their recording, and the next one must see a circuit this one
    // opened. A step before the last is no success of the notice: it
    // counts for the circuit only when it fails.
    if !(more_steps && matches!(outcome, Outcome::Success { .. })) {
        engine.observe(def, &outcome);
    }
    Some((outcome, more_steps))
}

/// Why the next try must not start, and how long its row then waits
/// (`None`: due at once): every try takes a unit of the definition's rate
/// budget (full, or unreadable: a database error waits
/// [`RATE_ERROR_WAIT`], not nothing, since the error would come back at
/// once too); and the checks took round trips, so the try must still fit
/// in the lease.
async fn gate(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: &Lease,
    needed: std::time::Duration,
) -> Option<(Option<std::time::Duration>, String)> {
    if let Some((wait, reason)) = rate_refused(engine, def).await {
        return Some((Some(wait), reason));
    }
    (lease.remaining() < needed).then(|| {
        let reason = format!(
            "only {:?} of the lease left; an attempt needs {needed:?}",
            lease.remaining()
        );
        (None, reason)
    })
}

/// The wait and the reason when the definition's rate budget refuses a
/// try.
async fn rate_refused(engine: &Arc<Engine>, def: &DefRef) -> Option<(std::time::Duration, String)> {
    let limit = def.rate_limit?;
    match crate::state::rate::take(&engine.store, def.id, limit).await {
        Ok(rate::Take::Granted) => None,
        Ok(rate::Take::Full(wait)) => Some((
            wait,
            format!("rate limit {limit} of `{}` reached", def.name),
        )),
        Err(e) => Some((
            RATE_ERROR_WAIT,
            format!("cannot take from the rate budget of `{}`: {e}", def.name),
        )),
    }
}

/// What recording a step that succeeded (not the last) came to.
#[allow(clippy::large_enum_variant)] // as `Tried`
enum Advanced {
    /// The next step's lease: it runs at once.
    Next(Lease),
    /// Recorded, but the attempt must stop: release the next step.
    HeldBack(Lease, String),
    /// Not recorded: the claim was lost, or the database refused.
    Ended(Ran),
    /// Its result cannot be kept: the step failed with this outcome.
    Failed(Lease, Outcome),
}

/// Records a step that succeeded and is not the last, with its result
/// for the next step.
async fn advance(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: Lease,
    result: Option<serde_json::Value>,
    note: Option<String>,
    stop: &Stop,
) -> Advanced {
    let result = match step_result(engine, def, &lease, result) {
        Ok(result) => result,
        Err(failure) => return Advanced::Failed(lease, failure),
    };
    match record::persist(lease, &stop.give_up, |l| {
        l.advance(result.clone(), note.as_deref())
    })
    .await
    {
        Ok(Ok(next)) => match held_back(engine, def, &next, stop) {
            Some(reason) => Advanced::HeldBack(next, reason),
            None => Advanced::Next(next),
        },
        Ok(Err(_lost)) => Advanced::Ended(Ran::Done(AttemptResult::LostClaim)),
        Err(e) => Advanced::Ended(Ran::Done(e.into_result())),
    }
}

/// Whether a failed try is tried again at once: only while the next try
/// (its delay, the timeout, the margin) fits in the lease, and never into
/// an open circuit or after a probe. Waits the delay; returns when the
/// try failed (this host's clock), or `None` when this failure is the
/// attempt's: shutting down between tries, a sleep that overran, a claim
/// lost meanwhile (an operator cancelled the notice).
async fn retry_at_once(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: &Lease,
    stop: &Stop,
) -> Option<chrono::NaiveDateTime> {
    let needed = engine.settings.attempt_timeout + engine.settings.lease_margin;
    let immediate = def.immediate;
    if lease.tries() >= immediate.count
        || lease.remaining() < immediate.delay + needed
        || engine.delivery.breakers.is_open(def.id, lease.claimed_at())
        || engine.delivery.breakers.is_probing(def.id)
    {
        return None;
    }
    let failed_at = crate::state::clock::app_now();
    let waited = tokio::select! {
        _ = tokio::time::sleep(immediate.delay) => true,
        _ = stop.abort.cancelled() => false,
    };
    if !waited
        || lease.remaining() < needed
        || !matches!(claim::still_held(&engine.store, lease).await, Ok(true))
    {
        return None;
    }
    Some(failed_at)
}

/// Records what the tries delivered: a plain success through `recorder`
/// (a sweep's batch), the rest inline, shutdown's abandoned delivery as a
/// release.
async fn finish(
    engine: &Arc<Engine>,
    def: &DefRef,
    mut lease: Lease,
    outcome: Option<Outcome>,
    recorder: &Recorder,
    stop: &Stop,
) -> Ran {
    // Delivered: a success (and a release) needs its payload no more; a
    // failure keeps it (once) for its alert, until it is recorded.
    match &outcome {
        Some(Outcome::Retry { .. } | Outcome::Permanent { .. }) => lease.recount_payload(1),
        _ => lease.drop_payload(),
    }
    // A success after failed tries writes their lines, and one after failed
    // attempts may write its `notice.recovered` event: recorded inline.
    let failures = u32::try_from(lease.row().retry_times).unwrap_or(0);
    let recovers = def.events_to.is_some() && def.alert.reported_failing(failures);
    let recorder = if lease.tries() > 0 || recovers {
        &Recorder::Inline
    } else {
        recorder
    };
    match outcome {
        Some(outcome) => match batch::batchable(def, outcome, recorder) {
            Ok(batch) => match batch.hand_over(lease) {
                None => Ran::Batched,
                Some(lease) => {
                    Ran::Done(Box::pin(record::succeed_inline(lease, None, &stop.give_up)).await)
                }
            },
            Err(outcome) => {
                let recorded =
                    Box::pin(record::record(engine, def, lease, outcome, &stop.give_up)).await;
                Ran::Done(background::follow_up(engine, recorded))
            }
        },
        None => {
            let reason = "shutting down: delivery abandoned".to_string();
            Ran::Done(Box::pin(record::release(engine, lease, reason, &stop.give_up)).await)
        }
    }
}

/// Why the attempt held by `lease` must not start (or go on to its next
/// step) now: shutting down, the definition's circuit open or the
/// definition paused since the claim (as this process last read it), or
/// too little of the lease left. It is released uncharged then.
fn held_back(engine: &Arc<Engine>, def: &DefRef, lease: &Lease, stop: &Stop) -> Option<String> {
    let needed = engine.settings.attempt_timeout + engine.settings.lease_margin;
    let paused = || {
        !engine.delivery.breakers.is_probing(def.id)
            && engine
                .defs
                .peek(def.id)
                .is_some_and(|d| d.is_paused_at(chrono::Utc::now().naive_utc()))
    };
    if stop.abort.is_cancelled() {
        Some("shutting down".to_string())
    } else if engine.delivery.breakers.is_open(def.id, lease.claimed_at()) {
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
    let max = engine.settings.max_param_bytes;
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
    match engine.settings.keys.seal(&text, def.id) {
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
    let _running = engine.lifecycle.tasks.token();
    match def {
        Ok(def) => report(
            run(
                engine,
                def,
                lease,
                &Recorder::Inline,
                &engine.lifecycle.stop,
                None,
            )
            .await
            .result(),
        ),
        Err(_) => park::park(engine, vec![lease], &engine.lifecycle.stop.give_up)
            .await
            .pop()
            .unwrap_or_else(|| report(AttemptResult::LostClaim)),
    }
}
