//! Deliver: run the channel or handler of one claimed attempt.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use super::claim::Claimed;
use crate::{
    def::{DefRef, Target},
    handler::{Notice, Outcome},
    notifier::Inner,
    producer::merged_target,
};

/// Whether this process can deliver notices of `def` at all. When it cannot,
/// the notice is left untouched for a process that can.
pub(crate) fn available(inner: &Inner, def: &DefRef) -> Result<(), String> {
    match &def.target {
        Target::Handler(t) if inner.handlers.get(&t.handler).is_none() => Err(format!(
            "handler `{}` is not registered in this process",
            t.handler
        )),
        Target::Amqp(_) => Err("channel `amqp` is not enabled in this process".into()),
        _ => Ok(()),
    }
}

/// Runs the attempt, turning errors, panics and timeouts into failures.
pub(crate) async fn deliver(inner: &Inner, def: &DefRef, claimed: &Claimed) -> Outcome {
    let row = &claimed.row;
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
        attempt: claimed.attempt,
        version: row.version,
        param,
        description: row.description.clone(),
        idempotency_key: row
            .idempotency_key
            .clone()
            .unwrap_or_else(|| row.id.to_string()),
        load_balance_num: row.load_balance_num,
    };
    let run = crate::channel::send(inner, &target, notice, &row.param);
    let timeout = inner.config.attempt_timeout;
    match tokio::time::timeout(timeout, AssertUnwindSafe(run).catch_unwind()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => Outcome::retry(format!("handler panicked: {}", panic_message(&panic))),
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
