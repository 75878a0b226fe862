//! Engine: the context every attempt needs, owned by the attempt layer.
//!
//! The store and the definitions, and four groups by purpose:
//! [`Settings`] (what attempts read of the [`Config`]), [`Delivery`] (the
//! channels and handlers, the alert sink, the circuit breakers, the
//! ordering rechecks), [`Lifecycle`] (the tracked tasks, the stop tokens,
//! the background slots) and [`Signals`] (what workers are told). A
//! [`Notifier`](crate::Notifier) holds one behind an `Arc`, plus the whole
//! `Config` and what only producers need; the layers below it (attempts,
//! records, batches, parks, the circuit controller) take the engine, never
//! the notifier. The layers above it read and write through the notifier's
//! store and definition cache; those that drive attempts (producers,
//! sweeps, confirmations) hand it the engine.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

use super::{Stop, breaker::Breakers, recheck::Rechecks};
use crate::{
    alert::AlertHook,
    channel::Channels,
    config::Config,
    crypto::Keys,
    def::{DefRef, cache::DefCache},
    error::Result,
    handler::{Handlers, Outcome},
    state::{Store, clock::Due},
};

/// Starts the controller of a circuit that has just tripped (opens it,
/// probes, closes it). Given by the layer above, which owns the controller.
pub(crate) type OnTrip = fn(&Arc<Engine>, DefRef);

/// At most one alert per definition this often, per process, about its
/// notices parked because they cannot be opened: 10 minutes.
pub const PARK_ALERT_EVERY: Duration = Duration::from_secs(600);

/// What every attempt needs, grouped by purpose; see the
/// [module docs](self).
pub(crate) struct Engine {
    pub store: Store,
    pub defs: DefCache,
    /// What attempts read of the [`Config`].
    pub settings: Settings,
    /// Where and how notices are delivered.
    pub delivery: Delivery,
    /// The tasks running on this engine's behalf, and their stop.
    pub lifecycle: Lifecycle,
    /// What this engine tells the workers built on it.
    pub signals: Signals,
}

/// What attempts read of the [`Config`] (the notifier keeps the whole).
pub(crate) struct Settings {
    /// [`Config::attempt_timeout`].
    pub attempt_timeout: Duration,
    /// [`Config::lease`].
    pub lease: Duration,
    /// [`Config::lease_margin`].
    pub lease_margin: Duration,
    /// [`Config::immediate_attempt`].
    pub immediate_attempt: bool,
    /// [`Config::max_param_bytes`].
    pub max_param_bytes: usize,
    /// [`Config::dashboard_url`], for the links of alerts and events.
    pub dashboard_url: Option<String>,
    /// [`Config::keys`], to seal params.
    pub keys: Keys,
}

impl Settings {
    fn of(config: &Config) -> Self {
        Settings {
            attempt_timeout: config.attempt_timeout,
            lease: config.lease,
            lease_margin: config.lease_margin(),
            immediate_attempt: config.immediate_attempt,
            max_param_bytes: config.max_param_bytes,
            dashboard_url: config.dashboard_url.clone(),
            keys: config.keys.clone(),
        }
    }
}

/// Where and how notices are delivered: the channels and handlers, the
/// alert sink, the circuit breakers, the ordering rechecks.
pub(crate) struct Delivery {
    pub handlers: Handlers,
    pub channels: Channels,
    pub alerts: Arc<dyn AlertHook>,
    /// Circuit breakers as this process sees them.
    pub breakers: Breakers,
    /// Ordering keys to check again after commits whose attempt did not
    /// take their notice (PostgreSQL).
    pub rechecks: Arc<Rechecks>,
    on_trip: OnTrip,
    /// When this process last alerted about a notice of each definition
    /// parked because it cannot be opened ([`PARK_ALERT_EVERY`]).
    park_alerts: std::sync::Mutex<std::collections::HashMap<i64, Instant>>,
}

/// The tasks running on an engine's behalf, and the tokens that stop them.
pub(crate) struct Lifecycle {
    /// Slots for after-commit attempts in the background.
    pub background: Arc<Semaphore>,
    /// Every attempt, release and hook running on behalf of this engine
    /// (after-commit attempts, foreground ones included); closed by shutdown.
    pub tasks: TaskTracker,
    /// The circuit controllers running (each opens, probes and closes one
    /// circuit); shutdown stops them as it begins ([`closing`](Self::closing))
    /// and waits for them within its bound.
    pub controllers: TaskTracker,
    /// Cancelled by shutdown: abort deliveries, then stop retrying writes.
    /// Sweeps take child tokens.
    pub stop: Stop,
    /// Cancelled as shutdown begins: the circuit controllers stop (a circuit
    /// left open ends by itself, a lease after its cool-down; a tripped one
    /// is not opened), and stop retrying their writes.
    pub closing: tokio_util::sync::CancellationToken,
}

/// What an engine tells the workers built on it: notices due now (the
/// store's wake-ups), the earliest due time recorded here, notices added
/// due later elsewhere; and the rows it released.
pub(crate) struct Signals {
    /// Rows released (due again at once) so far.
    released: AtomicU64,
    /// The earliest time a notice recorded through this engine falls due
    /// again (a retry, a confirmation deadline), for workers built on it.
    due_hint: watch::Sender<Option<Instant>>,
    /// Bumped when a notice was added due later in another process
    /// (PostgreSQL's `NOTIFY solid_notify, 'later'`): workers ask when it is
    /// due, without sweeping.
    due_checks: watch::Sender<u64>,
}

