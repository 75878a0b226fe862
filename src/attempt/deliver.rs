//! Deliver: run the channel or handler of one claimed attempt, bounded by
//! `attempt_timeout`.
//!
//! Errors, panics and timeouts become retryable failures. When the timeout
//! passes, the delivery's future is dropped: the HTTP request is aborted, the
//! handler stops at its next `.await`. A handler that blocks a thread or
//! spawns work of its own cannot be stopped this way; keep handlers async.

use std::borrow::Cow;
use std::{panic::AssertUnwindSafe, time::Duration};

use futures::FutureExt;

use crate::{
    def::{Confirm, DefRef, Target},
    handler::{Notice, Outcome},
    state::Lease,
    status::Status,
};

use super::engine::Engine;

/// Whether this build can deliver through the channel of `target`: `Err`
/// names the cargo feature that is off.
fn compiled_in(target: &Target) -> Result<(), String> {
    let missing = match target {
        Target::Http(_) if !cfg!(feature = "http") => "http",
        Target::Amqp(_) if !cfg!(feature = "amqp") => "amqp",
        Target::Email(_) if !cfg!(feature = "email") => "email",
        _ => return Ok(()),
    };
    Err(format!(
        "channel `{missing}` is not compiled into this process (cargo feature `{missing}`)"
    ))
}

