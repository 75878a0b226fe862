//! Notifier: the handle an application builds once and shares; it owns the
//! database pool, the definition cache, the registered handlers, the
//! built-in channels, and every attempt running in the background.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use chrono::NaiveDateTime;
use sea_orm::DatabaseConnection;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::{
    Config,
    alert::{AlertHook, LogAlerts},
    attempt::Stop,
    channel::Channels,
    def::{DefRef, cache::DefCache},
    error::Result,
    handler::{Handler, Handlers},
    load_balance::Balancer,
    state::{Store, clock::Due},
};

/// After a shutdown's timeout aborts running deliveries, how long releasing
/// their rows (and recording the outcomes delivered) may take before the
/// rest is given up, left to the leases: 3 seconds.
pub const RELEASE_GRACE: Duration = Duration::from_secs(3);

/// After [`RELEASE_GRACE`], how long a shutdown waits for what is still
/// running (a call waiting for the database) before it returns anyway: 1
/// second. A shutdown therefore returns within its timeout plus 4 seconds,
/// whatever the database does; what it leaves behind is due again when its
/// lease ends (a delivered success is then sent again: at-least-once).
pub const HARD_STOP_MARGIN: Duration = Duration::from_secs(1);

/// The outbox: add notices in transactions, attempt and record them.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Notifier {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub store: Store,
    pub defs: DefCache,
    pub handlers: Handlers,
    pub channels: Channels,
    pub config: Config,
    pub alerts: Arc<dyn AlertHook>,
    pub balancer: Balancer,
    /// Slots for after-commit attempts in the background.
    pub background: Arc<Semaphore>,
    /// Every attempt, release and hook running on behalf of this notifier
    /// (after-commit attempts, foreground ones included); closed by shutdown.
    pub tasks: TaskTracker,
    /// Cancelled by [`Notifier::shutdown`]: abort deliveries, then stop
    /// retrying writes. Sweeps take child tokens.
    pub stop: Stop,
    /// Notice ids taken from the sequence, not handed out yet (PostgreSQL).
    pub ids: crate::state::ids::IdBlocks,
    /// On the MySQL backend: whether the server is MariaDB (which has
    /// `@@in_transaction`), once known.
    pub mariadb: std::sync::OnceLock<bool>,
    /// Circuit breakers as this process sees them.
    pub circuits: crate::circuit::Circuits,
    /// Ordering keys to check again after commits whose attempt did not
    /// take their notice (PostgreSQL).
    pub rechecks: Arc<crate::attempt::recheck::Rechecks>,
    /// Rows released (due again at once) so far.
    released: AtomicU64,
    /// The earliest time a notice recorded through this notifier falls due
    /// again (a retry, a confirmation deadline), for workers built on it.
    due_hint: tokio::sync::watch::Sender<Option<std::time::Instant>>,
}

impl Inner {
    /// Counts rows made due again at once, and wakes the workers.
    pub fn count_released(&self, n: u64) {
        self.released.fetch_add(n, Ordering::Relaxed);
        if n > 0 {
            self.wake_workers();
        }
    }

    /// Wakes the workers built on this notifier: notices are due now.
    pub fn wake_workers(&self) {
        self.store.wake_workers();
    }

    /// Tells the workers built on this notifier that a notice falls due
    /// after `delay` (they sleep until then at the latest).
    pub fn due_after(&self, delay: Duration) {
        let at = std::time::Instant::now() + delay;
        self.due_hint.send_if_modified(|hint| match hint {
            Some(earlier) if *earlier <= at => false,
            _ => {
                *hint = Some(at);
                true
            }
        });
    }
}

impl Notifier {
    /// Starts building a notifier on `db`.
    pub fn builder(db: DatabaseConnection) -> NotifierBuilder {
        NotifierBuilder {
            db,
            handlers: Handlers::default(),
            config: Config::default(),
            alerts: Arc::new(LogAlerts),
        }
    }

    /// The database pool.
    pub fn db(&self) -> &DatabaseConnection {
        self.inner.store.db.pool()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Names of the registered handlers.
    pub fn handler_names(&self) -> Vec<String> {
        self.inner.handlers.names()
    }

    /// Whether an AMQP broker is configured.
    pub fn amqp_enabled(&self) -> bool {
        self.inner.channels.amqp.enabled()
    }

    /// Stops this notifier's attempts for shutdown: no new after-commit
    /// attempt starts (their notices are due at once for a sweeper), running
    /// ones (background and awaited alike) may finish within `timeout`;
    /// then their deliveries are abandoned and their rows released, and the
    /// outcomes delivered recorded, for up to [`RELEASE_GRACE`] more; what
    /// the database would not take by then is given up, left to its lease
    /// (counted in `solid_notify_outcomes_given_up_total`). Returns within
    /// `timeout` + [`RELEASE_GRACE`] + [`HARD_STOP_MARGIN`], whatever the
    /// database does (each of its calls is bounded too:
    /// [`Config::db_timeout`]), with how many rows were released meanwhile.
    /// Call it before the process exits.
    pub async fn shutdown(&self, timeout: Duration) -> Result<u64> {
        let inner = &self.inner;
        let before = inner.released.load(Ordering::Relaxed);
        inner.tasks.close();
        if tokio::time::timeout(timeout, inner.tasks.wait())
            .await
            .is_err()
        {
            inner.stop.abort.cancel();
            if tokio::time::timeout(RELEASE_GRACE, inner.tasks.wait())
                .await
                .is_err()
            {
                inner.stop.give_up.cancel();
                if tokio::time::timeout(HARD_STOP_MARGIN, inner.tasks.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        tasks = inner.tasks.len(),
                        "shutdown: attempts still waiting for the database are left behind; their notices are due again when their leases end"
                    );
                }
            }
        }
        Ok(inner.released.load(Ordering::Relaxed) - before)
    }

