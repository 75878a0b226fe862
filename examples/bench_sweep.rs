//! Benchmark: draining a backlog of due notices with the sweeper.
//!
//! Pre-inserts due notices with plain SQL and drains them with a no-op
//! handler. On PostgreSQL: a plain-SQL baseline (claim 500 with `FOR UPDATE
//! SKIP LOCKED` and move them to history in one statement, in a loop), then
//! one worker on a 10,000 and a 100,000 backlog, then two workers on
//! 100,000. Each run is a separate process so its peak RSS is its own.
//! Prints msgs/s, µs per notice, the ratio to the baseline, and peak RSS.
//! `SN_BENCH_DEFS=N` spreads a PostgreSQL backlog over N definitions (up to
//! 10,000 of them busy; `SN_BENCH_FRESH_DEFS=1`: created just before the
//! drain, not an hour before). `SN_BENCH_PARTITIONED=day|month` partitions a
//! PostgreSQL history first (`solid-notify history partition`). `SN_BENCH_PAYLOAD=BYTES` pads each PostgreSQL notice's param with that
//! many bytes of random hex (e.g. 100, 10000, 1048576).
//!
//! Run: `cargo run --release --example bench_sweep` (PostgreSQL);
//! `-- --all` adds one worker on 100,000 on MariaDB and on SQLite;
//! `-- --million` adds one worker on 1,000,000 on PostgreSQL, after printing
//! the plans of the claim's due-row query at that backlog;
//! `-- --ordered` adds one worker on 100,000 of an `ordering = "per_key"`
//! definition over 1,000 keys (with `--million`: also on 1,000,000, with
//! the plan of the ordered claim), and the same drain beside a stuck key:
//! 10,000 more notices of one key, due before all the others, held back by
//! a final failure (the claim skips them on every sweep).
//! `-- --encrypted` adds one worker on 100,000 notices of an `encrypt =
//! true` definition (each param sealed, opened to deliver it), with its
//! rate as a share of the plain run's.
//! `-- --pairs N` runs only N interleaved pairs of the unordered and the
//! ordered drain (one worker, 100,000 notices) and prints the ordered one's
//! rate as a share of the unordered one's in each pair, and the median
//! (only a share within one pair is comparable on a machine whose speed
//! drifts). Ordered runs print the same share against the unordered run of
//! their backlog.
//! (`BENCH_PG_URL` default `postgres://postgres@127.0.0.1:5432`,
//! `BENCH_MYSQL_URL` default `mysql://root@127.0.0.1:3306`; it creates and
//! drops its own database `sn_bench_sweep`, on SQLite a temporary file.)

