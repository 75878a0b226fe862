//! `solid-notify worker`: its settings (a TOML file, then environment, then
//! flags) and its run until SIGINT or SIGTERM.

use std::{path::PathBuf, time::Duration};

#[cfg(feature = "metrics")]
use solid_notify::telemetry;
use solid_notify::{
    Config, Notifier, Worker, WorkerConfig,
    ops::purge::{Retention, spawn_retention},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

use super::common::stop_signal;

/// Worker settings: a TOML file (`--config`), then environment, then flags.
#[derive(clap::Args)]
pub(crate) struct WorkerArgs {
    /// TOML file with a `[worker]` table (WorkerConfig keys) and a `[notifier]`
    /// table (`lease`, `attempt_timeout`, `def_cache_ttl`, `db_timeout`,
    /// `allow_private_network`).
    #[arg(long, env = "SOLID_NOTIFY_CONFIG")]
    config: Option<PathBuf>,
    /// fixed-rate (sweep at every cron tick) or fixed-delay (pause after each sweep).
    #[arg(long, env = "SOLID_NOTIFY_MODE", value_parser = parse_mode)]
    mode: Option<Mode>,
    /// Cron expression, seconds first (default: every second).
    #[arg(long, env = "SOLID_NOTIFY_CRON")]
    cron: Option<String>,
    /// Pause after each sweep in fixed-delay mode, e.g. 500ms, 2s (default 1s).
    #[arg(long, env = "SOLID_NOTIFY_DELAY", value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Wait before the first sweep (default 0).
    #[arg(long, env = "SOLID_NOTIFY_INITIAL_DELAY", value_parser = humantime::parse_duration)]
    initial_delay: Option<Duration>,
    /// Rows claimed per batch (default 1000).
    #[arg(long, env = "SOLID_NOTIFY_BATCH_SIZE")]
    batch_size: Option<u64>,
    /// Deliveries at once (default 32).
    #[arg(long, env = "SOLID_NOTIFY_CONCURRENCY")]
    concurrency: Option<usize>,
    /// Only these definitions, comma separated.
    #[arg(long, env = "SOLID_NOTIFY_DEFS", value_delimiter = ',')]
    defs: Option<Vec<String>>,
    /// Only definitions delivered by these handlers, comma separated.
    #[arg(long, env = "SOLID_NOTIFY_HANDLERS", value_delimiter = ',')]
    handlers: Option<Vec<String>>,
    /// Only these load_balance_num partitions, comma separated.
    #[arg(long, env = "SOLID_NOTIFY_PARTITIONS", value_delimiter = ',')]
    partitions: Option<Vec<i32>>,
    /// On MySQL/MariaDB and SQLite, how often to ask when the next notice
    /// is due, so that notices other processes add are sent on time
    /// (default 500ms; 0s: never).
    #[arg(long, env = "SOLID_NOTIFY_DUE_CHECK_EVERY", value_parser = humantime::parse_duration)]
    due_check_every: Option<Duration>,
    /// PostgreSQL: where to `LISTEN` for wake-ups when `--url` goes through
    /// a pooler in transaction mode (PostgreSQL itself, or the pooler in
    /// session mode). Default: `--url`.
    #[arg(long, env = "SOLID_NOTIFY_LISTEN_URL", hide_env_values = true)]
    listen_url: Option<String>,
    /// Claim lease (default 60s): a killed worker's rows are due again after it.
    #[arg(long, env = "SOLID_NOTIFY_LEASE", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// Attempt timeout (default 30s), shorter than the lease.
    #[arg(long, env = "SOLID_NOTIFY_ATTEMPT_TIMEOUT", value_parser = humantime::parse_duration)]
    attempt_timeout: Option<Duration>,
    /// How long in-flight deliveries may finish at shutdown (default 30s).
    #[arg(long, env = "SOLID_NOTIFY_SHUTDOWN_TIMEOUT", value_parser = humantime::parse_duration)]
    shutdown_timeout: Option<Duration>,
    /// Bytes of params a sweep holds at once (default 64 MiB), e.g.
    /// `67108864`; a larger notice still goes, alone.
    #[arg(long, env = "SOLID_NOTIFY_MAX_IN_FLIGHT_BYTES")]
    max_in_flight_bytes: Option<u64>,
    /// Longest any one database call may take (default 10s): past it the
    /// call counts as a lost connection.
    #[arg(long, env = "SOLID_NOTIFY_DB_TIMEOUT", value_parser = humantime::parse_duration)]
    db_timeout: Option<Duration>,
    /// Let HTTP requests reach private, loopback and link-local addresses
    /// for every definition (default: public addresses only).
    #[arg(long, env = "SOLID_NOTIFY_ALLOW_PRIVATE_NETWORK")]
    allow_private_network: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464;
    /// port 0 picks a free port, printed on stderr). Default: off.
    #[cfg(feature = "metrics")]
    #[arg(long, env = "SOLID_NOTIFY_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// How often the database gauges are refreshed (default 5s).
    #[arg(long, env = "SOLID_NOTIFY_GAUGE_EVERY", value_parser = humantime::parse_duration)]
    #[cfg(feature = "metrics")]
    gauge_every: Option<Duration>,
}

/// The TOML file of `worker --config`.
#[derive(Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WorkerFile {
    worker: WorkerConfig,
    notifier: NotifierFile,
    /// Scheduled purge of old history; off when absent.
    retention: Option<Retention>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct NotifierFile {
    #[serde(with = "humantime_serde")]
    lease: Option<Duration>,
    #[serde(with = "humantime_serde")]
    attempt_timeout: Option<Duration>,
    #[serde(with = "humantime_serde")]
    def_cache_ttl: Option<Duration>,
    #[serde(with = "humantime_serde")]
    db_timeout: Option<Duration>,
    allow_private_network: Option<bool>,
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    match text.replace('_', "-").as_str() {
        "fixed-rate" => Ok(Mode::FixedRate),
        "fixed-delay" => Ok(Mode::FixedDelay),
        other => Err(format!("`{other}` is not fixed-rate or fixed-delay")),
    }
}

impl WorkerArgs {
    /// Merges file, environment and flags (later wins) into the two configs.
    fn resolve(&self) -> solid_notify::Result<(Config, WorkerConfig, Option<Retention>)> {
        let file: WorkerFile = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| solid_notify::Error::Config(format!("{}: {e}", path.display())))?;
                toml::from_str(&text)
                    .map_err(|e| solid_notify::Error::Config(format!("{}: {e}", path.display())))?
            }
            None => WorkerFile::default(),
        };
        let mut w = file.worker;
        let mut n = Config::default();
        macro_rules! set {
            ($target:expr, $value:expr) => {
                if let Some(v) = $value {
                    $target = v;
                }
            };
        }
        set!(n.lease, file.notifier.lease);
        set!(n.attempt_timeout, file.notifier.attempt_timeout);
        set!(n.def_cache_ttl, file.notifier.def_cache_ttl);
        set!(n.db_timeout, file.notifier.db_timeout);
        set!(n.db_timeout, self.db_timeout);
        set!(n.allow_private_network, file.notifier.allow_private_network);
        n.allow_private_network |= self.allow_private_network;
        set!(n.lease, self.lease);
        set!(n.attempt_timeout, self.attempt_timeout);
        set!(w.mode, self.mode);
        set!(w.cron, self.cron.clone());
        set!(w.delay, self.delay);
        set!(w.initial_delay, self.initial_delay);
        set!(w.batch_size, self.batch_size);
        set!(w.concurrency, self.concurrency);
        set!(w.defs, self.defs.clone());
        set!(w.handlers, self.handlers.clone());
        set!(w.partitions, self.partitions.clone());
        set!(w.shutdown_timeout, self.shutdown_timeout);
        set!(w.max_in_flight_bytes, self.max_in_flight_bytes);
        set!(w.due_check_every, self.due_check_every);
        if let Some(url) = &self.listen_url {
            w.listen_url = Some(solid_notify::ListenUrl(url.clone()));
        }
        Ok((n, w, file.retention))
    }
}

