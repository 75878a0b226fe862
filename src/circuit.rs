//! Circuit breaker: a definition whose receiver keeps failing pauses itself.
//!
//! Each process counts the failed deliveries of each definition that has a
//! circuit (`circuit = { failures = 20, window = "1m", cool_down = "5m" }`):
//! retryable failures (errors, panics and timeouts included), counted as
//! each delivery ends; a permanent failure refuses one notice and says
//! nothing about the receiver, so it does not count. When `failures`
//! deliveries have failed within `window` with no success among them, the
//! circuit opens: in one transaction the definition is
//! paused in `notify_def` until cool-down plus one lease from now (only if
//! it is not paused already, so of all the processes seeing the same storm
//! exactly one opens it) and one alert notice is queued to the definition's
//! `email` ("paused after N consecutive failures"). Every worker then stops
//! claiming its notices (the pause is in the claiming statement), and
//! attempts already claimed in the opening process are released, uncharged.
//!
//! After the cool-down the opening process makes one probe attempt: it
//! claims the oldest due notice of the definition (the pause still holds
//! for everyone else) and attempts it on the one path. A success closes the
//! circuit: the pause is lifted and the workers are woken. A failure
//! re-opens it for another cool-down, without another alert; so does a
//! probe that found nothing due (the failed notices wait for their retries)
//! or ended without a verdict. If the opening process dies, the pause simply ends a lease after
//! the cool-down and the definition goes on as if closed. An operator's own
//! pause or resume always wins: the circuit only lifts or extends a pause
//! whose reason is its own.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::Instant,
};

use sea_orm::TransactionTrait;

use crate::{
    AttemptResult, Notifier, Outcome,
    alert::AlertMail,
    attempt::{self, Recorder, record},
    def::DefRef,
    state::{claim, insert::insert_plain, pause},
};

/// The start of `pause_reason` while a circuit holds the pause.
pub use crate::state::pause::CIRCUIT_REASON;

#[derive(Debug)]
enum Local {
    /// Counting failures since the last success (their times).
    Closed(VecDeque<Instant>),
    /// Tripped here, the pause not yet committed: every attempt is
    /// released (a claim may still pass the pause check).
    Opening,
    /// Open here since then: attempts claimed before are released, not
    /// delivered (later claims passed the pause in the claiming statement,
    /// or an operator resumed the definition).
    Open(Instant),
    /// The probe is running (or another process holds the circuit).
    Probing,
}

/// The circuits as this process sees them, by definition id.
#[derive(Debug, Default)]
pub(crate) struct Circuits {
    state: Mutex<HashMap<i64, Local>>,
}

impl Circuits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Local>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether an attempt of `def_id` claimed at `claimed_at` must be
    /// released rather than delivered.
    pub fn is_open(&self, def_id: i64, claimed_at: Instant) -> bool {
        match self.lock().get(&def_id) {
            Some(Local::Opening) => true,
            Some(Local::Open(since)) => claimed_at < *since,
            _ => false,
        }
    }

    /// Whether this process is probing `def_id` (its pause must not stop
    /// the probe).
    pub fn is_probing(&self, def_id: i64) -> bool {
        matches!(self.lock().get(&def_id), Some(Local::Probing))
    }

    /// Counts one delivery's outcome. `true`: this failure trips the
    /// circuit (the caller opens it).
    fn observe(&self, def: &DefRef, outcome: &Outcome) -> bool {
        let Some(circuit) = def.circuit else {
            return false;
        };
        let failed = match outcome {
            // The receiver (or handler) is failing: errors, panics and
            // timeouts arrive here as retries.
            Outcome::Retry { .. } => true,
            Outcome::Success { .. } => false,
            // A notice refused for good says nothing about the receiver.
            Outcome::Permanent { .. } => return false,
        };
        let mut state = self.lock();
        let entry = state
            .entry(def.id)
            .or_insert_with(|| Local::Closed(VecDeque::new()));
        let Local::Closed(failures) = entry else {
            return false;
        };
        if !failed {
            failures.clear();
            return false;
        }
        let now = Instant::now();
        failures.push_back(now);
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > circuit.window)
        {
            failures.pop_front();
        }
        if failures.len() < circuit.failures as usize {
            return false;
        }
        *entry = Local::Opening;
        true
    }

    fn set(&self, def_id: i64, local: Local) {
        self.lock().insert(def_id, local);
    }
}

/// Counts the outcome of a delivery of `def`, and opens its circuit when
/// this failure trips it.
pub(crate) fn observe(notifier: &Notifier, def: &DefRef, outcome: &Outcome) {
    if notifier.inner.circuits.observe(def, outcome) {
        let notifier = notifier.clone();
        let def = def.clone();
        tokio::spawn(async move { open(notifier, def).await });
    }
}

fn reason(n: u32) -> String {
    format!("{CIRCUIT_REASON}: paused after {n} consecutive failures")
}

