//! Handler: Rust code registered by name that delivers notices of the
//! `handler` channel, and the [`Outcome`] every delivery reports.

use std::{collections::HashMap, future::Future, sync::Arc};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

/// Any error a handler returns; it counts as a retryable failure.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one delivery attempt achieved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Delivered. A `note` is appended to the notice's description.
    Success {
        /// Optional result text kept with the notice.
        note: Option<String>,
        /// A JSON result for the next step of a multi-step notice
        /// ([`Notice::previous_result`] there); ignored after the last step.
        result: Option<Value>,
    },
    /// Failed; try again on the definition's schedule.
    Retry {
        /// Why, recorded in the notice's `errors`.
        reason: String,
    },
    /// Failed for good: skip the remaining retries.
    Permanent {
        /// Why, recorded in the notice's `errors`.
        reason: String,
    },
}

impl Outcome {
    /// Delivered, nothing to note.
    pub fn success() -> Self {
        Outcome::Success {
            note: None,
            result: None,
        }
    }

    /// This outcome, passing `result` on to the next step of a multi-step
    /// notice when it is a success (kept with the notice, in
    /// `step_result`, until that step succeeds). Other outcomes are
    /// unchanged.
    pub fn with_result(self, result: Value) -> Self {
        match self {
            Outcome::Success { note, .. } => Outcome::Success {
                note,
                result: Some(result),
            },
            other => other,
        }
    }

    /// Failed, retry later.
    pub fn retry(reason: impl Into<String>) -> Self {
        Outcome::Retry {
            reason: reason.into(),
        }
    }

    /// Failed for good.
    pub fn permanent(reason: impl Into<String>) -> Self {
        Outcome::Permanent {
            reason: reason.into(),
        }
    }
}

/// One notice as a handler sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// The notice id, the same on every attempt.
    pub id: i64,
    /// The definition's name.
    pub def: String,
    /// 1 for the first attempt, 2 for the first retry, …
    pub attempt: u32,
    /// The row version this attempt claimed: unique per attempt of a notice.
    pub version: i32,
    /// The param, parsed.
    pub param: Value,
    /// The producer's description.
    pub description: String,
    /// Key for de-duplication at the receiver: the producer's key, or the
    /// id; for the steps after the first of a multi-step notice, that key
    /// with `:2`, `:3`, … appended.
    pub idempotency_key: String,
    /// Partition number assigned at insert.
    pub load_balance_num: i32,
    /// The W3C trace-context headers of this attempt (`traceparent`, and
    /// `tracestate` when set), sent with HTTP and AMQP deliveries; empty
    /// when the producer had no OpenTelemetry span. See [`crate::trace`].
    pub trace_headers: std::collections::BTreeMap<String, String>,
    /// The producer's ordering key; with `ordering = "per_key"` this attempt
    /// runs only after every older notice of the key finished.
    pub ordering_key: Option<String>,
    /// The step this call delivers, 0-based (always 0 for a definition of
    /// one step). The steps before it succeeded.
    pub step: u32,
    /// How many steps the definition has (1 without `steps`).
    pub steps: u32,
    /// The result the step before this one passed on with
    /// [`Outcome::with_result`]; `None` at the first step or when it passed
    /// none.
    pub previous_result: Option<Value>,
}

/// Delivers notices of definitions whose target is `{ "handler": "<name>" }`.
///
/// An `Err` or a panic counts as a retryable failure. Closures of the shape
/// `Fn(Notice) -> impl Future<Output = Result<Outcome, BoxError>>` are handlers.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Delivers one attempt of `notice`.
    async fn handle(&self, notice: Notice) -> Result<Outcome, BoxError>;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Notice) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome, BoxError>> + Send + 'static,
{
    async fn handle(&self, notice: Notice) -> Result<Outcome, BoxError> {
        self(notice).await
    }
}

/// Handlers by registered name.
#[derive(Clone, Default)]
pub struct Handlers(HashMap<String, Arc<dyn Handler>>);

impl Handlers {
    /// Registers `handler` under `name`, replacing any previous one.
    pub fn insert(&mut self, name: impl Into<String>, handler: impl Handler) {
        self.0.insert(name.into(), Arc::new(handler));
    }

    /// The handler registered under `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Handler>> {
        self.0.get(name)
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.0.keys().cloned().collect();
        names.sort();
        names
    }
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}
