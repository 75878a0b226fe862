//! solid-notify's side of the peer benchmark in `../shared/bench-peers/`
//! (driven by its `bench.py`; its `build_sn.sh` builds this example when it
//! exists, so the comparison follows the project's API). Same commands,
//! arguments and output lines as the harness's own `sn_bench`; `RUST_LOG`
//! turns on the library's logs (on stderr).
//!
//! Subcommands, all against one database URL:
//! - `prepare`: run the migrations and store the definition `bench` (handler `bench`);
//! - `fill N`: insert N due notices with one plain-SQL statement (the documented
//!   polyglot-producer path; the backlog for the drain);
//! - `worker`: run one `Worker` until SIGTERM/SIGINT; with `--latency` the handler
//!   prints `LAT <i> <µs>` (now minus the producer's timestamp `t`); with
//!   `SN_BENCH_METRICS=1` it also serves Prometheus metrics and refreshes the
//!   gauges, as `solid-notify worker --metrics-addr` does;
//! - `produce`: one producer committing one notice per transaction at a steady
//!   rate; with `--immediate` the after-commit attempt runs here and this
//!   process prints the `LAT` lines;
//! - `enqueue`: single-notice transactions on a one-connection pool, prints `rate=`.
//!
//! The handler is a no-op in every mode (latency mode only prints one line).

use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use clap::{Parser, Subcommand, ValueEnum};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};
use serde_json::json;
use solid_notify::{
    Config, Notice, Notifier, Outcome, Worker, WorkerConfig,
    def::{Channel, DefSpec, store},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
struct Cli {
    /// postgres://user@host:port/database
    #[arg(long)]
    url: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum SweepMode {
    /// Fixed rate on the cron expression (the default: every second).
    Rate,
    /// Fixed delay between sweeps.
    Delay,
}

#[derive(Subcommand)]
enum Cmd {
    Prepare,
    Fill {
        n: u64,
    },
    Worker {
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value_t = 1000)]
        batch_size: u64,
        #[arg(long, value_enum, default_value_t = SweepMode::Rate)]
        mode: SweepMode,
        #[arg(long, default_value = "* * * * * *")]
        cron: String,
        #[arg(long, default_value_t = 10)]
        delay_ms: u64,
        #[arg(long, default_value_t = 16)]
        pool: u32,
        #[arg(long)]
        latency: bool,
    },
    Produce {
        #[arg(long, default_value_t = 200)]
        rate: u64,
        #[arg(long, default_value_t = 10.0)]
        secs: f64,
        #[arg(long)]
        immediate: bool,
        #[arg(long, default_value_t = 4)]
        pool: u32,
    },
    Enqueue {
        #[arg(long, default_value_t = 5000)]
        n: u64,
        #[arg(long, default_value_t = 100)]
        warmup: u64,
    },
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
    match cli.cmd {
        Cmd::Prepare => prepare(&cli.url).await,
        Cmd::Fill { n } => fill(&cli.url, n).await,
        Cmd::Worker {
            concurrency,
            batch_size,
            mode,
            cron,
            delay_ms,
            pool,
            latency,
        } => {
            let config = WorkerConfig {
                mode: match mode {
                    SweepMode::Rate => Mode::FixedRate,
                    SweepMode::Delay => Mode::FixedDelay,
                },
                cron,
                delay: Duration::from_millis(delay_ms),
                batch_size,
                concurrency,
                confirm_listener: false,
                ..WorkerConfig::default()
            };
            worker(&cli.url, config, pool, latency).await
        }
        Cmd::Produce {
            rate,
            secs,
            immediate,
            pool,
        } => produce(&cli.url, rate, secs, immediate, pool).await,
        Cmd::Enqueue { n, warmup } => enqueue(&cli.url, n, warmup).await,
    }
}

async fn connect(url: &str, pool: u32) -> BoxResult<DatabaseConnection> {
    let mut opts = ConnectOptions::new(url.to_string());
    opts.max_connections(pool).sqlx_logging(false);
    Ok(Database::connect(opts).await?)
}

fn epoch_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The benchmark handler: a no-op, or in latency mode one `LAT i µs` line.
fn notifier(
    db: DatabaseConnection,
    immediate: bool,
    latency: bool,
    handled: Arc<AtomicU64>,
) -> BoxResult<Notifier> {
    Ok(Notifier::builder(db)
        .config(Config {
            // The receivers listen on 127.0.0.1.
            allow_private_network: true,
            immediate_attempt: immediate,
            ..Config::default()
        })
        .handler("bench", move |n: Notice| {
            let handled = handled.clone();
            async move {
                if latency {
                    let now = epoch_us();
                    let t = n.param["t"].as_i64().unwrap_or(now);
                    let i = n.param["i"].as_i64().unwrap_or(-1);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "LAT {i} {}", now - t)?;
                }
                handled.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::success())
            }
        })
        .build()?)
}

