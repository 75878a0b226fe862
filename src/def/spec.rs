//! The column values of a definition ([`DefSpec`], unvalidated) and its
//! checks: [`DefSpec::check_columns`] before a write,
//! [`DefSpec::validate`] into the [`Def`] producers and dispatch use.

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    overrides,
    policy::{
        AlertPolicy, Circuit, Confirm, DEFAULT_IMMEDIATE_RETRY_DELAY_MS, ImmediateRetries,
        MAX_IMMEDIATE_RETRIES, MAX_IMMEDIATE_RETRY_DELAY_MS, MAX_RETRY_JITTER, OnError, Ordering,
        PER_KEY, RateLimit,
    },
    target::{Channel, Target, parse_address},
};
use crate::{
    entity::notify_def,
    error::DefinitionError,
    schedule::{RetryIntervals, RetryPolicy},
};

/// Default `retry_interval`: `5s,5m,1h,1d`.
pub const DEFAULT_RETRY_INTERVAL: &str = "5s,5m,1h,1d";
/// Default `max_retry_times`: 5 retries after the first attempt.
pub const DEFAULT_MAX_RETRY_TIMES: i64 = 5;
/// Default `max_retry_interval`: 1440 minutes (one day). `0` means no cap.
pub const DEFAULT_MAX_RETRY_INTERVAL: i64 = 1440;

/// A validated definition, ready for producers and dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Def {
    /// `notify_def.id`.
    pub id: i64,
    /// Unique name.
    pub name: String,
    /// Channel and its settings (of the first step, with `steps`).
    pub target: Target,
    /// The target as stored, for merging per-notice overrides.
    pub target_json: Value,
    /// The steps a notice runs, in order: one (`target`) without `steps`.
    /// Never empty.
    pub steps: Vec<Step>,
    /// Retry schedule and limits.
    pub retry: RetryPolicy,
    /// When failures alert.
    pub alert: AlertPolicy,
    /// Alert recipients.
    pub alert_emails: Vec<String>,
    /// Confirmation policy.
    pub confirm: Confirm,
    /// Free text.
    pub description: String,
    /// While this lies ahead (UTC), the definition is paused: no worker
    /// claims its notices and after-commit attempts leave them to a sweeper.
    /// Read from `notify_def.paused_until`; `None` for a definition built
    /// from a spec.
    pub paused_until: Option<chrono::NaiveDateTime>,
    /// Circuit breaker; `None`: off.
    pub circuit: Option<Circuit>,
    /// What a handler's `Err` or panic means.
    pub on_error: OnError,
    /// Tries again within the same claim before the schedule takes over.
    pub immediate: ImmediateRetries,
    /// Most tries started per window, across all workers; `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Whether notices with an `ordering_key` go one at a time per key.
    pub ordering: Ordering,
    /// Which target fields a notice may override ([`overrides`]).
    pub overrides: overrides::Overrides,
    /// The definition that receives this one's operational events
    /// ([`crate::event`]); `None`: none.
    pub events_to: Option<String>,
    /// Whether params and step results are stored sealed
    /// ([`crate::crypto`]).
    pub encrypt: bool,
}

/// One step of a multi-step definition: a channel and its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Channel and its settings.
    pub target: Target,
    /// The target as stored.
    pub target_json: Value,
}

/// Most `steps` a definition may have: 10.
pub const MAX_STEPS: usize = 10;

impl Def {
    /// Whether notices of this definition run several steps (`steps` with
    /// more than one entry).
    pub fn multi_step(&self) -> bool {
        self.steps.len() > 1
    }

    /// Whether the definition is paused at `now` (UTC).
    pub fn is_paused_at(&self, now: chrono::NaiveDateTime) -> bool {
        self.paused_until.is_some_and(|until| until > now)
    }
}

