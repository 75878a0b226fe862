//! AMQP: a notice is a message published to RabbitMQ (lapin), with
//! publisher confirms.
//!
//! One long-lived connection with one publishing channel in confirm mode is
//! opened on first use and reopened by itself after the broker restarts or
//! the connection drops; publishing while the broker is unreachable is a
//! retryable failure, never a hang (connecting is bounded by
//! [`AmqpConfig::connect_timeout`]). Publishes share the channel and their
//! confirms arrive asynchronously; each attempt waits for its own (bounded by
//! the attempt timeout): an ack is success, a nack or a `mandatory` message
//! returned as unroutable is a failed attempt.
//!
//! Channels fail alone: before publishing to an exchange the channel checks
//! that it exists (a passive declare on a throwaway channel, remembered for
//! [`EXCHANGE_CHECK_TTL`]), so a notice aimed at a missing exchange fails by
//! itself instead of closing the shared channel under everyone else. Should
//! the channel close anyway (the exchange deleted a moment ago, a broker
//! restart), publishes whose confirm was lost with it are published again on
//! a fresh channel within the same attempt, charged nothing.
//!
//! The message carries the notice id as `message_id`, headers
//! `x-notice-attempt`, `x-notice-def` and `x-idempotency-key` (and
//! `x-notice-step`, 1-based, for a definition of several steps; plus the
//! target's, and the W3C `traceparent` / `tracestate` of the producer's
//! trace when it had one: [`crate::trace`]), and `reply_to` naming the confirmation queue, where a consumer
//! can confirm or reject the notice (see [`crate::confirm`]).

use std::time::Duration;

#[cfg(feature = "amqp")]
mod client;
#[cfg(feature = "amqp")]
pub(crate) use client::{AmqpChannel, declare_confirm_queue};

/// Environment variable with the broker URL (unset: AMQP disabled).
pub const ENV_AMQP_URL: &str = "SOLID_NOTIFY_AMQP_URL";
/// Environment variable naming the confirmation queue.
pub const ENV_CONFIRM_QUEUE: &str = "SOLID_NOTIFY_CONFIRM_QUEUE";
/// Default confirmation queue.
pub const DEFAULT_CONFIRM_QUEUE: &str = "solid_notify.confirm";
/// Default [`AmqpConfig::connect_timeout`]: 5 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an exchange found to exist is trusted before it is checked
/// again: 10 seconds (a missing one is checked again after 1 second).
pub const EXCHANGE_CHECK_TTL: Duration = Duration::from_secs(10);
/// Times one attempt publishes again after its channel closed under it.
pub const REPUBLISH_TRIES: u32 = 3;

/// Where AMQP notices go and where confirmations come from. `Debug` hides
/// the broker's password.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// Broker URL, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`; `None`
    /// disables the channel. Default: `$SOLID_NOTIFY_AMQP_URL`.
    pub url: Option<String>,
    /// Queue consumers send confirmations to (named in every message's
    /// `reply_to`). Default: `$SOLID_NOTIFY_CONFIRM_QUEUE`, else
    /// [`DEFAULT_CONFIRM_QUEUE`].
    pub confirm_queue: String,
    /// Longest wait for a connection. Default [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &self.url.as_deref().map(crate::redact::url))
            .field("confirm_queue", &self.confirm_queue)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            url: std::env::var(ENV_AMQP_URL).ok().filter(|u| !u.is_empty()),
            confirm_queue: std::env::var(ENV_CONFIRM_QUEUE)
                .unwrap_or_else(|_| DEFAULT_CONFIRM_QUEUE.into()),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// AMQP without the `amqp` feature: never enabled, so its definitions are
/// left to a process built with it (`attempt::available`).
#[cfg(not(feature = "amqp"))]
pub(crate) struct AmqpChannel;

#[cfg(not(feature = "amqp"))]
impl AmqpChannel {
    pub fn new(_config: &AmqpConfig) -> Self {
        AmqpChannel
    }

    pub fn enabled(&self) -> bool {
        false
    }

    pub async fn publish(
        &self,
        _target: &crate::def::AmqpTarget,
        _notice: &crate::handler::Notice,
        _body: &str,
    ) -> crate::handler::Outcome {
        crate::handler::Outcome::retry(
            "the AMQP channel is not compiled into this process (cargo feature `amqp`)",
        )
    }
}
