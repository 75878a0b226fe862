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

use std::sync::Arc;

use sea_orm::TransactionTrait;

use crate::{
    alert::AlertMail,
    attempt::{
        self, AttemptResult, Recorder,
        engine::Engine,
        events::{self, EventRows},
        record,
    },
    def::{Circuit, DefRef},
    event::{Event, EventKind},
    state::{
        claim,
        insert::{insert_all, insert_plain},
        pause,
    },
};

/// The start of `pause_reason` while a circuit holds the pause.
pub use crate::state::pause::CIRCUIT_REASON;

/// Starts the controller of the circuit of `def`, which has just tripped
/// in `engine`'s breaker: a task tracked by the engine
/// (`Engine::controllers`) that opens the circuit, probes and closes it,
/// and stops at shutdown.
pub(crate) fn start(engine: &Arc<Engine>, def: DefRef) {
    let controller = engine.clone();
    engine
        .lifecycle
        .controllers
        .spawn(async move { open(controller, def).await });
}

fn reason(n: u32) -> String {
    format!("{CIRCUIT_REASON}: paused after {n} consecutive failures")
}

/// Opens the circuit of `def` (if no one paused it meanwhile), then runs
/// its probes until it closes: [`trip`]s it, then, after each cool-down
/// ([`stopped_cooling_down`]), probes, and [`close`]s or [`reopen`]s it.
async fn open(engine: Arc<Engine>, def: DefRef) {
    let Some(circuit) = def.circuit else {
        return;
    };
    if engine.lifecycle.closing.is_cancelled() {
        // Shutting down: no new fleet-wide pause that no one here would
        // probe; the failures are counted again (by clones still running).
        engine.delivery.breakers.closed(def.id);
        return;
    }
    let hold = circuit.cool_down + engine.settings.lease;
    if !trip(&engine, &def, &circuit, hold).await {
        return;
    }
    loop {
        if stopped_cooling_down(&engine, &circuit).await {
            // The pause ends by itself, a lease after the cool-down; until
            // then claims skip the definition. This process counts again.
            engine.delivery.breakers.closed(def.id);
            return;
        }
        engine.delivery.breakers.probing(def.id);
        let verdict = probe(&engine, &def).await;
        if engine.lifecycle.closing.is_cancelled() && !matches!(verdict, Ok(Probe::Delivered)) {
            // Shutting down: no new cool-down that no one here would probe;
            // the pause ends by itself, a lease after this one's cool-down.
            engine.delivery.breakers.closed(def.id);
            return;
        }
        let Some(again) = reopen_reason(&verdict, circuit.failures) else {
            // Delivered: close.
            close(&engine, &def).await;
            return;
        };
        if !reopen(&engine, &def, hold, &again, verdict).await {
            return;
        }
    }
}

/// Opens the circuit of `def` in the database for `hold`, and in this
/// process's breaker. `false`: it stays closed (paused already, or the
/// database refused; logged).
async fn trip(
    engine: &Arc<Engine>,
    def: &DefRef,
    circuit: &Circuit,
    hold: std::time::Duration,
) -> bool {
    let opened = open_in_db(engine, def, hold).await;
    engine.defs.invalidate();
    match opened {
        Ok(true) => {
            // Claims sent from now on see the committed pause.
            engine.delivery.breakers.opened(def.id);
            tracing::warn!(def = %def.name, failures = circuit.failures, cool_down = ?circuit.cool_down, "circuit opened: definition paused");
            true
        }
        Ok(false) => {
            // Paused already (another process's circuit, or an operator):
            // whoever paused it decides when it ends.
            engine.delivery.breakers.closed(def.id);
            false
        }
        Err(e) => {
            tracing::warn!(def = %def.name, error = %e, "cannot open the circuit; counting again");
            engine.delivery.breakers.closed(def.id);
            false
        }
    }
}

/// Waits out one cool-down. `true`: shutdown (or the engine's abort) came
/// first, or had come by its end.
async fn stopped_cooling_down(engine: &Arc<Engine>, circuit: &Circuit) -> bool {
    tokio::select! {
        biased;
        _ = engine.lifecycle.closing.cancelled() => true,
        _ = engine.lifecycle.stop.abort.cancelled() => true,
        _ = tokio::time::sleep(circuit.cool_down) => engine.lifecycle.closing.is_cancelled(),
    }
}

/// The pause reason a probe's `verdict` re-opens the circuit with; `None`:
/// delivered, the circuit closes.
fn reopen_reason(verdict: &crate::error::Result<Probe>, failures: u32) -> Option<String> {
    match verdict {
        Ok(Probe::Delivered) => None,
        Ok(Probe::Failed) => Some(format!("{CIRCUIT_REASON}: the probe failed")),
        // Nothing due to probe (the failed notices wait for later
        // retries), or no verdict (claim lost, released): stay open and
        // probe again after the next cool-down.
        Ok(Probe::NoVerdict) | Err(_) => Some(reason(failures)),
    }
}

/// A probe was delivered: the circuit's pause lifted (and the workers
/// woken), and this process counts again.
async fn close(engine: &Arc<Engine>, def: &DefRef) {
    match close_in_db(engine, def).await {
        Ok(true) => engine.wake_everyone().await,
        Ok(false) => taken_over(engine, def).await,
        Err(e) => {
            tracing::warn!(def = %def.name, error = %e, "cannot close the circuit; its pause ends by itself");
        }
    }
    engine.defs.invalidate();
    engine.delivery.breakers.closed(def.id);
    tracing::info!(def = %def.name, "circuit closed");
}

