//! Definitions: a kind of notification and its delivery policy (a
//! `notify_def` row).
//!
//! Write them as TOML files (`definitions/*.toml`, read with [`load_dir`]
//! or [`parse`]; the fields: `docs/definitions.md`) or as code
//! ([`DefSpec`]), and store them with [`sync`] (what `solid-notify defs
//! sync` does). The table is the truth at run time: edits made there take
//! effect within seconds, without a restart. Every definition, whatever its
//! source, is validated before it is used.
//!
//! ```no_run
//! # async fn run(db: sea_orm::DatabaseConnection) -> Result<(), solid_notify::Error> {
//! use solid_notify::def::{self, Channel, DefSpec};
//! let mut hook = DefSpec::new(
//!     "order_paid",
//!     Channel::Http,
//!     serde_json::json!({"url": "https://crm.example.com/hooks/orders"}),
//! );
//! hook.retry_interval = "5s,5m,1h,1d".into();
//! def::sync(&db, &[hook, DefSpec::handler("order_shipped", "ship_order")]).await?;
//! # Ok(()) }
//! ```

#[doc(hidden)]
pub mod cache;
#[doc(hidden)]
pub mod file;
#[doc(hidden)]
pub mod overrides;
mod policy;
#[cfg(test)]
mod prop;
mod spec;
#[doc(hidden)]
pub mod store;
mod target;

pub use file::{FileDef, load_dir, parse};
pub use spec::{
    DEFAULT_CIRCUIT_COOL_DOWN, DEFAULT_CIRCUIT_WINDOW, DEFAULT_MAX_RETRY_INTERVAL,
    DEFAULT_MAX_RETRY_TIMES, DEFAULT_ON_ERROR, DEFAULT_RETRY_INTERVAL, DefSpec,
};
pub use store::{SyncReport, sync};
pub use target::Channel;

// What a spec validates into, and the limits it is checked against: for
// the library and its tests, not part of the API.
#[doc(hidden)]
pub use policy::{
    AlertPolicy, Circuit, Confirm, DEFAULT_IMMEDIATE_RETRY_DELAY_MS, ImmediateRetries,
    MAX_IMMEDIATE_RETRIES, MAX_IMMEDIATE_RETRY_DELAY_MS, MAX_RATE_COUNT, MAX_RETRY_JITTER, OnError,
    Ordering, PER_KEY, RateLimit,
};
#[doc(hidden)]
pub use spec::{
    Def, DefRef, MAX_NAME_BYTES, MAX_RATE_LIMIT_BYTES, MAX_RETRY_INTERVAL_BYTES, MAX_STEPS, Step,
};
#[doc(hidden)]
pub use target::{
    AmqpTarget, EmailTarget, HandlerTarget, HeaderValue, HttpTarget, SecretRef, Target, TargetUrl,
    check_url,
};