use std::{
    error::Error,
    path::PathBuf,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use serde_json::json;
use solid_notify::{
    Config, Notifier, Outcome, Worker, WorkerConfig,
    crypto::Keys,
    def::{Channel, DefSpec, store},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

type BoxResult<T> = Result<T, Box<dyn Error>>;

fn pg_url() -> String {
    std::env::var("BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn mysql_url() -> String {
    std::env::var("BENCH_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

fn sqlite_path() -> PathBuf {
    std::env::temp_dir().join("sn_bench_sweep.db")
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 5 && args[1] == "run" {
        // RUST_LOG=solid_notify::sweep=trace shows each claim.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
        return run(&args[2], &args[3], args[4].parse()?).await;
    }
    let exe = std::env::current_exe()?;
    if args.iter().any(|a| a == "--pairs") {
        let pairs = flag_value(&args, "--pairs")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .ok_or("--pairs needs a count of pairs, 1 or more")?;
        return pairs_of_drains(&exe, pairs);
    }
    println!("drain of due notices, no-op handler, databases on 127.0.0.1");
    let mut runs = vec![
        ("postgres", "baseline", 100_000),
        ("postgres", "worker1", 10_000),
        ("postgres", "worker1", 100_000),
        ("postgres", "worker2", 100_000),
    ];
    if args.iter().any(|a| a == "--all") {
        runs.push(("mysql", "worker1", 100_000));
        runs.push(("sqlite", "worker1", 100_000));
    }
    let million = args.iter().any(|a| a == "--million");
    if million {
        runs.push(("postgres", "worker1", 1_000_000));
    }
    if args.iter().any(|a| a == "--encrypted") {
        runs.push(("postgres", "sealed1", 100_000));
    }
    if args.iter().any(|a| a == "--ordered") {
        runs.push(("postgres", "ordered1", 100_000));
        runs.push(("postgres", "stuck1", 100_000));
        if million {
            runs.push(("postgres", "ordered1", 1_000_000));
        }
    }
    let mut baseline = 0.0;
    // The unordered one-worker rate of each backlog, for the ordered runs.
    let mut unordered = std::collections::HashMap::new();
    for (backend, mode, backlog) in runs {
        let (rate, rss) = one_run(&exe, backend, mode, backlog)?;
        if mode == "baseline" {
            baseline = rate;
        }
        if backend == "postgres" && mode == "worker1" {
            unordered.insert(backlog, rate);
        }
        let ratio = if backend == "postgres" {
            format!("({:.2}x plain SQL)", rate / baseline)
        } else {
            String::new()
        };
        let share = match unordered.get(&backlog) {
            Some(plain) if mode == "ordered1" || mode == "stuck1" => {
                format!("({:.2}x unordered)", rate / plain)
            }
            Some(plain) if mode == "sealed1" => format!("({:.2}x plain)", rate / plain),
            _ => String::new(),
        };
        println!(
            "  {backend:<8} {mode:<9} backlog {backlog:>9}: {rate:>9.0} msgs/s {:>6.1} µs/notice {ratio:<18} {share:<18} peak RSS {:.1} MiB",
            1e6 / rate,
            rss as f64 / 1024.0
        );
    }
    Ok(())
}

/// The value after `name` in `args`, if given.
fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).map(String::as_str)
}

/// One measured drain in a child process (so its peak RSS is its own),
/// echoing what it printed: its rate and peak RSS in KiB.
fn one_run(
    exe: &std::path::Path,
    backend: &str,
    mode: &str,
    backlog: u64,
) -> BoxResult<(f64, u64)> {
    let out = Command::new(exe)
        .args(["run", backend, mode, &backlog.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().filter(|l| !l.starts_with("rate=")) {
        println!("    {line}");
    }
    let line = text.lines().last().unwrap_or_default();
    let (mut rate, mut rss) = (0.0, 0);
    for field in line.split_whitespace() {
        if let Some(v) = field.strip_prefix("rate=") {
            rate = v.parse()?;
        }
        if let Some(v) = field.strip_prefix("rss_kb=") {
            rss = v.parse()?;
        }
    }
    Ok((rate, rss))
}

/// `--pairs N`: N interleaved pairs of the unordered and the ordered drain
/// on PostgreSQL (one worker, 100,000 notices, 1,000 keys), each pair's
/// ordered rate as a share of its unordered rate, and their median.
fn pairs_of_drains(exe: &std::path::Path, pairs: usize) -> BoxResult<()> {
    const BACKLOG: u64 = 100_000;
    println!(
        "unordered against ordered drain (1,000 keys), one worker, {BACKLOG} notices, PostgreSQL"
    );
    let mut shares = Vec::new();
    for pair in 1..=pairs {
        let (plain, _) = one_run(exe, "postgres", "worker1", BACKLOG)?;
        let (ordered, _) = one_run(exe, "postgres", "ordered1", BACKLOG)?;
        let share = ordered / plain;
        println!(
            "  pair {pair}: unordered {plain:>7.0} msgs/s, ordered {ordered:>7.0} msgs/s: {share:.2}x"
        );
        shares.push(share);
    }
    shares.sort_by(f64::total_cmp);
    let mid = shares.len() / 2;
    let median = if shares.len() % 2 == 1 {
        shares[mid]
    } else {
        (shares[mid - 1] + shares[mid]) / 2.0
    };
    println!("  median of {} pairs: {median:.2}x", shares.len());
    Ok(())
}

/// `SN_BENCH_PAYLOAD=BYTES` (PostgreSQL, unordered): SQL appended to each
/// param's text that pads it to about that many bytes of random hex.
fn payload_pad() -> String {
    match std::env::var("SN_BENCH_PAYLOAD")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(bytes) if bytes > 16 => format!(
            ",\"pad\":\"' || (SELECT string_agg(md5(random()::text || k), '') \
             FROM generate_series(1, {}) k WHERE g > 0) || '\"",
            bytes.div_ceil(32)
        ),
        _ => String::new(),
    }
}

/// One measured drain in this process; prints `rate=… rss_kb=…`.
async fn run(backend: &str, mode: &str, backlog: u64) -> BoxResult<()> {
    let ordered = mode == "ordered1" || mode == "stuck1";
    let sealed = mode == "sealed1";
    let db = fresh_db(backend, ordered, sealed).await?;
    let keys = bench_keys()?;
    let fill = match backend {
        "postgres" if sealed => {
            // One sealed param for all (the same definition, so it opens
            // for each row): the drain opens every one of them.
            let def_id = db
                .query_one_raw(sea_orm::Statement::from_string(
                    db.get_database_backend(),
                    "SELECT id FROM notify_def WHERE name = 'bench'",
                ))
                .await?
                .ok_or("no bench definition")?
                .try_get_by_index::<i64>(0)?;
            let param = keys.seal("{\"i\":0}", def_id)?;
            format!(
                "INSERT INTO notify_msg (def_id, param, next_call_time) \
                 SELECT d.id, '{param}', (now() at time zone 'utc') - interval '1 minute' \
                 FROM generate_series(1, {backlog}) g, notify_def d WHERE d.name = 'bench'"
            )
        }
        "postgres" if ordered => format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time, ordering_key) \
             SELECT d.id, '{{\"i\":' || g || '}}', (now() at time zone 'utc') - interval '1 minute', \
             'k' || (g % 1000) \
             FROM generate_series(1, {backlog}) g, notify_def d WHERE d.name = 'bench' ORDER BY g"
        ),
        "postgres" if bench_defs() > 1 => format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT d.id, '{{\"i\":' || g || '}}', (now() at time zone 'utc') - interval '1 minute' \
             FROM generate_series(1, {backlog}) g JOIN notify_def d ON d.name = \
             CASE WHEN g % {k} = 0 THEN 'bench' ELSE 'bench_' || (g % {k}) END",
            k = bench_defs().min(10_000)
        ),
        "postgres" => format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT d.id, '{{\"i\":' || g || '{}}}', (now() at time zone 'utc') - interval '1 minute' \
             FROM generate_series(1, {backlog}) g, notify_def d WHERE d.name = 'bench'",
            payload_pad()
        ),
        "mysql" => format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT d.id, CONCAT('{{\"i\":', s.seq, '}}'), UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE \
             FROM seq_1_to_{backlog} s, notify_def d WHERE d.name = 'bench'"
        ),
        _ => format!(
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < {backlog}) \
             INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT d.id, '{{\"i\":' || g.x || '}}', strftime('%Y-%m-%d %H:%M:%f', 'now', '-60 seconds') \
             FROM g, notify_def d WHERE d.name = 'bench'"
        ),
    };
    db.execute_unprepared(&fill).await?;
    if mode == "stuck1" {
        // Due first (an hour ago), behind a final failure older still.
        db.execute_unprepared(&format!(
            "INSERT INTO notify_msg_history (id, def_id, param, status, next_call_time, create_time, ordering_key) \
             SELECT 0, d.id, '{{}}', 3, now() - interval '2 hours', now() - interval '2 hours', 'stuck' \
             FROM notify_def d WHERE d.name = 'bench'; \
             INSERT INTO notify_msg (def_id, param, next_call_time, ordering_key) \
             SELECT d.id, '{{}}', (now() at time zone 'utc') - interval '1 hour', 'stuck' \
             FROM generate_series(1, {STUCK}) g, notify_def d WHERE d.name = 'bench'"
        ))
        .await?;
    }
    let analyze = match backend {
        "postgres" => "VACUUM ANALYZE notify_msg",
        "mysql" => "ANALYZE TABLE notify_msg",
        _ => "ANALYZE",
    };
    db.execute_unprepared(analyze).await?;
    if backend == "postgres" && backlog >= 1_000_000 {
        explain(&db, ordered).await?;
    }
    let started = Instant::now();
    // The workers' process reading its definitions, before any drain.
    let (startup, drained) = match mode {
        "baseline" => {
            baseline(&db).await?;
            (Duration::ZERO, started.elapsed())
        }
        "worker1" | "ordered1" | "stuck1" | "sealed1" => drain(&db, 1, backlog, keys).await?,
        "worker2" => drain(&db, 2, backlog, keys).await?,
        other => return Err(format!("unknown mode {other}").into()),
    };
    let secs = drained.as_secs_f64();
    let left = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM notify_msg",
        ))
        .await?
        .map(|r| r.try_get::<i64>("", "n"))
        .transpose()?
        .unwrap_or(-1);
    let stuck = if mode == "stuck1" { STUCK } else { 0 };
    if left != stuck {
        return Err(format!("{left} notices left after the drain").into());
    }
    if bench_defs() > 1 {
        println!(
            "{} definitions: the workers got ready (definitions read, selection, park check) in {} ms before draining",
            bench_defs(),
            startup.as_millis()
        );
    }
    println!("rate={:.1} rss_kb={}", backlog as f64 / secs, peak_rss_kb());
    db.close().await?;
    drop_db(backend).await?;
    Ok(())
}