/// A probe was not delivered (`verdict`): the pause extended by `hold`
/// with reason `again`. `false`: the circuit is no longer this process's
/// to probe (an operator changed the pause, or the database refused).
async fn reopen(
    engine: &Arc<Engine>,
    def: &DefRef,
    hold: std::time::Duration,
    again: &str,
    verdict: crate::error::Result<Probe>,
) -> bool {
    // Re-open only a pause that is still the circuit's: an operator who
    // resumed (or paused it themselves) meanwhile decides.
    match pause::extend_if(&engine.store.db, def.id, hold, CIRCUIT_REASON, again).await {
        Ok(true) => {
            engine.delivery.breakers.opened(def.id);
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
            true
        }
        Ok(false) => {
            tracing::info!(def = %def.name, "circuit: an operator changed the pause meanwhile; counting again");
            taken_over(engine, def).await;
            engine.defs.invalidate();
            engine.delivery.breakers.closed(def.id);
            false
        }
        Err(e) => {
            // The pause still ends by itself a lease after the cool-down.
            tracing::warn!(def = %def.name, error = %e, "cannot re-open the circuit; counting again");
            engine.delivery.breakers.closed(def.id);
            false
        }
    }
}

/// Pauses `def` for `hold` and queues its alert, in one transaction, if it
/// is not paused now. `true`: this call opened it.
async fn open_in_db(
    engine: &Arc<Engine>,
    def: &DefRef,
    hold: std::time::Duration,
) -> crate::error::Result<bool> {
    let n = def.circuit.map_or(0, |c| c.failures);
    let alert = if def.alert_emails.is_empty() {
        None
    } else {
        let mail = AlertMail::circuit(def, n, hold);
        Some(
            // Retried while the database is away, until shutdown begins.
            record::alert_row(engine, &mail, &engine.lifecycle.closing)
                .await?
                .0,
        )
    };
    let why = reason(n);
    let mut opened = Event::new(EventKind::CircuitOpened, def, why.clone());
    opened.paused_until = Some(crate::state::clock::app_now() + hold);
    let mut paused = Event::new(EventKind::DefinitionPaused, def, why.clone());
    paused.paused_until = opened.paused_until;
    let events = events::rows(
        engine,
        def,
        None,
        &[opened, paused],
        &engine.lifecycle.closing,
    )
    .await?;
    if engine.lifecycle.closing.is_cancelled() {
        // Shutdown began meanwhile: pause nothing no one here would probe.
        return Ok(false);
    }
    let txn = engine.store.db.begin().await?;
    if !pause::open_if_unpaused(&txn, def.id, hold, &why).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    if let Some(row) = &alert {
        insert_plain(&txn, row).await?;
    }
    let ids = insert_all(&txn, &events.rows).await?;
    txn.commit().await?;
    if alert.is_some() {
        engine.wake_workers();
    }
    written(engine, &events, &ids);
    Ok(true)
}

/// Lifts the circuit's pause of `def` (if it is still the circuit's) with
/// its `circuit.closed` and `definition.resumed` events, in one
/// transaction. `true`: this call lifted it.
async fn close_in_db(engine: &Arc<Engine>, def: &DefRef) -> crate::error::Result<bool> {
    let why = "a probe attempt was delivered";
    let closed = Event::new(EventKind::CircuitClosed, def, why);
    let resumed = Event::new(
        EventKind::DefinitionResumed,
        def,
        format!("circuit closed: {why}"),
    );
    let events = events::rows(
        engine,
        def,
        None,
        &[closed, resumed],
        &engine.lifecycle.closing,
    )
    .await?;
    let txn = engine.store.db.begin().await?;
    if !pause::lift_if(&txn, def.id, CIRCUIT_REASON).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    let ids = insert_all(&txn, &events.rows).await?;
    txn.commit().await?;
    written(engine, &events, &ids);
    Ok(true)
}

/// The circuit of `def` closes because an operator resumed or paused the
/// definition meanwhile (whose own event said so): its `circuit.closed`
/// event, so that every `circuit.opened` is followed by one. Logged when it
/// cannot be written.
async fn taken_over(engine: &Arc<Engine>, def: &DefRef) {
    let closed = Event::new(
        EventKind::CircuitClosed,
        def,
        "an operator resumed or paused the definition meanwhile",
    );
    let written = async {
        let events = events::rows(engine, def, None, &[closed], &engine.lifecycle.closing).await?;
        if events.rows.is_empty() {
            return Ok::<_, crate::error::Error>(());
        }
        let txn = engine.store.db.begin().await?;
        let ids = insert_all(&txn, &events.rows).await?;
        txn.commit().await?;
        written(engine, &events, &ids);
        Ok(())
    };
    if let Err(e) = written.await {
        tracing::warn!(def = %def.name, error = %e, "cannot write the circuit.closed event");
    }
}

/// Counts the events written with ids `ids` and attempts them after their
/// commit.
fn written(engine: &Arc<Engine>, events: &EventRows, ids: &[i64]) {
    crate::counters::events_written(ids.len() as u64);
    let pending = events.pending(engine, ids);
    if !pending.is_empty() {
        attempt::background::after_commit(engine, pending);
    }
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
async fn probe(engine: &Arc<Engine>, def: &DefRef) -> crate::error::Result<Probe> {
    // Counted among the attempts a shutdown waits for, and aborts.
    let _running = engine.lifecycle.tasks.token();
    if engine.lifecycle.closing.is_cancelled() {
        return Ok(Probe::NoVerdict);
    }
    let Some(lease) = claim::claim_probe(&engine.store, def.id).await? else {
        return Ok(Probe::NoVerdict);
    };
    let result = attempt::run(
        engine,
        def.clone(),
        lease,
        &Recorder::Inline,
        &engine.lifecycle.stop,
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
