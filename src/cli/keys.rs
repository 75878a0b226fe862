//! `solid-notify keys blocked`: the ordering keys held back by a failure;
//! `solid-notify rekey`: encryption keys rotated.

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use solid_notify::{
    Error,
    entity::notify_def,
    ops::keys::{self, DEFAULT_BLOCKED_LIMIT, MAX_BLOCKED_LIMIT},
};

use super::common::print_json;

/// What `keys` does.
#[derive(clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Ordering keys held back by a final failure or parked notice (ordered
    /// definitions with stop_on_failure): each with its head notice, the
    /// head's status, how long the key has been blocked and how many
    /// notices wait behind it. Requeue the head to send it again first, or
    /// cancel it to let the key go on.
    Blocked {
        /// Only this definition.
        #[arg(long)]
        def: Option<String>,
        /// At most this many keys, oldest head first.
        #[arg(long, default_value_t = DEFAULT_BLOCKED_LIMIT,
              value_parser = clap::value_parser!(u64).range(1..=MAX_BLOCKED_LIMIT))]
        limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(db: &DatabaseConnection, command: KeysCommand) -> solid_notify::Result<()> {
    let KeysCommand::Blocked { def, limit, json } = command;
    let def_id = match def {
        None => None,
        Some(name) => Some(
            notify_def::Entity::find()
                .filter(notify_def::Column::Name.eq(name.as_str()))
                .one(db)
                .await?
                .ok_or(Error::UnknownDef(name))?
                .id,
        ),
    };
    let page = keys::blocked(db, def_id, limit).await?;
    if json {
        print_json(&serde_json::to_value(&page));
        return Ok(());
    }
    let blocked = &page.keys;
    if blocked.is_empty() {
        println!("no blocked key");
        return Ok(());
    }
    let now = chrono::Utc::now().naive_utc();
    println!(
        "{:<20} {:<24} {:>10} {:<14} {:>12} {:>8}",
        "def", "key", "head", "head status", "blocked for", "waiting"
    );
    for k in blocked {
        let age = (now - k.blocked_since).to_std().unwrap_or_default();
        let age = humantime::format_duration(std::time::Duration::from_secs(age.as_secs()));
        println!(
            "{:<20} {:<24} {:>10} {:<14} {:>12} {:>8}",
            k.def,
            // Keys are the producers': control characters escaped.
            keys::printable(&k.ordering_key),
            k.head_id,
            k.head_status.to_string(),
            age.to_string(),
            k.waiting
        );
    }
    if page.more {
        println!("… more keys are blocked: the oldest {limit} are shown (--limit)");
    }
    Ok(())
}

/// `solid-notify rekey`: seals every value again with the current key of
/// `$SOLID_NOTIFY_KEYS`.
pub(crate) async fn rekey(
    db: &DatabaseConnection,
    batch: u64,
    json: bool,
) -> solid_notify::Result<()> {
    let keys = solid_notify::crypto::Keys::from_env().map_err(|source| Error::Crypto {
        def: "*".into(),
        source,
    })?;
    let report = solid_notify::ops::rekey::rekey(db, &keys, batch).await?;
    if json {
        print_json(&serde_json::to_value(&report));
    } else {
        println!(
            "key {}: {} sealed again, {} sealed for the first time, {} already current, {} changed meanwhile (run again), {} cannot be opened",
            report.current,
            report.resealed,
            report.sealed,
            report.unchanged,
            report.skipped,
            report.failed_count
        );
        for (id, why) in &report.failed {
            println!("  notice {id}: {why}");
        }
        for (key, n) in &report.left {
            println!("  still sealed with key {key}: {n} (0: it may be dropped)");
        }
    }
    if report.failed_count > 0 {
        return Err(Error::Config(format!(
            "{} values cannot be opened with the keys given",
            report.failed_count
        )));
    }
    Ok(())
}
