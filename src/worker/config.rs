//! Config: how a worker schedules and bounds its sweeps, with defaults.
//!
//! The same struct is read from the `[worker]` table of a TOML file by the
//! `solid-notify worker --config FILE` command; durations are written like
//! `"500ms"`, `"1s"` or `"2m"`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default [`WorkerConfig::cron`]: every second.
pub const DEFAULT_CRON: &str = "* * * * * *";
/// Default [`WorkerConfig::delay`]: 1 second.
pub const DEFAULT_DELAY: Duration = Duration::from_secs(1);
pub use crate::sweep::MAX_BATCH_SIZE;
/// Largest [`WorkerConfig::concurrency`] a worker accepts: 10,000.
pub const MAX_CONCURRENCY: usize = 10_000;
/// Default [`WorkerConfig::batch_size`]: 1000 rows per claim.
pub const DEFAULT_BATCH_SIZE: u64 = 1000;
/// Default [`WorkerConfig::concurrency`]: 32 deliveries at once.
pub const DEFAULT_CONCURRENCY: usize = 32;
/// Default [`WorkerConfig::shutdown_timeout`]: 30 seconds.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`WorkerConfig::heartbeat_every`]: 5 seconds.
pub const DEFAULT_HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// Default [`WorkerConfig::due_check_every`]: 500 ms.
pub const DEFAULT_DUE_CHECK_EVERY: Duration = Duration::from_millis(500);
/// Shortest [`WorkerConfig::due_check_every`] a worker accepts (but zero): 50 ms.
pub const MIN_DUE_CHECK_EVERY: Duration = Duration::from_millis(50);
/// Longest [`WorkerConfig::due_check_every`] a worker accepts: 1 hour.
pub const MAX_DUE_CHECK_EVERY: Duration = Duration::from_secs(3600);
/// Default [`WorkerConfig::max_in_flight_bytes`]: 64 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = crate::sweep::DEFAULT_MAX_IN_FLIGHT_BYTES;

/// When sweeps start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerMode {
    /// Start a sweep at every tick of [`WorkerConfig::cron`]; a tick that comes
    /// while the previous sweep still runs is skipped. The default.
    #[default]
    FixedRate,
    /// Wait [`WorkerConfig::delay`] after each sweep finishes, then sweep again.
    FixedDelay,
}

/// Settings of a [`Worker`](super::Worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Fixed-rate or fixed-delay. Default [`WorkerMode::FixedRate`].
    pub mode: WorkerMode,
    /// Cron expression of the fixed-rate ticks, seconds first (`sec min hour
    /// day-of-month month day-of-week [year]`), in UTC. Default [`DEFAULT_CRON`].
    pub cron: String,
    /// Pause after each sweep in fixed-delay mode. Default [`DEFAULT_DELAY`].
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    /// Wait before the first sweep. Default: none.
    #[serde(with = "humantime_serde")]
    pub initial_delay: Duration,
    /// Rows claimed at a time; a full batch is followed by another claim at
    /// once. Default [`DEFAULT_BATCH_SIZE`]; 1 to [`MAX_BATCH_SIZE`].
    pub batch_size: u64,
    /// Deliveries running at once. Default [`DEFAULT_CONCURRENCY`]; 1 to
    /// [`MAX_CONCURRENCY`].
    pub concurrency: usize,
    /// Only notices of these definitions (by name). Default: all.
    pub defs: Vec<String>,
    /// Only notices of definitions delivered by these Rust handlers. Default: all.
    pub handlers: Vec<String>,
    /// Only notices of these `load_balance_num` partitions. Default: all.
    pub partitions: Vec<i32>,
    /// On shutdown, how long running deliveries may finish before they are
    /// abandoned and released. Default [`DEFAULT_SHUTDOWN_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Also consume the AMQP confirmation queue (when a broker is configured).
    /// Default: `true`.
    pub confirm_listener: bool,
    /// Sweep at once when woken (notices made due in this process; `NOTIFY`
    /// on PostgreSQL) and when the earliest due time it knows of comes,
    /// besides the schedule. Off: sweep on the schedule only. Default: `true`.
    pub wake: bool,
    /// With [`wake`](Self::wake) on MySQL/MariaDB and SQLite, which cannot
    /// tell other processes' workers when a notice is added: how often the
    /// worker asks the database when its next notice is due (one indexed
    /// `MIN` query), so that a notice added by another process is sent on
    /// time (a delayed notice when it falls due, a notice due at once
    /// within this long) rather than at the next tick. PostgreSQL's
    /// workers are told by `NOTIFY` and never ask on this schedule. Zero:
    /// never (other processes' notices wait for the tick); else
    /// [`MIN_DUE_CHECK_EVERY`] to [`MAX_DUE_CHECK_EVERY`]. Default
    /// [`DEFAULT_DUE_CHECK_EVERY`].
    #[serde(with = "humantime_serde")]
    pub due_check_every: Duration,
    /// How often the worker writes its heartbeat row in `notify_worker`
    /// (shown by the dashboard; a row silent for three of these is a worker
    /// gone). Zero: no heartbeat. Default [`DEFAULT_HEARTBEAT_EVERY`].
    #[serde(with = "humantime_serde")]
    pub heartbeat_every: Duration,
    /// The params a sweep holds at once, in bytes (waiting, being
    /// delivered; a delivered success drops its param before it is
    /// recorded): it claims rows only while under this, and only as many
    /// as fit, always at least one, so a notice larger than this still
    /// goes, alone. Default [`DEFAULT_MAX_IN_FLIGHT_BYTES`].
    pub max_in_flight_bytes: u64,
    /// PostgreSQL: where the wake-up listener connects for `LISTEN`, when
    /// the pool's connections go through a pooler in transaction mode,
    /// which keeps no session (the server itself, or the pooler in session
    /// mode). Default: none, the pool's own connection options. A listener
    /// that finds a pooler in transaction mode logs one warning, sets the
    /// gauge `solid_notify_wake_listening` to 0 and leaves the worker to
    /// poll (each tick, and every `due_check_every`).
    pub listen_url: Option<ListenUrl>,
}

/// A PostgreSQL connection URL (`postgres://user:password@host/db`), shown
/// by `Debug` without its credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ListenUrl(pub String);

impl ListenUrl {
    /// What may be shown of it: the URL without its credentials, or `***`
    /// for text that is no URL (a `key=value` string may hold a password).
    pub(crate) fn shown(&self) -> String {
        match url::Url::parse(&self.0) {
            Ok(_) => crate::redact::url(&self.0),
            Err(_) => crate::redact::HIDDEN.into(),
        }
    }
}

impl std::fmt::Debug for ListenUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            mode: WorkerMode::default(),
            cron: DEFAULT_CRON.into(),
            delay: DEFAULT_DELAY,
            initial_delay: Duration::ZERO,
            batch_size: DEFAULT_BATCH_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            defs: Vec::new(),
            handlers: Vec::new(),
            partitions: Vec::new(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            confirm_listener: true,
            wake: true,
            heartbeat_every: DEFAULT_HEARTBEAT_EVERY,
            due_check_every: DEFAULT_DUE_CHECK_EVERY,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            listen_url: None,
        }
    }
}
