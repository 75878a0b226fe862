//! Def: a kind of notification and its delivery policy (a `notify_def` row).
//!
//! Definitions are kept as TOML files under `definitions/` ([`file`](mod@file)), synced
//! into the table ([`store`]), and read back through a short-lived cache
//! ([`cache`]) so that edits made directly in the table take effect without a
//! restart. Whatever the source, every definition passes the same validation,
//! [`DefSpec::validate`], before it is used.
//!
//! The items below come from three files: `policy.rs` (the policy types of
//! a [`Def`]: [`AlertPolicy`], [`Confirm`], [`Ordering`], [`RateLimit`],
//! [`ImmediateRetries`], [`OnError`], [`Circuit`]), `spec.rs` ([`DefSpec`],
//! its defaults and checks, and the [`Def`] it validates into) and
//! `target.rs` ([`Channel`] and [`Target`]).

pub mod cache;
pub mod file;
pub mod overrides;
mod policy;
#[cfg(test)]
mod prop;
mod spec;
pub mod store;
mod target;

pub use policy::{
    AlertPolicy, Circuit, Confirm, DEFAULT_IMMEDIATE_RETRY_DELAY_MS, ImmediateRetries,
    MAX_IMMEDIATE_RETRIES, MAX_IMMEDIATE_RETRY_DELAY_MS, MAX_RATE_COUNT, MAX_RETRY_JITTER, OnError,
    Ordering, PER_KEY, RateLimit,
};
pub use spec::{
    DEFAULT_CIRCUIT_COOL_DOWN, DEFAULT_CIRCUIT_WINDOW, DEFAULT_MAX_RETRY_INTERVAL,
    DEFAULT_MAX_RETRY_TIMES, DEFAULT_ON_ERROR, DEFAULT_RETRY_INTERVAL, Def, DefRef, DefSpec,
    MAX_NAME_BYTES, MAX_RATE_LIMIT_BYTES, MAX_RETRY_INTERVAL_BYTES, MAX_STEPS, Step,
};
pub use target::{
    AmqpTarget, Channel, EmailTarget, HandlerTarget, HeaderValue, HttpTarget, SecretRef, Target,
    TargetUrl, check_url,
};
