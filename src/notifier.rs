//! Notifier: the handle an application builds once and shares; it owns the
//! database pool, the definition cache, the registered handlers, the
//! built-in channels, and every attempt running in the background.

use std::{sync::Arc, time::Duration};

use sea_orm::DatabaseConnection;

use crate::{
    alert::{AlertHook, LogAlerts},
    attempt::{AttemptReport, engine::Engine},
    config::Config,
    error::Result,
    handler::{Handler, Handlers},
    load_balance::Balancer,
    schema::DatabaseCheck,
    state::{Store, ids::IdBlocks},
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
    /// What every attempt needs (the attempt layer's context).
    pub(crate) engine: Arc<Engine>,
    pub(crate) producing: Arc<Producing>,
    /// The settings in force (the engine keeps what attempts read).
    config: Arc<Config>,
    /// What [`Notifier::check_database`] found, once it succeeded.
    checked: Arc<tokio::sync::OnceCell<DatabaseCheck>>,
    /// Its last failure, for a second.
    refused: Arc<crate::schema::Refused>,
}

/// What only producers need, beside the engine.
pub(crate) struct Producing {
    pub balancer: Balancer,
    /// Notice ids taken from the sequence, not handed out yet (PostgreSQL).
    pub ids: IdBlocks,
    /// On the MySQL backend: whether the server is MariaDB (which has
    /// `@@in_transaction`), once known.
    pub mariadb: std::sync::OnceLock<bool>,
}

impl Notifier {
    /// Checks the database before this process uses it, once per notifier
    /// (a success is kept; a failure is checked again at the next call):
    /// - the schema: [`Error::SchemaBehind`](crate::Error::SchemaBehind)
    ///   when a migration this build knows has not run; migrations this
    ///   build does not know (a newer release ran them) are logged once at
    ///   `WARN` and listed in [`DatabaseCheck::newer`];
    /// - PostgreSQL: whether a pooler in transaction mode stands between
    ///   (two new connections, closed after): refused with
    ///   [`Error::Pooler`](crate::Error::Pooler), which says what to
    ///   change, when it does not keep prepared statements.
    ///
    /// Each check is bounded by [`Config::db_timeout`]. Workers call it
    /// before their first sweep, and [`begin`](Self::begin) before its
    /// first transaction; an application that only calls
    /// [`add`](Self::add) in its own transactions calls it at start.
    pub async fn check_database(&self) -> Result<DatabaseCheck> {
        self.checked
            .get_or_try_init(|| async {
                // A refusal (an older schema, a pooler) is kept for a
                // second: callers waiting meanwhile get it again instead of
                // each checking in turn.
                if let Some(refused) = self.refused.recent() {
                    return Err(refused);
                }
                let checked = crate::schema::check(self.db(), self.config.db_timeout).await;
                if let Err(e) = &checked {
                    self.refused.keep(e);
                }
                checked
            })
            .await
            .cloned()
    }

    /// Starts building a notifier on `db`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), solid_notify::Error> {
    /// use solid_notify::{Config, Notice, Notifier, Outcome};
    /// let db = sea_orm::Database::connect("sqlite://notify.db?mode=rwc").await?;
    /// solid_notify::migrate(&db).await?;
    /// let notifier = Notifier::builder(db)
    ///     .config(Config::default())
    ///     .handler("ship", |n: Notice| async move {
    ///         println!("shipping {}", n.param);
    ///         Ok(Outcome::success())
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
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
        self.store().db.pool()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store the layers above the engine read and write with.
    pub(crate) fn store(&self) -> &Store {
        &self.engine.store
    }

    /// The definition cache.
    pub(crate) fn defs(&self) -> &crate::def::cache::DefCache {
        &self.engine.defs
    }

    /// The definition that receives `source`'s events, asked once
    /// ([`events::target`](crate::attempt::events::target)).
    pub(crate) async fn events_target(
        &self,
        source: &crate::def::Def,
    ) -> Result<Option<crate::def::DefRef>> {
        use crate::attempt::events;
        events::target(&self.engine, source, None, 0, &events::once()).await
    }

    /// The rows of `events` about `source`, asked once
    /// ([`events::rows`](crate::attempt::events::rows)).
    pub(crate) async fn events_of(
        &self,
        source: &crate::def::Def,
        events: &[crate::event::Event],
    ) -> Result<crate::attempt::events::EventRows> {
        use crate::attempt::events;
        events::rows(&self.engine, source, None, events, &events::once()).await
    }

    /// Wakes the workers of this process and, on PostgreSQL, of every
    /// process (`NOTIFY`); without it they would see newly due notices at
    /// their next poll.
    pub(crate) async fn wake_everyone(&self) {
        self.engine.wake_everyone().await;
    }

    /// The reserved alert definition (a built-in policy when its row is
    /// invalid; the row is recreated when missing).
    pub(crate) async fn alert_def(&self) -> Result<crate::def::DefRef> {
        self.engine.alert_def().await
    }

    /// What this notifier tells the workers built on it.
    pub(crate) fn signals(&self) -> &crate::attempt::engine::Signals {
        &self.engine.signals
    }

    #[doc(hidden)]
    /// Names of the registered handlers.
    pub fn handler_names(&self) -> Vec<String> {
        self.engine.delivery.handlers.names()
    }

