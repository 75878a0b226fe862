//! The AMQP client: connections, publishing with confirms (cargo feature
//! `amqp`, lapin).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable},
};
use tokio::sync::Mutex;

use super::{AmqpConfig, EXCHANGE_CHECK_TTL, REPUBLISH_TRIES};
use crate::{
    def::AmqpTarget,
    handler::{Notice, Outcome},
};

struct Link {
    connection: Arc<Connection>,
    channel: Channel,
}

/// Declares the (durable) confirmation queue.
pub(crate) async fn declare_confirm_queue(channel: &Channel, queue: &str) -> Result<(), String> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map(drop)
        .map_err(|e| format!("cannot declare the confirmation queue `{queue}`: {e}"))
}

/// When an exchange was checked, and whether it exists.
type Checked = (Instant, Result<(), String>);

/// The shared publisher.
pub(crate) struct AmqpChannel {
    config: AmqpConfig,
    link: Mutex<Option<Link>>,
    /// Exchanges checked lately: when, and whether they exist.
    exchanges: std::sync::Mutex<HashMap<String, Checked>>,
}

impl AmqpChannel {
    pub fn new(config: &AmqpConfig) -> Self {
        AmqpChannel {
            config: config.clone(),
            link: Mutex::new(None),
            exchanges: std::sync::Mutex::default(),
        }
    }

    /// Whether a broker is configured.
    pub fn enabled(&self) -> bool {
        self.config.url.is_some()
    }

    /// Opens a connection (bounded by the connect timeout).
    pub async fn connect(config: &AmqpConfig) -> Result<Connection, String> {
        let url = config.url.as_deref().ok_or("no AMQP broker configured")?;
        // Parsed here: the client's own message for a URL it cannot read
        // quotes it whole, password included.
        let uri = url.parse::<lapin::uri::AMQPUri>().map_err(|_| {
            format!(
                "the AMQP URL {} is not valid: write amqp://USER:PASSWORD@HOST:PORT/VHOST",
                crate::redact::url(url)
            )
        })?;
        match tokio::time::timeout(
            config.connect_timeout,
            Connection::connect_uri(uri, ConnectionProperties::default()),
        )
        .await
        {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(format!(
                "cannot connect to the broker: {}",
                crate::redact::scrub(&e.to_string(), url)
            )),
            Err(_) => Err(format!(
                "cannot connect to the broker within {:?}",
                config.connect_timeout
            )),
        }
    }

