//! Benchmark: many workers, one burst. Worker processes wait on one
//! PostgreSQL database with their defaults (a cron poll, `LISTEN`
//! wake-ups); a producer commits a burst of notices in transactions of
//! `--batch`, which wakes every worker. Per worker count it prints the
//! drain time and what the wake-ups cost, per delivered notice: scans of
//! `notify_msg`'s due-time indexes (what claims read, and the look-ups of
//! the next due time after a sweep; PostgreSQL's own count over the
//! database's life, the workers' first sweeps and their polls included),
//! the workers' sweeps (each one or more claims), rows claimed, and claims
//! lost. A herd shows as due-index scans per notice growing with the
//! workers, or as lost claims. PostgreSQL 15 or later (a session's counts
//! are in the statistics once it has ended).
//!
//! ```text
//! cargo run --release --features full --example bench_herd -- --workers 1,2,8 --notices 10000
//! ```
//!
//! (`BENCH_PG_URL` default `postgres://postgres@127.0.0.1:5432`; it creates
//! and drops its own database `sn_bench_herd`.)

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use serde_json::json;
use solid_notify::{
    Config, NewNotice, Notifier, Outcome, Worker, WorkerConfig,
    def::{Channel, DefSpec, store},
};
use tokio_util::sync::CancellationToken;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const DB: &str = "sn_bench_herd";

#[derive(Parser)]
struct Cli {
    /// Worker process counts to run, one burst each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,8")]
    workers: Vec<usize>,
    /// Notices in the burst.
    #[arg(long, default_value_t = 10_000)]
    notices: u64,
    /// Notices per producer transaction.
    #[arg(long, default_value_t = 100)]
    batch: u64,
    /// Internal: run as one worker process on the database at
    /// `BENCH_HERD_URL` (not an argument: `ps` shows arguments).
    #[arg(long, hide = true)]
    child: bool,
}

