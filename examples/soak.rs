//! A soak: a steady producer, workers draining, retention purging, and a
//! long REPEATABLE READ reader held open in the middle; one row per
//! interval of what a production database lives through. Not a test (it
//! runs for minutes): its table and plot go in `docs/` (ADRs 0014, 0016).
//!
//! ```text
//! cargo run --release --features full --example soak -- \
//!     --url postgres://postgres@127.0.0.1:5432/soak --minutes 30 --rate 2000 \
//!     --svg docs/soak-postgres.svg
//! ```
//!
//! The database should be empty (it is migrated, and its notices deleted,
//! at start). Per interval it prints, as a Markdown table row:
//! - the notices produced and delivered in it;
//! - commit-to-delivery latency p50 and p99 (ms), from each notice's
//!   producer timestamp to its handler call;
//! - the backlog (`notify_msg` rows) at its end;
//! - dead tuples of `notify_msg` and `notify_msg_history` (PostgreSQL's
//!   `pg_stat_user_tables`; MySQL/MariaDB: InnoDB's history list length,
//!   the undo records its purge has not reached, and `notify_msg`'s
//!   `data_free` bytes; SQLite: free pages);
//! - the sizes of both tables with their indexes, in MiB.
//!
//! Workers run in-process (`--workers`, each a `Worker` on one notifier,
//! immediate attempts off, so every notice goes through a claim). Retention
//! deletes successes older than `--keep` every `--purge-every`. The reader
//! opens at `--reader-at` minutes and commits `--reader-for` minutes later.

use std::{
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::Parser;
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
    TransactionTrait,
};
use serde_json::json;
use solid_notify::{
    Config, NewNotice, Notice, Notifier, Outcome, Worker, WorkerConfig,
    def::{Channel, DefSpec, store},
    ops::{Retention, spawn_retention},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
struct Cli {
    /// The database (PostgreSQL, MySQL/MariaDB or SQLite).
    #[arg(long)]
    url: String,
    /// How long the soak runs.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Notices produced per second.
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Seconds per row of the table.
    #[arg(long, default_value_t = 60)]
    every: u64,
    /// Workers (each a `Worker` in this process).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// When the long reader opens (minutes from the start; default: a
    /// third of the run).
    #[arg(long)]
    reader_at: Option<f64>,
    /// How long it stays open (minutes; default: a third of the run).
    #[arg(long)]
    reader_for: Option<f64>,
    /// Successes older than this are purged.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    keep: Duration,
    /// How often retention runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    purge_every: Duration,
    /// Where to write the plot (SVG).
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
}

/// What the handler saw in the current interval.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<u64>,
}

/// One row of the table.
struct Row {
    minute: f64,
    produced: u64,
    delivered: u64,
    p50_ms: f64,
    p99_ms: f64,
    backlog: i64,
    dead_live: i64,
    dead_history: i64,
    mib_live: f64,
    mib_history: f64,
    reader: bool,
}