/// Parses a `steps` value: an array of 1 to [`MAX_STEPS`] objects
/// `{"channel": …, "target": …}`. A problem names its field
/// (`steps[1].target`).
fn parse_steps(value: &Value) -> Result<Vec<Step>, (String, String)> {
    let shape = || "must be an array of { channel, target } tables".to_string();
    let list = value
        .as_array()
        .ok_or_else(|| ("steps".to_string(), shape()))?;
    if list.is_empty() || list.len() > MAX_STEPS {
        return Err((
            "steps".into(),
            format!("must have 1 to {MAX_STEPS} steps, not {}", list.len()),
        ));
    }
    let mut steps = Vec::new();
    for (i, step) in list.iter().enumerate() {
        let field = |name: &str| format!("steps[{i}]{name}");
        let step = step.as_object().ok_or_else(|| (field(""), shape()))?;
        if let Some(unknown) = step.keys().find(|k| *k != "channel" && *k != "target") {
            return Err((field(&format!(".{unknown}")), "unknown field".into()));
        }
        let channel = step
            .get("channel")
            .ok_or_else(|| (field(".channel"), "missing".to_string()))?;
        let channel = channel.as_str().and_then(Channel::parse).ok_or_else(|| {
            (
                field(".channel"),
                format!("unknown channel {channel} (use http, amqp, email or handler)"),
            )
        })?;
        let target_json = step
            .get("target")
            .ok_or_else(|| (field(".target"), "missing".to_string()))?;
        let target = Target::parse(channel, target_json).map_err(|p| (field(".target"), p))?;
        steps.push(Step {
            target,
            target_json: target_json.clone(),
        });
    }
    Ok(steps)
}

fn default_immediate_retry_delay() -> i64 {
    DEFAULT_IMMEDIATE_RETRY_DELAY_MS
}

/// Default [`DefSpec::on_error`]: `retry`.
pub const DEFAULT_ON_ERROR: &str = "retry";

fn default_on_error() -> String {
    DEFAULT_ON_ERROR.into()
}

