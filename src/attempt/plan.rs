//! Plan: what a failed attempt leads to, decided from the definition, the
//! notice and the reason alone ([`FailurePlan::decide`]). No database, no
//! clock and no randomness but what it is given: the recorder
//! ([`record`](super::record)) carries the plan out (resolves the alert's
//! recipients, seals the events, writes the transition) and the table
//! tests below pin every branch.

use std::time::Duration;

use chrono::NaiveDateTime;

use crate::{
    alert::FailureEvent,
    def::{DefRef, Ordering},
    event::{Event, EventKind, NoticeRef},
    state::errors_log::{append_error, append_try},
    status::Origin,
};

/// The notice whose attempt failed, as the plan needs it (read from its
/// lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failed<'a> {
    /// The notice id.
    pub id: i64,
    /// The attempt that failed (1 = the first).
    pub attempt: u32,
    /// Immediate tries of this attempt before this one (0: none).
    pub tries: u32,
    /// The failure log as stored, before this attempt.
    pub stored_errors: &'a str,
    /// The failure log with this attempt's earlier tries (when `tries > 0`).
    pub errors_so_far: &'a str,
    /// Who wrote the notice (an event notice raises no event).
    pub origin: Origin,
    /// Its ordering key.
    pub ordering_key: Option<&'a str>,
    /// Its param as stored (sealed when encrypted).
    pub param: &'a str,
}

/// Who an alert goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recipients {
    /// The definition's own `email`.
    Definition(Vec<String>),
    /// The alert definition's: an operational event's definition that has
    /// none of its own.
    AlertDefinition,
}

/// What a failed attempt leads to.
#[derive(Debug, Clone)]
pub(crate) struct FailurePlan {
    /// Whether the notice fails for good (a permanent failure, or its
    /// retries spent).
    pub is_final: bool,
    /// The failure log with this attempt's line.
    pub errors: String,
    /// The notice's failures, this one included, as stored.
    pub retry_times: i32,
    /// The wait before the next attempt (not used when final).
    pub delay: Duration,
    /// Whether the definition's alert policy fires: the alert hook runs,
    /// and the alert e-mail goes to [`recipients`](Self::recipients).
    pub alerts: bool,
    /// Who the alert e-mail goes to, when the policy fires; `None` when it
    /// does not, or when the definition names no one.
    pub recipients: Option<Recipients>,
    /// The operational events, when the definition sends them (and the
    /// notice is not an event itself).
    pub events: Vec<Event>,
    /// An operational event that failed for good: logged at `error`, since
    /// it raises no event of its own.
    pub lost_event: bool,
    /// What the alert hook and the e-mail are told (its `next_call_time`
    /// is filled in once the retry is written).
    pub report: FailureEvent,
}

impl FailurePlan {
    /// Decides what the failure of `failed`'s attempt of a notice of `def`
    /// for `reason` leads to, at `now` (this host's clock: the failure
    /// log's time, and the next attempt's estimate in a `notice.failing`
    /// event). `permanent`: the channel or handler said not to retry.
    /// `jitter` (-1 to 1) places the wait within the definition's
    /// `retry_jitter` (the recorder draws it at random).
    pub(crate) fn decide(
        def: &DefRef,
        failed: &Failed<'_>,
        reason: &str,
        permanent: bool,
        now: NaiveDateTime,
        jitter: f64,
    ) -> FailurePlan {
        let failures = failed.attempt;
        let is_final = permanent || def.retry.exhausted(failures);
        let errors = match failed.tries {
            0 => append_error(failed.stored_errors, now, failed.attempt, reason),
            tries => append_try(failed.errors_so_far, now, failed.attempt, tries + 1, reason),
        };
        let delay = def.retry.jittered(failures, jitter);
        let alerts = def.alert.fires(failures, is_final);
        let event_notice = failed.origin == Origin::Event;
        let recipients = match (alerts, def.alert_emails.is_empty(), event_notice) {
            (false, _, _) => None,
            (true, false, _) => Some(Recipients::Definition(def.alert_emails.clone())),
            (true, true, true) => Some(Recipients::AlertDefinition),
            (true, true, false) => None,
        };
        let next = (!is_final).then(|| now + delay);
        let events = Self::events(def, failed, reason, is_final, alerts, next);
        FailurePlan {
            is_final,
            retry_times: i32::try_from(failures).unwrap_or(i32::MAX),
            delay,
            alerts,
            recipients,
            events,
            lost_event: event_notice && is_final,
            report: FailureEvent {
                notice_id: failed.id,
                def: def.clone(),
                attempt: failed.attempt,
                failures,
                is_final,
                reason: reason.to_string(),
                errors: errors.clone(),
                param: failed.param.to_string(),
                retry_in: (!is_final).then_some(delay),
                next_call_time: None,
            },
            errors,
        }
    }

