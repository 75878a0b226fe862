//! Config: the tunables of a [`Notifier`](crate::Notifier), with their defaults.

use std::{collections::HashMap, time::Duration};

pub use crate::crypto::Keys;
use crate::{
    channel::{amqp::AmqpConfig, mail::MailConfig},
    crypto::KEYS_ENV,
    error::{Error, Result},
    load_balance::LoadBalance,
};

pub use crate::state::insert::DEFAULT_MAX_PARAM_BYTES;

/// Default [`Config::lease`]: 60 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// Default [`Config::attempt_timeout`]: 30 seconds.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`Config::max_background_attempts`]: 256.
pub const DEFAULT_MAX_BACKGROUND_ATTEMPTS: usize = 256;
/// Default [`Config::db_timeout`]: 10 seconds.
pub const DEFAULT_DB_TIMEOUT: Duration = Duration::from_secs(10);

/// How a notifier claims, runs and caches. `Debug` shows the names of
/// [`secrets`](Config::secrets), never their values, and URLs without their
/// passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// How far a claim pushes `next_call_time` (by the database's clock): a
    /// sender that dies mid-attempt leaves a row that is due again after this
    /// long. A freshly added notice is reserved for its producer's
    /// after-commit attempt the same way. Default [`DEFAULT_LEASE`]; must be
    /// at least twice `attempt_timeout`.
    pub lease: Duration,
    /// An attempt still running after this long is abandoned (its future
    /// dropped: the HTTP request aborted) and counts as a retryable failure.
    /// An attempt only starts while `attempt_timeout` plus
    /// [`lease_margin`](Config::lease_margin) fits in what is left of its
    /// lease, so no attempt can outlive its lease. Default
    /// [`DEFAULT_ATTEMPT_TIMEOUT`].
    pub attempt_timeout: Duration,
    /// How long a snapshot of `notify_def` is trusted.
    /// Default [`crate::def::cache::DEFAULT_TTL`].
    pub def_cache_ttl: Duration,
    /// Whether committed notices are attempted at once in-process. When off,
    /// new rows are due at once and wait for a sweeper. Default `true`.
    pub immediate_attempt: bool,
    /// Background after-commit attempts allowed at once; a notice that finds
    /// no slot is due at once for a sweeper.
    /// Default [`DEFAULT_MAX_BACKGROUND_ATTEMPTS`].
    pub max_background_attempts: usize,
    /// Largest `param` (and `description`) a notice may carry, in bytes;
    /// a larger one is refused by `add_notice` with
    /// [`Error::InvalidNotice`] before any SQL runs. Keep it below the
    /// database's own limit (MySQL/MariaDB `max_allowed_packet`).
    /// Default [`DEFAULT_MAX_PARAM_BYTES`] (1 MiB).
    pub max_param_bytes: usize,
    /// How new notices get their `load_balance_num` when they do not set it.
    /// Default `LoadBalance::Fixed { num: 0 }`.
    pub load_balance: LoadBalance,
    /// Where e-mail (the `email` channel and alerts) goes. Default
    /// [`MailConfig::default`]: SMTP from `$SOLID_NOTIFY_SMTP_URL`, else
    /// `.eml` files in a folder.
    pub mail: MailConfig,
    /// Named secrets (e.g. HTTP signing keys) kept out of `notify_def`; a name
    /// not found here is read from the environment variable
    /// `SOLID_NOTIFY_SECRET_<NAME>` only (`channel::http::SECRET_ENV_PREFIX`
    /// with the `http` feature).
    /// Redacted by `Debug`. Default: empty.
    pub secrets: HashMap<String, String>,
    /// RabbitMQ for the `amqp` channel and the confirmation queue. Default
    /// [`AmqpConfig::default`]: `$SOLID_NOTIFY_AMQP_URL` (unset: disabled).
    pub amqp: AmqpConfig,
    /// The longest any one database call of the library may take (a claim,
    /// a record, a release, a heartbeat, a wake-up check, the producer's
    /// insert and commit; a transaction's statements each, and its commit):
    /// past it the call counts as a lost connection. Claims and records are
    /// then retried as after any database error (never abandoning work
    /// delivered: its lease brings it back); a producer's commit answers
    /// [`Error::CommitOutcomeUnknown`].
    /// It bounds what a network partition can hold, where the socket stays
    /// open and TCP would wait for hours. Statements of the caller's own,
    /// sent through a [`NoticeTx`](crate::NoticeTx), are not bounded, nor
    /// are operator calls and migrations. Keep it well above the slowest
    /// statement a healthy database takes (a claim of a whole batch), and
    /// above SQLite's `busy_timeout` (5 s by default): an abandoned claim
    /// still leases its rows, to nobody, for a whole lease. Default
    /// [`DEFAULT_DB_TIMEOUT`].
    pub db_timeout: Duration,
    /// Let HTTP requests go to private, loopback, link-local and other
    /// non-public addresses, for every definition (one definition opts in
    /// with its target's `allow_private_network`). Off, a host is resolved
    /// and only its public addresses are connected to (see
    /// `channel::http`), so a producer's URL cannot reach the
    /// internal network. Default `false`; the tests and the quickstart,
    /// whose receivers listen on 127.0.0.1, turn it on.
    pub allow_private_network: bool,
    /// The dashboard's address (`https://ops.example.com/notify`): each
    /// operational event (`docs/events.md`) links to its page there.
    /// Default: `$SOLID_NOTIFY_DASHBOARD_URL`, else none (no link).
    pub dashboard_url: Option<String>,
    /// Keys that seal the params of definitions with `encrypt = true`
    /// ([`crate::crypto`]): the current one seals, every one opens.
    /// Redacted by `Debug` (ids only). Default: [`Keys::from_env`]
    /// (`$SOLID_NOTIFY_KEYS`; invalid text is logged at `error` and gives
    /// no keys, so encrypted notices are refused, never sealed badly).
    pub keys: Keys,
}

