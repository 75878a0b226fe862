//! The `solid-notify` command: migrations, definitions, the worker, and the
//! operator's commands (a thin face on [`solid_notify::ops`]).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
#[cfg(feature = "metrics")]
use solid_notify::telemetry;
use solid_notify::{
    Config, Notifier, Status, Worker, WorkerConfig,
    def::{file, store},
    ops::{
        Audit, BulkAction, NoticeFilter, NoticeView, Page, PauseEnd, Place, Purge, When, find,
        purge::{Retention, spawn_retention},
    },
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
    /// Give up connecting after this long (e.g. 5s, 500ms).
    #[arg(
        long,
        env = "SOLID_NOTIFY_CONNECT_TIMEOUT",
        global = true,
        default_value = "5s",
        value_parser = humantime::parse_duration
    )]
    connect_timeout: Duration,
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
    /// One notice, in flight or in history: definition, status, attempts,
    /// next call, failure log, param, description, whether a claim is live.
    Show {
        /// Notice id.
        id: Option<i64>,
        /// Find by idempotency key instead (every match).
        #[arg(long, conflicts_with = "id", required_unless_present = "id")]
        key: Option<String>,
        /// With --key: only this definition.
        #[arg(long, requires = "key")]
        def: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Notices in flight, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Finished notices.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// Put finished notices (final failure, cancelled, parked) back in
    /// flight: one id, or every one a filter finds (then --reason is
    /// required). Each gets an audit line.
    Requeue(Box<BulkArgs>),
    /// Cancel notices in flight: one id, or every one a filter finds (then
    /// --reason is required). Each moves to history with an audit line. One
    /// id may also be a final failure or parked notice in history: it is
    /// given up for good (cancelled), releasing its ordering key.
    Cancel(Box<BulkArgs>),
    /// Delete old succeeded and cancelled history in batches.
    Purge {
        /// Finished more than this long ago, e.g. 30d, 12h.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Also delete final failures and parked notices.
        #[arg(long)]
        include_failures: bool,
        /// Append every deleted row to this JSON Lines file first (flushed
        /// to disk before its batch is deleted).
        #[arg(long)]
        archive: Option<PathBuf>,
        /// Count what would go; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Rows per batch.
        #[arg(long, default_value_t = solid_notify::ops::purge::DEFAULT_PURGE_BATCH,
              value_parser = clap::value_parser!(u64).range(1..=solid_notify::ops::bulk::MAX_BATCH_SIZE))]
        batch_size: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pause a definition: no worker claims its notices until it resumes.
    Pause {
        /// Definition name.
        def: String,
        /// Until this UTC time (2026-11-23T18:00:00Z) or for this long (2h);
        /// default: until `resume`.
        #[arg(long, value_parser = parse_time)]
        until: Option<When>,
        /// Why (kept in notify_def.pause_reason).
        #[arg(long, default_value = "")]
        reason: String,
        /// Who (default: $USER).
        #[arg(long)]
        actor: Option<String>,
    },
    /// End the pause of a definition; its due notices go at once.
    Resume {
        /// Definition name.
        def: String,
    },
    /// Serve the operator dashboard (and its JSON API under /api/) until
    /// SIGINT or SIGTERM.
    #[cfg(feature = "dashboard")]
    Serve {
        /// Address to bind. A non-loopback address requires --token.
        #[arg(long, default_value = solid_notify::dashboard::DEFAULT_ADDR)]
        addr: std::net::SocketAddr,
        /// Bearer token (or basic-auth password) required on every request.
        #[arg(long, env = "SOLID_NOTIFY_DASHBOARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Allow requeue, cancel, bulk actions, pause and resume (default:
        /// read-only).
        #[arg(long)]
        allow_actions: bool,
    },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Finished notices, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        page: PageArgs,
    },
}