fn epoch_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let cli = Cli::parse();
    let mut options = ConnectOptions::new(cli.url.clone());
    options.max_connections(24).sqlx_logging(false);
    let db = Database::connect(options).await?;
    if db.get_database_backend() == DbBackend::Sqlite {
        // WAL, as docs/operating.md advises: in the rollback journal's
        // mode the reader holds every commit back, and producers fail with
        // "database is locked" once their busy timeout has passed (the
        // first 10-minute run did, in the reader's first minute).
        db.execute_unprepared("PRAGMA journal_mode = WAL").await?;
    }
    solid_notify::migrate(&db).await?;
    let spec = DefSpec::new("soak", Channel::Handler, json!({"handler": "soak"}));
    store::sync(&db, &[spec]).await?;
    db.execute_unprepared("DELETE FROM notify_msg").await?;
    db.execute_unprepared("DELETE FROM notify_msg_history")
        .await?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let delivered = Arc::new(AtomicU64::new(0));
    let notifier = {
        let (seen, delivered) = (seen.clone(), delivered.clone());
        Notifier::builder(db.clone())
            .config(Config {
                immediate_attempt: false,
                ..Config::default()
            })
            .handler("soak", move |n: Notice| {
                let (seen, delivered) = (seen.clone(), delivered.clone());
                async move {
                    let now = epoch_us();
                    let t = n.param["t"].as_i64().unwrap_or(now);
                    if let Ok(mut seen) = seen.lock() {
                        seen.latencies_us.push((now - t).max(0) as u64);
                    }
                    delivered.fetch_add(1, Ordering::Relaxed);
                    Ok(Outcome::success())
                }
            })
            .build()?
    };
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..cli.workers {
        let worker = Worker::new(
            notifier.clone(),
            WorkerConfig {
                mode: Mode::FixedDelay,
                delay: Duration::from_millis(50),
                confirm_listener: false,
                ..WorkerConfig::default()
            },
        )?;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = worker.run(stop).await {
                eprintln!("worker refused: {e}");
            }
        }));
    }
    let retention = Retention {
        older_than: cli.keep,
        include_failures: false,
        archive: None,
        batch_size: 5_000,
        every: cli.purge_every,
    };
    tasks.push(spawn_retention(db.clone(), retention, stop.clone()));
    let produced = Arc::new(AtomicU64::new(0));
    tasks.push(tokio::spawn(produce(
        notifier.clone(),
        cli.rate,
        produced.clone(),
        stop.clone(),
    )));

    let total = Duration::from_secs_f64(cli.minutes * 60.0);
    let reader_at = Duration::from_secs_f64(cli.reader_at.unwrap_or(cli.minutes / 3.0) * 60.0);
    let reader_for = Duration::from_secs_f64(cli.reader_for.unwrap_or(cli.minutes / 3.0) * 60.0);
    let reader_db = {
        let mut options = ConnectOptions::new(cli.url.clone());
        options.max_connections(1).sqlx_logging(false);
        Database::connect(options).await?
    };
    println!(
        "soak: {} for {} min at {} notices/s, {} workers, reader at {:.1}–{:.1} min, keep {:?}",
        backend_name(db.get_database_backend()),
        cli.minutes,
        cli.rate,
        cli.workers,
        reader_at.as_secs_f64() / 60.0,
        (reader_at + reader_for).as_secs_f64() / 60.0,
        cli.keep
    );
    let (_, dead_a, dead_b) = labels(backend_name(db.get_database_backend()));
    println!(
        "| minute | produced | delivered | p50 ms | p99 ms | backlog | {dead_a} | {dead_b} | notify_msg MiB | history MiB | reader |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let start = Instant::now();
    let mut rows = Vec::new();
    let mut reader = None;
    let (mut last_produced, mut last_delivered) = (0, 0);
    let every = Duration::from_secs(cli.every.max(1));
    let mut next = start + every;
    while start.elapsed() < total {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let now = start.elapsed();
        // Whether the reader was open during the interval now ending.
        let was_open = reader.is_some();
        let reading = now >= reader_at && now < reader_at + reader_for;
        if reading && reader.is_none() {
            reader = Some(open_reader(&reader_db).await?);
        }
        if !reading && let Some(r) = reader.take() {
            r.commit().await?;
        }
        let mut latencies = std::mem::take(&mut seen.lock().map_err(|_| "poisoned")?.latencies_us);
        latencies.sort_unstable();
        let (p, d) = (
            produced.load(Ordering::Relaxed),
            delivered.load(Ordering::Relaxed),
        );
        let sizes = sample(&db).await?;
        let row = Row {
            minute: now.as_secs_f64() / 60.0,
            produced: p - last_produced,
            delivered: d - last_delivered,
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            backlog: sizes.0,
            dead_live: sizes.1,
            dead_history: sizes.2,
            mib_live: sizes.3,
            mib_history: sizes.4,
            reader: was_open,
        };
        (last_produced, last_delivered) = (p, d);
        println!(
            "| {:.1} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {:.1} | {:.1} | {} |",
            row.minute,
            row.produced,
            row.delivered,
            row.p50_ms,
            row.p99_ms,
            row.backlog,
            row.dead_live,
            row.dead_history,
            row.mib_live,
            row.mib_history,
            if row.reader { "open" } else { "" }
        );
        rows.push(row);
    }
    if let Some(r) = reader.take() {
        r.commit().await?;
    }
    stop.cancel();
    for task in tasks {
        task.await.ok();
    }
    notifier.shutdown(Duration::from_secs(10)).await?;
    if let Some(path) = cli.svg {
        std::fs::write(&path, plot(&rows, backend_name(db.get_database_backend())))?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// One producer: every 10 ms a transaction with the notices due by then.
async fn produce(notifier: Notifier, rate: u64, produced: Arc<AtomicU64>, stop: CancellationToken) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.is_cancelled() {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        let n = due
            .saturating_sub(produced.load(Ordering::Relaxed))
            .min(500);
        if n == 0 {
            continue;
        }
        let added = async {
            let tx = notifier.begin().await?;
            for _ in 0..n {
                tx.add(NewNotice::new("soak", &json!({"t": epoch_us()})))
                    .await?;
            }
            tx.commit().await
        };
        match added.await {
            Ok(_) => {
                produced.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => eprintln!("producer: {e}"),
        }
    }
}

/// A REPEATABLE READ transaction that has read both tables: its snapshot
/// holds back vacuum (PostgreSQL), purge (InnoDB) or checkpoints (SQLite
/// in WAL mode) until it ends.
async fn open_reader(db: &DatabaseConnection) -> BoxResult<sea_orm::DatabaseTransaction> {
    let isolation = match db.get_database_backend() {
        DbBackend::Sqlite => None,
        _ => Some(sea_orm::IsolationLevel::RepeatableRead),
    };
    let txn = db.begin_with_config(isolation, None).await?;
    txn.execute_unprepared("SELECT COUNT(*) FROM notify_msg")
        .await?;
    txn.execute_unprepared("SELECT COUNT(*) FROM notify_msg_history")
        .await?;
    Ok(txn)
}

/// Backlog, dead tuples (or free space) of both tables, and their sizes
/// in MiB with indexes.
async fn sample(db: &DatabaseConnection) -> BoxResult<(i64, i64, i64, f64, f64)> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT (SELECT COUNT(*) FROM notify_msg)::bigint, \
             (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'notify_msg')::bigint, \
             (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'notify_msg_history')::bigint, \
             pg_total_relation_size('notify_msg')::float8 / 1048576, \
             pg_total_relation_size('notify_msg_history')::float8 / 1048576"
        }
        DbBackend::MySql => {
            "SELECT (SELECT COUNT(*) FROM notify_msg), \
             (SELECT CAST(`count` AS SIGNED) FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'), \
             (SELECT CAST(data_free AS SIGNED) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'notify_msg'), \
             (SELECT CAST(data_length + index_length AS DOUBLE) / 1048576 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'notify_msg'), \
             (SELECT CAST(data_length + index_length AS DOUBLE) / 1048576 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'notify_msg_history')"
        }
        _ => {
            "SELECT (SELECT COUNT(*) FROM notify_msg), \
             (SELECT freelist_count FROM pragma_freelist_count()), 0, \
             (SELECT CAST(page_count AS REAL) * (SELECT page_size FROM pragma_page_size()) / 1048576 FROM pragma_page_count()), 0.0"
        }
    };
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or("no row")?;
    let int = |i: usize| {
        row.try_get_by_index::<Option<i64>>(i)
            .ok()
            .flatten()
            .unwrap_or(0)
    };
    let float = |i: usize| {
        row.try_get_by_index::<Option<f64>>(i)
            .ok()
            .flatten()
            .unwrap_or(0.0)
    };
    Ok((int(0), int(1), int(2), float(3), float(4)))
}