/// The column values of a definition, unvalidated: what a TOML file or a
/// `notify_def` row holds. Field names are the column names.
///
/// ```no_run
/// # async fn run(db: sea_orm::DatabaseConnection) -> Result<(), solid_notify::Error> {
/// use solid_notify::def::{Channel, DefSpec, store};
/// let mut spec = DefSpec::new(
///     "order_paid",
///     Channel::Http,
///     serde_json::json!({"url": "https://crm.example.com/hooks/orders"}),
/// );
/// spec.retry_interval = "5s,5m,1h,1d".into();
/// spec.max_retry_times = 8;
/// store::sync(&db, &[spec]).await?; // checked, then inserted or updated
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefSpec {
    /// Unique name (the table key in a TOML file).
    pub name: String,
    /// `http`, `amqp`, `email` or `handler`.
    pub channel: String,
    /// The channel's settings, a JSON object.
    pub target: Value,
    /// `5m` or `5s,5m,1h,1d`. Default [`DEFAULT_RETRY_INTERVAL`].
    pub retry_interval: String,
    /// Retries after the first attempt, -1 = unlimited. Default [`DEFAULT_MAX_RETRY_TIMES`].
    pub max_retry_times: i64,
    /// Cap on one wait in minutes, 0 = none. Default [`DEFAULT_MAX_RETRY_INTERVAL`].
    pub max_retry_interval: i64,
    /// 0 final failure, 1 every failure, 2 never, 3 after N failures. Default 0.
    pub alert_trigger_type: i64,
    /// N for type 3. Default 0.
    pub alert_trigger_fail_times: i64,
    /// Alert recipients, comma separated. Default empty (alerts are only logged).
    pub email: String,
    /// Whether a send only counts once confirmed. Default `false`.
    pub need_confirm: bool,
    /// Seconds to wait for confirmation, 0 = forever. Default 0.
    pub max_confirm_delay: i64,
    /// Free text. Default empty.
    pub description: String,
    /// Circuit breaker: pause the definition after this many failed
    /// attempts within `circuit_window` with no success among them; 0 = off.
    /// Default 0. (TOML: `circuit = { failures = 20, window = "1m",
    /// cool_down = "5m" }`.)
    #[serde(default)]
    pub circuit_failures: i64,
    /// The circuit's window in seconds. Default [`DEFAULT_CIRCUIT_WINDOW`].
    #[serde(default = "default_circuit_window")]
    pub circuit_window: i64,
    /// Seconds the circuit stays open before one probe attempt. Default
    /// [`DEFAULT_CIRCUIT_COOL_DOWN`].
    #[serde(default = "default_circuit_cool_down")]
    pub circuit_cool_down: i64,
    /// What a handler's `Err` or panic means: `retry` (retried on the
    /// schedule) or `fail` (a final failure at once). Default
    /// [`DEFAULT_ON_ERROR`].
    #[serde(default = "default_on_error")]
    pub on_error: String,
    /// Extra tries within the same claim after a retryable failure, 0 to
    /// [`MAX_IMMEDIATE_RETRIES`]. Default 0. See [`ImmediateRetries`].
    #[serde(default)]
    pub immediate_retries: i64,
    /// Milliseconds before each immediate retry, 0 to
    /// [`MAX_IMMEDIATE_RETRY_DELAY_MS`]. Default
    /// [`DEFAULT_IMMEDIATE_RETRY_DELAY_MS`]. (TOML: `"200ms"`, `"1s"`.)
    #[serde(default = "default_immediate_retry_delay")]
    pub immediate_retry_delay: i64,
    /// Each scheduled wait is spread by ± this percentage, 0 to
    /// [`MAX_RETRY_JITTER`]. Default 0. (TOML: `"20%"`.)
    #[serde(default)]
    pub retry_jitter: i64,
    /// Most tries started per second, minute or hour across all workers:
    /// `50/s`, `600/m`, `1000/h`; empty: no limit. Default empty. See
    /// [`RateLimit`].
    #[serde(default)]
    pub rate_limit: String,
    /// `per_key` to deliver notices sharing an `ordering_key` one at a time,
    /// oldest first; empty: unordered. Default empty. See [`Ordering`].
    #[serde(default)]
    pub ordering: String,
    /// With `ordering = "per_key"`: whether a final failure holds back the
    /// later notices of its key until it is requeued or cancelled. Default
    /// true.
    #[serde(default = "default_stop_on_failure")]
    pub stop_on_failure: bool,
    /// The steps of a multi-step notice, run in order and resumed at the
    /// one that failed: a JSON array of 1 to [`MAX_STEPS`] objects
    /// `{"channel": …, "target": …}`; `null` (the default): the one step of
    /// `channel` and `target`, which are ignored when this is set (`defs
    /// sync` writes the first step's there). See [`Step`].
    #[serde(default)]
    pub steps: Value,
    /// The name of the definition that receives this one's operational
    /// events (`docs/events.md`): any definition, on any channel; empty
    /// (the default): none. Not this definition itself.
    #[serde(default)]
    pub events_to: String,
    /// Whether params, and the step results derived from them, are stored
    /// sealed and opened only to deliver them ([`crate::crypto`]). Default
    /// false.
    #[serde(default)]
    pub encrypt: bool,
}

fn default_stop_on_failure() -> bool {
    true
}

/// Default circuit window: 60 seconds.
pub const DEFAULT_CIRCUIT_WINDOW: i64 = 60;
/// Default circuit cool-down: 300 seconds.
pub const DEFAULT_CIRCUIT_COOL_DOWN: i64 = 300;

fn default_circuit_window() -> i64 {
    DEFAULT_CIRCUIT_WINDOW
}

fn default_circuit_cool_down() -> i64 {
    DEFAULT_CIRCUIT_COOL_DOWN
}

