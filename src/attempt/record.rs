//! Record: an attempt's outcome becomes its lease's transition.
//!
//! Success moves the notice to history (inline, or through a sweep's
//! [`batch`](super::batch)), or leaves it awaiting confirmation; a failure
//! schedules the next attempt or ends the notice, with the alert notice the
//! definition's policy asks for queued in the same transaction. A write the
//! database refuses for a transient reason (connection lost, backend
//! terminated, deadlock) is tried again with backoff until it lands, the
//! claim turns out lost, or the caller gives up (shutdown): then the row is
//! left to its lease, and a delivered success is resent only because the
//! process stopped before it could be recorded.

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{AttemptResult, pending::PendingNotice};
use std::sync::Arc;

use super::{
    engine::Engine,
    events::{self, EventRows},
    plan::{Failed, FailurePlan, Recipients},
};
use crate::{
    alert::{self, AlertMail, FailureEvent},
    db::{self, Backoff},
    def::{Confirm, DefRef},
    event::{Event, EventKind, NoticeRef},
    handler::Outcome,
    state::{Deadline, Final, Held, Lease, Retry, Scheduled, insert::NewRow},
};

/// Longest time an in-process [`AlertHook`](crate::AlertHook) may take per
/// alert before it is abandoned (the alert e-mail does not depend on it).
pub const ALERT_HOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// The write did not land.
pub(crate) enum Unwritten {
    /// The caller gave up while the database was unreachable: the lease is
    /// left to run out.
    GaveUp(String),
    /// The database refused it for good (a bug or bad data): the lease is
    /// left to run out, so that a write that can never land costs one
    /// attempt per lease, not a loop of attempts.
    Refused(String),
}

impl Unwritten {
    pub(crate) fn into_result(self) -> AttemptResult {
        match self {
            Unwritten::GaveUp(e) => AttemptResult::Error {
                error: format!("{e}; left to its lease"),
            },
            Unwritten::Refused(e) => AttemptResult::Error { error: e },
        }
    }
}

/// Tries `write` until it lands: transient database faults are retried with
/// [`Backoff`] until `give_up`; other errors are final.
pub(crate) async fn persist<T, F, Fut>(
    mut lease: Lease,
    give_up: &CancellationToken,
    mut write: F,
) -> Result<T, Unwritten>
where
    F: FnMut(Lease) -> Fut,
    Fut: Future<Output = Result<T, Held>>,
{
    let mut backoff = Backoff::default();
    loop {
        match write(lease).await {
            Ok(value) => return Ok(value),
            Err(Held { lease: held, error }) => {
                let id = held.id();
                if !db::is_transient(&error) {
                    tracing::error!(notice_id = id, error = %error, "the database refused an outcome; the notice is due again when its lease ends");
                    held.forget();
                    return Err(Unwritten::Refused(format!("{error}; left to its lease")));
                }
                tracing::warn!(notice_id = id, error = %error, "cannot record an outcome yet; retrying");
                if !backoff.wait(give_up).await {
                    held.forget();
                    crate::counters::outcomes_given_up(1);
                    return Err(Unwritten::GaveUp(error.to_string()));
                }
                lease = held;
            }
        }
    }
}

/// Releases a lease that will not be attempted here.
pub(crate) async fn release(
    engine: &Arc<Engine>,
    lease: Lease,
    reason: String,
    give_up: &CancellationToken,
) -> AttemptResult {
    release_for(engine, lease, Duration::ZERO, reason, give_up).await
}

/// Releases a lease that will not be attempted now, due again after `wait`.
pub(crate) async fn release_for(
    engine: &Arc<Engine>,
    lease: Lease,
    wait: Duration,
    reason: String,
    give_up: &CancellationToken,
) -> AttemptResult {
    match persist(lease, give_up, |l| l.release_for(wait)).await {
        Ok(Ok(())) => {
            engine.count_released(1);
            AttemptResult::Released { reason }
        }
        Ok(Err(_lost)) => AttemptResult::LostClaim,
        Err(e) => e.into_result(),
    }
}

/// A recorded outcome, and what it asks of its caller next: the alert
/// notice it queued, to attempt after its commit. The recorder reports it
/// instead of starting it ([`background::follow_up`](super::background::follow_up)
/// does).
#[must_use]
pub(crate) struct Recorded {
    pub(super) result: AttemptResult,
    /// The alert and event notices it queued.
    pub(super) follow: Vec<PendingNotice>,
}

impl From<AttemptResult> for Recorded {
    fn from(result: AttemptResult) -> Self {
        Recorded {
            result,
            follow: Vec::new(),
        }
    }
}

/// Records the outcome of the attempt held by `lease`.
pub(crate) async fn record(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: Lease,
    outcome: Outcome,
    give_up: &CancellationToken,
) -> Recorded {
    match outcome {
        Outcome::Success { note, .. } => succeed(engine, def, lease, note, give_up).await,
        Outcome::Retry { reason } => fail(engine, def, lease, reason, false, give_up).await,
        Outcome::Permanent { reason } => fail(engine, def, lease, reason, true, give_up).await,
    }
}

