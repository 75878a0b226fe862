//! The `solid-notify` command: migrations, definitions and the worker.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use solid_notify::{
    Config, Notifier, Status, Worker, WorkerConfig,
    def::{file, store},
    history,
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

/// Reliable notifications after commit: operate the outbox tables.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Database URL (sqlite://…, postgres://…, mysql://…).
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        default_value = "sqlite://solid-notify.db?mode=rwc"
    )]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or upgrade the notify_def, notify_msg and notify_msg_history tables.
    Migrate,
    /// Manage notify_def rows.
    Defs {
        #[command(subcommand)]
        command: DefsCommand,
    },
    /// Sweep due notices on a schedule until SIGINT or SIGTERM.
    Worker(Box<WorkerArgs>),
    /// Finished notices: find, inspect, requeue.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// Cancel a notice in flight (it moves to history with status 5).
    Cancel {
        /// Notice id.
        id: i64,
    },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Finished notices, newest first.
    List {
        /// Only this definition.
        #[arg(long)]
        def: Option<String>,
        /// Only this outcome: succeeded, final_failure, cancelled or parked.
        #[arg(long, value_parser = parse_status)]
        status: Option<Status>,
        /// At most this many rows.
        #[arg(long, default_value_t = 50)]
        limit: u64,
    },
    /// One finished notice with its param and failure log.
    Show {
        /// Notice id.
        id: i64,
    },
    /// Put a final failure, cancelled or parked notice back in flight, due at
    /// once, with a fresh retry budget.
    Requeue {
        /// Notice id.
        id: i64,
    },
}

fn parse_status(text: &str) -> Result<Status, String> {
    match Status::parse(text) {
        Some(status) if status.is_terminal() => Ok(status),
        _ => Err(format!(
            "`{text}` is not succeeded, final_failure, cancelled or parked"
        )),
    }
}

/// Worker settings: a TOML file (`--config`), then environment, then flags.
#[derive(clap::Args)]
struct WorkerArgs {
    /// TOML file with a `[worker]` table (WorkerConfig keys) and a `[notifier]`
    /// table (`lease`, `attempt_timeout`, `def_cache_ttl`).
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
    /// Claim lease (default 60s): a killed worker's rows are due again after it.
    #[arg(long, env = "SOLID_NOTIFY_LEASE", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// Attempt timeout (default 30s), shorter than the lease.
    #[arg(long, env = "SOLID_NOTIFY_ATTEMPT_TIMEOUT", value_parser = humantime::parse_duration)]
    attempt_timeout: Option<Duration>,
    /// How long in-flight deliveries may finish at shutdown (default 30s).
    #[arg(long, env = "SOLID_NOTIFY_SHUTDOWN_TIMEOUT", value_parser = humantime::parse_duration)]
    shutdown_timeout: Option<Duration>,
}

/// The TOML file of `worker --config`.
#[derive(Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct WorkerFile {
    worker: WorkerConfig,
    notifier: NotifierFile,
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
    fn resolve(self) -> solid_notify::Result<(Config, WorkerConfig)> {
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
        set!(n.lease, self.lease);
        set!(n.attempt_timeout, self.attempt_timeout);
        set!(w.mode, self.mode);
        set!(w.cron, self.cron);
        set!(w.delay, self.delay);
        set!(w.initial_delay, self.initial_delay);
        set!(w.batch_size, self.batch_size);
        set!(w.concurrency, self.concurrency);
        set!(w.defs, self.defs);
        set!(w.handlers, self.handlers);
        set!(w.partitions, self.partitions);
        set!(w.shutdown_timeout, self.shutdown_timeout);
        Ok((n, w))
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                ctrl_c.await.ok();
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.ok();
}

