//! # solid-notify
//!
//! Reliable notifications after commit: the transactional outbox for sea-orm.
//!
//! A producer adds a notice inside its own transaction ([`NoticeTx`], from
//! [`Notifier::begin`] or [`Notifier::wrap`]); the notice row (`notify_msg`)
//! commits with the business data or not at all. Right after the commit
//! the notice is attempted once in-process; a [`Worker`] sweeps for
//! everything else: retries, and notices written with plain SQL by
//! producers in any language. Every attempt claims its row with an
//! optimistic version check and a lease from the database's clock,
//! delivers it through its channel (HTTP, AMQP, e-mail) or a Rust
//! [`Handler`] within its timeout, and records the outcome. Failures are
//! retried on the schedule of the notice's definition ([`def`]); past its
//! retries a notice is a final failure, raises an alert ([`AlertHook`]),
//! and moves to `notify_msg_history` like every finished notice, where the
//! operator calls ([`ops`], the CLI, the [`dashboard`]) find and replay it.
//!
//! ```no_run
//! # async fn run() -> Result<(), solid_notify::Error> {
//! use solid_notify::{Notifier, Outcome, def::DefSpec};
//! let db = sea_orm::Database::connect("sqlite://notify.db?mode=rwc").await?;
//! solid_notify::migrate(&db).await?;
//! solid_notify::def::sync(&db, &[DefSpec::handler("order_paid", "ship")]).await?;
//! let notifier = Notifier::builder(db)
//!     .handler("ship", |n: solid_notify::Notice| async move {
//!         println!("shipping order {}", n.param["order"]);
//!         Ok(Outcome::success())
//!     })
//!     .build()?;
//! let tx = notifier.begin().await?;
//! // … business writes on `&tx` …
//! tx.add_notice("order_paid", &serde_json::json!({"order": 42}), "web checkout").await?;
//! tx.commit().await?; // the notice is attempted once the commit succeeded
//! # Ok(()) }
//! ```
//!
//! ## The API
//!
//! - Producing: [`Notifier`], [`NotifierBuilder`], [`Config`], [`NoticeTx`],
//!   [`NewNotice`], and what an attempt reports ([`AttemptReport`]).
//! - Delivering: [`Handler`], [`Notice`], [`Outcome`]; [`Worker`] and
//!   [`WorkerConfig`]; [`pool_options`] and [`connect`] for a pool that
//!   survives network partitions; [`migrate`].
//! - Definitions as code: [`def`].
//! - Operating: [`ops`] (methods on [`Notifier`]), the [`dashboard`] and
//!   [`telemetry`] (metrics, `/healthz`, `/readyz`).
//!
//! Modules hidden from these pages are public only for the `solid-notify`
//! binary, the tests and the benchmarks: they are not part of the API.
//!
//! ## Cargo features
//!
//! `postgres`, `sqlite`, `http` and `email` by default; `full` turns on
//! every feature. The outbox, the workers, the [`ops`] calls and the
//! handler channel need only the database they run on. A definition whose
//! channel is compiled out is left to a process built with it; a database
//! whose feature is off is refused ([`Error::BackendNotCompiled`]) by
//! [`NotifierBuilder::build`], [`migrate`] and [`connect`].
//!
//! | feature | adds |
//! |---|---|
//! | `postgres` (default) | PostgreSQL (sqlx-postgres): notices sent with the `COMMIT`, `LISTEN` wake-ups |
//! | `sqlite` (default) | SQLite (sqlx-sqlite) |
//! | `http` (default) | the HTTP channel, signed webhooks (reqwest) |
//! | `email` (default) | the e-mail channel and alert e-mails (lettre's transports) |
//! | `mysql` | MySQL and MariaDB (sqlx-mysql) |
//! | `amqp` | the AMQP channel and the confirmation listener (lapin) |
//! | `encrypt` | params of definitions with `encrypt = true` sealed at rest ([`Keys`]; chacha20poly1305) |
//! | `cli` | the `solid-notify` binary (clap, tracing-subscriber) |
//! | `dashboard` | `dashboard`: the operator pages and JSON API (axum, maud) |
//! | `metrics` | `telemetry::serve_metrics`: a Prometheus endpoint with `/healthz` and `/readyz`; the counters go through the `metrics` facade either way |
//! | `otel` | the producer's OpenTelemetry span context, linked to each attempt; without it a stored `traceparent` is still passed on |