/// The environment variable [`Config::dashboard_url`] defaults to.
pub const DASHBOARD_URL_ENV: &str = "SOLID_NOTIFY_DASHBOARD_URL";

impl Default for Config {
    fn default() -> Self {
        Config {
            lease: DEFAULT_LEASE,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            def_cache_ttl: crate::def::cache::DEFAULT_TTL,
            immediate_attempt: true,
            max_background_attempts: DEFAULT_MAX_BACKGROUND_ATTEMPTS,
            load_balance: LoadBalance::default(),
            mail: MailConfig::default(),
            secrets: HashMap::new(),
            amqp: AmqpConfig::default(),
            max_param_bytes: DEFAULT_MAX_PARAM_BYTES,
            db_timeout: DEFAULT_DB_TIMEOUT,
            allow_private_network: false,
            dashboard_url: std::env::var(DASHBOARD_URL_ENV)
                .ok()
                .filter(|url| !url.trim().is_empty()),
            keys: Keys::from_env().unwrap_or_else(|e| {
                tracing::error!(error = %e, "{KEYS_ENV} is not usable; no encryption keys");
                Keys::new()
            }),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut secrets: Vec<&String> = self.secrets.keys().collect();
        secrets.sort();
        f.debug_struct("Config")
            .field("lease", &self.lease)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("def_cache_ttl", &self.def_cache_ttl)
            .field("immediate_attempt", &self.immediate_attempt)
            .field("max_background_attempts", &self.max_background_attempts)
            .field("max_param_bytes", &self.max_param_bytes)
            .field("load_balance", &self.load_balance)
            .field("mail", &self.mail)
            .field("secrets", &secrets)
            .field("amqp", &self.amqp)
            .field("db_timeout", &self.db_timeout)
            .field("allow_private_network", &self.allow_private_network)
            .field("dashboard_url", &self.dashboard_url)
            .field("keys", &self.keys)
            .finish()
    }
}

impl Config {
    /// The safety margin between an attempt's timeout and the end of its
    /// lease: a tenth of the lease. An attempt starts only while
    /// `attempt_timeout + lease_margin()` fits in what is left of its lease
    /// (measured from just before the claiming statement, on a monotonic
    /// clock); so with the defaults a claimed row must start within 24 s of
    /// its claim, or is released for another sender.
    pub fn lease_margin(&self) -> Duration {
        self.lease / 10
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<()> {
        if self.attempt_timeout.is_zero() || self.lease < self.attempt_timeout * 2 {
            return Err(Error::Config(format!(
                "lease ({:?}) must be at least twice attempt_timeout ({:?}, not zero), so that an attempt always ends before its lease",
                self.lease, self.attempt_timeout
            )));
        }
        if self.max_param_bytes == 0 {
            return Err(Error::Config("max_param_bytes must be at least 1".into()));
        }
        if self.db_timeout.is_zero() {
            return Err(Error::Config("db_timeout must not be zero".into()));
        }
        if self.max_background_attempts == 0 && self.immediate_attempt {
            return Err(Error::Config(
                "max_background_attempts must be at least 1 when immediate_attempt is on".into(),
            ));
        }
        self.load_balance.validate().map_err(Error::Config)
    }
}
