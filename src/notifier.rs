//! Notifier: the handle an application builds once and shares; it owns the
//! database pool, the definition cache, the registered handlers and the config.

use std::sync::Arc;

use sea_orm::DatabaseConnection;
use tokio::sync::Semaphore;

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
                db: self.db,
                handlers: self.handlers,
                config: self.config,
                alerts: self.alerts,
            }),
        })
    }
}
