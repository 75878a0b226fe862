//! Benchmark: what `add_notice` adds to a business transaction.
//!
//! On PostgreSQL, runs 5,000 one-row business transactions alone and 5,000
//! with one `add_notice` each, interleaved in blocks of 100 so drift hits both
//! equally, and prints the per-transaction cost and the ratio. Two notice
//! variants run: enqueue only (no after-commit attempt), and enqueue with the
//! after-commit attempt of a no-op handler running in the background. A third
//! variant adds one hand-written INSERT into `notify_msg` instead: the floor
//! any outbox pays for writing its row in the caller's transaction. A last
//! one adds notices of an `ordering = "per_key"` definition over 10 keys,
//! attempted after commit, with no sweeper: most wait behind an older
//! notice of their key, the path where a commit's attempt does not take its
//! notice. It also counts the database transactions per such add,
//! background ones included, over 1,000 more added by 8 producers at once
//! (about 25 s of waiting for PostgreSQL's statistics). An `encrypt = true`
//! variant adds the same notice, its param sealed before the insert
//! (enqueue only), for its cost against the plain one.
//! It runs on a current-thread runtime so that scheduling noise stays out.
//!
//! Run: `cargo run --release --example bench_enqueue`
//! (`BENCH_PG_URL` default `postgres://postgres@127.0.0.1:5432`; it creates and
//! drops its own database `sn_bench_enqueue`.)

use std::{
    error::Error,
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, Database, DatabaseConnection, TransactionTrait};
use serde_json::json;
use solid_notify::{
    Config, NewNotice, Notifier, Outcome,
    crypto::Keys,
    def::{Channel, DefSpec, store},
};