/// Whether this process can deliver notices of `def` at all (every step).
/// When it cannot, the notice is left for a process that can.
pub(crate) fn available(engine: &Engine, def: &DefRef) -> Result<(), String> {
    // Encrypted notices go to a process that can open them; one that holds
    // keys but not the notice's parks it ([`unusable`]).
    if def.encrypt && !cfg!(feature = "encrypt") {
        return Err(
            "encryption is not compiled into this process (cargo feature `encrypt`)".into(),
        );
    }
    if def.encrypt && engine.settings.keys.current_id().is_none() {
        return Err(format!(
            "`{}` has encrypt = true and this process has no encryption keys",
            def.name
        ));
    }
    for step in &def.steps {
        compiled_in(&step.target)?;
        match &step.target {
            Target::Handler(t) if engine.delivery.handlers.get(&t.handler).is_none() => {
                return Err(format!(
                    "handler `{}` is not registered in this process",
                    t.handler
                ));
            }
            Target::Amqp(_) if !engine.delivery.channels.amqp.enabled() => {
                return Err("channel `amqp` has no broker configured in this process".into());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether an after-commit attempt of `def` must be left to a sweeper
/// because the definition is paused, as this process last read it (within
/// [`Config::def_cache_ttl`](crate::Config::def_cache_ttl); sweeps check the
/// pause in the claiming statement itself).
pub(crate) fn paused(def: &DefRef) -> Result<(), String> {
    match def.paused_until {
        Some(until) if def.is_paused_at(chrono::Utc::now().naive_utc()) => Err(format!(
            "definition `{}` is paused until {until} UTC: left for a sweeper after it resumes",
            def.name
        )),
        _ => Ok(()),
    }
}

/// Request headers an override's `headers` may not set: they would send the
/// request (and the definition's credentials) to another site behind a
/// shared front end without moving its URL.
const ROUTING_HEADERS: [&str; 4] = ["host", "forwarded", "x-forwarded-host", ":authority"];

/// Merges `over` into the definition's target (top-level keys replace),
/// when the definition allows each of its fields
/// ([`overrides`](crate::def::overrides)). An HTTP URL moved to another
/// origin goes without the definition's headers and signature, unless the
/// definition lets them follow.
pub(crate) fn merged_target(
    def: &DefRef,
    over: &serde_json::Value,
) -> std::result::Result<Target, String> {
    let Some(over) = over.as_object() else {
        return Err("target override must be a JSON object".into());
    };
    if let Some(field) = def.overrides.refused(over) {
        return Err(format!(
            "`{field}` may not be overridden: definition `{}` allows overriding {}",
            def.name,
            def.overrides.describe()
        ));
    }
    let mut target = def.target_json.clone();
    let Some(base) = target.as_object_mut() else {
        return Err("the definition's target is not a JSON object".into());
    };
    for (k, v) in over {
        base.insert(k.clone(), v.clone());
    }
    refused_override(over)?;
    let mut merged = Target::parse(def.target.channel(), &target)?;
    if let (Target::Http(merged), Target::Http(own)) = (&mut merged, &def.target) {
        kept_to_own_origin(def, over, merged, own)?;
    }
    Ok(merged)
}

/// `Err` when an override sets what no definition lets it: a header that
/// routes the request, a header value or URL that names a secret.
fn refused_override(over: &serde_json::Map<String, serde_json::Value>) -> Result<(), String> {
    // Headers that route the request elsewhere without moving its URL.
    if let Some(name) = over
        .get("headers")
        .and_then(|h| h.as_object())
        .and_then(|h| {
            h.keys()
                .find(|k| ROUTING_HEADERS.iter().any(|r| k.eq_ignore_ascii_case(r)))
        })
    {
        return Err(format!("header `{name}` may not be overridden"));
    }
    // A secret reference would send any secret of the process where the
    // notice says.
    if let Some(name) = over
        .get("headers")
        .and_then(|h| h.as_object())
        .and_then(|h| h.iter().find(|(_, v)| !v.is_string()).map(|(k, _)| k))
    {
        return Err(format!(
            "header `{name}`: an override's header value must be text (it may not name a secret)"
        ));
    }
    // Nor may its URL: it would send the notice to a secret URL of the
    // process (and tell which secrets exist).
    if over.get("url").is_some_and(|url| !url.is_string()) {
        return Err("`url`: an override's URL must be text (it may not name a secret)".into());
    }
    Ok(())
}

/// Keeps the definition's credentials with its own origin in the `merged`
/// HTTP target: `Err` when `over` moves a URL kept as a secret; a URL moved
/// elsewhere loses the private-network leave, secret headers and (unless
/// they follow) the definition's headers and signature.
fn kept_to_own_origin(
    def: &DefRef,
    over: &serde_json::Map<String, serde_json::Value>,
    merged: &mut crate::def::HttpTarget,
    own: &crate::def::HttpTarget,
) -> Result<(), String> {
    // A URL kept as a secret is the credential itself: no notice
    // changes it (nor learns its origin).
    if own.url.text().is_none() && over.contains_key("url") {
        return Err(format!(
            "`url` may not be overridden: definition `{}` keeps its URL as a secret",
            def.name
        ));
    }
    let moved = match (merged.url.text(), own.url.text()) {
        (Some(to), Some(from)) => crate::def::overrides::origin(to)
            .is_none_or(|to| Some(to) != crate::def::overrides::origin(from)),
        (None, None) => false,
        _ => true,
    };
    // The definition's leave to reach private addresses is for its own
    // URL's origin only.
    if moved {
        merged.allow_private_network = false;
    }
    // A secret reference stays with its own origin, whatever the
    // definition lets follow: its value never goes where a notice says.
    if moved {
        merged
            .headers
            .retain(|_, value| !matches!(value, crate::def::HeaderValue::Secret(_)));
    }
    if moved && !def.overrides.credentials_follow {
        if !over.contains_key("headers") {
            merged.headers.clear();
        }
        merged.signing_secret = None;
    }
    Ok(())
}

/// Runs the attempt held by `lease`, for at most `timeout`. A row still
/// awaiting confirmation past its deadline is not sent again here: the
/// missing confirmation is the attempt's failure.
pub(crate) async fn deliver(
    engine: &Engine,
    def: &DefRef,
    lease: &Lease,
    timeout: Duration,
) -> Outcome {
    let row = lease.row();
    let prepared = match row.status {
        Status::AwaitingConfirm => {
            let waited = match def.confirm {
                Confirm::Within(d) => format!("within {}", crate::schedule::format_interval(d)),
                _ => "before its deadline".into(),
            };
            Err(Outcome::retry(format!("not confirmed {waited}")))
        }
        _ => prepare(engine, def, lease),
    };
    let outcome = match prepared {
        Ok((target, notice, raw)) => {
            let run = engine.delivery.channels.send(
                &engine.delivery.handlers,
                &target,
                notice,
                &raw,
                timeout,
                def.on_error,
            );
            match tokio::time::timeout(timeout, AssertUnwindSafe(run).catch_unwind()).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(panic)) => def
                    .on_error
                    .outcome(format!("handler panicked: {}", panic_message(&panic))),
                Err(_) => Outcome::retry(format!("attempt timed out after {timeout:?}")),
            }
        }
        Err(outcome) => outcome,
    };
    of_step(def, lease, outcome)
}

/// `outcome` of the step `lease`'s row is on: a failure's reason names the
/// step (`step 2 of 3: …`) when the definition has several.
pub(crate) fn of_step(def: &DefRef, lease: &Lease, outcome: Outcome) -> Outcome {
    match def.multi_step() {
        true => named_step(outcome, lease.row().step, def.steps.len()),
        false => outcome,
    }
}

/// The target of the step `lease`'s row is on, the notice its channel gets
/// and its param's text (opened, when sealed); a permanent failure when the
/// row cannot be delivered as stored.
fn prepare<'r>(
    engine: &Engine,
    def: &DefRef,
    lease: &'r Lease,
) -> Result<(Target, Notice, Cow<'r, str>), Outcome> {
    let row = lease.row();
    let raw = opened(engine, def, &row.param, "param")?;
    let param = serde_json::from_str(&raw)
        .map_err(|e| Outcome::permanent(format!("param is not valid JSON: {e}")))?;
    let index = usize::try_from(row.step).unwrap_or(usize::MAX);
    let step = def.steps.get(index).ok_or_else(|| {
        Outcome::permanent(format!(
            "step {} does not exist: `{}` has {} steps",
            i64::from(row.step) + 1,
            def.name,
            def.steps.len()
        ))
    })?;
    let target = match &row.target_override {
        None => step.target.clone(),
        Some(_) if def.multi_step() => {
            return Err(Outcome::permanent(
                "a target override cannot apply to a definition of several steps",
            ));
        }
        Some(text) => {
            let over: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| Outcome::permanent(format!("target override is invalid: {e}")))?;
            // Retried, not failed for good: a definition that is changed
            // to allow the field (after an upgrade, say) delivers it.
            if let Some(field) = over.as_object().and_then(|o| def.overrides.refused(o)) {
                return Err(Outcome::retry(format!(
                    "`{field}` may not be overridden: definition `{}` allows overriding {}",
                    def.name,
                    def.overrides.describe()
                )));
            }
            merged_target(def, &over)
                .map_err(|e| Outcome::permanent(format!("target override is invalid: {e}")))?
        }
    };
    let previous_result = match &row.step_result {
        None => None,
        Some(text) => Some(
            serde_json::from_str(&opened(engine, def, text, "the previous step's result")?)
                .map_err(|e| {
                    Outcome::permanent(format!("the previous step's result is not valid JSON: {e}"))
                })?,
        ),
    };
    let notice = Notice {
        id: row.id,
        def: def.name.clone(),
        attempt: lease.attempt(),
        version: row.version,
        param,
        description: row.description.clone(),
        idempotency_key: step_key(
            row.idempotency_key
                .clone()
                .unwrap_or_else(|| row.id.to_string()),
            index,
        ),
        load_balance_num: row.load_balance_num,
        trace_headers: crate::trace::headers(row.trace_context.as_deref()),
        ordering_key: row.ordering_key.clone(),
        step: u32::try_from(index).unwrap_or(u32::MAX),
        steps: u32::try_from(def.steps.len()).unwrap_or(u32::MAX),
        previous_result,
    };
    Ok((target, notice, raw))
}

