//! Alert: telling a person that a notice is failing.
//!
//! Whether a failure alerts is the definition's
//! [`AlertPolicy`](crate::def::AlertPolicy): type 0 on the final failure,
//! type 1 on failures 1, 2, 4, 8, … and the final one (the storm rule: a
//! notice failing every 5 s for a day sends 15 alerts, not 17,280), type 2
//! never, type 3 once when the failure count reaches N.
//!
//! An alert is an e-mail to the definition's `email` recipients, queued as a
//! notice of the reserved definition [`ALERT_DEF`] in the same transaction
//! that records the failure. It is therefore sent right after that commit,
//! retried on its own schedule when the mail server is down (`30s,1m,5m,15m,1h`,
//! without limit) and never dropped, and it cannot block or undo the failed
//! notice's bookkeeping. Alerts do not alert about themselves (type 2).
//! Every worker sweeps alert notices, whatever its filters. If the reserved
//! row is edited into something invalid, the built-in policy
//! ([`builtin_spec`]) stands in and an `error` is logged; if it is deleted,
//! it is created again. A failure is never recorded without its alert.
//! In addition, the in-process [`AlertHook`] sees every alerting failure
//! (the default, [`LogAlerts`], logs it) on a task of its own.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::NaiveDateTime;
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    def::{Channel, Def, DefSpec},
    error::DefinitionError,
    state::errors_log::truncate,
};

/// Name of the reserved definition whose notices are alert e-mails. The
/// migrations create it; its row may be tuned like any definition.
pub const ALERT_DEF: &str = "solid_notify_alert";
/// Description of every alert notice.
pub const ALERT_DESCRIPTION: &str = "alert e-mail";

/// The built-in policy of [`ALERT_DEF`], as the migrations create it: e-mail,
/// retried after `30s,1m,5m,15m,1h` without limit, never alerting about
/// itself. Its `email` (empty here) receives alerts about parked notices.
pub fn builtin_spec() -> DefSpec {
    DefSpec {
        retry_interval: "30s,1m,5m,15m,1h".into(),
        max_retry_times: -1,
        max_retry_interval: 60,
        alert_trigger_type: 2,
        description: "alert e-mails about failing notices (recipients in each param)".into(),
        ..DefSpec::new(ALERT_DEF, Channel::Email, json!({}))
    }
}

/// The built-in alert definition with the id of the stored row, standing in
/// for a row that does not validate. It keeps the row's `email` (the
/// recipients of alerts about parked notices) when that part is valid.
pub(crate) fn builtin_def(id: i64, email: &str) -> Result<Def, DefinitionError> {
    let with_email = DefSpec {
        email: email.to_string(),
        ..builtin_spec()
    };
    with_email
        .validate(id, "built-in alert definition")
        .or_else(|_| builtin_spec().validate(id, "built-in alert definition"))
}
/// Failure-log lines quoted in an alert.
pub const ALERT_ERROR_LINES: usize = 5;
/// Bytes of the param quoted in an alert.
pub const ALERT_PARAM_BYTES: usize = 500;

/// A failure that the definition's alert policy says to report.
#[derive(Debug, Clone, Serialize)]
pub struct FailureEvent {
    /// The notice id.
    pub notice_id: i64,
    /// The definition, as the library reads it (see
    /// [`def_name`](Self::def_name) and [`recipients`](Self::recipients)).
    #[doc(hidden)]
    #[serde(skip)]
    pub def: Arc<Def>,
    /// The attempt that failed (1 = first attempt).
    pub attempt: u32,
    /// Failures so far, this one included.
    pub failures: u32,
    /// Whether the notice failed for good and moved to history.
    pub is_final: bool,
    /// Why this attempt failed.
    pub reason: String,
    /// The full failure log.
    pub errors: String,
    /// The notice's param as stored.
    pub param: String,
    /// How long until the next attempt, unless final.
    pub retry_in: Option<Duration>,
    /// When the next attempt is due (UTC, the database's clock), unless
    /// final; known once the failure is recorded (the e-mail, written in the
    /// same transaction, gives `retry_in`).
    pub next_call_time: Option<NaiveDateTime>,
}

impl FailureEvent {
    /// The name of the notice's definition.
    pub fn def_name(&self) -> &str {
        &self.def.name
    }

    /// The definition's alert recipients (its `email`), possibly none.
    pub fn recipients(&self) -> &[String] {
        &self.def.alert_emails
    }
}

/// Receives failures that alert, in-process, after they are recorded.
#[async_trait]
pub trait AlertHook: Send + Sync + 'static {
    /// Reports `event`. Must not fail; it runs after the failure is recorded.
    async fn alert(&self, event: FailureEvent);
}

/// The default hook: logs each alert at `error` level with `tracing`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogAlerts;

#[async_trait]
impl AlertHook for LogAlerts {
    async fn alert(&self, event: FailureEvent) {
        tracing::error!(
            notice_id = event.notice_id,
            def = %event.def.name,
            attempt = event.attempt,
            is_final = event.is_final,
            reason = %event.reason,
            "notice failure alert"
        );
    }
}

/// The alert e-mail of one failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertMail {
    /// Recipients (the definition's `email`).
    pub to: Vec<String>,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub body: String,
}