impl DefSpec {
    /// A spec with every default filled in.
    pub fn new(name: impl Into<String>, channel: Channel, target: Value) -> Self {
        DefSpec {
            name: name.into(),
            channel: channel.as_str().into(),
            target,
            retry_interval: DEFAULT_RETRY_INTERVAL.into(),
            max_retry_times: DEFAULT_MAX_RETRY_TIMES,
            max_retry_interval: DEFAULT_MAX_RETRY_INTERVAL,
            alert_trigger_type: 0,
            alert_trigger_fail_times: 0,
            email: String::new(),
            need_confirm: false,
            max_confirm_delay: 0,
            description: String::new(),
            circuit_failures: 0,
            circuit_window: DEFAULT_CIRCUIT_WINDOW,
            circuit_cool_down: DEFAULT_CIRCUIT_COOL_DOWN,
            on_error: DEFAULT_ON_ERROR.into(),
            immediate_retries: 0,
            immediate_retry_delay: DEFAULT_IMMEDIATE_RETRY_DELAY_MS,
            retry_jitter: 0,
            rate_limit: String::new(),
            ordering: String::new(),
            stop_on_failure: true,
            steps: Value::Null,
            events_to: String::new(),
            encrypt: false,
        }
    }

    /// A definition whose notices go to the Rust handler registered as
    /// `handler` ([`NotifierBuilder::handler`](crate::NotifierBuilder::handler)),
    /// every other field at its default.
    pub fn handler(name: impl Into<String>, handler: impl Into<String>) -> Self {
        DefSpec::new(
            name,
            Channel::Handler,
            serde_json::json!({ "handler": handler.into() }),
        )
    }

    #[doc(hidden)]
    /// Reads the spec back from a stored row.
    pub fn from_row(row: &notify_def::Model) -> Result<Self, DefinitionError> {
        let target = serde_json::from_str(&row.target).map_err(|e| DefinitionError {
            origin: format!("notify_def#{}", row.id),
            def: row.name.clone(),
            field: "target".into(),
            problem: format!("not valid JSON: {e}"),
        })?;
        Ok(DefSpec {
            name: row.name.clone(),
            channel: row.channel.clone(),
            target,
            retry_interval: row.retry_interval.clone(),
            max_retry_times: row.max_retry_times.into(),
            max_retry_interval: row.max_retry_interval.into(),
            alert_trigger_type: row.alert_trigger_type.into(),
            alert_trigger_fail_times: row.alert_trigger_fail_times.into(),
            email: row.email.clone(),
            need_confirm: row.need_confirm,
            max_confirm_delay: row.max_confirm_delay.into(),
            description: row.description.clone(),
            circuit_failures: row.circuit_failures.into(),
            circuit_window: row.circuit_window.into(),
            circuit_cool_down: row.circuit_cool_down.into(),
            on_error: row.on_error.clone(),
            immediate_retries: row.immediate_retries.into(),
            immediate_retry_delay: row.immediate_retry_delay.into(),
            retry_jitter: row.retry_jitter.into(),
            rate_limit: row.rate_limit.clone(),
            ordering: row.ordering.clone(),
            stop_on_failure: row.stop_on_failure,
            events_to: row.events_to.clone(),
            encrypt: row.encrypt,
            steps: match row.steps.trim() {
                "" => Value::Null,
                text => serde_json::from_str(text).map_err(|e| DefinitionError {
                    origin: format!("notify_def#{}", row.id),
                    def: row.name.clone(),
                    field: "steps".into(),
                    problem: format!("not valid JSON: {e}"),
                })?,
            },
        })
    }