impl Engine {
    /// An engine over `store` with `config`'s channels; `on_trip` starts a
    /// tripped circuit's controller.
    pub fn new(
        store: Store,
        config: &Config,
        handlers: Handlers,
        alerts: Arc<dyn AlertHook>,
        on_trip: OnTrip,
    ) -> Result<Self> {
        Ok(Engine {
            store,
            defs: DefCache::new(config.def_cache_ttl),
            settings: Settings::of(config),
            delivery: Delivery {
                handlers,
                channels: Channels::new(
                    config.secrets.clone(),
                    config.allow_private_network,
                    &config.mail,
                    &config.amqp,
                )?,
                alerts,
                breakers: Breakers::default(),
                rechecks: Default::default(),
                on_trip,
                park_alerts: Default::default(),
            },
            lifecycle: Lifecycle {
                background: Arc::new(Semaphore::new(config.max_background_attempts.max(1))),
                tasks: TaskTracker::new(),
                controllers: TaskTracker::new(),
                stop: Stop::default(),
                closing: Default::default(),
            },
            signals: Signals {
                released: AtomicU64::new(0),
                due_hint: watch::channel(None).0,
                due_checks: watch::channel(0).0,
            },
        })
    }

    /// Counts the outcome of a delivery of `def` in its breaker, and starts
    /// the circuit's controller when this failure trips it.
    pub fn observe(self: &Arc<Self>, def: &DefRef, outcome: &Outcome) {
        if self.delivery.breakers.observe(def, outcome) {
            (self.delivery.on_trip)(self, def.clone());
        }
    }

    /// Counts rows made due again at once, and wakes the workers.
    pub fn count_released(&self, n: u64) {
        self.signals.released.fetch_add(n, Ordering::Relaxed);
        if n > 0 {
            self.wake_workers();
        }
    }

    /// Wakes the workers built on this engine: notices are due now.
    pub fn wake_workers(&self) {
        self.store.wake_workers();
    }

    /// Wakes the workers of this process and, on PostgreSQL, of every
    /// process (`NOTIFY`); without it they would see newly due notices at
    /// their next poll.
    pub async fn wake_everyone(&self) {
        let db = &self.store.db;
        if db.get_database_backend() == DbBackend::Postgres {
            let notify = Statement::from_string(
                DbBackend::Postgres,
                format!("SELECT pg_notify('{}', '')", migration::WAKE_CHANNEL),
            );
            if let Err(e) = db.execute_raw(notify).await {
                tracing::warn!(error = %e, "cannot wake other processes' workers; they poll");
            }
        }
        self.wake_workers();
    }

    /// The reserved alert definition (a built-in policy when its row is
    /// invalid; the row is recreated when missing).
    pub async fn alert_def(&self) -> Result<DefRef> {
        self.defs.alert_def(&self.store.db).await
    }

    /// Whether this engine attempts notices right after their commit:
    /// [`Config::immediate_attempt`], and not shutting down.
    pub fn attempts_after_commit(&self) -> bool {
        self.settings.immediate_attempt && !self.lifecycle.tasks.is_closed()
    }

    /// When a new notice is first due: reserved for the after-commit attempt
    /// when this engine makes them, or for a notice that waits its turn
    /// (`in_turn`: it has an ordering key), due now and claimed in turn.
    pub fn first_due(&self, in_turn: bool) -> Due {
        match (self.attempts_after_commit(), in_turn) {
            (true, false) => Due::Reserved(self.settings.lease),
            (true, true) => Due::InTurn,
            (false, _) => Due::Now,
        }
    }
}

impl Delivery {
    /// Whether a notice of `def_id` parked now may alert: once per
    /// [`PARK_ALERT_EVERY`] per definition in this process, so that a
    /// missing key over thousands of notices sends one mail, not thousands.
    pub fn park_alert_due(&self, def_id: i64) -> bool {
        let Ok(last) = self.park_alerts.lock() else {
            return true;
        };
        last.get(&def_id)
            .is_none_or(|at| at.elapsed() >= PARK_ALERT_EVERY)
    }

    /// Records that an alert about a parked notice of `def_id` was queued
    /// (with its park) now.
    pub fn park_alerted(&self, def_id: i64) {
        if let Ok(mut last) = self.park_alerts.lock() {
            last.insert(def_id, Instant::now());
        }
    }
}

impl Signals {
    /// Rows made due again at once so far.
    pub fn released(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// Tells the workers built on its engine that a notice falls due
    /// after `delay` (they sleep until then at the latest).
    pub fn due_after(&self, delay: Duration) {
        let at = Instant::now() + delay;
        self.due_hint.send_if_modified(|hint| match hint {
            Some(earlier) if *earlier <= at => false,
            _ => {
                *hint = Some(at);
                true
            }
        });
    }

    /// Tells the workers built on its engine that a notice was added due
    /// later: they ask the database when, without sweeping.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's listener alone
    pub fn ask_due(&self) {
        self.due_checks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever [`ask_due`](Self::ask_due) is called.
    pub fn subscribe_due_checks(&self) -> watch::Receiver<u64> {
        self.due_checks.subscribe()
    }

    /// A receiver of the earliest due time recorded in this process.
    pub fn subscribe_due_hint(&self) -> watch::Receiver<Option<Instant>> {
        self.due_hint.subscribe()
    }

    /// Forgets a due-time hint that has passed (a sweep has run since).
    pub fn clear_due_hint(&self, swept_at: Instant) {
        self.due_hint.send_if_modified(|hint| match hint {
            Some(at) if *at <= swept_at => {
                *hint = None;
                true
            }
            _ => false,
        });
    }
}