fn server_url() -> String {
    std::env::var("BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let cli = Cli::parse();
    if cli.child {
        let url = std::env::var("BENCH_HERD_URL").map_err(|_| "BENCH_HERD_URL is not set")?;
        return child(&url).await;
    }
    println!(
        "a burst of {} notices ({} per transaction) to worker processes with their defaults (LISTEN on), PostgreSQL on 127.0.0.1",
        cli.notices, cli.batch
    );
    println!(
        "| workers | drained in ms | due-index scans | per notice | sweeps | per notice | rows claimed | lost claims | wake-ups |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for workers in cli.workers {
        burst(workers, cli.notices, cli.batch.max(1)).await?;
    }
    Ok(())
}

/// One burst to `workers` fresh worker processes, and its row.
async fn burst(workers: usize, notices: u64, batch: u64) -> BoxResult<()> {
    let url = fresh_db().await?;
    let db = Database::connect(&url).await?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..workers {
        children.push(
            Command::new(&exe)
                .arg("--child")
                .env("BENCH_HERD_URL", &url)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    // Every worker listens before the burst: its wake-up is what is measured.
    let deadline = Instant::now() + Duration::from_secs(60);
    while listeners(&db).await? < workers as i64 {
        if Instant::now() > deadline {
            return Err("the workers did not all LISTEN within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let producer = Notifier::builder(db.clone())
        .config(Config {
            immediate_attempt: false,
            ..Config::default()
        })
        .build()?;
    let started = Instant::now();
    let mut sent = 0;
    while sent < notices {
        let n = batch.min(notices - sent);
        let tx = producer.begin().await?;
        for i in 0..n {
            tx.add(NewNotice::new("herd", &json!({ "i": sent + i })))
                .await?;
        }
        tx.commit().await?;
        sent += n;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while delivered(&db).await? < notices as i64 {
        if Instant::now() > deadline {
            return Err("the burst was not delivered within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained = started.elapsed();
    // Every worker told to stop first, so none polls while another's
    // counts are read.
    for child in &mut children {
        drop(child.stdin.take());
    }
    let mut total = Tally::default();
    for child in children {
        total.add(&finish(child)?);
    }
    drop(producer);
    db.close().await?;
    // One session of ours now, so every other one is a worker's.
    let db = Database::connect(
        sea_orm::ConnectOptions::new(&url)
            .max_connections(1)
            .to_owned(),
    )
    .await?;
    let scans = claim_scans(&db).await?;
    let per = |n: u64| n as f64 / notices as f64;
    println!(
        "| {workers} | {} | {scans} | {:.3} | {} | {:.3} | {} | {} | {} |",
        drained.as_millis(),
        per(scans),
        total.sweeps,
        per(total.sweeps),
        total.claimed,
        total.lost,
        total.wakeups
    );
    db.close().await?;
    drop_db().await
}

/// What one worker process counted.
#[derive(Default)]
struct Tally {
    sweeps: u64,
    claimed: u64,
    lost: u64,
    wakeups: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.sweeps += other.sweeps;
        self.claimed += other.claimed;
        self.lost += other.lost;
        self.wakeups += other.wakeups;
    }
}

/// Reads the counts a worker printed once its stdin closed (it stops):
/// an error if it failed or printed none.
fn finish(mut child: Child) -> BoxResult<Tally> {
    let mut out = String::new();
    child
        .stdout
        .take()
        .ok_or("no stdout")?
        .read_to_string(&mut out)?;
    let status = child.wait()?;
    if !status.success() || !out.contains("sweeps=") {
        return Err(format!("a worker failed ({status}): {out}").into());
    }
    let mut tally = Tally::default();
    for field in out.split_whitespace() {
        let Some((name, value)) = field.split_once('=') else {
            continue;
        };
        let value: u64 = value.parse()?;
        match name {
            "sweeps" => tally.sweeps = value,
            "claimed" => tally.claimed = value,
            "lost" => tally.lost = value,
            "wakeups" => tally.wakeups = value,
            _ => {}
        }
    }
    Ok(tally)
}

/// One worker process: its defaults, a no-op handler, until stdin closes;
/// then its counts on stdout.
async fn child(url: &str) -> BoxResult<()> {
    let db = Database::connect(url).await?;
    let notifier = Notifier::builder(db)
        .config(Config {
            immediate_attempt: false,
            ..Config::default()
        })
        .handler("noop", |_n| async { Ok(Outcome::success()) })
        .build()?;
    let worker = Arc::new(Worker::new(
        notifier.clone(),
        WorkerConfig {
            confirm_listener: false,
            ..WorkerConfig::default()
        },
    )?);
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let (worker, stop) = (worker.clone(), stop.clone());
        async move { worker.run(stop).await }
    });
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        while BufReader::new(std::io::stdin())
            .read_line(&mut line)
            .unwrap_or(0)
            > 0
        {}
    })
    .await?;
    stop.cancel();
    run.await??;
    let s = worker.stats().snapshot();
    let mut out = std::io::stdout();
    writeln!(
        out,
        "sweeps={} claimed={} lost={} wakeups={}",
        s.sweeps, s.claimed, s.lost_claims, s.wakeups
    )?;
    Ok(())
}

/// Sessions waiting in `LISTEN` on the bench database (a listener quiet
/// for 30 s checks its session with `SELECT 1`: the workers start within
/// seconds of each other, well before).
async fn listeners(db: &DatabaseConnection) -> BoxResult<i64> {
    scalar(
        db,
        &format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{DB}' AND query ILIKE 'LISTEN%'"
        ),
    )
    .await
}

/// Index scans of `notify_msg`'s due-time indexes since the database was
/// made, once every worker's session has ended (a session's counts reach
/// the statistics when it ends, at the latest).
async fn claim_scans(db: &DatabaseConnection) -> BoxResult<u64> {
    if scalar(db, "SELECT current_setting('server_version_num')::bigint").await? < 150_000 {
        return Err("PostgreSQL 15 or later: an older server's statistics lag".into());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(
        db,
        &format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{DB}' \
             AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ),
    )
    .await?
        > 0
    {
        if Instant::now() > deadline {
            return Err("the workers' sessions did not end within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = scalar(
        db,
        "SELECT COALESCE(SUM(idx_scan), 0)::bigint FROM pg_stat_user_indexes \
         WHERE relname = 'notify_msg' AND indexrelname LIKE '%due_at'",
    )
    .await?;
    Ok(n as u64)
}

/// Notices delivered (in history).
async fn delivered(db: &DatabaseConnection) -> BoxResult<i64> {
    scalar(db, "SELECT COUNT(*) FROM notify_msg_history").await
}

async fn scalar(db: &DatabaseConnection, sql: &str) -> BoxResult<i64> {
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql,
        ))
        .await?
        .ok_or("no row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// A new, migrated bench database with the one definition; its URL.
async fn fresh_db() -> BoxResult<String> {
    drop_db().await?;
    let server = Database::connect(format!("{}/postgres", server_url())).await?;
    server
        .execute_unprepared(&format!("CREATE DATABASE {DB}"))
        .await?;
    server.close().await?;
    let url = format!("{}/{DB}", server_url());
    let db = Database::connect(&url).await?;
    solid_notify::migrate(&db).await?;
    store::sync(
        &db,
        &[DefSpec::new(
            "herd",
            Channel::Handler,
            json!({ "handler": "noop" }),
        )],
    )
    .await?;
    db.close().await?;
    Ok(url)
}

async fn drop_db() -> BoxResult<()> {
    let server = Database::connect(format!("{}/postgres", server_url())).await?;
    server
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .await?;
    server.close().await?;
    Ok(())
}