/// Why the notice `lease` holds cannot be delivered as stored, to park it
/// with (never sent garbled, never failed for good, its retries not
/// spent): a sealed value that does not open here (its key is missing, or
/// a different key has its id), a param or previous step's result that is
/// not JSON, a step its definition does not have, a target override that
/// is not a JSON object or meets a definition of several steps. Once the
/// definition or the keys are fixed, a requeue delivers it. A plaintext
/// value of a definition with `encrypt = true` (a plain-SQL producer's row,
/// or one written before encryption was turned on) is delivered as
/// written, and logged: `solid-notify rekey` seals such rows at rest.
pub(crate) fn unusable(engine: &Engine, def: &DefRef, lease: &Lease) -> Option<String> {
    let row = lease.row();
    let keys = &engine.settings.keys;
    for (what, stored) in [
        ("param", Some(&row.param)),
        (
            "step_result (the previous step's result)",
            row.step_result.as_ref(),
        ),
    ] {
        let Some(stored) = stored else { continue };
        let opened = match keys.open(stored, def.id) {
            Ok(text) => Cow::Owned(text),
            Err(crate::crypto::CryptoError::NotSealed) => {
                if def.encrypt {
                    tracing::warn!(notice_id = row.id, def = %def.name, "the {what} of a notice of an encrypted definition is not sealed (plain SQL, or written before encrypt was set); delivered as written, `solid-notify rekey` seals it");
                }
                Cow::Borrowed(stored.as_str())
            }
            Err(e) => return Some(format!("cannot decrypt {what}: {e}")),
        };
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&opened) {
            return Some(format!("{what} is not JSON: {e}"));
        }
    }
    if usize::try_from(row.step).map_or(true, |step| step >= def.steps.len()) {
        return Some(format!(
            "step {} does not exist: `{}` has {} steps",
            i64::from(row.step) + 1,
            def.name,
            def.steps.len()
        ));
    }
    if let Some(text) = &row.target_override {
        if def.multi_step() {
            return Some(
                "target_override (a target override) cannot apply to a definition of several steps"
                    .into(),
            );
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(_)) => {}
            Ok(_) => return Some("target_override is not a JSON object".into()),
            Err(e) => return Some(format!("target_override is not JSON: {e}")),
        }
    }
    None
}