fn percentile(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() - 1) as f64 * q).round() as usize;
    sorted_us[i.min(sorted_us.len() - 1)] as f64 / 1000.0
}

fn backend_name(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "PostgreSQL",
        DbBackend::MySql => "MySQL/MariaDB",
        _ => "SQLite",
    }
}

/// One line of a panel: its name, colour and value.
type Series = (&'static str, &'static str, Box<dyn Fn(&Row) -> f64>);

/// Three panels over the minutes: p50/p99 latency, backlog, and dead
/// tuples with table sizes; the reader's window shaded.
/// The third panel's title and the names of the two counts `sample` takes
/// besides the backlog, per backend.
fn labels(backend: &str) -> (&'static str, &'static str, &'static str) {
    match backend {
        "PostgreSQL" => (
            "dead tuples (k) and sizes (MiB)",
            "dead notify_msg",
            "dead history",
        ),
        "MySQL/MariaDB" => (
            "InnoDB history list length (k), free space (MB) and sizes (MiB)",
            "InnoDB history list length",
            "free bytes notify_msg",
        ),
        _ => ("free pages (k) and file size (MiB)", "free pages", "–"),
    }
}

fn plot(rows: &[Row], backend: &str) -> String {
    let (w, h, pad) = (900.0, 220.0, 50.0);
    let last = rows.last().map_or(1.0, |r| r.minute).max(1.0);
    let x = |m: f64| pad + (w - 2.0 * pad) * m / last;
    let mut svg = String::new();
    let height = 3.0 * h + 40.0;
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{pad}" y="20" font-size="14">solid-notify soak on {backend}: one row per interval; the long reader shaded</text>"#
    );
    let (title, dead_a, dead_b) = labels(backend);
    let panels: [(&str, Vec<Series>); 3] = [
        (
            "latency, ms",
            vec![
                ("p50", "#1f77b4", Box::new(|r: &Row| r.p50_ms)),
                ("p99", "#d62728", Box::new(|r: &Row| r.p99_ms)),
            ],
        ),
        (
            "backlog, notices",
            vec![("backlog", "#2ca02c", Box::new(|r: &Row| r.backlog as f64))],
        ),
        (
            title,
            vec![
                (
                    dead_a,
                    "#9467bd",
                    Box::new(|r: &Row| r.dead_live as f64 / 1000.0),
                ),
                (
                    dead_b,
                    "#8c564b",
                    Box::new(|r: &Row| r.dead_history as f64 / 1000.0),
                ),
                ("notify_msg MiB", "#ff7f0e", Box::new(|r: &Row| r.mib_live)),
                ("history MiB", "#7f7f7f", Box::new(|r: &Row| r.mib_history)),
            ],
        ),
    ];
    for (p, (title, series)) in panels.iter().enumerate() {
        let top = 40.0 + p as f64 * h;
        let bottom = top + h - 40.0;
        let max = series
            .iter()
            .flat_map(|(_, _, f)| rows.iter().map(f))
            .fold(0.0_f64, f64::max)
            .max(1e-9);
        let y = |v: f64| bottom - (bottom - top - 20.0) * v / max;
        // The reader's window: the intervals it was open in.
        let interval = rows.first().map_or(1.0, |r| r.minute);
        let open: Vec<f64> = rows.iter().filter(|r| r.reader).map(|r| r.minute).collect();
        if let (Some(a), Some(b)) = (open.first(), open.last()) {
            let _ = write!(
                svg,
                r##"<rect x="{}" y="{top}" width="{}" height="{}" fill="#eeeeee"/>"##,
                x(*a - interval),
                (x(*b) - x(*a - interval)).max(2.0),
                bottom - top
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{pad}" y="{}">{title} (max {max:.1})</text><line x1="{pad}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="black"/>"#,
            top + 12.0,
            w - pad
        );
        for (i, (name, color, f)) in series.iter().enumerate() {
            let points: Vec<String> = rows
                .iter()
                .map(|r| format!("{:.1},{:.1}", x(r.minute), y(f(r))))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/><text x="{}" y="{}" fill="{color}">{name}</text>"#,
                points.join(" "),
                w - pad - 160.0,
                top + 28.0 + 14.0 * i as f64
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}">minutes → {last:.0}</text>"#,
            w - pad - 80.0,
            bottom + 16.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
