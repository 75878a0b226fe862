//! Deliver: run the channel or handler of one claimed attempt, bounded by
//! `attempt_timeout`.
//!
//! Errors, panics and timeouts become retryable failures. When the timeout
//! passes, the delivery's future is dropped: the HTTP request is aborted, the
//! handler stops at its next `.await`. A handler that blocks a thread or
//! spawns work of its own cannot be stopped this way; keep handlers async.

use std::{panic::AssertUnwindSafe, time::Duration};

use futures::FutureExt;

use crate::{
    Status,
    def::{Confirm, DefRef, Target},
    handler::{Notice, Outcome},
    notifier::Inner,
    state::Lease,
};

/// Whether this process can deliver notices of `def` at all. When it cannot,
/// the notice is left for a process that can.
pub(crate) fn available(inner: &Inner, def: &DefRef) -> Result<(), String> {
    match &def.target {
        Target::Handler(t) if inner.handlers.get(&t.handler).is_none() => Err(format!(
            "handler `{}` is not registered in this process",
            t.handler
        )),
        Target::Amqp(_) if !inner.channels.amqp.enabled() => {
            Err("channel `amqp` has no broker configured in this process".into())
        }
        _ => Ok(()),
    }
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

/// Merges `over` into the definition's target (top-level keys replace).
pub(crate) fn merged_target(
    def: &DefRef,
    over: &serde_json::Value,
) -> std::result::Result<Target, String> {
    let mut target = def.target_json.clone();
    if let (Some(base), Some(over)) = (target.as_object_mut(), over.as_object()) {
        for (k, v) in over {
            base.insert(k.clone(), v.clone());
        }
    } else {
        return Err("target override must be a JSON object".into());
    }
    Target::parse(def.target.channel(), &target)
}

/// Runs the attempt held by `lease`, for at most `timeout`. A row still
/// awaiting confirmation past its deadline is not sent again here: the
/// missing confirmation is the attempt's failure.
pub(crate) async fn deliver(
    inner: &Inner,
    def: &DefRef,
    lease: &Lease,
    timeout: Duration,
) -> Outcome {
    let row = lease.row();
    if row.status == Status::AwaitingConfirm {
        let waited = match def.confirm {
            Confirm::Within(d) => format!("within {}", crate::schedule::format_interval(d)),
            _ => "before its deadline".into(),
        };
        return Outcome::retry(format!("not confirmed {waited}"));
    }
    let param = match serde_json::from_str(&row.param) {
        Ok(param) => param,
        Err(e) => return Outcome::permanent(format!("param is not valid JSON: {e}")),
    };
    let target = match &row.target_override {
        None => def.target.clone(),
        Some(text) => match serde_json::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(|over| merged_target(def, &over))
        {
            Ok(target) => target,
            Err(e) => return Outcome::permanent(format!("target override is invalid: {e}")),
        },
    };
    let notice = Notice {
        id: row.id,
        def: def.name.clone(),
        attempt: lease.attempt(),
        version: row.version,
        param,
        description: row.description.clone(),
        idempotency_key: row
            .idempotency_key
            .clone()
            .unwrap_or_else(|| row.id.to_string()),
        load_balance_num: row.load_balance_num,
        trace_headers: crate::trace::headers(row.trace_context.as_deref()),
        ordering_key: row.ordering_key.clone(),
    };
    let run = crate::channel::send(inner, &target, notice, &row.param, timeout, def.on_error);
    match tokio::time::timeout(timeout, AssertUnwindSafe(run).catch_unwind()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => def
            .on_error
            .outcome(format!("handler panicked: {}", panic_message(&panic))),
        Err(_) => Outcome::retry(format!("attempt timed out after {timeout:?}")),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