    #[doc(hidden)]
    /// Checks what the columns can hold, before a spec is written (a row
    /// already stored is not held to it: SQLite keeps what it was given):
    /// no NUL (PostgreSQL refuses it in text), `retry_interval` within
    /// [`MAX_RETRY_INTERVAL_BYTES`] and `rate_limit` within
    /// [`MAX_RATE_LIMIT_BYTES`].
    pub fn check_columns(&self, source: &str) -> Result<(), DefinitionError> {
        let fail = |field: &str, problem: String| DefinitionError {
            origin: source.to_string(),
            def: self.name.clone(),
            field: field.to_string(),
            problem,
        };
        for (field, text, max) in [
            ("name", &self.name, MAX_NAME_BYTES),
            (
                "retry_interval",
                &self.retry_interval,
                MAX_RETRY_INTERVAL_BYTES,
            ),
            ("rate_limit", &self.rate_limit, MAX_RATE_LIMIT_BYTES),
            ("email", &self.email, usize::MAX),
            ("description", &self.description, usize::MAX),
            ("channel", &self.channel, usize::MAX),
            ("events_to", &self.events_to, MAX_NAME_BYTES),
        ] {
            if text.contains('\0') {
                return Err(fail(field, "must not hold NUL".into()));
            }
            if text.len() > max {
                return Err(fail(
                    field,
                    format!("is {} bytes, over the column's {max}", text.len()),
                ));
            }
        }
        Ok(())
    }

    #[doc(hidden)]
    /// Validates every field; `source` names where the spec came from. The
    /// checks run in the order of the fields, each stage below one field
    /// or a few that go together; the first problem is the error.
    pub fn validate(&self, id: i64, source: &str) -> Result<Def, DefinitionError> {
        let fail = |field: &str, problem: String| DefinitionError {
            origin: source.to_string(),
            def: self.name.clone(),
            field: field.to_string(),
            problem,
        };
        self.check_name(&fail)?;
        let (steps, overrides) = self.steps(&fail)?;
        let (target, target_json) = (steps[0].target.clone(), steps[0].target_json.clone());
        let (intervals, max_retries, cap) = self.schedule(&fail)?;
        let alert = self.alert_policy(max_retries, &fail)?;
        let alert_emails = parse_address_list(&self.email).map_err(|p| fail("email", p))?;
        let confirm = self.confirm(&fail)?;
        let circuit = self.circuit(&fail)?;
        let on_error = match self.on_error.as_str() {
            "retry" => OnError::Retry,
            "fail" => OnError::Fail,
            other => {
                return Err(fail(
                    "on_error",
                    format!("`{other}` is not \"retry\" or \"fail\""),
                ));
            }
        };
        let immediate = self.immediate(&fail)?;
        let jitter_percent = non_negative(self.retry_jitter)
            .filter(|n| *n <= MAX_RETRY_JITTER)
            .ok_or_else(|| {
                fail(
                    "retry_jitter",
                    format!(
                        "{}% is not from 0% to {MAX_RETRY_JITTER}%",
                        self.retry_jitter
                    ),
                )
            })?;
        let rate_limit = match self.rate_limit.trim() {
            "" => None,
            text => Some(RateLimit::parse(text).map_err(|p| fail("rate_limit", p))?),
        };
        let ordering = self.ordering(&fail)?;
        // Alert notices are written by the library, unsealed; they carry
        // no param of a notice.
        if self.encrypt && self.name == "solid_notify_alert" {
            return Err(fail(
                "encrypt",
                "the alert definition solid_notify_alert cannot be encrypted".into(),
            ));
        }
        let events_to = self.events_to(&fail)?;
        Ok(Def {
            id,
            name: self.name.clone(),
            target,
            target_json,
            steps,
            retry: RetryPolicy {
                intervals,
                max_retries,
                cap,
                jitter_percent,
            },
            alert,
            alert_emails,
            confirm,
            description: self.description.clone(),
            paused_until: None,
            circuit,
            on_error,
            immediate,
            rate_limit,
            ordering,
            overrides,
            events_to,
            encrypt: self.encrypt,
        })
    }

    /// `name`: 1 to [`MAX_NAME_BYTES`] bytes, no control characters.
    fn check_name(&self, fail: &Fail<'_>) -> Result<(), DefinitionError> {
        if self.name.trim().is_empty() || self.name.len() > MAX_NAME_BYTES {
            return Err(fail("name", format!("must be 1 to {MAX_NAME_BYTES} bytes")));
        }
        if self.name.contains(|c: char| c.is_control() && c != '\t') {
            return Err(fail(
                "name",
                "must not hold control characters (NUL, CR, LF, …)".into(),
            ));
        }
        Ok(())
    }