/// Filters shared by list, history list, requeue and cancel.
#[derive(clap::Args, Clone, Default)]
struct FilterArgs {
    /// Only this definition.
    #[arg(long)]
    def: Option<String>,
    /// Only this status (not_sent, failed, awaiting_confirm in flight;
    /// succeeded, final_failure, cancelled, parked in history).
    #[arg(long, value_parser = parse_status)]
    status: Option<Status>,
    /// Only notices with at least one failed attempt.
    #[arg(long)]
    failing: bool,
    /// Only notices due before this time (UTC, or a duration meaning that
    /// long ago).
    #[arg(long, value_parser = parse_time)]
    due_before: Option<When>,
    /// Only notices created more than this long ago (e.g. 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Only this load_balance_num partition.
    #[arg(long)]
    partition: Option<i32>,
    /// Only notices whose param contains this text.
    #[arg(long)]
    param_contains: Option<String>,
}

/// History's time range (also accepted by requeue).
#[derive(clap::Args, Clone, Default)]
struct RangeArgs {
    /// Finished at or after this time (UTC, or a duration meaning that long ago).
    #[arg(long, value_parser = parse_time)]
    since: Option<When>,
    /// Finished before this time (UTC, or a duration meaning that long ago).
    #[arg(long, value_parser = parse_time)]
    until: Option<When>,
}

#[derive(clap::Args, Clone)]
struct PageArgs {
    /// At most this many rows.
    #[arg(long, default_value_t = 50)]
    limit: u64,
    /// Only ids below this one (the last id of the previous page).
    #[arg(long)]
    before_id: Option<i64>,
    /// Print JSON (one array).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct BulkArgs {
    /// One notice id (no filter needed).
    id: Option<i64>,
    #[command(flatten)]
    filter: FilterArgs,
    #[command(flatten)]
    range: RangeArgs,
    /// A file of notice ids, one per line.
    #[arg(long)]
    ids: Option<PathBuf>,
    /// Why: written into each notice's log (required unless one id is given).
    #[arg(long)]
    reason: Option<String>,
    /// Who: written into each notice's log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
    /// Count and list the first ids; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: write the notices counted, each with its version, to
    /// FILE (JSON), for `--pinned FILE`.
    #[arg(long, requires = "dry_run", value_name = "FILE")]
    pin: Option<PathBuf>,
    /// Act on exactly the notices a `--dry-run --pin FILE` counted, each
    /// only if it has not changed since (the others are skipped and listed).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dry_run", "ids", "id"])]
    pinned: Option<PathBuf>,
    /// Rows per batch.
    #[arg(long, default_value_t = solid_notify::ops::bulk::DEFAULT_BATCH_SIZE,
          value_parser = clap::value_parser!(u64).range(1..=solid_notify::ops::bulk::MAX_BATCH_SIZE))]
    batch_size: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_time(text: &str) -> Result<When, String> {
    When::parse(text)
}

fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| {
        format!(
            "`{text}` is not not_sent, failed, awaiting_confirm, succeeded, final_failure, cancelled or parked"
        )
    })
}

impl FilterArgs {
    fn filter(&self, range: Option<&RangeArgs>) -> NoticeFilter {
        NoticeFilter {
            def: self.def.clone(),
            status: self.status,
            failing: self.failing,
            due_before: self.due_before.map(When::ago),
            older_than: self.older_than,
            partition: self.partition,
            param_contains: self.param_contains.clone(),
            since: range.and_then(|r| r.since).map(When::ago),
            until: range.and_then(|r| r.until).map(When::ago),
            ids: None,
            key: None,
        }
    }
}

/// Worker settings: a TOML file (`--config`), then environment, then flags.
#[derive(clap::Args)]
struct WorkerArgs {
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
        Ok((n, w, file.retention))
    }
}

