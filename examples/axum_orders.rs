//! An axum service whose orders and their notices commit together.
//!
//! `POST /orders` with `{"item": "lamp", "qty": 2, "gift_note": "Happy birthday!"}`
//! (`gift_note` optional) writes a row into the application's own `orders`
//! table and adds an `order_placed` notice in one transaction
//! (`Notifier::begin`), answering `201 {"id": …, "gift_wrap": …}`. A gift
//! note runs an optional gift-wrap step in a nested transaction (a
//! savepoint): it records the note and adds a `gift_wrap` notice, then
//! rolls back when the note does not fit on the card
//! ([`CARD_MAX_CHARS`]). The order and its notice still commit; the
//! gift-wrap notice is never stored nor sent.
//!
//! Both definitions deliver over HTTP to the URL in `ORDER_WEBHOOK_URL` (or
//! the first argument); they are synced from code at start. The notice is
//! attempted right after the commit, and a [`Worker`] in the same process
//! retries what failed. SIGTERM or Ctrl-C stops accepting requests, stops
//! the worker, shuts the notifier down and exits 0.
//!
//! Environment:
//! - `DATABASE_URL`: `postgres://…` or `mysql://…`; default a SQLite file
//!   in the temporary directory.
//! - `LISTEN`: the address to listen on, default `127.0.0.1:3000` (port 0
//!   picks a free one). The bound address is printed on stdout as
//!   `listening on http://ADDR`.
//! - `ORDER_WEBHOOK_URL`: where the notices go, default
//!   `http://127.0.0.1:9000/orders`.
//!
//! Run: `cargo run --example axum_orders`, then
//! `curl -i -X POST localhost:3000/orders -H 'content-type: application/json' -d '{"item":"lamp","qty":2}'`

use std::{error::Error, net::SocketAddr, time::Duration};

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait};
use serde::Deserialize;
use serde_json::json;
use solid_notify::{
    NewNotice, NoticeTx, Notifier, Worker, WorkerConfig,
    def::{self, Channel, DefSpec},
};
use tokio_util::sync::CancellationToken;

/// The longest gift note the card printer takes; a longer one rolls the
/// gift-wrap step back (and only that step).
const CARD_MAX_CHARS: usize = 40;
/// Connections of the pool shared by the requests and the worker.
const POOL_SIZE: u32 = 10;
/// How long running deliveries may finish at shutdown.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The body of `POST /orders`.
#[derive(Debug, Deserialize)]
struct NewOrder {
    item: String,
    qty: i32,
    gift_note: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // Logs go to stderr; stdout has the `listening on` line.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // Signals are watched from the start: one that comes while the service
    // is starting still shuts it down gracefully.
    let signal = shutdown_signal()?;

    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("solid-notify-axum-orders.db");
        format!("sqlite://{}?mode=rwc", path.display())
    });
    let webhook = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("ORDER_WEBHOOK_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:9000/orders".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());

    // The pool a worker opens (bounded pings and waits), with room for the
    // requests' transactions and the worker at once: sea-orm gives SQLite
    // a single connection unless told otherwise, and a transaction holding
    // it would leave the worker (and a definition lookup waiting for the
    // worker's) stuck until `Config::db_timeout`.
    let mut options = solid_notify::pool_options(url.as_str());
    options.max_connections(POOL_SIZE);
    let db = solid_notify::connect_with(options, std::time::Duration::from_secs(5)).await?;
    solid_notify::migrate(&db).await?; // solid-notify's own tables
    create_orders_table(&db).await?; // the application's table

    // The definitions, from code. A definitions file works the same way:
    // `solid_notify::def::load_dir(path)?`, then sync each `.spec` (or
    // `solid-notify defs sync` at deploy time).
    let target = json!({
        "url": webhook,
        // Requests go to public addresses only, unless allowed: the
        // example's receiver (and the test's) listens on 127.0.0.1. This
        // lifts the guard for this definition's own URL only (never for a
        // notice's override to another origin); drop it once the URL is a
        // public one.
        "allow_private_network": true,
    });
    let mut specs = Vec::new();
    for (name, description) in [
        ("order_placed", "an order was placed"),
        ("gift_wrap", "an order is to be gift-wrapped"),
    ] {
        let mut spec = DefSpec::new(name, Channel::Http, target.clone());
        spec.retry_interval = "5s,1m,10m,1h".into();
        spec.description = description.into();
        specs.push(spec);
    }
    def::sync(&db, &specs).await?;

    let notifier = Notifier::builder(db).build()?;

    // A worker in this process: retries, and notices whose after-commit
    // attempt did not finish.
    let worker = Worker::new(
        notifier.clone(),
        WorkerConfig {
            shutdown_timeout: SHUTDOWN_TIMEOUT,
            ..WorkerConfig::default()
        },
    )?;
    let worker_stop = CancellationToken::new();
    let worker_task = tokio::spawn({
        let stop = worker_stop.clone();
        async move { worker.run(stop).await }
    });

    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(notifier.clone());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("notices go to {webhook}");

    // 1. Stop accepting requests; requests under way finish (their
    //    after-commit attempts run on).
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await?;
    // 2. Stop the worker: running deliveries finish, or are released.
    worker_stop.cancel();
    worker_task.await??;
    // 3. Let the after-commit attempts finish, or release their rows.
    let released = notifier.shutdown(SHUTDOWN_TIMEOUT).await?;
    println!("stopped ({released} notices released for the next start)");
    Ok(())
}

