//! `solid-notify requeue` and `cancel`: one notice, or every one a filter,
//! a file of ids or a pinned dry run names, with an audit line each.

use std::path::PathBuf;

use solid_notify::{
    Notifier,
    ops::{Audit, BulkAction, BulkReport, NoticeFilter, Place},
};

use super::common::{FilterArgs, RangeArgs, default_actor, print_json};

#[derive(clap::Args)]
pub(crate) struct BulkArgs {
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

pub(crate) async fn run(
    db: sea_orm::DatabaseConnection,
    args: BulkArgs,
    requeue: bool,
) -> solid_notify::Result<()> {
    if let Some(path) = &args.pinned {
        return bulk_pinned(&db, &args, path, requeue).await;
    }
    let mut filter = args.filter.filter(Some(&args.range));
    let ids = listed_ids(&args)?;
    let one = refuse_unsafe(&args, &filter)?;
    if args.id.is_some() || args.ids.is_some() {
        filter.ids = Some(ids);
    }
    let notifier = Notifier::builder(db.clone()).build()?;
    // Before a pin too: a pinned file is acted on as it is.
    if !one && args.ids.is_none() {
        narrowing(&notifier, requeue, &filter).await?;
    }
    if let Some(path) = &args.pin {
        return pin_to_file(&db, path, requeue, &filter).await;
    }
    let audit = Audit::new(
        args.actor.unwrap_or_else(default_actor),
        args.reason.unwrap_or_default(),
    );
    if one && !args.dry_run && !args.json {
        return act_on_one(&notifier, args.id.unwrap_or_default(), requeue, &audit).await;
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
    print_bulk_report(&report, args.json);
    Ok(())
}

/// The notice ids given: the one id, then those of the `--ids` file
/// (blank lines and `#` comments skipped).
fn listed_ids(args: &BulkArgs) -> solid_notify::Result<Vec<i64>> {
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
    Ok(ids)
}

/// Refuses filters that match every notice, and a bulk action with no
/// narrowing or no reason; answers whether exactly one notice id is meant.
fn refuse_unsafe(args: &BulkArgs, filter: &NoticeFilter) -> solid_notify::Result<bool> {
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
    let one = args.id.is_some() && args.ids.is_none() && *filter == NoticeFilter::default();
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
    Ok(one)
}

/// `--dry-run --pin FILE`: pins what `filter` matches and writes it to
/// `path` (JSON), changing nothing.
async fn pin_to_file(
    db: &sea_orm::DatabaseConnection,
    path: &std::path::Path,
    requeue: bool,
    filter: &NoticeFilter,
) -> solid_notify::Result<()> {
    let place = if requeue {
        Place::History
    } else {
        Place::InFlight
    };
    let notifier = Notifier::builder(db.clone()).build()?;
    let pinned = notifier.pin(place, filter, CLI_MAX_PINNED).await?;
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
    Ok(())
}

/// Requeues (or cancels) the one notice `id` and says so.
async fn act_on_one(
    notifier: &Notifier,
    id: i64,
    requeue: bool,
    audit: &Audit,
) -> solid_notify::Result<()> {
    if requeue {
        notifier.requeue(id, audit).await?;
        println!("notice {id} requeued: due now");
    } else {
        notifier.cancel(id, audit).await?;
        println!("notice {id} cancelled");
    }
    Ok(())
}

/// Prints a bulk action's report: as JSON, or its line and first ids.
fn print_bulk_report(report: &BulkReport, json: bool) {
    if json {
        print_json(&serde_json::to_value(report));
    } else {
        println!("{report}");
        if !report.first_ids.is_empty() {
            let ids: Vec<String> = report.first_ids.iter().map(i64::to_string).collect();
            println!("first ids: {}", ids.join(", "));
        }
    }
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

/// Refuses text filters that match every notice a requeue (or cancel)
/// looks at: `--param-contains '{'` is in every JSON object.
async fn narrowing(
    notifier: &Notifier,
    requeue: bool,
    filter: &NoticeFilter,
) -> solid_notify::Result<()> {
    let place = match requeue {
        true => Place::History,
        false => Place::InFlight,
    };
    if filter.narrows_by_text_only() && notifier.matches_every_notice(place, filter).await? {
        return Err(solid_notify::Error::Config(
            "the filters given match every notice: narrow them with another filter".into(),
        ));
    }
    Ok(())
}