const TXNS: usize = 5_000;
const BLOCK: usize = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let base = std::env::var("BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let admin = Database::connect(format!("{base}/postgres")).await?;
    admin
        .execute_unprepared("DROP DATABASE IF EXISTS sn_bench_enqueue WITH (FORCE)")
        .await?;
    admin
        .execute_unprepared("CREATE DATABASE sn_bench_enqueue")
        .await?;
    let mut opts = sea_orm::ConnectOptions::new(format!("{base}/sn_bench_enqueue"));
    opts.max_connections(8).sqlx_logging(false);
    let db = Database::connect(opts).await?;
    solid_notify::migrate(&db).await?;
    db.execute_unprepared(
        "CREATE TABLE bench_orders (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .await?;
    let spec = DefSpec::new("bench", Channel::Handler, json!({"handler": "noop"}));
    let mut ordered = DefSpec::new(
        "bench_ordered",
        Channel::Handler,
        json!({"handler": "noop"}),
    );
    ordered.ordering = "per_key".into();
    let mut sealed = DefSpec::new("bench_sealed", Channel::Handler, json!({"handler": "noop"}));
    sealed.encrypt = true;
    store::sync(&db, &[spec, ordered, sealed]).await?;

    let keys = Keys::new().with("bench", [42; 32])?;
    let build = |immediate: bool| {
        Notifier::builder(db.clone())
            .config(Config {
                // The receivers listen on 127.0.0.1.
                allow_private_network: true,
                immediate_attempt: immediate,
                keys: keys.clone(),
                ..Config::default()
            })
            .handler("noop", |_n| async { Ok(Outcome::success()) })
            .build()
    };
    let enqueue_only = build(false)?;
    let with_attempt = build(true)?;

    // Warm up connections, statement caches and the definition cache.
    for i in 0..200 {
        business(&db, i).await?;
        with_notice(&enqueue_only, i).await?;
        with_sealed_notice(&enqueue_only, i).await?;
    }

    let mut alone = Duration::ZERO;
    let mut enqueue = Duration::ZERO;
    let mut silent = Duration::ZERO;
    let mut attempted = Duration::ZERO;
    let mut raw = Duration::ZERO;
    let mut keyed = Duration::ZERO;
    let mut sealed = Duration::ZERO;
    for block in 0..TXNS / BLOCK {
        let t = Instant::now();
        for i in 0..BLOCK {
            business(&db, block * BLOCK + i).await?;
        }
        alone += t.elapsed();
        let t = Instant::now();
        for i in 0..BLOCK {
            with_notice(&enqueue_only, block * BLOCK + i).await?;
        }
        enqueue += t.elapsed();
        let t = Instant::now();
        for i in 0..BLOCK {
            with_sealed_notice(&enqueue_only, block * BLOCK + i).await?;
        }
        sealed += t.elapsed();
        // The same without the wake-up trigger: what NOTIFY costs.
        db.execute_unprepared("ALTER TABLE notify_msg DISABLE TRIGGER solid_notify_wake_insert")
            .await?;
        let t = Instant::now();
        for i in 0..BLOCK {
            with_notice(&enqueue_only, block * BLOCK + i).await?;
        }
        silent += t.elapsed();
        db.execute_unprepared("ALTER TABLE notify_msg ENABLE TRIGGER solid_notify_wake_insert")
            .await?;
        let t = Instant::now();
        for i in 0..BLOCK {
            with_notice(&with_attempt, block * BLOCK + i).await?;
        }
        attempted += t.elapsed();
        let t = Instant::now();
        for i in 0..BLOCK {
            extra_raw_insert(&db, block * BLOCK + i).await?;
        }
        raw += t.elapsed();
        // Ordered notices over KEYS keys, attempted after commit.
        let t = Instant::now();
        for i in 0..BLOCK {
            with_keyed_notice(&with_attempt, block * BLOCK + i).await?;
        }
        keyed += t.elapsed();
        settle(&db).await?;
    }
    // The database's transactions per ordered add, background ones (claims,
    // key checks) included: counted over a quiet window on each side, as
    // idle backends report their counts up to 10 s late.
    // PRODUCERS at once, as a burst of commits to busy keys comes.
    tokio::time::sleep(STATS_LAG).await;
    let before = xacts(&db).await?;
    let burst = Instant::now();
    let producers = (0..PRODUCERS).map(|p| {
        let notifier = with_attempt.clone();
        async move {
            for i in (p..COUNTED).step_by(PRODUCERS) {
                with_keyed_notice(&notifier, TXNS + i).await?;
            }
            Ok::<_, Box<dyn Error>>(())
        }
    });
    for done in futures::future::join_all(producers).await {
        done?;
    }
    let polls = settle(&db).await?;
    let burst = burst.elapsed();
    tokio::time::sleep(STATS_LAG).await;
    // Less this count's own first query and the polls of `settle`.
    let keyed_xacts = xacts(&db).await? - before - 1 - polls;

    let per = |d: Duration| d.as_secs_f64() * 1e6 / TXNS as f64;
    println!("{TXNS} transactions each, interleaved in blocks of {BLOCK}, PostgreSQL on 127.0.0.1");
    println!(
        "  business row alone              {:>8.1} µs/txn",
        per(alone)
    );
    println!(
        "  + add_notice (enqueue only)     {:>8.1} µs/txn  ratio {:.3}",
        per(enqueue),
        enqueue.as_secs_f64() / alone.as_secs_f64()
    );
    println!(
        "  + add_notice, encrypt = true    {:>8.1} µs/txn  ratio {:.3}  ({:.3}x the plain add, {:+.1} µs)",
        per(sealed),
        sealed.as_secs_f64() / alone.as_secs_f64(),
        sealed.as_secs_f64() / enqueue.as_secs_f64(),
        per(sealed) - per(enqueue)
    );
    println!(
        "  + add_notice, no NOTIFY trigger {:>8.1} µs/txn  ratio {:.3}  (NOTIFY costs {:.1} µs)",
        per(silent),
        silent.as_secs_f64() / alone.as_secs_f64(),
        per(enqueue) - per(silent)
    );
    println!(
        "  + one raw-SQL INSERT (floor)    {:>8.1} µs/txn  ratio {:.3}  (the cost of any extra statement)",
        per(raw),
        raw.as_secs_f64() / alone.as_secs_f64()
    );
    println!(
        "  + add_notice + after-commit     {:>8.1} µs/txn  ratio {:.3}  (no-op handler in background)",
        per(attempted),
        attempted.as_secs_f64() / alone.as_secs_f64()
    );
    println!(
        "  + ordered add_notice, {KEYS} keys   {:>8.1} µs/txn  ratio {:.3}  (after-commit on, no sweeper)",
        per(keyed),
        keyed.as_secs_f64() / alone.as_secs_f64(),
    );
    println!(
        "    the same, {PRODUCERS} producers at once: {:.0} adds/s, {:.2} database transactions per add, background ones included",
        COUNTED as f64 / burst.as_secs_f64(),
        keyed_xacts as f64 / COUNTED as f64
    );
    db.close().await?;
    admin
        .execute_unprepared("DROP DATABASE IF EXISTS sn_bench_enqueue WITH (FORCE)")
        .await?;
    Ok(())
}

async fn business(db: &DatabaseConnection, i: usize) -> Result<(), Box<dyn Error>> {
    let tx = db.begin().await?;
    insert_order(&tx, i).await?;
    tx.commit().await?;
    Ok(())
}

async fn extra_raw_insert(db: &DatabaseConnection, i: usize) -> Result<(), Box<dyn Error>> {
    let tx = db.begin().await?;
    insert_order(&tx, i).await?;
    tx.execute_raw(sea_orm::Statement::from_sql_and_values(
        tx.get_database_backend(),
        "INSERT INTO notify_msg (def_id, param, description) VALUES ($1, $2, $3) RETURNING id",
        [
            1i64.into(),
            format!("{{\"order\":{i}}}").into(),
            "bench".into(),
        ],
    ))
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn with_notice(notifier: &Notifier, i: usize) -> Result<(), Box<dyn Error>> {
    let tx = notifier.begin().await?;
    insert_order(&tx, i).await?;
    tx.add_notice("bench", &json!({"order": i}), "bench")
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn with_sealed_notice(notifier: &Notifier, i: usize) -> Result<(), Box<dyn Error>> {
    let tx = notifier.begin().await?;
    insert_order(&tx, i).await?;
    tx.add_notice("bench_sealed", &json!({"order": i}), "bench")
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Keys of the ordered variant.
const KEYS: usize = 10;
/// Ordered adds whose database transactions are counted.
const COUNTED: usize = 1_000;
/// Producers adding them at once.
const PRODUCERS: usize = 8;
/// How late an idle backend may report its transactions (PostgreSQL 15's
/// `PGSTAT_IDLE_INTERVAL`), and a margin.
const STATS_LAG: Duration = Duration::from_millis(11_000);

async fn with_keyed_notice(notifier: &Notifier, i: usize) -> Result<(), Box<dyn Error>> {
    let tx = notifier.begin().await?;
    insert_order(&tx, i).await?;
    tx.add(
        NewNotice::new("bench_ordered", &json!({"order": i}))
            .ordering_key(format!("customer-{}", i % KEYS)),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Committed transactions of this database so far (the statistics
/// collector's view, flushed first).
async fn xacts(db: &DatabaseConnection) -> Result<i64, Box<dyn Error>> {
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT pg_stat_force_next_flush(), xact_commit FROM pg_stat_database \
             WHERE datname = current_database()",
        ))
        .await?
        .ok_or("no pg_stat_database row")?;
    Ok(row.try_get_by_index::<i64>(1)?)
}

/// Waits until no notice is being sent (the background attempts have
/// ended); returns how many queries that took.
async fn settle(db: &DatabaseConnection) -> Result<i64, Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut polls = 0;
    loop {
        polls += 1;
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                "SELECT count(*) FROM notify_msg WHERE leased",
            ))
            .await?
            .ok_or("no count")?;
        if row.try_get_by_index::<i64>(0)? == 0 {
            return Ok(polls);
        }
        if Instant::now() > deadline {
            return Err("ordered notices still being sent after 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn insert_order(conn: &impl ConnectionTrait, i: usize) -> Result<(), sea_orm::DbErr> {
    conn.execute_raw(sea_orm::Statement::from_sql_and_values(
        conn.get_database_backend(),
        "INSERT INTO bench_orders (item, amount) VALUES ($1, $2)",
        [format!("item {i}").into(), (i as i64).into()],
    ))
    .await?;
    Ok(())
}
