//! Engine: the context every attempt needs, owned by the attempt layer.
//!
//! The store, the definitions, the channels and handlers, the circuit
//! breakers, the alert sink, the tracked tasks, the stop tokens, the
//! background slots, the ordering rechecks and the signals to workers. A
//! [`Notifier`](crate::Notifier) holds one behind an `Arc`, plus what only
//! producers need; the layers below it (attempts, records, batches, parks,
//! the circuit controller) take the engine, never the notifier.

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

/// What every attempt needs; see the [module docs](self).
pub(crate) struct Engine {
    pub store: Store,
    pub defs: DefCache,
    pub handlers: Handlers,
    pub channels: Channels,
    pub config: Config,
    pub alerts: Arc<dyn AlertHook>,
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
    /// Circuit breakers as this process sees them.
    pub breakers: Breakers,
    /// Ordering keys to check again after commits whose attempt did not
    /// take their notice (PostgreSQL).
    pub rechecks: Arc<Rechecks>,
    on_trip: OnTrip,
    /// Rows released (due again at once) so far.
    released: AtomicU64,
    /// When this process last alerted about a notice of each definition
    /// parked because it cannot be opened ([`PARK_ALERT_EVERY`]).
    park_alerts: std::sync::Mutex<std::collections::HashMap<i64, Instant>>,
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
        config: Config,
        handlers: Handlers,
        alerts: Arc<dyn AlertHook>,
        on_trip: OnTrip,
    ) -> Result<Self> {
        Ok(Engine {
            store,
            defs: DefCache::new(config.def_cache_ttl),
            background: Arc::new(Semaphore::new(config.max_background_attempts.max(1))),
            channels: Channels::new(
                config.secrets.clone(),
                config.allow_private_network,
                &config.mail,
                &config.amqp,
            )?,
            tasks: TaskTracker::new(),
            controllers: TaskTracker::new(),
            stop: Stop::default(),
            closing: Default::default(),
            breakers: Breakers::default(),
            rechecks: Default::default(),
            on_trip,
            released: AtomicU64::new(0),
            park_alerts: Default::default(),
            due_hint: watch::channel(None).0,
            due_checks: watch::channel(0).0,
            handlers,
            config,
            alerts,
        })
    }

    /// Counts the outcome of a delivery of `def` in its breaker, and starts
    /// the circuit's controller when this failure trips it.
    pub fn observe(self: &Arc<Self>, def: &DefRef, outcome: &Outcome) {
        if self.breakers.observe(def, outcome) {
            (self.on_trip)(self, def.clone());
        }
    }

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

    /// Rows made due again at once so far.
    pub fn released(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// Counts rows made due again at once, and wakes the workers.
    pub fn count_released(&self, n: u64) {
        self.released.fetch_add(n, Ordering::Relaxed);
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

    /// Tells the workers built on this engine that a notice falls due
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

    /// Tells the workers built on this engine that a notice was added due
    /// later: they ask the database when, without sweeping.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // PostgreSQL's listener alone
    pub fn ask_due(&self) {
        self.due_checks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever [`ask_due`](Self::ask_due) is called.
    pub fn subscribe_due_checks(&self) -> watch::Receiver<u64> {
        self.due_checks.subscribe()
    }

    /// A receiver that changes whenever [`wake_workers`](Self::wake_workers) is called.
    pub fn subscribe_wakes(&self) -> watch::Receiver<u64> {
        self.store.wakes.subscribe()
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

    /// The application's clock, for the dates of failure-log lines (the
    /// database's clock decides everything else).
    pub fn app_now(&self) -> chrono::NaiveDateTime {
        chrono::Utc::now().naive_utc()
    }

    /// The reserved alert definition (a built-in policy when its row is
    /// invalid; the row is recreated when missing).
    pub async fn alert_def(&self) -> Result<DefRef> {
        self.defs.alert_def(&self.store.db).await
    }

    /// Whether this engine attempts notices right after their commit:
    /// [`Config::immediate_attempt`], and not shutting down.
    pub fn attempts_after_commit(&self) -> bool {
        self.config.immediate_attempt && !self.tasks.is_closed()
    }

    /// When a new notice is first due: reserved for the after-commit attempt
    /// when this engine makes them, or for a notice that waits its turn
    /// (`in_turn`: it has an ordering key), due now and claimed in turn.
    pub fn first_due(&self, in_turn: bool) -> Due {
        match (self.attempts_after_commit(), in_turn) {
            (true, false) => Due::Reserved(self.config.lease),
            (true, true) => Due::InTurn,
            (false, _) => Due::Now,
        }
    }
}