#[derive(Subcommand)]
enum DefsCommand {
    /// Validate the TOML files in DIR and upsert them into notify_def by name.
    Sync {
        /// Folder of *.toml definition files.
        #[arg(default_value = "definitions")]
        dir: PathBuf,
        /// Only validate; write nothing.
        #[arg(long)]
        check: bool,
    },
    /// List the definitions in notify_def, flagging invalid rows.
    List,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> solid_notify::Result<()> {
    if let Command::Defs {
        command: DefsCommand::Sync { dir, check: true },
    } = &cli.command
    {
        let defs = file::load_dir(dir)?;
        println!("{} definitions in {} are valid", defs.len(), dir.display());
        return Ok(());
    }
    let db =
        sea_orm::Database::connect(solid_notify::worker::pool_options(&cli.database_url)).await?;
    match cli.command {
        Command::Worker(args) => {
            let (config, worker_config) = args.resolve()?;
            let notifier = Notifier::builder(db).config(config).build()?;
            let notifier_for_shutdown = notifier.clone();
            let worker_timeout = worker_config.shutdown_timeout;
            let worker = Worker::new(notifier, worker_config)?;
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                stop_signal().await;
                tracing::info!("stopping: finishing in-flight deliveries");
                stop.cancel();
            });
            worker.run(shutdown).await;
            notifier_for_shutdown.shutdown(worker_timeout).await?;
            let stats = worker.stats().snapshot();
            eprintln!(
                "worker stopped: {} claimed, {} succeeded, {} failed, {} lost claims, {} released",
                stats.claimed,
                stats.succeeded,
                stats.failed(),
                stats.lost_claims,
                stats.released
            );
        }
        Command::History { command } => match command {
            HistoryCommand::List { def, status, limit } => {
                println!(
                    "{:<10} {:<8} {:<14} {:>7}  {:<26} last error",
                    "id", "def_id", "status", "retries", "last call (UTC)"
                );
                for row in history::list(&db, def.as_deref(), status, limit).await? {
                    let last = row.errors.lines().last().unwrap_or("");
                    let when = row
                        .last_call_time
                        .map(|t| t.to_string())
                        .unwrap_or_default();
                    println!(
                        "{:<10} {:<8} {:<14} {:>7}  {:<26} {last}",
                        row.id,
                        row.def_id,
                        row.status.to_string(),
                        row.retry_times,
                        when
                    );
                }
            }
            HistoryCommand::Show { id } => {
                let row = history::show(&db, id).await?;
                println!("{}", serde_json::to_string_pretty(&row).unwrap_or_default());
            }
            HistoryCommand::Requeue { id } => {
                Notifier::builder(db).build()?.requeue(id).await?;
                println!("notice {id} requeued: due now");
            }
        },
        Command::Cancel { id } => {
            Notifier::builder(db).build()?.cancel(id).await?;
            println!("notice {id} cancelled");
        }
        Command::Migrate => {
            solid_notify::migrate(&db).await?;
            println!("migrations applied");
        }
        Command::Defs { command } => match command {
            DefsCommand::Sync { dir, .. } => {
                let specs: Vec<_> = file::load_dir(&dir)?.into_iter().map(|d| d.spec).collect();
                let report = store::sync(&db, &specs).await?;
                for (what, names) in [
                    ("inserted", &report.inserted),
                    ("updated", &report.updated),
                    ("unchanged", &report.unchanged),
                    ("only in table (left alone)", &report.only_in_table),
                ] {
                    if !names.is_empty() {
                        println!("{what}: {}", names.join(", "));
                    }
                }
            }
            DefsCommand::List => {
                println!(
                    "{:<6} {:<28} {:<8} {:<18} {:>5} {:>5}  status",
                    "id", "name", "channel", "retry_interval", "max", "alert"
                );
                for (row, def) in store::list(&db).await? {
                    let status = match def {
                        Ok(_) => "ok".to_string(),
                        Err(e) => format!("INVALID: {e}"),
                    };
                    println!(
                        "{:<6} {:<28} {:<8} {:<18} {:>5} {:>5}  {status}",
                        row.id,
                        row.name,
                        row.channel,
                        row.retry_interval,
                        row.max_retry_times,
                        row.alert_trigger_type
                    );
                }
            }
        },
    }
    Ok(())
}
