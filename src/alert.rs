//! Alert: the hook called when a notice's failure should reach a person.
//!
//! Dispatch decides *whether* a failure alerts from the definition's
//! [`AlertPolicy`](crate::def::AlertPolicy) and calls the configured
//! [`AlertHook`] after the failure is recorded; the hook can neither block
//! nor undo that bookkeeping. The default hook, [`LogAlerts`], logs.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::def::Def;

/// A failure that the definition's alert policy says to report.
#[derive(Debug, Clone, Serialize)]
pub struct FailureEvent {
    /// The notice id.
    pub notice_id: i64,
    /// The definition (its `alert_emails` are the recipients).
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
}

/// Receives failures that should alert.
#[async_trait]
pub trait AlertHook: Send + Sync + 'static {
    /// Reports `event`. Must not fail: whatever it cannot do now it retries itself.
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
