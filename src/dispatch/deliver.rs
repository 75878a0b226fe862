//! Deliver: run the channel or handler of one claimed attempt.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use super::claim::Claimed;
use crate::{
    Status,
    channel::amqp::BrokerConfirm,
    def::{Confirm, DefRef, Target},
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
        Target::Amqp(_) if !inner.channels.amqp.enabled() => {
            Err("channel `amqp` has no broker configured in this process".into())
        }
        _ => Ok(()),
    }
}

/// What one delivery produced: its outcome and, for an AMQP publish, the
/// broker's verdict still to come.
pub(crate) struct Delivery {
    pub outcome: Outcome,
    pub broker: Option<BrokerConfirm>,
}

impl From<Outcome> for Delivery {
    fn from(outcome: Outcome) -> Self {
        Delivery {
            outcome,
            broker: None,
        }
    }
}

/// Runs the attempt, turning errors, panics and timeouts into failures. A
/// row still awaiting confirmation past its deadline is not sent again here:
/// the missing confirmation is the attempt's failure.
pub(crate) async fn deliver(inner: &Inner, def: &DefRef, claimed: &Claimed) -> Delivery {
    let row = &claimed.row;
    if row.status == Status::AwaitingConfirm {
        let waited = match def.confirm {
            Confirm::Within(d) => format!("within {}", crate::schedule::format_interval(d)),
            _ => "before its deadline".into(),
        };
        return Outcome::retry(format!("not confirmed {waited}")).into();
    }
    let param = match serde_json::from_str(&row.param) {
        Ok(param) => param,
        Err(e) => return Outcome::permanent(format!("param is not valid JSON: {e}")).into(),
    };
    let target = match &row.target_override {
        None => def.target.clone(),
        Some(text) => match serde_json::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(|over| merged_target(def, &over))
        {
            Ok(target) => target,
            Err(e) => {
                return Outcome::permanent(format!("target override is invalid: {e}")).into();
            }
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
        Ok(Ok((outcome, broker))) => Delivery { outcome, broker },
        Ok(Err(panic)) => {
            Outcome::retry(format!("handler panicked: {}", panic_message(&panic))).into()
        }
        Err(_) => Outcome::retry(format!("attempt timed out after {timeout:?}")).into(),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