/// Serves every allocation of 128 KiB or more (a large param, its parsed
/// copy, a request body) by its own mapping, returned to the system when
/// freed. glibc otherwise raises that threshold as such blocks are freed,
/// up to 32 MiB, and keeps them in its per-thread arenas: a worker that
/// delivered 1 MiB payloads then held up to twice its bound in bytes
/// (`max_in_flight_bytes`) under load. Embedders may do the same, or set
/// `MALLOC_MMAP_THRESHOLD_=131072` in the environment.
#[allow(unsafe_code)]
fn return_large_payloads_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called once,
    // before the worker allocates payloads, and any value is safe.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
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
    /// List the definitions in notify_def by name, flagging invalid and
    /// paused rows, a page at a time.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only definitions whose name contains this.
        #[arg(long)]
        name: Option<String>,
        /// Start after this name (the last of the previous page).
        #[arg(long)]
        after: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    return_large_payloads_to_the_os();
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
        let (defs, errors) = file::check_dir(dir);
        for e in &errors {
            eprintln!("error: {e}");
        }
        if !errors.is_empty() {
            return Err(solid_notify::Error::Config(format!(
                "{} error(s) in {}",
                errors.len(),
                dir.display()
            )));
        }
        println!("{} definitions in {} are valid", defs.len(), dir.display());
        return Ok(());
    }
    let db = solid_notify::worker::connect(&cli.database_url, cli.connect_timeout).await?;
    match cli.command {
        Command::Worker(args) => run_worker(db, *args).await?,
        #[cfg(feature = "dashboard")]
        Command::Serve {
            addr,
            token,
            allow_actions,
        } => {
            let notifier = Notifier::builder(db).build()?;
            let config = solid_notify::dashboard::DashboardConfig {
                allow_actions,
                token,
                base_path: String::new(),
            };
            let shutdown = CancellationToken::new();
            let (bound, served) =
                solid_notify::dashboard::serve(notifier, addr, config, shutdown.clone()).await?;
            println!("dashboard: http://{bound}/");
            stop_signal().await;
            shutdown.cancel();
            served.await.ok();
        }
        Command::Show { id, key, def, json } => {
            let views = match (id, key) {
                (Some(id), _) => vec![find::show(&db, id).await?],
                (None, Some(key)) => find::by_key(&db, &key, def.as_deref()).await?,
                (None, None) => Vec::new(),
            };
            if json {
                print_json(&if views.len() == 1 && id.is_some() {
                    serde_json::to_value(&views[0])
                } else {
                    serde_json::to_value(&views)
                });
            } else if views.is_empty() {
                println!("no notice has that key");
            } else {
                for (n, view) in views.iter().enumerate() {
                    if n > 0 {
                        println!();
                    }
                    print_view(view);
                }
            }
        }
        Command::List { filter, page } => {
            let views = find::list(&db, Place::InFlight, &filter.filter(None), page.page()).await?;
            print_list(&views, page.json);
        }
        Command::History {
            command:
                HistoryCommand::List {
                    filter,
                    range,
                    page,
                },
        } => {
            let views = find::list(
                &db,
                Place::History,
                &filter.filter(Some(&range)),
                page.page(),
            )
            .await?;
            print_list(&views, page.json);
        }
        Command::Requeue(args) => bulk(db, *args, true).await?,
        Command::Cancel(args) => bulk(db, *args, false).await?,
        Command::Purge {
            older_than,
            include_failures,
            archive,
            dry_run,
            batch_size,
            json,
        } => {
            let purge = Purge {
                older_than,
                include_failures,
                archive,
                dry_run,
                batch_size,
            };
            let report = solid_notify::ops::purge::purge(&db, &purge)
                .await
                .map_err(|e| {
                    eprintln!("{}", e.done);
                    e.error
                })?;
            if json {
                print_json(&serde_json::to_value(&report));
            } else {
                println!("{report}");
            }
        }
        Command::Pause {
            def,
            until,
            reason,
            actor,
        } => {
            let end = match until {
                None => PauseEnd::OnResume,
                Some(When::At(t)) => PauseEnd::At(t),
                Some(When::Offset(d)) => PauseEnd::After(d),
            };
            let audit = Audit::new(actor.unwrap_or_else(default_actor), reason);
            Notifier::builder(db)
                .build()?
                .pause(&def, end, &audit)
                .await?;
            println!("{def} paused");
        }
        Command::Resume { def } => {
            Notifier::builder(db).build()?.resume(&def).await?;
            println!("{def} resumed");
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
            DefsCommand::List {
                json,
                name,
                after,
                limit,
            } => {
                let rows: Vec<_> = store::page(&db, name.as_deref(), after.as_deref(), limit)
                    .await?
                    .into_iter()
                    .map(|stored| {
                        let def = stored.validate();
                        (stored.row, def)
                    })
                    .collect();
                let next = (rows.len() as u64 == limit)
                    .then(|| rows.last().map(|(row, _)| row.name.clone()))
                    .flatten();
                if let Some(next) = &next {
                    eprintln!("more may follow: --after {next}");
                }
                if json {
                    let list: Vec<_> = rows
                        .iter()
                        .map(|(row, def)| {
                            serde_json::json!({
                                "def": row,
                                "valid": def.is_ok(),
                                "problem": def.as_ref().err().map(|e| e.to_string()),
                            })
                        })
                        .collect();
                    print_json(&Ok(serde_json::Value::Array(list)));
                    return Ok(());
                }
                println!(
                    "{:<6} {:<28} {:<8} {:<18} {:>5} {:>5}  status",
                    "id", "name", "channel", "retry_interval", "max", "alert"
                );
                let now = chrono::Utc::now().naive_utc();
                for (row, def) in rows {
                    let status = match (def, row.paused_until) {
                        (Err(e), _) => format!("INVALID: {e}"),
                        (Ok(_), Some(until)) if until > now => format!(
                            "PAUSED until {} ({})",
                            until,
                            row.pause_reason.as_deref().unwrap_or("")
                        ),
                        (Ok(_), _) => "ok".to_string(),
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

async fn run_worker(db: sea_orm::DatabaseConnection, args: WorkerArgs) -> solid_notify::Result<()> {
    let (config, worker_config, retention) = args.resolve()?;
    let notifier = Notifier::builder(db.clone()).config(config).build()?;
    let notifier_for_shutdown = notifier.clone();
    let worker_timeout = worker_config.shutdown_timeout;
    let shutdown = CancellationToken::new();
    #[cfg(feature = "metrics")]
    if let Some(addr) = args.metrics_addr {
        let bound = telemetry::serve_metrics(addr, shutdown.clone()).await?;
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
    let ((), stopped) = tokio::join!(worker.run(shutdown), notifier_stopped);
    stopped?;
    // Tasks the last sweeps started meanwhile (alert hooks, releases):
    // what is left of the deadline.
    if let Some(at) = stopping_at.get() {
        let deadline =
            *at + worker_timeout + solid_notify::RELEASE_GRACE + solid_notify::HARD_STOP_MARGIN;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
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

/// `$USER`, else `unknown`.
fn default_actor() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

async fn bulk(
    db: sea_orm::DatabaseConnection,
    args: BulkArgs,
    requeue: bool,
) -> solid_notify::Result<()> {
    if let Some(path) = &args.pinned {
        return bulk_pinned(&db, &args, path, requeue).await;
    }
    let mut filter = args.filter.filter(Some(&args.range));
    let mut ids = Vec::new();
    if let Some(id) = args.id {
        ids.push(id);
    }
    if let Some(path) = &args.ids {
        let text = std::fs::read_to_string(path)
            .map_err(|e| solid_notify::Error::Config(format!("{}: {e}", path.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            ids.push(line.parse().map_err(|_| {
                solid_notify::Error::Config(format!(
                    "{} line {}: `{line}` is not a notice id",
                    path.display(),
                    n + 1
                ))
            })?);
        }
    }
    if filter.param_contains.as_deref() == Some("") {
        return Err(solid_notify::Error::Config(
            "--param-contains is empty: it would match every notice".into(),
        ));
    }
    if args.filter.older_than.is_some_and(|d| d.is_zero()) {
        return Err(solid_notify::Error::Config(
            "--older-than 0 would match every notice".into(),
        ));
    }
    let one = args.id.is_some() && args.ids.is_none() && filter == NoticeFilter::default();
    if !one {
        if !filter.narrows() && args.ids.is_none() && args.id.is_none() {
            return Err(solid_notify::Error::Config(
                "give one notice id, --ids FILE, or at least one filter that leaves some notices out"
                    .into(),
            ));
        }
        if !args.dry_run
            && args
                .reason
                .as_deref()
                .is_none_or(|r| Audit::new("", r).reason.is_empty())
        {
            return Err(solid_notify::Error::Config(
                "--reason is required for a bulk action".into(),
            ));
        }
    }
    if args.id.is_some() || args.ids.is_some() {
        filter.ids = Some(ids);
    }
    if let Some(path) = &args.pin {
        let place = if requeue {
            Place::History
        } else {
            Place::InFlight
        };
        let notifier = Notifier::builder(db.clone()).build()?;
        let pinned = notifier.pin(place, &filter, CLI_MAX_PINNED).await?;
        let text = serde_json::to_string(&pinned)
            .map_err(|e| solid_notify::Error::Config(format!("{}: {e}", path.display())))?;
        std::fs::write(path, text)
            .map_err(|e| solid_notify::Error::Config(format!("{}: {e}", path.display())))?;
        println!(
            "{} matched (dry run: nothing changed); pinned in {}: act on exactly them with --pinned {}",
            pinned.len(),
            path.display(),
            path.display()
        );
        return Ok(());
    }
    let audit = Audit::new(
        args.actor.unwrap_or_else(default_actor),
        args.reason.unwrap_or_default(),
    );
    let notifier = Notifier::builder(db.clone()).build()?;
    if one && !args.dry_run && !args.json {
        let id = args.id.unwrap_or_default();
        if requeue {
            notifier.requeue_audited(id, &audit).await?;
            println!("notice {id} requeued: due now");
        } else {
            notifier.cancel_audited(id, &audit).await?;
            println!("notice {id} cancelled");
        }
        return Ok(());
    }
    let action = BulkAction {
        filter,
        audit,
        dry_run: args.dry_run,
        batch_size: args.batch_size,
    };
    let report = if requeue {
        notifier.requeue_where(&action).await
    } else {
        notifier.cancel_where(&action).await
    }
    .map_err(|e| {
        eprintln!("{}", e.done);
        e.error
    })?;
    if args.json {
        print_json(&serde_json::to_value(&report));
    } else {
        println!("{report}");
        if !report.first_ids.is_empty() {
            let ids: Vec<String> = report.first_ids.iter().map(i64::to_string).collect();
            println!("first ids: {}", ids.join(", "));
        }
    }
    Ok(())
}

/// Most notices `--dry-run --pin` pins: 10,000,000 (160 MB).
const CLI_MAX_PINNED: usize = 10_000_000;

/// `requeue|cancel --pinned FILE`: exactly the notices a dry run pinned.
async fn bulk_pinned(
    db: &sea_orm::DatabaseConnection,
    args: &BulkArgs,
    path: &std::path::Path,
    requeue: bool,
) -> solid_notify::Result<()> {
    use solid_notify::ops::bulk::{Pinned, PinnedAction};
    let bad =
        |problem: String| solid_notify::Error::Config(format!("{}: {problem}", path.display()));
    if args.filter.filter(Some(&args.range)) != NoticeFilter::default() {
        return Err(solid_notify::Error::Config(
            "--pinned acts on what its dry run counted: give no filter with it".into(),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let pinned: Pinned = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let expected = if requeue {
        PinnedAction::Requeue
    } else {
        PinnedAction::Cancel
    };
    if pinned.action != expected {
        return Err(bad(format!(
            "it pins a {:?}, not a {expected:?}",
            pinned.action
        )));
    }
    let reason = args.reason.clone().unwrap_or_default();
    let audit = Audit::new(args.actor.clone().unwrap_or_else(default_actor), reason);
    // Checked as written: control characters count as no reason.
    if audit.reason.is_empty() {
        return Err(solid_notify::Error::Config(
            "--reason is required for a bulk action".into(),
        ));
    }
    let notifier = Notifier::builder(db.clone()).build()?;
    let report = notifier
        .apply_pinned(&pinned, &audit, args.batch_size, false)
        .await
        .map_err(|e| {
            eprintln!("{}", e.done);
            e.error
        })?;
    if args.json {
        print_json(&serde_json::to_value(&report));
    } else {
        println!("{report}");
        if !report.skipped_ids.is_empty() {
            let ids: Vec<String> = report.skipped_ids.iter().map(i64::to_string).collect();
            println!("skipped (changed since the count): {}", ids.join(", "));
        }
    }
    Ok(())
}

impl PageArgs {
    fn page(&self) -> Page {
        Page {
            before_id: self.before_id,
            limit: self.limit,
        }
    }
}

fn print_json(value: &serde_json::Result<serde_json::Value>) {
    match value.as_ref().map(serde_json::to_string_pretty) {
        Ok(Ok(text)) => println!("{text}"),
        Ok(Err(e)) => eprintln!("error: cannot print JSON: {e}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

fn print_list(views: &[NoticeView], json: bool) {
    if json {
        print_json(&serde_json::to_value(views));
        return;
    }
    println!(
        "{:<10} {:<20} {:<16} {:>7}  {:<26} last log line",
        "id", "def", "status", "retries", "next call (UTC)"
    );
    for v in views {
        println!(
            "{:<10} {:<20} {:<16} {:>7}  {:<26} {}",
            v.id,
            v.def.as_deref().unwrap_or("?"),
            v.status.to_string(),
            v.retry_times,
            v.next_call_time.to_string(),
            v.errors.last().map(String::as_str).unwrap_or("")
        );
    }
}

fn print_view(v: &NoticeView) {
    let place = match v.place {
        Place::InFlight => "in flight",
        Place::History => "history",
    };
    println!("notice        {}", v.id);
    println!(
        "definition    {} (id {})",
        v.def.as_deref().unwrap_or("? (deleted)"),
        v.def_id
    );
    println!("status        {} ({place})", v.status);
    println!("attempts      {} failed", v.retry_times);
    println!("created       {} UTC", v.create_time);
    if let Some(t) = v.last_call_time {
        println!("last call     {t} UTC");
    }
    println!(
        "next call     {} UTC{}",
        v.next_call_time,
        if v.claim_live {
            " (an attempt holds it until then)"
        } else {
            ""
        }
    );
    println!("claim live    {}", if v.claim_live { "yes" } else { "no" });
    println!("partition     {}", v.partition);
    if let Some(k) = &v.idempotency_key {
        println!("key           {k}");
    }
    if let Some(t) = &v.trace_id {
        println!("trace id      {t}");
    }
    if v.step > 0 || v.step_result.is_some() {
        println!("steps done    {} (on step {})", v.steps_done, v.step + 1);
    }
    if let Some(r) = &v.step_result {
        println!("step result   {r}");
    }
    println!("version       {}", v.version);
    println!(
        "param         {}",
        serde_json::to_string_pretty(&v.param).unwrap_or_default()
    );
    println!("description   {}", v.description);
    println!("log           {} line(s)", v.errors.len());
    for line in &v.errors {
        println!("  {line}");
    }
}
