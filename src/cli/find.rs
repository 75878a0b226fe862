//! `solid-notify show`, `list` and `history list`: notices in flight or in
//! history, as a table, a card or JSON.

use clap::Subcommand;
use sea_orm::DatabaseConnection;
use solid_notify::ops::{NoticeView, Partitioning, Period, Place, find};

use super::common::{FilterArgs, PageArgs, RangeArgs, print_json};

#[derive(Subcommand)]
pub(crate) enum HistoryCommand {
    /// Finished notices, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[command(flatten)]
        range: RangeArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Partition notify_msg_history by the time each notice finished
    /// (PostgreSQL), online: a copy is filled in batches while a trigger
    /// mirrors every change, then swapped in under a lock held for
    /// milliseconds. Run again, it resumes, or makes the periods ahead.
    /// Retention then drops whole periods; final failures are kept.
    Partition {
        /// One partition per UTC day or month.
        #[arg(long, value_enum, default_value_t = Period::Month)]
        period: Period,
        /// Periods made ahead of the current one.
        #[arg(long, default_value_t = solid_notify::ops::DEFAULT_AHEAD)]
        ahead: u32,
        /// Rows copied per batch.
        #[arg(long, default_value_t = solid_notify::ops::DEFAULT_COPY_BATCH,
              value_parser = clap::value_parser!(u64).range(1..=100_000))]
        batch_size: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// How notify_msg_history is partitioned: its periods.
    Partitions {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `history partition`: partitions history online.
pub(crate) async fn partition(
    db: &DatabaseConnection,
    period: Period,
    ahead: u32,
    batch_size: u64,
    json: bool,
) -> solid_notify::Result<()> {
    let how = Partitioning {
        period,
        ahead,
        batch_size,
        ..Partitioning::default()
    };
    let done = solid_notify::state::partitions::convert(db, &how).await?;
    if json {
        print_json(&serde_json::to_value(&done));
    } else if done.already {
        println!(
            "history is partitioned already; {} period(s) made ahead",
            done.made.len()
        );
    } else {
        println!(
            "history partitioned by {period}: {} rows ({} copied in batches), {} partition(s) made",
            done.rows,
            done.copied,
            done.made.len()
        );
    }
    Ok(())
}

/// `history partitions`: the periods of partitioned history.
pub(crate) async fn partitions(db: &DatabaseConnection, json: bool) -> solid_notify::Result<()> {
    let layout = solid_notify::state::partitions::layout(db).await?;
    if json {
        print_json(&serde_json::to_value(&layout));
        return Ok(());
    }
    match layout {
        None => println!("history is one table (not partitioned)"),
        Some(layout) => {
            println!("history is partitioned by {}", layout.period);
            for p in &layout.periods {
                println!("{}  {} .. {}", p.name, p.from, p.to);
            }
        }
    }
    Ok(())
}

/// `show`: one notice by id, or every notice with an idempotency key.
pub(crate) async fn show(
    db: &DatabaseConnection,
    id: Option<i64>,
    key: Option<String>,
    def: Option<String>,
    json: bool,
) -> solid_notify::Result<()> {
    let views = match (id, key) {
        (Some(id), _) => vec![find::show(db, id).await?],
        (None, Some(key)) => find::by_key(db, &key, def.as_deref()).await?,
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
    Ok(())
}

/// `list`: notices in flight, newest first.
pub(crate) async fn list(
    db: &DatabaseConnection,
    filter: FilterArgs,
    page: PageArgs,
) -> solid_notify::Result<()> {
    let views = find::list(db, Place::InFlight, &filter.filter(None), page.page()).await?;
    print_list(&views, page.json);
    Ok(())
}

/// `history list`: finished notices, newest first.
pub(crate) async fn history(
    db: &DatabaseConnection,
    filter: FilterArgs,
    range: RangeArgs,
    page: PageArgs,
) -> solid_notify::Result<()> {
    let views = find::list(
        db,
        Place::History,
        &filter.filter(Some(&range)),
        page.page(),
    )
    .await?;
    print_list(&views, page.json);
    Ok(())
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
            v.state(),
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
    if let Some(why) = &v.unreadable {
        println!("unreadable    {why}");
    }
    if let Some(t) = v.not_before {
        let state = if v.scheduled { "scheduled" } else { "due" };
        println!("not before    {t} UTC ({state})");
    }
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