// Layers: each floor imports only its own floor and those below (checked
// by `.ci/import_circles.py`, with no circle and no import through this
// root): 1 leaves (status, error, handler, schedule, trace, db, entity,
// report, counters, schema); 2 def; 3 state, the only writer; 4 alert, event and
// the definition cache; 5 channel; 6 config; 7 attempt, whose engine holds
// what every attempt needs; 8 circuit's controller; 9 Notifier, the
// facade; 10 producer, sweep, confirm, ops; 11 telemetry, worker; 12 the
// dashboard and the binary.

// The public surface: the items re-exported below and the modules `def`,
// `ops`, `dashboard` and `telemetry`. The modules marked `doc(hidden)`
// are public only for the `solid-notify` binary, the tests and the
// benchmarks: they are not part of the API and change in any release.
#[doc(hidden)]
pub mod alert;
#[doc(hidden)]
pub mod attempt;
#[doc(hidden)]
pub mod channel;
#[doc(hidden)]
pub mod circuit;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod confirm;
mod counters;
#[doc(hidden)]
pub mod crypto;
#[cfg(feature = "dashboard")]
pub mod dashboard;
mod db;
pub mod def;
#[doc(hidden)]
pub mod entity;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod event;
#[doc(hidden)]
pub mod handler;
#[cfg(any(feature = "dashboard", feature = "metrics"))]
mod listener;
#[doc(hidden)]
pub mod load_balance;
mod notifier;
pub mod ops;
#[doc(hidden)]
pub mod producer;
#[doc(hidden)]
pub mod redact;
mod report;
#[doc(hidden)]
pub mod schedule;
mod schema;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod stats;
mod status;
#[doc(hidden)]
pub mod sweep;
pub mod telemetry;
#[doc(hidden)]
pub mod trace;
#[doc(hidden)]
pub mod worker;

pub use alert::{AlertHook, FailureEvent};
pub use attempt::PendingNotice;
pub use channel::{amqp::AmqpConfig, mail::MailConfig};
pub use config::Config;
pub use confirm::ConfirmOutcome;
pub use crypto::{CryptoError, Keys};
pub use error::{DefinitionError, Error, Result};
pub use handler::{BoxError, Handler, Notice, Outcome};
pub use load_balance::LoadBalance;
pub use notifier::{HARD_STOP_MARGIN, RELEASE_GRACE};
pub use notifier::{Notifier, NotifierBuilder};
pub use producer::MAX_DELAY;
pub use producer::{NewNotice, NoticeTx};
pub use report::{AttemptReport, AttemptResult};
pub use schema::{
    DatabaseCheck, MIGRATION_LOCK_PAUSE, MIGRATION_LOCK_TIMEOUT, MIGRATION_LOCK_TRIES,
};
pub use status::{Origin, Status};
pub use worker::{
    ListenUrl, Worker, WorkerConfig, WorkerMode, connect, connect_with, pool_options,
};

// The README's example, compiled and run by `cargo test --doc` (on SQLite).
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

/// Runs solid-notify's migrations (its own tracking table,
/// `solid_notify_migrations`): creates or upgrades its tables. A database
/// a pre-release build migrated is adopted first (ADR 0013).
///
/// On PostgreSQL each migration waits at most
/// [`MIGRATION_LOCK_TIMEOUT`] (2 s) for a
/// table's lock, so that it never holds producers queued behind it for
/// longer; one that could not take it rolls back and is tried again, up to
/// 30 times, 2 s apart.
///
/// Fails with [`Error::BackendNotCompiled`] when the connection's database
/// has no cargo feature in this build.
pub async fn migrate(db: &sea_orm::DatabaseConnection) -> Result<()> {
    db::check_backend(db.get_database_backend())?;
    if migration::adopt_pre_release(db).await? {
        tracing::info!(
            "adopted a database of the pre-release migrations: recorded as the baseline"
        );
    }
    schema::migrate::<migration::Migrator>(db, schema::MIGRATION_LOCK_TIMEOUT).await
}

/// [`migrate`]'s runner for any migrator `M`, with its lock timeout on
/// PostgreSQL: for the migration checks of the tests.
#[doc(hidden)]
pub async fn migrate_with<M: migration::MigratorTrait>(
    db: &sea_orm::DatabaseConnection,
    lock_timeout: std::time::Duration,
) -> Result<()> {
    schema::migrate::<M>(db, lock_timeout).await
}