    /// `channel` and `target` (one step, with the overrides the target
    /// allows), or `steps`.
    fn steps(&self, fail: &Fail<'_>) -> Result<(Vec<Step>, overrides::Overrides), DefinitionError> {
        if !self.steps.is_null() {
            let steps = parse_steps(&self.steps).map_err(|(field, p)| fail(&field, p))?;
            return Ok((steps, overrides::Overrides::default()));
        }
        let channel = Channel::parse(&self.channel).ok_or_else(|| {
            fail(
                "channel",
                format!(
                    "unknown channel `{}` (use http, amqp, email or handler)",
                    self.channel
                ),
            )
        })?;
        let mut target_json = self.target.clone();
        let overrides =
            overrides::Overrides::take(channel, &mut target_json).map_err(|p| fail("target", p))?;
        let target = Target::parse(channel, &target_json).map_err(|p| fail("target", p))?;
        Ok((
            vec![Step {
                target,
                target_json,
            }],
            overrides,
        ))
    }

    /// `retry_interval`, `max_retry_times` (-1: forever) and
    /// `max_retry_interval` (minutes, 0: no cap).
    fn schedule(
        &self,
        fail: &Fail<'_>,
    ) -> Result<(RetryIntervals, Option<u32>, Option<Duration>), DefinitionError> {
        let intervals: RetryIntervals = self
            .retry_interval
            .parse()
            .map_err(|p| fail("retry_interval", p))?;
        let max_retries = match self.max_retry_times {
            -1 => None,
            n => Some(
                u32::try_from(n)
                    .ok()
                    .filter(|n| *n <= i32::MAX as u32)
                    .ok_or_else(|| fail("max_retry_times", format!("{n} is not -1 or a count")))?,
            ),
        };
        let cap_minutes = non_negative(self.max_retry_interval)
            .ok_or_else(|| fail("max_retry_interval", "must be 0 (no cap) or minutes".into()))?;
        let cap = (cap_minutes > 0).then(|| Duration::from_secs(u64::from(cap_minutes) * 60));
        Ok((intervals, max_retries, cap))
    }

