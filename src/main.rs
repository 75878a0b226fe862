//! The `solid-notify` command: migrations and definitions.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use solid_notify::def::{file, store};

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
    let db = sea_orm::Database::connect(&cli.database_url).await?;
    match cli.command {
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