/// `stored` (`what` of a notice of `def`) as its text: opened when sealed
/// ([`crate::crypto`]). A value that does not open fails for good; a
/// missing key never gets here (the attempt parks the notice first).
fn opened<'r>(
    engine: &Engine,
    def: &DefRef,
    stored: &'r str,
    what: &str,
) -> Result<Cow<'r, str>, Outcome> {
    if !crate::crypto::is_sealed(stored) {
        return Ok(Cow::Borrowed(stored));
    }
    engine
        .settings
        .keys
        .open(stored, def.id)
        .map(Cow::Owned)
        .map_err(|e| Outcome::permanent(format!("cannot decrypt the {what}: {e}")))
}

/// The receiver's de-duplication key of step `index` (0-based): the
/// notice's key for the first step, `key:2`, `key:3`, … for the next ones,
/// so that a receiver serving several steps never takes one for a replay of
/// another.
fn step_key(key: String, index: usize) -> String {
    match index {
        0 => key,
        n => format!("{key}:{}", n + 1),
    }
}

/// A failure's reason, naming the step it failed at (`step 2 of 3: …`).
fn named_step(outcome: Outcome, step: i32, steps: usize) -> Outcome {
    let name = |reason: String| format!("step {} of {steps}: {reason}", i64::from(step) + 1);
    match outcome {
        Outcome::Retry { reason } => Outcome::Retry {
            reason: name(reason),
        },
        Outcome::Permanent { reason } => Outcome::Permanent {
            reason: name(reason),
        },
        success => success,
    }
}
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod features {
    use serde_json::json;

    use super::compiled_in;
    use crate::def::{Channel, Target};

    /// Each built-in channel is available exactly when its feature is on;
    /// a handler needs none.
    #[test]
    fn a_channel_is_available_only_with_its_feature() {
        let cases = [
            (
                Channel::Http,
                json!({"url": "https://example.com/hook"}),
                cfg!(feature = "http"),
                "http",
            ),
            (
                Channel::Amqp,
                json!({"exchange": "orders", "routing_key": "paid"}),
                cfg!(feature = "amqp"),
                "amqp",
            ),
            (
                Channel::Email,
                json!({"recipients": ["ops@example.com"]}),
                cfg!(feature = "email"),
                "email",
            ),
            (Channel::Handler, json!({"handler": "ship"}), true, ""),
        ];
        for (channel, target, built, feature) in cases {
            let target = Target::parse(channel, &target).expect("a valid target");
            match compiled_in(&target) {
                Ok(()) => assert!(built, "{feature} is off, yet available"),
                Err(why) => {
                    assert!(!built, "{feature} is on, yet: {why}");
                    assert!(why.contains(&format!("cargo feature `{feature}`")), "{why}");
                }
            }
        }
    }
}