async fn prepare(url: &str) -> BoxResult<()> {
    let db = connect(url, 2).await?;
    solid_notify::migrate(&db).await?;
    let spec = DefSpec::new("bench", Channel::Handler, json!({"handler": "bench"}));
    store::sync(&db, &[spec]).await?;
    db.close().await?;
    Ok(())
}

async fn fill(url: &str, n: u64) -> BoxResult<()> {
    let db = connect(url, 1).await?;
    db.execute_unprepared(&format!(
        "INSERT INTO notify_msg (def_id, param, description) \
         SELECT d.id, '{{\"i\":' || g || '}}', 'bench' \
         FROM generate_series(1, {n}) g, notify_def d WHERE d.name = 'bench'"
    ))
    .await?;
    db.close().await?;
    Ok(())
}

async fn worker(url: &str, config: WorkerConfig, pool: u32, latency: bool) -> BoxResult<()> {
    // The pool `solid-notify worker` opens.
    let mut opts = solid_notify::worker::pool_options(url);
    opts.max_connections(pool).sqlx_logging(false);
    let db = Database::connect(opts).await?;
    let notifier = notifier(db, false, latency, Arc::default())?;
    let stop = CancellationToken::new();
    // SN_BENCH_METRICS=1: the worker as `solid-notify worker --metrics-addr`
    // runs it (Prometheus recorder, gauges every 5 s), to measure their cost
    // (feature `metrics`).
    #[cfg(feature = "metrics")]
    if std::env::var("SN_BENCH_METRICS").is_ok_and(|v| v == "1") {
        let addr = solid_notify::telemetry::serve_metrics(
            ([127, 0, 0, 1], 0).into(),
            notifier.db().clone(),
            stop.clone(),
        )
        .await?;
        eprintln!("metrics: http://{addr}/metrics");
        solid_notify::telemetry::spawn_gauges(
            notifier.clone(),
            solid_notify::telemetry::DEFAULT_GAUGE_EVERY,
            stop.clone(),
        );
    }
    let worker = Worker::new(notifier, config)?;
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        signal_stop.cancel();
    });
    println!("READY");
    worker.run(stop).await?;
    Ok(())
}

async fn produce(url: &str, rate: u64, secs: f64, immediate: bool, pool: u32) -> BoxResult<()> {
    let db = connect(url, pool).await?;
    let handled = Arc::new(AtomicU64::new(0));
    let notifier = notifier(db, immediate, true, handled.clone())?;
    let total = (rate as f64 * secs).round() as u64;
    let start = tokio::time::Instant::now();
    // Time from `t` to the end of the commit, per notice: the rest of a
    // notice's latency is the hand-off to the handler.
    let mut committed = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate as f64)).await;
        let (t, began) = (epoch_us(), Instant::now());
        let tx = notifier.begin().await?;
        tx.add_notice("bench", &json!({"t": t, "i": i}), "lat")
            .await?;
        tx.commit().await?;
        // The harness leaves the first 20 out of its latency figures.
        if i >= 20 {
            committed.push(began.elapsed().as_micros() as u64);
        }
    }
    eprintln!("produced {total} in {:.2}s", start.elapsed().as_secs_f64());
    committed.sort_unstable();
    if !committed.is_empty() {
        let at = |q: f64| committed[((committed.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        eprintln!("commit ms p50={:.2} p99={:.2}", at(0.5), at(0.99));
    }
    if immediate {
        let deadline = Instant::now() + Duration::from_secs(30);
        while handled.load(Ordering::Relaxed) < total && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        notifier.shutdown(Duration::from_secs(5)).await?;
    }
    println!("DONE");
    Ok(())
}

async fn enqueue(url: &str, n: u64, warmup: u64) -> BoxResult<()> {
    let db = connect(url, 1).await?;
    let notifier = notifier(db.clone(), false, false, Arc::default())?;
    let one = |i: u64| {
        let notifier = notifier.clone();
        async move {
            let tx = notifier.begin().await?;
            tx.add_notice("bench", &json!({"i": i}), "enqueue").await?;
            tx.commit().await?;
            BoxResult::Ok(())
        }
    };
    for i in 0..warmup {
        one(i).await?;
    }
    let started = Instant::now();
    for i in 0..n {
        one(warmup + i).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!("rate={:.1}", n as f64 / secs);
    db.close().await?;
    Ok(())
}
