//! Confirm: finishing notices that wait for a confirmation (status 4).
//!
//! A definition with `need_confirm` leaves each successful send awaiting
//! confirmation until `max_confirm_delay` seconds have passed (0 = forever);
//! an AMQP publish awaits the broker's ack the same way. A confirmation moves
//! the notice to history as succeeded; a rejection is a failed attempt with
//! the given reason (retried on schedule, counted toward `max_retry_times`
//! and alerts); a deadline that passes is a failed attempt found by the
//! sweeper. Confirmations that come late, twice, or for an unknown id are
//! answered at once with what happened and change nothing.
//!
//! Confirm from code ([`Notifier::confirm`], [`Notifier::reject`], e.g. in an
//! HTTP callback endpoint), or by publishing to the confirmation queue a JSON
//! message `{"id": 42, "ok": true}` or `{"id": 42, "ok": false, "reason":
//! "…"}`; [`listen`] applies them (a [`Worker`](crate::Worker) runs it when a
//! broker is configured).

use std::time::Duration;

#[cfg(feature = "amqp")]
use futures::StreamExt;
#[cfg(feature = "amqp")]
use lapin::{
    options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions},
    types::FieldTable,
};
use sea_orm::{ColumnTrait, EntityTrait, ExprTrait, PaginatorTrait, QueryFilter, sea_query::Expr};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::{
    attempt::record,
    entity::{notify_msg, notify_msg_history, read::Unreadable},
    error::Result,
    handler::Outcome,
    notifier::Notifier,
    report::AttemptResult,
    state,
    status::Status,
};

/// What a confirmation or rejection did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "confirmation", rename_all = "snake_case")]
pub enum ConfirmOutcome {
    /// The notice was awaiting confirmation and is now in history as succeeded.
    Confirmed,
    /// The rejection was recorded as a failed attempt.
    Rejected(AttemptResult),
    /// The notice is in flight but not awaiting confirmation (the deadline
    /// passed and it waits for its resend, or it was never sent): ignored,
    /// at once.
    NotAwaiting {
        /// Its current status.
        status: Status,
    },
    /// The notice has already finished (a duplicate or late confirmation): ignored.
    AlreadyFinished {
        /// Its final status.
        status: Status,
    },
    /// No notice has this id: ignored.
    Unknown,
    /// The notice's row cannot be read as a notice (a plain-SQL
    /// producer's cell of another type): ignored; a claim parks it.
    Unreadable {
        /// Why, naming each cell.
        reason: String,
    },
    /// The notice's attempt is still running (a live claim: the
    /// confirmation came before the send was recorded) and did not finish
    /// within [`EARLY_CONFIRMATION_WAIT`]: nothing changed; send it again
    /// later (the listener hands such a message back to the queue).
    AttemptInProgress,
}

/// The one notice row `select` finds (of either table: their columns are
/// the same), decoded on its own: `Err` when it cannot be read as a notice.
async fn read_row<E: sea_orm::EntityTrait>(
    db: &impl sea_orm::ConnectionTrait,
    select: sea_orm::Select<E>,
) -> Result<Option<std::result::Result<notify_msg::Model, Unreadable>>> {
    let row = db
        .query_one(&sea_orm::QueryTrait::into_query(select))
        .await?;
    Ok(row.map(|row| crate::entity::read::notice(&row)))
}

/// A message on the confirmation queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmMessage {
    /// The notice id (the `message_id` of the published message).
    pub id: i64,
    /// `true` to confirm, `false` to reject.
    pub ok: bool,
    /// Why it was rejected.
    #[serde(default)]
    pub reason: Option<String>,
}

/// How long a confirmation that arrives while its notice's attempt is still
/// being recorded (a very fast consumer) waits for the attempt to finish.
pub const EARLY_CONFIRMATION_WAIT: Duration = Duration::from_secs(2);

impl Notifier {
    /// Confirms notice `id`.
    pub async fn confirm(&self, id: i64) -> Result<ConfirmOutcome> {
        self.confirm_or_reject(id, Ok(())).await
    }

    /// Rejects notice `id`: a failed attempt with `reason`.
    pub async fn reject(&self, id: i64, reason: &str) -> Result<ConfirmOutcome> {
        self.confirm_or_reject(id, Err(reason.to_string())).await
    }

