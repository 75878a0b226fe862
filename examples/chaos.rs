//! Chaos: a black-box check of the two promises, run by `.ci/run`.
//!
//! Starts several `solid-notify worker` processes against a fresh PostgreSQL
//! database and an HTTP receiver on 127.0.0.1 that fails 30% of first
//! attempts and answers in 0–200 ms. Notices are inserted with plain SQL
//! while, every few seconds, one worker is killed with SIGKILL (and started
//! again) and now and then every database session is terminated; the first
//! worker reaches the database through a proxy that freezes now and then
//! for 8 s (a network partition: sockets open, nothing forwarded), longer
//! than the lease, so its late writes arrive after other workers took its
//! notices. Then the chaos stops, the workers drain what is left, and the
//! run prints
//!
//! ```text
//! lost=0 overlaps=0 out_of_order=0 duplicates=N
//! ```
//!
//! A third of the notices belong to an ordered definition (`ordering =
//! "per_key"`, 40 keys), whose keys move on through the batches' claims of
//! each next notice on PostgreSQL.
//!
//! Meanwhile a producer in this process adds notices through
//! `Notifier::begin` with after-commit attempts, inside nested transactions
//! and SQL savepoints of which it rolls back a random share. A notice
//! rolled back (or whose transaction did not commit) must be neither
//! stored nor received; one committed must be delivered like the others.
//!
//! `lost`: notices never answered 2xx or not in history as succeeded;
//! `overlaps`: two requests for one notice running at the same time;
//! `out_of_order`: a request for an ordered notice that started before
//! every request for the notice before it in its key had ended;
//! `duplicates`: successful requests beyond one per notice (expected after a
//! SIGKILL: at-least-once); `rolled_back_stored` and `rolled_back_received`:
//! the producer's rolled-back notices found in a table or at the receiver.
//! Exits with 1 when `lost`, `overlaps`, `out_of_order` or either
//! `rolled_back` count is above 0.
//!
//! ```sh
//! cargo build --bin solid-notify && cargo run --example chaos -- --secs 30
//! ```
//! Settings: `--workers 3 --notices 3000 --secs 30 --param-bytes 0` (padding
//! added to each notice's param, for large payloads), PostgreSQL from
//! `SN_CHAOS_PG_URL` (default `postgres://postgres@127.0.0.1:5432`), the
//! worker binary from `SN_BIN` (default: next to this example's directory).

#[path = "../tests/common/receiver.rs"]
mod receiver;

#[path = "../tests/common/proxy.rs"]
mod proxy;

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use receiver::{Receiver, Reply};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionSession,
    TransactionTrait,
};
use serde_json::json;
use solid_notify::{
    Error, Notifier,
    def::{Channel, DefSpec, store},
};
use tokio::process::{Child, Command};

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Settings {
    workers: usize,
    notices: usize,
    secs: u64,
    /// Bytes of padding in each inserted notice's param (0: none).
    param_bytes: u64,
}

fn settings() -> Settings {
    let mut s = Settings {
        workers: 3,
        notices: 3000,
        secs: 30,
        param_bytes: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match pair[0].as_str() {
            "--workers" => s.workers = value.max(1) as usize,
            "--notices" => s.notices = value.max(1) as usize,
            "--secs" => s.secs = value.max(1),
            "--param-bytes" => s.param_bytes = value,
            other => eprintln!("ignoring unknown argument {other}"),
        }
    }
    s
}

/// Whether the receiver fails this notice's first attempt (30% of them).
fn fails_first(id: i64) -> bool {
    (id.wrapping_mul(2_654_435_761) >> 7).rem_euclid(10) < 3
}

async fn exec(db: &DatabaseConnection, sql: &str) -> BoxResult<()> {
    db.execute_unprepared(sql).await?;
    Ok(())
}