    /// `alert_trigger_type` and `alert_trigger_fail_times` (type 3's count
    /// must be reachable within `max_retries`).
    fn alert_policy(
        &self,
        max_retries: Option<u32>,
        fail: &Fail<'_>,
    ) -> Result<AlertPolicy, DefinitionError> {
        let alert = match self.alert_trigger_type {
            0 => AlertPolicy::OnFinalFailure,
            1 => AlertPolicy::OnEveryFailure,
            2 => AlertPolicy::Never,
            3 => {
                let n = non_negative(self.alert_trigger_fail_times)
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        fail(
                            "alert_trigger_fail_times",
                            "alert type 3 needs a count of at least 1".into(),
                        )
                    })?;
                if let Some(max) = max_retries
                    && n > max.saturating_add(1)
                {
                    return Err(fail(
                        "alert_trigger_fail_times",
                        format!(
                            "{n} failures can never happen with max_retry_times = {max} ({} attempts)",
                            max + 1
                        ),
                    ));
                }
                AlertPolicy::AfterFailures(n)
            }
            other => {
                return Err(fail(
                    "alert_trigger_type",
                    format!(
                        "{other} is not 0 (final failure), 1 (every failure), 2 (never) or 3 (after N failures)"
                    ),
                ));
            }
        };
        if non_negative(self.alert_trigger_fail_times).is_none() {
            return Err(fail(
                "alert_trigger_fail_times",
                "must not be negative".into(),
            ));
        }
        Ok(alert)
    }

    /// `need_confirm` and `max_confirm_delay` (seconds, 0: forever).
    fn confirm(&self, fail: &Fail<'_>) -> Result<Confirm, DefinitionError> {
        let delay = non_negative(self.max_confirm_delay)
            .ok_or_else(|| fail("max_confirm_delay", "must be 0 (forever) or seconds".into()))?;
        Ok(match (self.need_confirm, delay) {
            (false, _) => Confirm::NotNeeded,
            (true, 0) => Confirm::Forever,
            (true, secs) => Confirm::Within(Duration::from_secs(secs.into())),
        })
    }

    /// `circuit_failures` (0: off), `circuit_window`, `circuit_cool_down`.
    fn circuit(&self, fail: &Fail<'_>) -> Result<Option<Circuit>, DefinitionError> {
        let failures = match non_negative(self.circuit_failures) {
            None => {
                return Err(fail(
                    "circuit_failures",
                    "must be 0 (off) or a count".into(),
                ));
            }
            Some(0) => return Ok(None),
            Some(failures) => failures,
        };
        let secs = |field: &str, n: i64| {
            non_negative(n)
                .filter(|n| *n > 0)
                .map(|n| Duration::from_secs(n.into()))
                .ok_or_else(|| fail(field, format!("{n} is not a positive number of seconds")))
        };
        Ok(Some(Circuit {
            failures,
            window: secs("circuit_window", self.circuit_window)?,
            cool_down: secs("circuit_cool_down", self.circuit_cool_down)?,
        }))
    }

    /// `immediate_retries` and `immediate_retry_delay` (ms).
    fn immediate(&self, fail: &Fail<'_>) -> Result<ImmediateRetries, DefinitionError> {
        Ok(ImmediateRetries {
            count: non_negative(self.immediate_retries)
                .filter(|n| *n <= MAX_IMMEDIATE_RETRIES)
                .ok_or_else(|| {
                    fail(
                        "immediate_retries",
                        format!(
                            "{} is not a count from 0 to {MAX_IMMEDIATE_RETRIES}",
                            self.immediate_retries
                        ),
                    )
                })?,
            delay: non_negative(self.immediate_retry_delay)
                .filter(|n| *n <= MAX_IMMEDIATE_RETRY_DELAY_MS)
                .map(|ms| Duration::from_millis(ms.into()))
                .ok_or_else(|| {
                    fail(
                        "immediate_retry_delay",
                        format!(
                            "{} ms is not from 0 to {MAX_IMMEDIATE_RETRY_DELAY_MS} ms",
                            self.immediate_retry_delay
                        ),
                    )
                })?,
        })
    }

    /// `ordering` (exactly as the claims compare it in SQL) and
    /// `stop_on_failure`.
    fn ordering(&self, fail: &Fail<'_>) -> Result<Ordering, DefinitionError> {
        match self.ordering.as_str() {
            "" => Ok(Ordering::Unordered),
            PER_KEY => Ok(Ordering::PerKey {
                stop_on_failure: self.stop_on_failure,
            }),
            other => Err(fail(
                "ordering",
                format!("`{other}` is not \"{PER_KEY}\" (or empty: unordered)"),
            )),
        }
    }

    /// `events_to`: another definition's name, never the alert
    /// definition's.
    fn events_to(&self, fail: &Fail<'_>) -> Result<Option<String>, DefinitionError> {
        match self.events_to.as_str() {
            "" => Ok(None),
            name if name == self.name => Err(fail(
                "events_to",
                "must name another definition: a definition's events cannot go to itself".into(),
            )),
            // The reserved alert definition (`alert::ALERT_DEF`) carries
            // alert e-mails only.
            "solid_notify_alert" => Err(fail(
                "events_to",
                "cannot be the alert definition solid_notify_alert: name a definition of your own (any channel)"
                    .into(),
            )),
            name if name.len() > MAX_NAME_BYTES
                || name.trim() != name
                || name.contains(|c: char| c.is_control()) =>
            {
                Err(fail(
                    "events_to",
                    format!(
                        "must be a definition's name (1 to {MAX_NAME_BYTES} bytes, no control characters, no surrounding spaces)"
                    ),
                ))
            }
            name => Ok(Some(name.to_string())),
        }
    }
}