    /// Applies a consumer's verdict; one that comes while the notice's
    /// attempt is still running (a live claim: a consumer faster than the
    /// attempt's own bookkeeping) waits up to [`EARLY_CONFIRMATION_WAIT`].
    async fn confirm_or_reject(
        &self,
        id: i64,
        verdict: std::result::Result<(), String>,
    ) -> Result<ConfirmOutcome> {
        let give_up = std::time::Instant::now() + EARLY_CONFIRMATION_WAIT;
        loop {
            let outcome = self.apply_confirmation(id, verdict.clone()).await?;
            if outcome != ConfirmOutcome::AttemptInProgress || std::time::Instant::now() >= give_up
            {
                return Ok(outcome);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether notice `id` is held by a live claim (by the database's clock).
    async fn claim_is_live(&self, id: i64) -> Result<bool> {
        let db = &self.store().db;
        let now = crate::state::clock::now(self.store().backend());
        Ok(notify_msg::Entity::find_by_id(id)
            .filter(notify_msg::Column::Leased.eq(true))
            .filter(Expr::col(notify_msg::Column::NextCallTime).gt(now))
            .count(db)
            .await?
            > 0)
    }

    /// Applies a verdict to notice `id` if it awaits confirmation.
    async fn apply_confirmation(
        &self,
        id: i64,
        verdict: std::result::Result<(), String>,
    ) -> Result<ConfirmOutcome> {
        let inner = &self.engine;
        let db = &inner.store.db;
        let mut tries = 0;
        let row = loop {
            let row = match read_row(db, notify_msg::Entity::find_by_id(id)).await? {
                Some(Ok(row)) => row,
                Some(Err(unreadable)) => {
                    return Ok(ConfirmOutcome::Unreadable {
                        reason: unreadable.reason(),
                    });
                }
                None => {
                    return Ok(
                        match read_row(db, notify_msg_history::Entity::find_by_id(id)).await? {
                            Some(Ok(done)) => ConfirmOutcome::AlreadyFinished {
                                status: done.status,
                            },
                            Some(Err(unreadable)) => ConfirmOutcome::Unreadable {
                                reason: unreadable.reason(),
                            },
                            None => ConfirmOutcome::Unknown,
                        },
                    );
                }
            };
            if row.status == Status::AwaitingConfirm {
                break row;
            }
            let live = self.claim_is_live(id).await?;
            // The attempt may have recorded its send between the two reads:
            // decide only on a row that stood still.
            let again = read_row(db, notify_msg::Entity::find_by_id(id)).await?;
            let moved = !matches!(&again, Some(Ok(a)) if a.version == row.version);
            tries += 1;
            if moved && tries < crate::db::CONFLICT_TRIES {
                continue;
            }
            return Ok(if live {
                ConfirmOutcome::AttemptInProgress
            } else {
                ConfirmOutcome::NotAwaiting { status: row.status }
            });
        };
        let status = row.status;
        match verdict {
            Ok(()) => Ok(match state::confirm::confirm(&inner.store, &row).await? {
                Ok(()) => ConfirmOutcome::Confirmed,
                Err(_lost) => ConfirmOutcome::NotAwaiting { status },
            }),
            Err(reason) => {
                let def = inner.defs.by_id(db, row.def_id).await?;
                let Some(lease) = state::claim::claim_one(&inner.store, &row).await? else {
                    return Ok(ConfirmOutcome::NotAwaiting { status });
                };
                let outcome =
                    crate::attempt::deliver::of_step(&def, &lease, Outcome::retry(reason));
                let recorded = record::record(
                    &self.engine,
                    &def,
                    lease,
                    outcome,
                    &inner.lifecycle.stop.give_up,
                )
                .await;
                let result = crate::attempt::background::follow_up(&self.engine, recorded);
                Ok(match result {
                    AttemptResult::LostClaim => ConfirmOutcome::NotAwaiting { status },
                    other => ConfirmOutcome::Rejected(other),
                })
            }
        }
    }
}

/// Consumes the confirmation queue and applies each message until `shutdown`,
/// reconnecting by itself when the broker goes away. Malformed messages are
/// logged and dropped; nothing here ends the loop but `shutdown`.
pub async fn listen(notifier: Notifier, shutdown: CancellationToken) {
    // Without the `amqp` feature no broker is ever enabled.
    #[cfg(not(feature = "amqp"))]
    let _ = (notifier, shutdown);
    #[cfg(feature = "amqp")]
    listen_amqp(notifier, shutdown).await;
}

#[cfg(feature = "amqp")]
async fn listen_amqp(notifier: Notifier, shutdown: CancellationToken) {
    let config = notifier.config().amqp.clone();
    if config.url.is_none() {
        return;
    }
    while !shutdown.is_cancelled() {
        let run = tokio::select! {
            run = consume(&notifier, &config, &shutdown) => run,
            _ = shutdown.cancelled() => Ok(()),
        };
        if let Err(e) = run {
            tracing::warn!(error = %e, queue = %config.confirm_queue, "confirmation listener interrupted; reconnecting");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}

#[cfg(feature = "amqp")]
async fn consume(
    notifier: &Notifier,
    config: &crate::channel::amqp::AmqpConfig,
    shutdown: &CancellationToken,
) -> std::result::Result<(), String> {
    let connection = crate::channel::amqp::AmqpChannel::connect(config).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let queue = config.confirm_queue.as_str();
    crate::channel::amqp::declare_confirm_queue(&channel, queue).await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "solid-notify-confirm".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let delivery = tokio::select! {
            next = consumer.next() => next,
            _ = shutdown.cancelled() => return Ok(()),
        };
        let delivery = match delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("the broker closed the consumer".into()),
        };
        match serde_json::from_slice::<ConfirmMessage>(&delivery.data) {
            Ok(message) => {
                let verdict = if message.ok {
                    Ok(())
                } else {
                    Err(message
                        .reason
                        .unwrap_or_else(|| "rejected by the consumer".into()))
                };
                match notifier.confirm_or_reject(message.id, verdict).await {
                    Ok(ConfirmOutcome::AttemptInProgress) => {
                        // Too early: hand it back to the queue for later.
                        delivery
                            .nack(BasicNackOptions {
                                requeue: true,
                                ..BasicNackOptions::default()
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                        continue;
                    }
                    Ok(outcome) => {
                        tracing::info!(notice_id = message.id, ?outcome, "confirmation applied")
                    }
                    Err(e) => {
                        // Not acked: the broker redelivers it after we reconnect.
                        return Err(format!("applying confirmation of {}: {e}", message.id));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "dropping a malformed confirmation message"),
        }
        delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    }
}