async fn scalar(db: &DatabaseConnection, sql: &str) -> BoxResult<i64> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql.to_string()))
        .await?
        .ok_or("no row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// The port of a database URL.
fn pg_port(url: &str) -> BoxResult<u16> {
    Ok(url::Url::parse(url)?.port().unwrap_or(5432))
}

fn worker_bin() -> BoxResult<PathBuf> {
    if let Ok(bin) = std::env::var("SN_BIN") {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|examples| examples.parent())
        .ok_or("cannot locate the target directory")?;
    let bin = profile_dir.join("solid-notify");
    if !bin.exists() {
        return Err(format!(
            "{} not found: run `cargo build --bin solid-notify` first, or set SN_BIN",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

fn spawn_worker(bin: &PathBuf, url: &str) -> BoxResult<Child> {
    Ok(Command::new(bin)
        .args([
            "worker",
            "--allow-private-network",
            "--database-url",
            url,
            "--mode",
            "fixed-delay",
            "--delay",
            "50ms",
            "--lease",
            "6s",
            "--attempt-timeout",
            "2s",
            "--concurrency",
            "16",
            "--batch-size",
            "100",
            "--shutdown-timeout",
            "2s",
            "--db-timeout",
            "3s",
        ])
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()?)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> BoxResult<bool> {
    let s = settings();
    let base = std::env::var("SN_CHAOS_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let name = format!("sn_t_chaos_{}", std::process::id());
    let admin = Database::connect(format!("{base}/postgres")).await?;
    exec(&admin, &format!("CREATE DATABASE {name}")).await?;
    let url = format!("{base}/{name}");
    let outcome = chaos(&s, &admin, &url, &name).await;
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await?;
    outcome
}

async fn chaos(s: &Settings, admin: &DatabaseConnection, url: &str, name: &str) -> BoxResult<bool> {
    let db = Database::connect(url).await?;
    solid_notify::migrate(&db).await?;
    let receiver = Receiver::start(|r| {
        let delay = Duration::from_millis((r.id.unsigned_abs() * 7919) % 200);
        let status = if r.attempt == 1 && fails_first(r.id) {
            500
        } else {
            200
        };
        Reply::status(status).after(delay)
    })
    .await;
    let mut spec = DefSpec::new("chaos", Channel::Http, json!({ "url": receiver.url }));
    spec.retry_interval = "1s".into();
    spec.max_retry_times = -1;
    let mut ordered = spec.clone();
    ordered.name = "chaos_ordered".into();
    ordered.ordering = "per_key".into();
    store::sync(&db, &[spec, ordered]).await?;

    let bin = worker_bin()?;
    // The first worker's way to the database: a proxy that freezes.
    let server: std::net::SocketAddr = ([127, 0, 0, 1], pg_port(url)?).into();
    let partition = proxy::Proxy::start(server).await;
    let frozen_url = url.replacen(
        &format!(":{}/", server.port()),
        &format!(":{}/", partition.port),
        1,
    );
    let url_of = |worker: usize| {
        if worker == 0 {
            frozen_url.clone()
        } else {
            url.to_string()
        }
    };
    let mut workers = Vec::new();
    for worker in 0..s.workers {
        workers.push(spawn_worker(&bin, &url_of(worker))?);
    }
    let producer_db = Database::connect(url).await?;
    let producer = Notifier::builder(producer_db).build()?;
    let produced = tokio::spawn(produce(
        producer.clone(),
        Instant::now() + Duration::from_secs(s.secs),
    ));
    // Every third notice is ordered, keyed by `g % 40`, written in `g`'s
    // order (so in each key's order).
    // `--param-bytes`: each param padded with that many bytes of hex.
    let pad = match s.param_bytes {
        0 => String::new(),
        n => format!(
            " || ',\"pad\":\"' || repeat(md5(g::text), {}) || '\"'",
            n.div_ceil(32)
        ),
    };
    let insert = |n: usize| {
        format!(
            "INSERT INTO notify_msg (def_id, param, description, ordering_key) \
             SELECT d.id, '{{\"i\":' || g{pad} || '}}', 'chaos', \
             CASE WHEN g % 3 = 0 THEN 'k' || (g % {KEYS}) END \
             FROM generate_series(1, {n}) g JOIN notify_def d \
             ON d.name = CASE WHEN g % 3 = 0 THEN 'chaos_ordered' ELSE 'chaos' END ORDER BY g"
        )
    };
    let started = Instant::now();
    let chunks = (s.secs as usize).max(1);
    let per_chunk = s.notices / chunks;
    let mut inserted = 0;
    let (mut kills, mut terminations, mut freezes) = (0, 0, 0);
    for second in 0..s.secs {
        let n = if second as usize + 1 == chunks {
            s.notices - inserted
        } else {
            per_chunk
        };
        if n > 0 {
            exec(&db, &insert(n)).await?;
            inserted += n;
        }
        if second % 3 == 2 {
            let victim = fastrand::usize(..workers.len());
            workers[victim].start_kill()?; // SIGKILL
            workers[victim].wait().await?;
            workers[victim] = spawn_worker(&bin, &url_of(victim))?;
            kills += 1;
        }
        // The first worker's partition: 8 s frozen out of every 12.
        match second % 12 {
            1 => {
                partition.freeze();
                freezes += 1;
            }
            9 => partition.thaw(),
            _ => {}
        }
        if second % 5 == 4 {
            terminations += scalar(
                admin,
                &format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                ),
            )
            .await?;
        }
        tokio::time::sleep_until((started + Duration::from_secs(second + 1)).into()).await;
    }
    partition.thaw();
    let produced = produced.await??;
    producer.shutdown(Duration::from_secs(10)).await.ok();
    eprintln!(
        "chaos: {inserted} notices, {} workers, {kills} SIGKILLs, {terminations} sessions terminated, \
         {freezes} freezes in {}s; the producer kept {} notices and rolled back {} ({} commits of \
         unknown outcome); draining",
        s.workers,
        s.secs,
        produced.kept.len(),
        produced.rolled_back.len(),
        produced.unknown.len()
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let db = Database::connect(url).await?;
    loop {
        let left = scalar(&db, "SELECT COUNT(*) FROM notify_msg")
            .await
            .unwrap_or(-1);
        if left == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for worker in &mut workers {
        if let Some(pid) = worker.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
    for worker in &mut workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), worker.wait()).await;
    }
    let succeeded = scalar(
        &db,
        "SELECT COUNT(*) FROM notify_msg_history WHERE status = 1",
    )
    .await?;
    let delivered_ids = receiver.delivered();
    let delivered = delivered_ids.len() as i64;
    // Committed: the plain-SQL notices, the producer's kept ones, and those
    // of its commits of unknown outcome that are in a table.
    let unknown_committed = stored(&db, &produced.unknown).await? as usize;
    let expected = (s.notices + produced.kept.len() + unknown_committed) as i64;
    let lost = (expected - succeeded.min(delivered)).max(0);
    let overlaps = receiver.overlaps().len();
    let duplicates = receiver.duplicates();
    let out_of_order = out_of_order(&db, &receiver).await?;
    let rolled_back_stored = stored(&db, &produced.rolled_back).await?;
    let received: std::collections::HashSet<i64> =
        receiver.seen().iter().map(|seen| seen.id).collect();
    let rolled_back_received = produced
        .rolled_back
        .iter()
        .filter(|id| received.contains(id))
        .count();
    println!(
        "lost={lost} overlaps={overlaps} out_of_order={out_of_order} duplicates={duplicates} \
         rolled_back_stored={rolled_back_stored} rolled_back_received={rolled_back_received}"
    );
    db.close().await?;
    Ok(lost == 0
        && overlaps == 0
        && out_of_order == 0
        && rolled_back_stored == 0
        && rolled_back_received == 0)
}

/// What the producer added: notices committed, notices rolled back (with
/// their savepoint, or with their whole transaction), and notices of
/// commits whose outcome it could not know.
#[derive(Default)]
struct Produced {
    kept: Vec<i64>,
    rolled_back: Vec<i64>,
    unknown: Vec<i64>,
}

/// Adds notices until `until`, in transactions that open nested
/// transactions and SQL savepoints and roll a random share of them back.
/// The chaos terminates its sessions too: a transaction that fails is
/// rolled back whole.
async fn produce(notifier: Notifier, until: Instant) -> BoxResult<Produced> {
    let mut produced = Produced::default();
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        let param = |part: &str| json!({ "producer": n, "part": part });
        let built: Result<_, Error> = async {
            let tx = notifier.begin().await?;
            kept.push(tx.add_notice("chaos", &param("outer"), "producer").await?);
            let roll_back = fastrand::u8(0..10) < 4;
            match fastrand::u8(0..3) {
                0 => {
                    let nested = tx.begin().await?;
                    let id = nested
                        .add_notice("chaos", &param("nested"), "producer")
                        .await?;
                    if roll_back {
                        dropped.push(id);
                        nested.rollback().await?;
                    } else {
                        kept.push(id);
                        TransactionSession::commit(nested).await?;
                    }
                }
                1 => {
                    tx.execute_unprepared("SAVEPOINT chaos").await?;
                    let id = tx
                        .add_notice("chaos", &param("savepoint"), "producer")
                        .await?;
                    if roll_back {
                        dropped.push(id);
                        tx.execute_unprepared("ROLLBACK TO SAVEPOINT chaos").await?;
                    } else {
                        kept.push(id);
                        tx.execute_unprepared("RELEASE SAVEPOINT chaos").await?;
                    }
                }
                _ => {}
            }
            kept.push(tx.add_notice("chaos", &param("after"), "producer").await?);
            Ok(tx)
        }
        .await;
        let committed = match built {
            Ok(tx) => tx.commit().await.map(drop),
            Err(e) => Err(e),
        };
        match committed {
            Ok(()) => {
                produced.kept.extend(kept);
                produced.rolled_back.extend(dropped);
            }
            Err(Error::CommitOutcomeUnknown(_)) => {
                produced.unknown.extend(kept);
                produced.rolled_back.extend(dropped);
            }
            // Nothing of it committed.
            Err(_) => {
                produced.rolled_back.extend(kept);
                produced.rolled_back.extend(dropped);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(produced)
}

/// How many of `ids` are in `notify_msg` or `notify_msg_history`.
async fn stored(db: &DatabaseConnection, ids: &[i64]) -> BoxResult<i64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    let list = list.join(",");
    scalar(
        db,
        &format!(
            "SELECT (SELECT COUNT(*) FROM notify_msg WHERE id IN ({list})) + \
             (SELECT COUNT(*) FROM notify_msg_history WHERE id IN ({list}))"
        ),
    )
    .await
}

/// Keys of the ordered definition.
const KEYS: usize = 40;

/// Requests for an ordered notice that started before every request for
/// the notice before it in its key had ended.
async fn out_of_order(db: &DatabaseConnection, receiver: &Receiver) -> BoxResult<usize> {
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id, ordering_key FROM notify_msg_history WHERE ordering_key IS NOT NULL \
             ORDER BY ordering_key, create_time, id",
        ))
        .await?;
    let mut spans: std::collections::HashMap<i64, (Instant, Instant)> = Default::default();
    for seen in receiver.seen() {
        let ended = seen.ended.unwrap_or_else(Instant::now);
        let span = spans.entry(seen.id).or_insert((seen.started, ended));
        span.0 = span.0.min(seen.started);
        span.1 = span.1.max(ended);
    }
    let mut wrong = 0;
    let mut before: Option<(String, i64)> = None;
    for row in rows {
        let (id, key): (i64, String) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
        if let Some((prev_key, prev)) = &before
            && *prev_key == key
            && let (Some(a), Some(b)) = (spans.get(prev), spans.get(&id))
            && b.0 < a.1
        {
            wrong += 1;
        }
        before = Some((key, id));
    }
    Ok(wrong)
}