/// `POST /orders`: the order and its notices in one transaction.
async fn create_order(
    State(notifier): State<Notifier>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let item = order.item.trim();
    if item.is_empty() || item.chars().count() > 200 {
        return Err(ApiError::Invalid("item: 1 to 200 characters"));
    }
    if !(1..=1000).contains(&order.qty) {
        return Err(ApiError::Invalid("qty: 1 to 1000"));
    }
    if order
        .gift_note
        .as_ref()
        .is_some_and(|n| n.chars().count() > 500)
    {
        return Err(ApiError::Invalid("gift_note: at most 500 characters"));
    }

    let tx = notifier.begin().await?; // a sea-orm transaction
    let id = insert_order(&tx, item, order.qty).await?;
    tx.add(
        NewNotice::new(
            "order_placed",
            &json!({"order": id, "item": item, "qty": order.qty}),
        )
        .description("POST /orders")
        // Receivers get it as `Idempotency-Key`, to drop a repeated delivery.
        .idempotency_key(format!("order-{id}")),
    )
    .await?;

    let mut gift_wrap = false;
    if let Some(note) = &order.gift_note {
        // A nested transaction: a savepoint, and a `NoticeTx` too.
        let gift = tx.begin().await?;
        let backend = gift.get_database_backend();
        let sql = match backend {
            DbBackend::Postgres => "UPDATE orders SET gift_note = $1 WHERE id = $2",
            _ => "UPDATE orders SET gift_note = ? WHERE id = ?",
        };
        let values = [note.as_str().into(), id.into()];
        gift.execute_raw(Statement::from_sql_and_values(backend, sql, values))
            .await?;
        gift.add_notice(
            "gift_wrap",
            &json!({"order": id, "gift_note": note}),
            "POST /orders, gift wrap",
        )
        .await?;
        if note.chars().count() <= CARD_MAX_CHARS {
            gift.commit().await?; // released into `tx`: goes with its commit
            gift_wrap = true;
        } else {
            // Takes back the note and the `gift_wrap` notice, nothing else:
            // that notice is never stored nor sent.
            gift.rollback().await?;
        }
    }

    tx.commit().await?; // then the notices are attempted at once
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "gift_wrap": gift_wrap})),
    ))
}

/// Creates the application's `orders` table (if missing), one statement
/// per backend: only the auto-increment key differs.
async fn create_orders_table(db: &DatabaseConnection) -> Result<(), DbErr> {
    let id = match db.get_database_backend() {
        DbBackend::Postgres => "id BIGSERIAL PRIMARY KEY",
        DbBackend::MySql => "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        _ => "id INTEGER PRIMARY KEY AUTOINCREMENT",
    };
    db.execute_unprepared(&format!(
        "CREATE TABLE IF NOT EXISTS orders ({id}, item VARCHAR(200) NOT NULL, \
         qty INTEGER NOT NULL, gift_note VARCHAR(500) NULL)"
    ))
    .await?;
    Ok(())
}

/// Inserts an order and returns its id (`RETURNING` on PostgreSQL and
/// SQLite, the last insert id on MySQL/MariaDB).
async fn insert_order(tx: &NoticeTx, item: &str, qty: i32) -> Result<i64, DbErr> {
    let backend = tx.get_database_backend();
    let values = [item.into(), qty.into()];
    let sql = match backend {
        DbBackend::MySql => {
            let sql = "INSERT INTO orders (item, qty) VALUES (?, ?)";
            let done = tx
                .execute_raw(Statement::from_sql_and_values(backend, sql, values))
                .await?;
            return i64::try_from(done.last_insert_id())
                .map_err(|e| DbErr::Custom(format!("order id: {e}")));
        }
        DbBackend::Postgres => "INSERT INTO orders (item, qty) VALUES ($1, $2) RETURNING id",
        _ => "INSERT INTO orders (item, qty) VALUES (?, ?) RETURNING id",
    };
    let row = tx
        .query_one_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
        .ok_or_else(|| DbErr::Custom("the insert returned no id".into()))?;
    row.try_get_by_index::<i64>(0)
}

/// What a request can fail with.
#[derive(Debug)]
enum ApiError {
    /// The body does not make an order: 422, nothing written.
    Invalid(&'static str),
    /// The database or the outbox failed: 500, the transaction rolled back
    /// (dropped), nothing stored nor sent.
    Internal(String),
}

impl From<solid_notify::Error> for ApiError {
    fn from(e: solid_notify::Error) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<DbErr> for ApiError {
    fn from(e: DbErr) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Invalid(problem) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"error": problem})),
            )
                .into_response(),
            ApiError::Internal(problem) => {
                tracing::error!("POST /orders failed: {problem}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(json!({"error": "internal error"})),
                )
                    .into_response()
            }
        }
    }
}

/// Resolves at the first SIGTERM or Ctrl-C (SIGINT). The handlers are
/// installed at once, when this is called, not when it is first awaited.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "Ctrl-C",
            };
            println!("{which}: shutting down");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                println!("Ctrl-C: shutting down");
            }
        })
    }
}
