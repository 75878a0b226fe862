//! # solid-notify
//!
//! Reliable notifications after commit: the transactional outbox for sea-orm.
//!
//! A producer adds a notice inside its own transaction ([`NoticeTx`]); the
//! notice row (`notify_msg`) commits with the business data or not at all.
//! Right after the commit the notice is attempted once in-process; a
//! [`worker`] runs [`sweep`]s for everything else. Every attempt, then and
//! later, takes the one [`attempt`] path: claim the row with an optimistic
//! version check and a lease from the database's clock, deliver it through
//! its [`channel`] or Rust [`handler`] within its timeout, record the
//! outcome. Failures are retried on the schedule of the notice's
//! [`def`]inition ([`schedule`]); past its retries a notice is a final
//! failure, raises an [`alert`], and moves to `notify_msg_history` like every
//! finished notice. One module, [`state`], writes the notice tables: every
//! transition is a guarded statement that names the version it expects.
//!
//! ```no_run
//! # async fn run() -> Result<(), solid_notify::Error> {
//! use solid_notify::{Notifier, Outcome};
//! let db = sea_orm::Database::connect("sqlite://notify.db?mode=rwc").await?;
//! solid_notify::migrate(&db).await?;
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
//! ## Cargo features
//!
//! All on by default; the outbox, the workers, the [`ops`] calls and the
//! handler channel need only the database they run on. A definition whose
//! channel is compiled out is left to a process built with it; a database
//! whose feature is off is refused ([`Error::BackendNotCompiled`]) by
//! [`NotifierBuilder::build`], [`migrate`] and [`worker::connect`].
//!
//! | feature | adds |
//! |---|---|
//! | `postgres` | PostgreSQL (sqlx-postgres): notices sent with the `COMMIT`, `LISTEN` wake-ups |
//! | `mysql` | MySQL and MariaDB (sqlx-mysql) |
//! | `sqlite` | SQLite (sqlx-sqlite) |
//! | `http` | the HTTP channel, signed webhooks (reqwest) |
//! | `amqp` | the AMQP channel and the confirmation listener (lapin) |
//! | `email` | the e-mail channel and alert e-mails (lettre's transports) |
//! | `encrypt` | params of definitions with `encrypt = true` sealed at rest ([`crypto`]; chacha20poly1305) |
//! | `cli` | the `solid-notify` binary (clap, tracing-subscriber) |
//! | `dashboard` | `dashboard`: the operator pages and JSON API (axum, maud) |
//! | `metrics` | `telemetry::serve_metrics`, a Prometheus endpoint; the counters go through the `metrics` facade either way |
//! | `otel` | [`trace`]: the producer's OpenTelemetry span context, linked to each attempt; without it a stored `traceparent` is still passed on |

//! ## Layers
//!
//! Each floor imports only its own floor and those below (checked by
//! `.ci/import_circles.py`, with no circle and no import through this
//! root): 1 leaves (status, error, handler, schedule, trace, db, entity,
//! report, counters); 2 [`def`]; 3 [`state`], the only writer; 4 [`alert`],
//! [`event`] and the definition cache; 5 [`channel`]; 6 [`config`]; 7 [`attempt`],
//! whose engine holds what every attempt needs; 8 [`circuit`]'s controller;
//! 9 [`Notifier`], the facade; 10 [`producer`], [`sweep`], [`confirm`],
//! [`ops`]; 11 [`telemetry`], [`worker`]; 12 the dashboard and the binary.

pub mod alert;
pub mod attempt;
pub mod channel;
pub mod circuit;
pub mod config;
pub mod confirm;
mod counters;
pub mod crypto;
#[cfg(feature = "dashboard")]
pub mod dashboard;
mod db;
pub mod def;
pub mod entity;
pub mod error;
pub mod event;
pub mod handler;
#[cfg(any(feature = "dashboard", feature = "metrics"))]
mod listener;
pub mod load_balance;
mod notifier;
pub mod ops;
pub mod producer;
pub mod redact;
mod report;
pub mod schedule;
pub mod state;
pub mod stats;
mod status;
pub mod sweep;
pub mod telemetry;
pub mod trace;
pub mod worker;

pub use alert::{AlertHook, FailureEvent};
pub use attempt::{AttemptReport, AttemptResult, PendingNotice};
pub use config::Config;
pub use error::{DefinitionError, Error, Result};
pub use handler::{BoxError, Handler, Notice, Outcome};
pub use load_balance::LoadBalance;
pub use notifier::{HARD_STOP_MARGIN, Notifier, NotifierBuilder, RELEASE_GRACE};
pub use producer::{MAX_DELAY, NewNotice, NoticeTx};
pub use status::Status;
pub use worker::{Worker, WorkerConfig};

/// Runs solid-notify's migrations (its own tracking table,
/// `solid_notify_migrations`): creates or upgrades the three tables.
///
/// Fails with [`Error::BackendNotCompiled`] when the connection's database
/// has no cargo feature in this build.
pub async fn migrate(db: &sea_orm::DatabaseConnection) -> Result<()> {
    use migration::MigratorTrait;
    db::check_backend(db.get_database_backend())?;
    migration::Migrator::up(db, None).await?;
    Ok(())
}