    /// Wakes the workers built on this notifier (or its clones): notices are
    /// due now. Producers, operators and releases call it themselves.
    pub(crate) fn wake_workers(&self) {
        self.inner.wake_workers();
    }

    /// A receiver that changes whenever [`wake_workers`](Self::wake_workers) is called.
    pub(crate) fn subscribe_wakes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.store.wakes.subscribe()
    }

    /// A receiver of the earliest due time recorded in this process.
    pub(crate) fn subscribe_due_hint(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<std::time::Instant>> {
        self.inner.due_hint.subscribe()
    }

    /// Forgets a due-time hint that has passed (a sweep has run since).
    pub(crate) fn clear_due_hint(&self, swept_at: std::time::Instant) {
        self.inner.due_hint.send_if_modified(|hint| match hint {
            Some(at) if *at <= swept_at => {
                *hint = None;
                true
            }
            _ => false,
        });
    }

    /// Forgets cached definitions so the next use rereads the whole of
    /// `notify_def`.
    pub fn reload_defs(&self) {
        self.inner.defs.forget();
    }

    /// The application's clock, for the dates of failure-log lines (the
    /// database's clock decides everything else).
    pub(crate) fn app_now(&self) -> NaiveDateTime {
        chrono::Utc::now().naive_utc()
    }

    /// The reserved alert definition (a built-in policy when its row is
    /// invalid; the row is recreated when missing).
    pub(crate) async fn alert_def(&self) -> Result<DefRef> {
        self.inner.defs.alert_def(&self.inner.store.db).await
    }

    /// Whether this notifier attempts notices right after their commit:
    /// [`Config::immediate_attempt`], and not shutting down.
    pub(crate) fn attempts_after_commit(&self) -> bool {
        self.inner.config.immediate_attempt && !self.inner.tasks.is_closed()
    }

    /// When a new notice is first due: reserved for the after-commit attempt
    /// when this notifier makes them, or for a notice that waits its turn
    /// (`in_turn`: it has an ordering key), due now and claimed in turn.
    pub(crate) fn first_due(&self, in_turn: bool) -> Due {
        match (self.attempts_after_commit(), in_turn) {
            (true, false) => Due::Reserved(self.inner.config.lease),
            (true, true) => Due::InTurn,
            (false, _) => Due::Now,
        }
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("handlers", &self.inner.handlers)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Notifier`]; see [`Notifier::builder`].
pub struct NotifierBuilder {
    db: DatabaseConnection,
    handlers: Handlers,
    config: Config,
    alerts: Arc<dyn AlertHook>,
}

impl NotifierBuilder {
    /// Registers a Rust handler for definitions whose target is `{"handler": name}`.
    pub fn handler(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(name, handler);
        self
    }

    /// Replaces the whole configuration (default: [`Config::default`]).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Where alerts go in-process (default: [`LogAlerts`]).
    pub fn alert_hook(mut self, hook: impl AlertHook) -> Self {
        self.alerts = Arc::new(hook);
        self
    }

    /// Checks the configuration and builds the notifier.
    pub fn build(self) -> Result<Notifier> {
        self.config.validate()?;
        Ok(Notifier {
            inner: Arc::new(Inner {
                store: Store::new(self.db, self.config.lease, self.config.db_timeout),
                defs: DefCache::new(self.config.def_cache_ttl),
                background: Arc::new(Semaphore::new(self.config.max_background_attempts.max(1))),
                balancer: Balancer::new(self.config.load_balance),
                channels: Channels::new(&self.config)?,
                tasks: TaskTracker::new(),
                stop: Stop::default(),
                circuits: crate::circuit::Circuits::default(),
                rechecks: Default::default(),
                ids: Default::default(),
                mariadb: std::sync::OnceLock::new(),
                released: AtomicU64::new(0),
                due_hint: tokio::sync::watch::channel(None).0,
                handlers: self.handlers,
                config: self.config,
                alerts: self.alerts,
            }),
        })
    }
}
