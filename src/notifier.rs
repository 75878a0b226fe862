//! Notifier: the handle an application builds once and shares; it owns the
//! database pool, the definition cache, the registered handlers and the config.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use sea_orm::DatabaseConnection;
use tokio::sync::Semaphore;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    Config,
    alert::{AlertHook, LogAlerts},
    channel::Channels,
    def::cache::DefCache,
    error::Result,
    handler::{Handler, Handlers},
    load_balance::Balancer,
};

/// The outbox: add notices in transactions, attempt and record them.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Notifier {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub db: DatabaseConnection,
    pub defs: DefCache,
    pub handlers: Handlers,
    pub config: Config,
    pub alerts: Arc<dyn AlertHook>,
    pub background: Arc<Semaphore>,
    pub balancer: Balancer,
    pub channels: Channels,
    /// After-commit attempts running in the background.
    pub background_tasks: TaskTracker,
    /// Cancelled by [`Notifier::shutdown`] to abandon background attempts.
    pub stop_background: CancellationToken,
    /// Rows claimed by attempts of [`Notifier::attempt`] and the after-commit
    /// route that have not recorded their outcome yet: id → claimed version.
    pub claims: Mutex<HashMap<i64, i32>>,
}

impl Inner {
    pub fn track_claim(&self, id: i64, version: i32) {
        self.claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, version);
    }

    pub fn untrack_claim(&self, id: i64) {
        self.claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
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
        &self.inner.db
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

    /// Stops after-commit attempts for shutdown: no new ones start (their
    /// notices wait for a sweeper), running ones may finish within `timeout`,
    /// and those still running are abandoned and their rows released (due
    /// again at once). Returns how many rows were released. Call it before
    /// the process exits.
    pub async fn shutdown(&self, timeout: std::time::Duration) -> Result<u64> {
        let tasks = &self.inner.background_tasks;
        tasks.close();
        if tokio::time::timeout(timeout, tasks.wait()).await.is_err() {
            self.inner.stop_background.cancel();
            tasks.wait().await;
        }
        let unfinished: Vec<(i64, i32)> = self
            .inner
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        Ok(crate::sweep::batch::release(&self.inner, &unfinished).await?)
    }

    /// Forgets cached definitions so the next use rereads `notify_def`.
    pub fn reload_defs(&self) {
        self.inner.defs.invalidate();
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

    /// Where alerts go (default: [`LogAlerts`]).
    pub fn alert_hook(mut self, hook: impl AlertHook) -> Self {
        self.alerts = Arc::new(hook);
        self
    }

    /// Checks the configuration and builds the notifier.
    pub fn build(self) -> Result<Notifier> {
        self.config.validate()?;
        Ok(Notifier {
            inner: Arc::new(Inner {
                defs: DefCache::new(self.config.def_cache_ttl),
                background: Arc::new(Semaphore::new(self.config.max_background_attempts.max(1))),
                balancer: Balancer::new(self.config.load_balance),
                channels: Channels::new(&self.config)?,
                background_tasks: TaskTracker::new(),
                stop_background: CancellationToken::new(),
                claims: Mutex::default(),
                db: self.db,
                handlers: self.handlers,
                config: self.config,
                alerts: self.alerts,
            }),
        })
    }
}