/// The plans of the claim's due-row query at this backlog (`ordered`: with
/// the order rule of `solid_notify::state::order`, as the claim sends it).
async fn explain(db: &DatabaseConnection, ordered: bool) -> BoxResult<()> {
    let in_turn = if ordered {
        format!(
            "AND {}",
            solid_notify::state::order::in_turn_sql(sea_orm::DbBackend::Postgres)
        )
    } else {
        String::new()
    };
    let due = format!(
        "SELECT id FROM notify_msg WHERE due_at <= (statement_timestamp() AT TIME ZONE 'UTC') \
         AND next_call_time <= (statement_timestamp() AT TIME ZONE 'UTC') \
         AND status IN (0, 2, 4) AND def_id IN (1, 2) {in_turn} ORDER BY due_at LIMIT 1000 FOR UPDATE SKIP LOCKED"
    );
    let plans = [
        format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {due}"),
        format!(
            "EXPLAIN (COSTS OFF) UPDATE notify_msg SET version = version + 1, leased = true \
             WHERE id = ANY(ARRAY(({due}))) RETURNING *"
        ),
    ];
    for sql in plans {
        println!(
            "plan of: {}",
            sql.split(" WHERE").next().unwrap_or_default()
        );
        let rows = db
            .query_all_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                sql,
            ))
            .await?;
        for row in rows {
            println!("  {}", row.try_get_by_index::<String>(0)?);
        }
    }
    Ok(())
}