    /// `notice.failed` (and `key.blocked` for a key it holds) when final;
    /// `notice.failing` when the alert policy fires on a failure that is
    /// not. The caller's events step drops them all when the definition
    /// sends none or the notice is an event.
    fn events(
        def: &DefRef,
        failed: &Failed<'_>,
        reason: &str,
        is_final: bool,
        alerts: bool,
        next: Option<NaiveDateTime>,
    ) -> Vec<Event> {
        let notice = |next| NoticeRef {
            id: failed.id,
            attempt: failed.attempt,
            failures: failed.attempt,
            ordering_key: failed.ordering_key.map(str::to_string),
            next_attempt_at: next,
        };
        let mut events = Vec::new();
        if is_final {
            let mut failed_event = Event::new(EventKind::NoticeFailed, def, reason);
            failed_event.notice = Some(notice(None));
            events.push(failed_event);
            if let (
                Ordering::PerKey {
                    stop_on_failure: true,
                },
                Some(key),
            ) = (def.ordering, failed.ordering_key)
            {
                let mut blocked = Event::new(
                    EventKind::KeyBlocked,
                    def,
                    format!("notice {} failed for good: {reason}", failed.id),
                );
                blocked.notice = Some(notice(None));
                blocked.key = Some(key.to_string());
                events.push(blocked);
            }
        } else if alerts {
            let mut failing = Event::new(EventKind::NoticeFailing, def, reason);
            failing.notice = Some(notice(next));
            events.push(failing);
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::NaiveDate;
    use serde_json::json;

    use super::*;
    use crate::def::{Channel, DefSpec};

    fn now() -> NaiveDateTime {
        NaiveDate::from_ymd_opt(2026, 11, 28)
            .and_then(|d| d.and_hms_opt(12, 0, 0))
            .unwrap()
    }

    /// A definition: retries `5s,1m` twice (3 attempts), alert type
    /// `alert_type` after 2 failures, mailing `email`.
    fn def(alert_type: i64, email: &str, per_key: bool) -> DefRef {
        let mut spec = DefSpec::new("hook", Channel::Handler, json!({"handler": "h"}));
        spec.retry_interval = "5s,1m".into();
        spec.max_retry_times = 2;
        spec.alert_trigger_type = alert_type;
        spec.alert_trigger_fail_times = 2;
        spec.email = email.into();
        spec.events_to = "ops".into();
        if per_key {
            spec.ordering = "per_key".into();
        }
        Arc::new(spec.validate(7, "test").unwrap())
    }

    fn failed(attempt: u32, origin: Origin, key: Option<&'static str>) -> Failed<'static> {
        Failed {
            id: 42,
            attempt,
            tries: 0,
            stored_errors: "",
            errors_so_far: "",
            origin,
            ordering_key: key,
            param: "{\"order\":1}",
        }
    }

    fn kinds(plan: &FailurePlan) -> Vec<EventKind> {
        plan.events.iter().map(|e| e.kind).collect()
    }

    /// One row: (alert type, email, per key, attempt, permanent, key,
    /// origin) → (final, delay, alerts, recipients, events).
    #[test]
    fn a_policy_and_a_failure_give_one_plan() {
        use EventKind::*;
        let ops = || Some(Recipients::Definition(vec!["ops@example.com".into()]));
        #[allow(clippy::type_complexity)]
        let table: Vec<(
            (i64, &str, bool, u32, bool, Option<&'static str>, Origin),
            (bool, u64, bool, Option<Recipients>, Vec<EventKind>),
        )> = vec![
            // Type 0 (the default): only the final failure alerts.
            (
                (
                    0,
                    "ops@example.com",
                    false,
                    1,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 5, false, None, vec![]),
            ),
            (
                (
                    0,
                    "ops@example.com",
                    false,
                    2,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 60, false, None, vec![]),
            ),
            // The last interval repeats; the third failure is the last.
            (
                (
                    0,
                    "ops@example.com",
                    false,
                    3,
                    false,
                    None,
                    Origin::Producer,
                ),
                (true, 60, true, ops(), vec![NoticeFailed]),
            ),
            // A permanent failure ends it at once.
            (
                (0, "ops@example.com", false, 1, true, None, Origin::Producer),
                (true, 5, true, ops(), vec![NoticeFailed]),
            ),
            // Type 1: failures 1, 2, 4, … and the final one alert; those
            // not final say failing.
            (
                (
                    1,
                    "ops@example.com",
                    false,
                    1,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 5, true, ops(), vec![NoticeFailing]),
            ),
            (
                (
                    1,
                    "ops@example.com",
                    false,
                    2,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 60, true, ops(), vec![NoticeFailing]),
            ),
            (
                (
                    1,
                    "ops@example.com",
                    false,
                    3,
                    false,
                    None,
                    Origin::Producer,
                ),
                (true, 60, true, ops(), vec![NoticeFailed]),
            ),
            // Type 2: never.
            (
                (
                    2,
                    "ops@example.com",
                    false,
                    1,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 5, false, None, vec![]),
            ),
            (
                (
                    2,
                    "ops@example.com",
                    false,
                    3,
                    false,
                    None,
                    Origin::Producer,
                ),
                (true, 60, false, None, vec![NoticeFailed]),
            ),
            // Type 3: once, at the 2nd failure.
            (
                (
                    3,
                    "ops@example.com",
                    false,
                    1,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 5, false, None, vec![]),
            ),
            (
                (
                    3,
                    "ops@example.com",
                    false,
                    2,
                    false,
                    None,
                    Origin::Producer,
                ),
                (false, 60, true, ops(), vec![NoticeFailing]),
            ),
            (
                (
                    3,
                    "ops@example.com",
                    false,
                    3,
                    false,
                    None,
                    Origin::Producer,
                ),
                (true, 60, false, None, vec![NoticeFailed]),
            ),
            // No one to mail: the hook still runs, no e-mail.
            (
                (1, "", false, 1, false, None, Origin::Producer),
                (false, 5, true, None, vec![NoticeFailing]),
            ),
            // An event notice with no recipients of its own: the alert
            // definition's.
            (
                (1, "", false, 1, false, None, Origin::Event),
                (
                    false,
                    5,
                    true,
                    Some(Recipients::AlertDefinition),
                    vec![NoticeFailing],
                ),
            ),
            (
                (0, "", false, 3, false, None, Origin::Event),
                (
                    true,
                    60,
                    true,
                    Some(Recipients::AlertDefinition),
                    vec![NoticeFailed],
                ),
            ),
            // A per-key final failure holds its key.
            (
                (2, "", true, 3, false, Some("order-1"), Origin::Producer),
                (true, 60, false, None, vec![NoticeFailed, KeyBlocked]),
            ),
            // Without a key there is nothing to block.
            (
                (2, "", true, 3, false, None, Origin::Producer),
                (true, 60, false, None, vec![NoticeFailed]),
            ),
        ];
        for ((alert, email, per_key, attempt, permanent, key, origin), want) in table {
            let d = def(alert, email, per_key);
            let plan = FailurePlan::decide(
                &d,
                &failed(attempt, origin, key),
                "HTTP 503",
                permanent,
                now(),
                0.0,
            );
            let got = (
                plan.is_final,
                plan.delay.as_secs(),
                plan.alerts,
                plan.recipients.clone(),
                kinds(&plan),
            );
            assert_eq!(
                got, want,
                "alert type {alert}, email {email:?}, per key {per_key}, attempt {attempt}, permanent {permanent}, key {key:?}"
            );
            assert_eq!(plan.retry_times, attempt as i32);
            assert_eq!(plan.lost_event, plan.is_final && origin == Origin::Event);
            assert!(
                plan.errors
                    .ends_with(&format!("attempt {attempt}: HTTP 503")),
                "{}",
                plan.errors
            );
            assert_eq!(plan.report.retry_in, (!plan.is_final).then_some(plan.delay));
        }
    }

    #[test]
    fn the_failing_event_names_the_next_attempt_and_the_key_event_the_key() {
        let d = def(1, "ops@example.com", true);
        // Failure 1 alerts (type 1) and is not final: notice.failing.
        let plan = FailurePlan::decide(
            &d,
            &failed(1, Origin::Producer, Some("k")),
            "boom",
            false,
            now(),
            0.0,
        );
        let notice = plan.events[0].notice.as_ref().unwrap();
        assert_eq!(notice.next_attempt_at, Some(now() + Duration::from_secs(5)));
        assert_eq!(notice.ordering_key.as_deref(), Some("k"));
        let plan = FailurePlan::decide(
            &d,
            &failed(3, Origin::Producer, Some("k")),
            "boom",
            false,
            now(),
            0.0,
        );
        assert_eq!(plan.events[1].key.as_deref(), Some("k"));
        assert_eq!(plan.events[1].reason, "notice 42 failed for good: boom");
        assert_eq!(
            plan.events[0].notice.as_ref().unwrap().next_attempt_at,
            None
        );
    }

    #[test]
    fn the_wait_moves_within_the_jitter_it_is_given() {
        let mut spec = DefSpec::new("hook", Channel::Handler, json!({"handler": "h"}));
        spec.retry_interval = "10s".into();
        spec.retry_jitter = 20;
        let d: DefRef = Arc::new(spec.validate(7, "test").unwrap());
        let wait = |jitter| {
            FailurePlan::decide(
                &d,
                &failed(1, Origin::Producer, None),
                "x",
                false,
                now(),
                jitter,
            )
            .delay
            .as_millis()
        };
        assert_eq!((wait(-1.0), wait(0.0), wait(1.0)), (8_000, 10_000, 12_000));
    }

    #[test]
    fn an_immediate_retry_adds_its_try_to_the_log_so_far() {
        let d = def(0, "", false);
        let mut f = failed(1, Origin::Producer, None);
        f.stored_errors = "old";
        f.errors_so_far = "2026-11-28T11:59:59.000Z attempt 1, try 1: first";
        f.tries = 1;
        let plan = FailurePlan::decide(&d, &f, "second", false, now(), 0.0);
        assert!(
            plan.errors
                .starts_with("2026-11-28T11:59:59.000Z attempt 1, try 1: first"),
            "{}",
            plan.errors
        );
        assert!(
            plan.errors.contains("attempt 1, try 2: second"),
            "{}",
            plan.errors
        );
        assert!(!plan.errors.contains("old"), "{}", plan.errors);
    }
}
