//! `solid-notify defs`: check or sync the TOML files of a folder, list the
//! definitions of the table.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use sea_orm::DatabaseConnection;
use solid_notify::def::{file, store};

use super::common::print_json;

#[derive(Subcommand)]
pub(crate) enum DefsCommand {
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

/// `defs sync --check`: validates the files of `dir`, without a database.
pub(crate) fn check(dir: &Path) -> solid_notify::Result<()> {
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
    Ok(())
}

/// `defs sync` (writing) and `defs list`.
pub(crate) async fn run(db: &DatabaseConnection, command: DefsCommand) -> solid_notify::Result<()> {
    match command {
        DefsCommand::Sync { dir, .. } => {
            let specs: Vec<_> = file::load_dir(&dir)?.into_iter().map(|d| d.spec).collect();
            let report = store::sync(db, &specs).await?;
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
            let rows: Vec<_> = store::page(db, name.as_deref(), after.as_deref(), limit)
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
    }
    Ok(())
}