    async fn channel(&self) -> Result<(Arc<Connection>, Channel), String> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref()
            && l.channel.status().connected()
        {
            return Ok((l.connection.clone(), l.channel.clone()));
        }
        *link = None;
        let connection = Self::connect(&self.config).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("cannot enable publisher confirms: {e}"))?;
        // The queue every message names in `reply_to` exists before any
        // consumer can answer, even if no listener has started yet.
        declare_confirm_queue(&channel, &self.config.confirm_queue).await?;
        let connection = Arc::new(connection);
        *link = Some(Link {
            connection: connection.clone(),
            channel: channel.clone(),
        });
        Ok((connection, channel))
    }

    /// Forgets the publishing channel if it is still `broken` (the next
    /// publish opens a fresh one).
    async fn reset(&self, broken: &Channel) {
        let mut link = self.link.lock().await;
        if link.as_ref().is_some_and(|l| l.channel.id() == broken.id()) {
            *link = None;
        }
    }

    /// Whether `exchange` exists, checked on a throwaway channel (a missing
    /// exchange closes the channel that asks).
    async fn check_exchange(&self, connection: &Connection, exchange: &str) -> Result<(), String> {
        if exchange.is_empty() {
            return Ok(()); // the default exchange always exists
        }
        let cached = self
            .exchanges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(exchange)
            .cloned();
        if let Some((at, known)) = cached {
            let ttl = if known.is_ok() {
                EXCHANGE_CHECK_TTL
            } else {
                Duration::from_secs(1)
            };
            if at.elapsed() < ttl {
                return known;
            }
        }
        let probe = connection
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let known = match probe
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                options,
                FieldTable::default(),
            )
            .await
        {
            Ok(()) => {
                probe.close(200, "checked".into()).await.ok();
                Ok(())
            }
            Err(e) if matches!(e.kind(), lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404) => {
                Err(format!("exchange `{exchange}` does not exist"))
            }
            Err(e) => return Err(format!("cannot check exchange `{exchange}`: {e}")),
        };
        self.exchanges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(exchange.to_string(), (Instant::now(), known.clone()));
        known
    }

    /// Publishes one attempt and waits for the broker's verdict.
    pub async fn publish(&self, target: &AmqpTarget, notice: &Notice, body: &str) -> Outcome {
        let properties = BasicProperties::default()
            .with_message_id(notice.id.to_string().into())
            .with_content_type(target.content_type.as_str().into())
            .with_delivery_mode(if target.persistent { 2 } else { 1 })
            .with_reply_to(self.config.confirm_queue.as_str().into())
            .with_headers(message_headers(target, notice));
        let options = BasicPublishOptions {
            mandatory: target.mandatory,
            ..BasicPublishOptions::default()
        };
        let mut lost = String::new();
        for _ in 0..REPUBLISH_TRIES {
            let (connection, channel) = match self.channel().await {
                Ok(link) => link,
                Err(reason) => return Outcome::retry(reason),
            };
            if let Err(reason) = self.check_exchange(&connection, &target.exchange).await {
                return Outcome::retry(reason);
            }
            let published = channel
                .basic_publish(
                    target.exchange.as_str().into(),
                    target.routing_key.as_str().into(),
                    options,
                    body.as_bytes(),
                    properties.clone(),
                )
                .await;
            let confirm = match published {
                Ok(confirm) => confirm.await,
                Err(e) => Err(e),
            };
            match confirm {
                Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => {
                    return Outcome::success();
                }
                Ok(Confirmation::Ack(Some(returned))) | Ok(Confirmation::Nack(Some(returned))) => {
                    return Outcome::retry(format!(
                        "returned by the broker: {} {}",
                        returned.reply_code, returned.reply_text
                    ));
                }
                Ok(Confirmation::Nack(None)) => return Outcome::retry("nacked by the broker"),
                Err(e) => {
                    // The channel closed before this message's verdict (another
                    // publish's error, a restart): not this notice's failure.
                    tracing::debug!(notice_id = notice.id, error = %e, "publish lost with its channel; publishing again");
                    lost = e.to_string();
                    self.reset(&channel).await;
                    // Check the exchange again: it may be this message's fault.
                    self.exchanges
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&target.exchange);
                }
            }
        }
        Outcome::retry(format!("AMQP publish failed: {lost}"))
    }
}

/// The message's headers: the trace's and the target's, then the notice's
/// attempt, definition, idempotency key and (of several) 1-based step.
fn message_headers(target: &AmqpTarget, notice: &Notice) -> FieldTable {
    let mut headers = FieldTable::default();
    for (name, value) in notice.trace_headers.iter().chain(&target.headers) {
        headers.insert(
            name.as_str().into(),
            AMQPValue::LongString(value.as_str().into()),
        );
    }
    headers.insert(
        "x-notice-attempt".into(),
        AMQPValue::LongLongInt(notice.attempt.into()),
    );
    headers.insert(
        "x-notice-def".into(),
        AMQPValue::LongString(notice.def.as_str().into()),
    );
    headers.insert(
        "x-idempotency-key".into(),
        AMQPValue::LongString(notice.idempotency_key.as_str().into()),
    );
    if notice.steps > 1 {
        headers.insert(
            "x-notice-step".into(),
            AMQPValue::LongLongInt(i64::from(notice.step) + 1),
        );
    }
    headers
}
