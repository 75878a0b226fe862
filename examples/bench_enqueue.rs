//! Benchmark: what `add_notice` adds to a business transaction.
//!
//! On PostgreSQL, runs 5,000 one-row business transactions alone and 5,000
//! with one `add_notice` each, interleaved in blocks of 100 so drift hits both
//! equally, and prints the per-transaction cost and the ratio. Two notice
//! variants run: enqueue only (no after-commit attempt), and enqueue with the
//! after-commit attempt of a no-op handler running in the background. A third
//! variant adds one hand-written INSERT into `notify_msg` instead: the floor
//! any outbox pays for writing its row in the caller's transaction.
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
    Config, Notifier, Outcome,
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
    store::sync(&db, &[spec]).await?;

    let build = |immediate: bool| {
        Notifier::builder(db.clone())
            .config(Config {
                immediate_attempt: immediate,
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
    }

    let mut alone = Duration::ZERO;
    let mut enqueue = Duration::ZERO;
    let mut silent = Duration::ZERO;
    let mut attempted = Duration::ZERO;
    let mut raw = Duration::ZERO;
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
    }

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

async fn insert_order(conn: &impl ConnectionTrait, i: usize) -> Result<(), sea_orm::DbErr> {
    conn.execute_raw(sea_orm::Statement::from_sql_and_values(
        conn.get_database_backend(),
        "INSERT INTO bench_orders (item, amount) VALUES ($1, $2)",
        [format!("item {i}").into(), (i as i64).into()],
    ))
    .await?;
    Ok(())
}