async fn succeed(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: Lease,
    note: Option<String>,
    give_up: &CancellationToken,
) -> Recorded {
    let until = match def.confirm {
        Confirm::NotNeeded => None,
        Confirm::Within(d) => Some(Deadline::After(d)),
        Confirm::Forever => Some(Deadline::Forever),
    };
    let events = match recovered(engine, def, &lease, give_up).await {
        Ok(events) => events,
        Err(e) => return not_queued(lease, "its event", &e),
    };
    let note = note.as_deref();
    let written = match until {
        Some(until) => persist(lease, give_up, |l| {
            l.await_confirmation(until, note, &events.rows)
        })
        .await
        .map(|w| {
            w.map(|ids| {
                if let Deadline::After(d) = until {
                    engine.signals.due_after(d);
                }
                (AttemptResult::AwaitingConfirm, ids)
            })
        }),
        None => persist(lease, give_up, |l| l.succeed(note, &events.rows))
            .await
            .map(|w| w.map(|ids| (AttemptResult::Succeeded, ids))),
    };
    match written {
        Ok(Ok((result, ids))) => {
            crate::counters::events_written(ids.len() as u64);
            Recorded {
                result,
                follow: events.pending(engine, &ids),
            }
        }
        Ok(Err(_lost)) => AttemptResult::LostClaim.into(),
        Err(e) => e.into_result().into(),
    }
}

/// The `notice.recovered` event of a delivered notice that was reported
/// failing (`notice.failing`), when its definition sends events.
async fn recovered(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: &Lease,
    give_up: &CancellationToken,
) -> Result<EventRows, crate::error::Error> {
    let failures = u32::try_from(lease.row().retry_times).unwrap_or(0);
    if def.events_to.is_none() || !def.alert.reported_failing(failures) {
        return Ok(EventRows::default());
    }
    let mut event = Event::new(
        EventKind::NoticeRecovered,
        def,
        format!(
            "delivered on attempt {} after {failures} failures",
            lease.attempt()
        ),
    );
    event.notice = Some(notice_ref(lease, failures, None));
    events::rows(engine, def, Some(lease.row().origin), &[event], give_up).await
}

/// The notice an event about `lease`'s attempt names.
fn notice_ref(lease: &Lease, failures: u32, next: Option<chrono::NaiveDateTime>) -> NoticeRef {
    NoticeRef {
        id: lease.id(),
        attempt: lease.attempt(),
        failures,
        ordering_key: lease.row().ordering_key.clone(),
        next_attempt_at: next,
    }
}

/// An outcome not recorded because what it must queue with it (`what`)
/// could not be built while the database was away: the row is left to its
/// lease and attempted again after it (a failure is never recorded without
/// its alert and events).
fn not_queued(lease: Lease, what: &str, e: &crate::error::Error) -> Recorded {
    tracing::error!(notice_id = lease.id(), error = %e, "cannot queue {what}; outcome not recorded, due again when its lease ends");
    lease.forget();
    AttemptResult::Error {
        error: format!("cannot queue {what} ({e}); left to its lease"),
    }
    .into()
}

pub(crate) async fn succeed_inline(
    lease: Lease,
    note: Option<&str>,
    give_up: &CancellationToken,
) -> AttemptResult {
    match persist(lease, give_up, |l| l.succeed(note, &[])).await {
        Ok(Ok(_)) => AttemptResult::Succeeded,
        Ok(Err(_lost)) => AttemptResult::LostClaim,
        Err(e) => e.into_result(),
    }
}

async fn fail(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: Lease,
    reason: String,
    permanent: bool,
    give_up: &CancellationToken,
) -> Recorded {
    let row = lease.row();
    let failed = Failed {
        id: lease.id(),
        attempt: lease.attempt(),
        tries: lease.tries(),
        stored_errors: &row.errors,
        errors_so_far: lease.errors_so_far(),
        origin: row.origin,
        ordering_key: row.ordering_key.as_deref(),
        param: &row.param,
    };
    let jitter = fastrand::f64() * 2.0 - 1.0;
    let plan = FailurePlan::decide(
        def,
        &failed,
        &reason,
        permanent,
        crate::state::clock::app_now(),
        jitter,
    );
    let (alert, events) = match follow_ups(engine, def, &lease, &plan, give_up).await {
        Ok(queued) => queued,
        Err((what, e)) => return not_queued(lease, what, &e),
    };
    if plan.lost_event {
        tracing::error!(notice_id = lease.id(), def = %def.name, reason = %reason, "an operational event failed for good; it raises no event of its own");
    }
    let follow: Vec<NewRow> = alert
        .iter()
        .map(|(row, _)| row.clone())
        .chain(events.rows.iter().cloned())
        .collect();
    let alerts = plan.alerts;
    let (result, ids, report) =
        match write_failure(engine, lease, plan, follow, reason, give_up).await {
            Ok(written) => written,
            Err(result) => return result.into(),
        };
    // The alert's id comes first, then the events'.
    let (alert_ids, event_ids) = ids.split_at(usize::from(alert.is_some()).min(ids.len()));
    let mut pending = Vec::new();
    if let (Some((row, alert_def)), [id]) = (alert, alert_ids) {
        engine.wake_workers();
        let here = engine.attempts_after_commit();
        pending.push(PendingNotice::alert(*id, row, alert_def, here));
    }
    crate::counters::events_written(event_ids.len() as u64);
    pending.extend(events.pending(engine, event_ids));
    if alerts {
        spawn_hook(engine, report);
    }
    Recorded {
        result,
        follow: pending,
    }
}