pub(crate) async fn run(
    db: sea_orm::DatabaseConnection,
    args: WorkerArgs,
) -> solid_notify::Result<()> {
    let (config, worker_config, retention) = args.resolve()?;
    let notifier = Notifier::builder(db.clone()).config(config).build()?;
    let notifier_for_shutdown = notifier.clone();
    let worker_timeout = worker_config.shutdown_timeout;
    let shutdown = CancellationToken::new();
    #[cfg(feature = "metrics")]
    if let Some(addr) = args.metrics_addr {
        let bound = telemetry::serve_metrics(addr, db.clone(), shutdown.clone()).await?;
        eprintln!("metrics: http://{bound}/metrics");
        let every = args.gauge_every.unwrap_or(telemetry::DEFAULT_GAUGE_EVERY);
        telemetry::spawn_gauges(notifier.clone(), every, shutdown.clone());
    }
    if let Some(retention) = retention {
        spawn_retention(db, retention, shutdown.clone());
    }
    let worker = Worker::new(notifier, worker_config)?;
    let stop = shutdown.clone();
    let stopping_at = std::sync::Arc::new(std::sync::OnceLock::new());
    tokio::spawn({
        let stopping_at = stopping_at.clone();
        async move {
            stop_signal().await;
            tracing::info!("stopping: finishing in-flight deliveries");
            let _ = stopping_at.set(std::time::Instant::now());
            stop.cancel();
        }
    });
    // Once stopping, the notifier's own tasks (releases, alert hooks) get
    // the same deadline as the worker's sweeps, at the same time: the
    // process exits within shutdown_timeout + RELEASE_GRACE +
    // HARD_STOP_MARGIN whatever the database does.
    let notifier_stopped = {
        let (shutdown, notifier) = (shutdown.clone(), notifier_for_shutdown.clone());
        async move {
            shutdown.cancelled().await;
            notifier.shutdown(worker_timeout).await
        }
    };
    let running = async {
        let ran = worker.run(shutdown.clone()).await;
        if ran.is_err() {
            // Refused before it started: nothing to wait for.
            shutdown.cancel();
        }
        ran
    };
    let (ran, stopped) = tokio::join!(running, notifier_stopped);
    ran?;
    stopped?;
    // Tasks the last sweeps started meanwhile (alert hooks, releases):
    // what is left of the deadline.
    if let Some(at) = stopping_at.get() {
        // A timeout too long to add up means no deadline.
        let deadline = at.checked_add(
            worker_timeout
                .saturating_add(solid_notify::RELEASE_GRACE + solid_notify::HARD_STOP_MARGIN),
        );
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(std::time::Instant::now())
        });
        tokio::time::timeout(left, notifier_for_shutdown.shutdown(Duration::ZERO))
            .await
            .ok();
    }
    let stats = worker.stats().snapshot();
    eprintln!(
        "worker stopped: {} claimed, {} succeeded, {} failed, {} lost claims, {} released, {} successes given up or left unrecorded",
        stats.claimed,
        stats.succeeded,
        stats.failed(),
        stats.lost_claims,
        stats.released,
        stats.given_up + stats.unrecorded
    );
    Ok(())
}