/// How [`DefSpec::validate`]'s stages report a field's problem.
type Fail<'a> = dyn Fn(&str, String) -> DefinitionError + 'a;

/// Longest definition name: 191 bytes (the column is `varchar(191)`).
pub const MAX_NAME_BYTES: usize = 191;
/// Longest `retry_interval`: 255 bytes (the column is `varchar(255)`).
pub const MAX_RETRY_INTERVAL_BYTES: usize = 255;
/// Longest `rate_limit`: 32 bytes (the column is `varchar(32)`).
pub const MAX_RATE_LIMIT_BYTES: usize = 32;

/// `Some(n)` when `n` fits a non-negative `i32` column.
fn non_negative(n: i64) -> Option<u32> {
    u32::try_from(n).ok().filter(|n| *n <= i32::MAX as u32)
}

/// Splits and validates a comma-separated address list (empty = no addresses).
fn parse_address_list(text: &str) -> Result<Vec<String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_address(s).map(|a| a.to_string()))
        .collect()
}

/// A shared, validated definition.
pub type DefRef = Arc<Def>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> DefSpec {
        DefSpec::new("d", Channel::Handler, json!({"handler": "h"}))
    }

    fn field_of(spec: DefSpec) -> String {
        spec.validate(0, "test").unwrap_err().field
    }

    #[test]
    fn defaults_validate() {
        let def = spec().validate(7, "test").unwrap();
        assert_eq!(def.id, 7);
        assert_eq!(def.retry.max_retries, Some(5));
        assert_eq!(def.retry.cap, Some(Duration::from_secs(86_400)));
        assert_eq!(def.alert, AlertPolicy::OnFinalFailure);
        assert_eq!(def.confirm, Confirm::NotNeeded);
    }

    #[test]
    fn each_bad_field_is_named() {
        type Edit = Box<dyn Fn(&mut DefSpec)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("channel", Box::new(|s| s.channel = "sms".into())),
            ("target", Box::new(|s| s.target = json!({"nope": 1}))),
            ("target", Box::new(|s| s.target = json!("h"))),
            (
                "retry_interval",
                Box::new(|s| s.retry_interval = "5 min".into()),
            ),
            ("max_retry_times", Box::new(|s| s.max_retry_times = -2)),
            (
                "max_retry_interval",
                Box::new(|s| s.max_retry_interval = -1),
            ),
            ("alert_trigger_type", Box::new(|s| s.alert_trigger_type = 4)),
            (
                "alert_trigger_fail_times",
                Box::new(|s| s.alert_trigger_type = 3),
            ),
            (
                "alert_trigger_fail_times",
                Box::new(|s| {
                    s.alert_trigger_type = 3;
                    s.alert_trigger_fail_times = 9;
                }),
            ),
            (
                "email",
                Box::new(|s| s.email = "ops@example.com, not-an-address".into()),
            ),
            ("max_confirm_delay", Box::new(|s| s.max_confirm_delay = -5)),
            ("name", Box::new(|s| s.name = " ".into())),
            ("immediate_retries", Box::new(|s| s.immediate_retries = -1)),
            ("immediate_retries", Box::new(|s| s.immediate_retries = 11)),
            (
                "immediate_retry_delay",
                Box::new(|s| s.immediate_retry_delay = 60_001),
            ),
            ("retry_jitter", Box::new(|s| s.retry_jitter = 101)),
            ("retry_jitter", Box::new(|s| s.retry_jitter = -1)),
            ("rate_limit", Box::new(|s| s.rate_limit = "50".into())),
            ("rate_limit", Box::new(|s| s.rate_limit = "0/s".into())),
            ("rate_limit", Box::new(|s| s.rate_limit = "5/d".into())),
        ];
        for (field, edit) in cases {
            let mut s = spec();
            edit(&mut s);
            assert_eq!(field_of(s), field);
        }
    }
}