impl AlertMail {
    /// Writes the alert: what failed, how often, the last errors, a param
    /// excerpt, and what the operator can do.
    pub fn compose(event: &FailureEvent) -> AlertMail {
        let def = &event.def.name;
        let id = event.notice_id;
        let subject = if event.is_final {
            format!(
                "[solid-notify] {def}: notice {id} failed for good after {} attempts",
                event.attempt
            )
        } else {
            format!(
                "[solid-notify] {def}: notice {id} failing ({} failures)",
                event.failures
            )
        };
        let lines: Vec<&str> = event.errors.lines().collect();
        let last = &lines[lines.len().saturating_sub(ALERT_ERROR_LINES)..];
        let state = match event.retry_in {
            Some(wait) => format!(
                "It will be tried again in {}.",
                crate::schedule::format_interval(wait)
            ),
            None => "It will not be tried again: it is in notify_msg_history with status 3 (final failure).".into(),
        };
        let todo = if event.is_final {
            format!(
                "- fix the receiver, then requeue it: solid-notify requeue {id}\n\
                 - inspect it: solid-notify show {id}"
            )
        } else {
            format!(
                "- fix the receiver; the retries will then succeed on their own\n\
                 - inspect it: solid-notify show {id}"
            )
        };
        let body = format!(
            "Notice {id} of definition `{def}` failed on attempt {attempt} ({failures} failures so far).\n\
             {state}\n\nLast error: {reason}\n\nFailure log (last {n} lines):\n{log}\n\n\
             Param (first {bytes} bytes):\n{param}\n\nWhat you can do:\n{todo}\n",
            attempt = event.attempt,
            failures = event.failures,
            reason = event.reason,
            n = last.len(),
            log = last
                .iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
            bytes = ALERT_PARAM_BYTES,
            param = crate::crypto::shown(&event.param)
                .unwrap_or_else(|| truncate(&event.param, ALERT_PARAM_BYTES)),
        );
        AlertMail {
            to: event.def.alert_emails.clone(),
            subject,
            body,
        }
    }

    /// The param of the alert notice that sends this mail.
    pub fn param(&self) -> Value {
        json!({"to": self.to, "subject": self.subject, "body": self.body})
    }

    /// The alert that the circuit of `def` opened after `failures` failed
    /// attempts: it is paused for `hold`, then probed once.
    pub fn circuit(def: &Def, failures: u32, hold: Duration) -> AlertMail {
        let name = &def.name;
        AlertMail {
            to: def.alert_emails.clone(),
            subject: format!("[solid-notify] {name}: paused after {failures} consecutive failures"),
            body: format!(
                "The circuit of definition `{name}` opened: its last {failures} attempts failed \
                 with no success among them.\n\n\
                 No worker attempts its notices now; they wait in flight, uncharged. After the \
                 cool-down one probe attempt is made: a success resumes the definition, a \
                 failure pauses it again (without another alert). The pause ends by itself \
                 within {} at the latest if no probe runs.\n\n\
                 What you can do:\n\
                 - look at the failures: solid-notify list --def {name} --failing\n\
                 - fix the receiver, then resume at once: solid-notify resume {name}\n\
                 - or keep it paused: solid-notify pause {name} --reason \"…\"\n",
                humantime::format_duration(hold)
            ),
        }
    }

    /// The alert that the worker `worker` (host:pid) failed `n` sweeps in a
    /// row, the last with `error`.
    pub fn sweeps_failing(to: Vec<String>, worker: &str, n: u64, error: &str) -> AlertMail {
        // The database's message, cut short (it names tables, not secrets).
        let error: String = error.chars().take(300).collect();
        AlertMail {
            to,
            subject: format!("[solid-notify] worker {worker}: {n} sweeps failed in a row"),
            body: format!(
                "The worker {worker} could not claim due notices {n} times in a row. The last \
                 error was:\n\n  {error}\n\n\
                 Its notices wait in flight; nothing is lost. It keeps trying. Look at the \
                 worker's log and at the metric solid_notify_sweeps_failing_in_a_row; a revoked \
                 privilege, a full disk or a schema that is not migrated are the usual causes.\n"
            ),
        }
    }

    /// The alert about notices parked because their definition `def_id` is
    /// unknown or invalid.
    pub fn parked(to: Vec<String>, def_id: i64, reason: &str, ids: &[i64]) -> AlertMail {
        let shown: Vec<String> = ids.iter().take(20).map(i64::to_string).collect();
        let more = ids.len().saturating_sub(shown.len());
        AlertMail {
            to,
            subject: format!(
                "[solid-notify] {} notices of definition id {def_id} parked",
                ids.len()
            ),
            body: format!(
                "{n} notices of notify_def id {def_id} cannot be attempted: {reason}\n\n\
                 They are in notify_msg_history with status 6 (parked): {list}{more}\n\n\
                 What you can do:\n\
                 - fix or restore the definition (solid-notify defs sync), then requeue them:\n\
                 \x20 solid-notify requeue --status parked --since 1d --reason \"definition fixed\"\n",
                n = ids.len(),
                list = shown.join(", "),
                more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                },
            ),
        }
    }
}