    #[doc(hidden)]
    /// Whether an AMQP broker is configured.
    pub fn amqp_enabled(&self) -> bool {
        self.engine.delivery.channels.amqp.enabled()
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
        let inner = &self.engine;
        let before = inner.signals.released();
        // `None`: no deadline (a timeout too long to add up waits for ever).
        let deadline = tokio::time::Instant::now()
            .checked_add(timeout)
            .and_then(|t| t.checked_add(RELEASE_GRACE + HARD_STOP_MARGIN));
        // The circuit controllers stop now (a circuit left open ends by
        // itself, a lease after its cool-down); a probe running is an
        // attempt like the others.
        inner.lifecycle.controllers.close();
        inner.lifecycle.closing.cancel();
        inner.lifecycle.tasks.close();
        if tokio::time::timeout(timeout, inner.lifecycle.tasks.wait())
            .await
            .is_err()
        {
            inner.lifecycle.stop.abort.cancel();
            if tokio::time::timeout(RELEASE_GRACE, inner.lifecycle.tasks.wait())
                .await
                .is_err()
            {
                inner.lifecycle.stop.give_up.cancel();
                if tokio::time::timeout(HARD_STOP_MARGIN, inner.lifecycle.tasks.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        tasks = inner.lifecycle.tasks.len(),
                        "shutdown: attempts still waiting for the database are left behind; their notices are due again when their leases end"
                    );
                }
            }
        }
        let controllers = inner.lifecycle.controllers.wait();
        let stopped = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, controllers).await.is_ok(),
            None => {
                controllers.await;
                true
            }
        };
        if !stopped {
            tracing::warn!(
                "shutdown: a circuit controller is still waiting for the database; left behind"
            );
        }
        Ok(inner.signals.released() - before)
    }

    #[doc(hidden)]
    /// Attempts one notice as read from `notify_msg` (its `version` is the one
    /// the claim expects), recording the outcome inline. Safe to call from any
    /// number of tasks or processes at once: at most one of them sends. A
    /// notice whose definition is unknown or invalid is parked.
    pub async fn attempt(&self, row: crate::entity::notify_msg::Model) -> AttemptReport {
        crate::attempt::attempt_row(&self.engine, row).await
    }

    /// Wakes the workers built on this notifier (or its clones): notices are
    /// due now. Producers, operators and releases call it themselves.
    pub(crate) fn wake_workers(&self) {
        self.engine.wake_workers();
    }

    /// Forgets cached definitions so the next use rereads the whole of
    /// `notify_def`.
    pub fn reload_defs(&self) {
        self.defs().forget();
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("handlers", &self.engine.delivery.handlers)
            .field("config", &self.config)
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
    /// Fails with [`Error::BackendNotCompiled`](crate::error::Error::BackendNotCompiled)
    /// when the connection's database has no cargo feature in this build.
    pub fn build(self) -> Result<Notifier> {
        crate::db::check_backend(self.db.get_database_backend())?;
        self.config.validate()?;
        let store = Store::new(self.db, self.config.lease, self.config.db_timeout);
        let producing = Producing {
            balancer: Balancer::new(self.config.load_balance),
            ids: Default::default(),
            mariadb: std::sync::OnceLock::new(),
        };
        let engine = Engine::new(
            store,
            &self.config,
            self.handlers,
            self.alerts,
            crate::circuit::start,
        )?;
        Ok(Notifier {
            engine: Arc::new(engine),
            producing: Arc::new(producing),
            config: Arc::new(self.config),
            checked: Arc::default(),
            refused: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A build without `postgres` or `mysql` refuses a real connection to
    /// that server in the builder, `migrate` and `worker::connect`, though
    /// sea-orm has the driver (the dev-dependencies give it all three, as
    /// another crate of an application may). Run by `.ci/run` with `sqlite`
    /// alone; the builds with every backend take them in every other test.
    #[cfg(not(all(feature = "postgres", feature = "mysql")))]
    #[tokio::test]
    async fn a_database_without_its_feature_is_refused() {
        let mut servers = Vec::new();
        if !cfg!(feature = "postgres") {
            let base = std::env::var("SN_TEST_PG_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
            servers.push((format!("{base}/postgres"), "postgres"));
        }
        if !cfg!(feature = "mysql") {
            let base = std::env::var("SN_TEST_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
            servers.push((format!("{base}/test"), "mysql"));
        }
        for (url, wanted) in servers {
            let db = sea_orm::Database::connect(&url).await.unwrap_or_else(|e| {
                panic!("cannot connect to {url}: {e} (.ci/run starts the servers)")
            });
            let built = super::Notifier::builder(db.clone()).build().err();
            let migrated = crate::migrate(&db).await.err();
            let connected = crate::worker::connect(&url, Duration::from_secs(5))
                .await
                .err();
            for refused in [built, migrated, connected] {
                let refused = refused.expect("refused");
                assert!(
                    matches!(refused, crate::error::Error::BackendNotCompiled { feature, .. } if feature == wanted),
                    "{url}: {refused:?}"
                );
            }
            db.close().await.ok();
        }
        let sqlite = sea_orm::Database::connect("sqlite::memory:").await;
        let sqlite = sqlite.expect("an in-memory SQLite database");
        assert_eq!(
            super::Notifier::builder(sqlite).build().is_ok(),
            cfg!(feature = "sqlite")
        );
    }

    /// `worker::connect` names the host, never the password, whatever
    /// sea-orm's error says (an unknown scheme: sea-orm names the URL).
    #[tokio::test]
    async fn a_refused_url_never_shows_its_password() {
        let refused =
            crate::worker::connect("nosuch://user:hunter2@127.0.0.1/db", Duration::from_secs(5))
                .await
                .expect_err("no driver for the scheme");
        assert!(!refused.to_string().contains("hunter2"), "{refused}");
        assert!(refused.to_string().contains("127.0.0.1"), "{refused}");
    }
}