async fn fresh_db(backend: &str, ordered: bool, encrypt: bool) -> BoxResult<DatabaseConnection> {
    drop_db(backend).await?;
    let url = match backend {
        "postgres" => {
            let admin = Database::connect(format!("{}/postgres", pg_url())).await?;
            admin
                .execute_unprepared("CREATE DATABASE sn_bench_sweep")
                .await?;
            format!("{}/sn_bench_sweep", pg_url())
        }
        "mysql" => {
            let admin = Database::connect(format!("{}/test", mysql_url())).await?;
            admin
                .execute_unprepared("CREATE DATABASE sn_bench_sweep")
                .await?;
            format!("{}/sn_bench_sweep", mysql_url())
        }
        _ => format!("sqlite://{}?mode=rwc", sqlite_path().display()),
    };
    let mut opts = sea_orm::ConnectOptions::new(url);
    opts.max_connections(16).sqlx_logging(false);
    let db = Database::connect(opts).await?;
    solid_notify::migrate(&db).await?;
    if let Ok(period) = std::env::var("SN_BENCH_PARTITIONED")
        && backend == "postgres"
    {
        let how = solid_notify::ops::Partitioning {
            period: match period.as_str() {
                "day" => solid_notify::ops::Period::Day,
                _ => solid_notify::ops::Period::Month,
            },
            ..Default::default()
        };
        solid_notify::state::partitions::convert(&db, &how).await?;
    }
    let mut spec = DefSpec::new("bench", Channel::Handler, json!({"handler": "noop"}));
    if ordered {
        spec.ordering = "per_key".into();
    }
    spec.encrypt = encrypt;
    store::sync(&db, &[spec]).await?;
    let defs = bench_defs();
    if backend == "postgres" && defs > 1 {
        // Copies of `bench` (same handler), as `bench_1` … `bench_{N-1}`,
        // last changed an hour ago: definitions exist long before a
        // backlog does (within `CHANGE_SLACK` of a bulk change, a refresh
        // of the definition cache reads every changed row's id and time:
        // `SN_BENCH_FRESH_DEFS=1` measures that case).
        let changed = match std::env::var("SN_BENCH_FRESH_DEFS").is_ok() {
            true => "now() at time zone 'utc'",
            false => "(now() at time zone 'utc') - interval '1 hour'",
        };
        db.execute_unprepared(&format!(
            "DO $$ DECLARE cols text; BEGIN \
             SELECT string_agg(quote_ident(column_name), ', ') INTO cols \
             FROM information_schema.columns WHERE table_name = 'notify_def' \
             AND column_name NOT IN ('id', 'name', 'update_time'); \
             EXECUTE format('INSERT INTO notify_def (name, update_time, %s) \
             SELECT ''bench_'' || g, {}, %s \
             FROM notify_def, generate_series(1, {}) g WHERE name = ''bench''', cols, cols); \
             END $$",
            changed.replace('\'', "''"),
            defs - 1
        ))
        .await?;
    }
    Ok(db)
}