/// Opens the circuit of `def` (if no one paused it meanwhile), then runs
/// its probes until it closes.
async fn open(notifier: Notifier, def: DefRef) {
    let Some(circuit) = def.circuit else {
        return;
    };
    let inner = &notifier.inner;
    let hold = circuit.cool_down + inner.config.lease;
    let opened = open_in_db(&notifier, &def, hold).await;
    inner.defs.invalidate();
    match opened {
        Ok(true) => {
            // Claims sent from now on see the committed pause.
            inner.circuits.set(def.id, Local::Open(Instant::now()));
            tracing::warn!(def = %def.name, failures = circuit.failures, cool_down = ?circuit.cool_down, "circuit opened: definition paused");
        }
        Ok(false) => {
            // Paused already (another process's circuit, or an operator):
            // whoever paused it decides when it ends.
            inner.circuits.set(def.id, Local::Closed(VecDeque::new()));
            return;
        }
        Err(e) => {
            tracing::warn!(def = %def.name, error = %e, "cannot open the circuit; counting again");
            inner.circuits.set(def.id, Local::Closed(VecDeque::new()));
            return;
        }
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(circuit.cool_down) => {}
            _ = inner.stop.abort.cancelled() => return,
        }
        inner.circuits.set(def.id, Local::Probing);
        let verdict = probe(&notifier, &def).await;
        let again = match &verdict {
            Ok(Probe::Delivered) => None,
            Ok(Probe::Failed) => Some(format!("{CIRCUIT_REASON}: the probe failed")),
            // Nothing due to probe (the failed notices wait for later
            // retries), or no verdict (claim lost, released): stay open and
            // probe again after the next cool-down.
            Ok(Probe::NoVerdict) | Err(_) => Some(reason(circuit.failures)),
        };
        let Some(again) = again else {
            // Delivered: close.
            match pause::lift_if(&inner.store.db, def.id, CIRCUIT_REASON).await {
                Ok(_) => notifier.wake_everyone().await,
                Err(e) => {
                    tracing::warn!(def = %def.name, error = %e, "cannot close the circuit; its pause ends by itself");
                }
            }
            inner.defs.invalidate();
            inner.circuits.set(def.id, Local::Closed(VecDeque::new()));
            tracing::info!(def = %def.name, "circuit closed");
            return;
        };
        // Re-open only a pause that is still the circuit's: an operator who
        // resumed (or paused it themselves) meanwhile decides.
        match pause::extend_if(&inner.store.db, def.id, hold, CIRCUIT_REASON, &again).await {
            Ok(true) => {
                inner.circuits.set(def.id, Local::Open(Instant::now()));
                match verdict {
                    Err(e) => {
                        tracing::warn!(def = %def.name, error = %e, "circuit probe could not run; trying again after the cool-down");
                    }
                    Ok(Probe::Failed) => {
                        tracing::warn!(def = %def.name, "circuit probe failed: re-opened");
                    }
                    _ => {
                        tracing::info!(def = %def.name, "circuit: nothing to probe yet; still open")
                    }
                }
            }
            Ok(false) => {
                tracing::info!(def = %def.name, "circuit: an operator changed the pause meanwhile; counting again");
                inner.defs.invalidate();
                inner.circuits.set(def.id, Local::Closed(VecDeque::new()));
                return;
            }
            Err(e) => {
                // The pause still ends by itself a lease after the cool-down.
                tracing::warn!(def = %def.name, error = %e, "cannot re-open the circuit; counting again");
                inner.circuits.set(def.id, Local::Closed(VecDeque::new()));
                return;
            }
        }
    }
}

/// Pauses `def` for `hold` and queues its alert, in one transaction, if it
/// is not paused now. `true`: this call opened it.
async fn open_in_db(
    notifier: &Notifier,
    def: &DefRef,
    hold: std::time::Duration,
) -> crate::Result<bool> {
    let inner = &notifier.inner;
    let n = def.circuit.map_or(0, |c| c.failures);
    let alert = if def.alert_emails.is_empty() {
        None
    } else {
        let mail = AlertMail::circuit(def, n, hold);
        Some(
            record::alert_row(notifier, &mail, &inner.stop.give_up)
                .await?
                .0,
        )
    };
    let txn = inner.store.db.begin().await?;
    if !pause::open_if_unpaused(&txn, def.id, hold, &reason(n)).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    if let Some(row) = &alert {
        insert_plain(&txn, row).await?;
    }
    txn.commit().await?;
    if alert.is_some() {
        inner.wake_workers();
    }
    Ok(true)
}

/// What a probe found.
enum Probe {
    Delivered,
    Failed,
    /// Nothing due, or the attempt ended without a verdict.
    NoVerdict,
}

/// One probe: claims the oldest due notice of `def` past its pause and
/// attempts it.
async fn probe(notifier: &Notifier, def: &DefRef) -> crate::Result<Probe> {
    let inner = &notifier.inner;
    let Some(lease) = claim::claim_probe(&inner.store, def.id).await? else {
        return Ok(Probe::NoVerdict);
    };
    let _running = inner.tasks.token();
    let result = attempt::run(
        notifier,
        def.clone(),
        lease,
        &Recorder::Inline,
        &inner.stop,
        None,
    )
    .await
    .result();
    Ok(match result {
        AttemptResult::Succeeded | AttemptResult::AwaitingConfirm => Probe::Delivered,
        AttemptResult::WillRetry { .. } | AttemptResult::FinalFailure { .. } => Probe::Failed,
        _ => Probe::NoVerdict,
    })
}