/// Writes what `plan` decided, with `follow` queued in the same
/// transaction: the final failure, or the retry (then due at its time).
/// The result, the ids `follow` got and the alert's report (with the next
/// attempt's time); `Err` with the result when nothing was written (the
/// claim lost, the database refused or away).
async fn write_failure(
    engine: &Arc<Engine>,
    lease: Lease,
    plan: FailurePlan,
    follow: Vec<NewRow>,
    reason: String,
    give_up: &CancellationToken,
) -> Result<(AttemptResult, Vec<i64>, FailureEvent), AttemptResult> {
    let attempt = lease.attempt();
    let FailurePlan {
        is_final,
        errors,
        retry_times,
        delay,
        mut report,
        ..
    } = plan;
    if is_final {
        let fail = Final {
            errors,
            retry_times,
            follow,
        };
        return match persist(lease, give_up, |l| l.fail_for_good(&fail)).await {
            Ok(Ok(ids)) => Ok((AttemptResult::FinalFailure { attempt, reason }, ids, report)),
            Ok(Err(_lost)) => Err(AttemptResult::LostClaim),
            Err(e) => Err(e.into_result()),
        };
    }
    let retry = Retry {
        errors,
        retry_times,
        delay,
        follow,
    };
    match persist(lease, give_up, |l| l.retry(&retry)).await {
        Ok(Ok(Scheduled { at, follow })) => {
            engine.signals.due_after(delay);
            report.next_call_time = Some(at);
            Ok((
                AttemptResult::WillRetry {
                    attempt,
                    at,
                    reason,
                },
                follow,
                report,
            ))
        }
        Ok(Err(_lost)) => Err(AttemptResult::LostClaim),
        Err(e) => Err(e.into_result()),
    }
}

/// What a failure's plan queues with it: the alert notice (its recipients
/// resolved: the alert definition's are read for an event definition with
/// none of its own) and the event rows (sealed when their definition
/// encrypts). On an error, what could not be built, for the log.
async fn follow_ups(
    engine: &Arc<Engine>,
    def: &DefRef,
    lease: &Lease,
    plan: &FailurePlan,
    give_up: &CancellationToken,
) -> Result<(Option<(NewRow, DefRef)>, EventRows), (&'static str, crate::error::Error)> {
    let recipients = match &plan.recipients {
        None => Vec::new(),
        Some(Recipients::Definition(to)) => to.clone(),
        Some(Recipients::AlertDefinition) => db::retry_db(give_up, || engine.alert_def())
            .await
            .map_err(|e| ("the alert", e))?
            .alert_emails
            .clone(),
    };
    let alert = if recipients.is_empty() {
        None
    } else {
        let mut mail = AlertMail::compose(&plan.report);
        mail.to = recipients;
        Some(
            alert_row(engine, &mail, give_up)
                .await
                .map_err(|e| ("the alert", e))?,
        )
    };
    let events = events::rows(engine, def, Some(lease.row().origin), &plan.events, give_up)
        .await
        .map_err(|e| ("its events", e))?;
    Ok((alert, events))
}

/// The alert notice of a failure, due at once (attempted right after its
/// commit by this process when it makes after-commit attempts, else by a
/// sweeper), and the alert definition (read again while the database is
/// away, until `give_up`).
pub(crate) async fn alert_row(
    engine: &Arc<Engine>,
    mail: &AlertMail,
    give_up: &CancellationToken,
) -> Result<(NewRow, DefRef), crate::error::Error> {
    let def = db::retry_db(give_up, || engine.alert_def()).await?;
    let row = NewRow::follow_up(
        crate::status::Origin::Alert,
        def.id,
        mail.param().to_string(),
        alert::ALERT_DESCRIPTION.to_string(),
    );
    Ok((row, def))
}

/// Runs the alert hook on its own task, bounded by [`ALERT_HOOK_TIMEOUT`].
pub(crate) fn spawn_hook(engine: &Arc<Engine>, event: FailureEvent) {
    let hooks = engine.delivery.alerts.clone();
    engine.lifecycle.tasks.spawn(async move {
        let notice_id = event.notice_id;
        if tokio::time::timeout(ALERT_HOOK_TIMEOUT, hooks.alert(event))
            .await
            .is_err()
        {
            tracing::warn!(
                notice_id,
                "alert hook took longer than {ALERT_HOOK_TIMEOUT:?}; abandoned"
            );
        }
    });
}
