//! The `solid-notify` command: migrations, definitions, the worker, and the
//! operator's commands (a thin face on [`solid_notify::ops`]).

mod cli;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use solid_notify::ops::{Purge, When};

use crate::cli::{
    bulk::{self, BulkArgs},
    common::{FilterArgs, PageArgs, parse_time},
    defs::{self, DefsCommand},
    find::{self, HistoryCommand},
    keys::{self, KeysCommand},
    pause, purge,
    worker::{self, WorkerArgs},
};

/// Reliable notifications after commit: operate the outbox tables.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Database URL (sqlite://…, postgres://…, mysql://…).
    #[arg(
        long,
        env = "DATABASE_URL",
        // `--help` would show the URL, password included.
        hide_env_values = true,
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
    /// The level at which a slow database statement is logged, with its
    /// SQL: off, error, warn, info, debug or trace.
    #[arg(
        long,
        env = "SOLID_NOTIFY_SLOW_STATEMENT_LEVEL",
        global = true,
        default_value_t = solid_notify::worker::DEFAULT_SLOW_STATEMENT_LEVEL
    )]
    slow_statement_level: log::LevelFilter,
    /// A statement that runs longer than this is slow (e.g. 1s, 250ms).
    #[arg(
        long,
        env = "SOLID_NOTIFY_SLOW_STATEMENT_AFTER",
        global = true,
        default_value = "1s",
        value_parser = humantime::parse_duration
    )]
    slow_statement_after: Duration,
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
    /// Ordering keys: those held back by a failure.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Seal every param and step result again with the current encryption
    /// key (the first of $SOLID_NOTIFY_KEYS), in batches, after a key
    /// rotation; also seals the plaintext ones of definitions with encrypt =
    /// true. Old keys must still be in $SOLID_NOTIFY_KEYS to open what they
    /// sealed.
    Rekey {
        /// Rows read per batch.
        #[arg(long, default_value_t = solid_notify::ops::rekey::DEFAULT_REKEY_BATCH,
              value_parser = clap::value_parser!(u64).range(1..=solid_notify::ops::rekey::MAX_REKEY_BATCH))]
        batch_size: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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
        return defs::check(dir);
    }
    let mut options = solid_notify::worker::pool_options(cli.database_url.as_str());
    match cli.slow_statement_level {
        // sea-orm takes Off for "unset", which leaves sqlx's WARN after 1 s:
        // no statement is that slow instead.
        log::LevelFilter::Off => options.sqlx_slow_statements_logging_settings(
            log::LevelFilter::Trace,
            Duration::from_secs(u64::from(u32::MAX)),
        ),
        level => options.sqlx_slow_statements_logging_settings(level, cli.slow_statement_after),
    };
    let db = solid_notify::worker::connect_with(options, cli.connect_timeout).await?;
    match cli.command {
        Command::Worker(args) => worker::run(db, *args).await?,
        #[cfg(feature = "dashboard")]
        Command::Serve {
            addr,
            token,
            allow_actions,
        } => crate::cli::serve::run(db, addr, token, allow_actions).await?,
        Command::Show { id, key, def, json } => find::show(&db, id, key, def, json).await?,
        Command::List { filter, page } => find::list(&db, filter, page).await?,
        Command::History { command } => match command {
            HistoryCommand::List {
                filter,
                range,
                page,
            } => find::history(&db, filter, range, page).await?,
            HistoryCommand::Partition {
                period,
                ahead,
                batch_size,
                json,
            } => find::partition(&db, period, ahead, batch_size, json).await?,
            HistoryCommand::Partitions { json } => find::partitions(&db, json).await?,
        },
        Command::Keys { command } => keys::run(&db, command).await?,
        Command::Rekey { batch_size, json } => keys::rekey(&db, batch_size, json).await?,
        Command::Requeue(args) => bulk::run(db, *args, true).await?,
        Command::Cancel(args) => bulk::run(db, *args, false).await?,
        Command::Purge {
            older_than,
            include_failures,
            archive,
            dry_run,
            batch_size,
            json,
        } => {
            let args = Purge {
                older_than,
                include_failures,
                archive,
                dry_run,
                batch_size,
            };
            purge::run(&db, args, json).await?
        }
        Command::Pause {
            def,
            until,
            reason,
            actor,
        } => pause::pause(db, def, until, reason, actor).await?,
        Command::Resume { def } => pause::resume(db, def).await?,
        Command::Migrate => {
            solid_notify::migrate(&db).await?;
            println!("migrations applied");
        }
        Command::Defs { command } => defs::run(&db, command).await?,
    }
    Ok(())
}