/// The key of the `--encrypted` run (every run has it; only that one's
/// definition seals).
fn bench_keys() -> BoxResult<Keys> {
    Ok(Keys::new().with("bench", [42; 32])?)
}

/// `SN_BENCH_DEFS=N` (PostgreSQL, unordered): N definitions, the backlog
/// spread over up to 10,000 of them (default 1).
fn bench_defs() -> u64 {
    std::env::var("SN_BENCH_DEFS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

async fn drop_db(backend: &str) -> BoxResult<()> {
    match backend {
        "postgres" => {
            let admin = Database::connect(format!("{}/postgres", pg_url())).await?;
            admin
                .execute_unprepared("DROP DATABASE IF EXISTS sn_bench_sweep WITH (FORCE)")
                .await?;
        }
        "mysql" => {
            let admin = Database::connect(format!("{}/test", mysql_url())).await?;
            admin
                .execute_unprepared("DROP DATABASE IF EXISTS sn_bench_sweep")
                .await?;
        }
        _ => {
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(format!("{}{suffix}", sqlite_path().display())).ok();
            }
        }
    }
    Ok(())
}

/// Notices of the stuck key in the `stuck1` drain.
const STUCK: i64 = 10_000;

/// The plain-SQL floor: claim 500 with SKIP LOCKED and move them to history.
async fn baseline(db: &DatabaseConnection) -> BoxResult<()> {
    use sea_orm::{IdenStatic, Iterable};
    // The history's columns (`notify_msg` has `due_at` and `held_key` too).
    let columns: Vec<&str> = solid_notify::entity::notify_msg::Column::iter()
        .map(|c| c.as_str())
        .collect();
    let columns = columns.join(", ");
    let sql = format!(
        "WITH c AS (SELECT id FROM notify_msg WHERE due_at <= (now() at time zone 'utc') \
         AND status IN (0, 2, 4) ORDER BY due_at LIMIT 500 FOR UPDATE SKIP LOCKED), \
         moved AS (DELETE FROM notify_msg m USING c WHERE m.id = c.id RETURNING m.*) \
         INSERT INTO notify_msg_history ({columns}) SELECT {columns} FROM moved"
    );
    while db.execute_unprepared(&sql).await?.rows_affected() > 0 {}
    Ok(())
}

/// Drains the backlog with `workers` workers; returns how long getting the
/// workers ready took (definitions read, selection, park check; not part
/// of the drain's rate) and how long the drain took, until the workers
/// stopped.
async fn drain(
    db: &DatabaseConnection,
    workers: usize,
    backlog: u64,
    keys: Keys,
) -> BoxResult<(Duration, Duration)> {
    let started = Instant::now();
    let notifier = Notifier::builder(db.clone())
        .config(Config {
            // The receivers listen on 127.0.0.1.
            allow_private_network: true,
            immediate_attempt: false,
            keys,
            ..Config::default()
        })
        .handler("noop", |_n| async { Ok(Outcome::success()) })
        .build()?;
    let stop = CancellationToken::new();
    let mut ready = Vec::new();
    for _ in 0..workers {
        let worker = Arc::new(Worker::new(
            notifier.clone(),
            WorkerConfig {
                mode: Mode::FixedDelay,
                delay: Duration::from_millis(10),
                batch_size: 1000,
                concurrency: 64,
                ..WorkerConfig::default()
            },
        )?);
        // Warms its connections, reads every definition, works out its
        // selection and parks what it must (and claims nothing).
        worker.prepare().await?;
        ready.push(worker);
    }
    let startup = started.elapsed();
    let stats: Vec<_> = ready.iter().map(|w| w.stats()).collect();
    let mut tasks = Vec::new();
    for worker in ready {
        let token = stop.clone();
        tasks.push(tokio::spawn(async move { worker.run(token).await }));
    }
    let draining = Instant::now();
    while stats.iter().map(|s| s.snapshot().succeeded).sum::<u64>() < backlog {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained = draining.elapsed();
    stop.cancel();
    for task in tasks {
        task.await??;
    }
    let stopped = draining.elapsed();
    eprintln!(
        "drained in {} ms; the workers stopped {} ms later",
        drained.as_millis(),
        (stopped - drained).as_millis()
    );
    // Measured here: the notifier's drop (at 100,000 definitions, freeing
    // its cache takes half a second) is no part of the drain.
    Ok((startup, stopped))
}

/// Peak resident set size of this process (VmHWM), in KiB.
fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
