//! AMQP: a notice is a message published to RabbitMQ (lapin), confirmed
//! asynchronously.
//!
//! One long-lived connection with one publishing channel in confirm mode is
//! opened on first use and reopened by itself after the broker restarts or the
//! connection drops; publishing while the broker is unreachable is a
//! retryable failure, never a hang (connecting is bounded by
//! [`AmqpConfig::connect_timeout`]). A publish does not wait for the broker:
//! the notice becomes "awaiting confirmation" (status 4) and the broker's ack
//! later finishes it, while a nack, or a `mandatory` message returned as
//! unroutable, is a failed attempt.
//!
//! The message carries the notice id as `message_id`, headers
//! `x-notice-attempt`, `x-notice-def` and `x-idempotency-key` (plus the
//! target's), and `reply_to` naming the confirmation queue, where a consumer
//! can confirm or reject the notice (see [`crate::confirm`]).

use std::time::Duration;

use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
    options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable},
};
use tokio::sync::Mutex;

use crate::{
    def::AmqpTarget,
    handler::{Notice, Outcome},
};

/// Environment variable with the broker URL (unset: AMQP disabled).
pub const ENV_AMQP_URL: &str = "SOLID_NOTIFY_AMQP_URL";
/// Environment variable naming the confirmation queue.
pub const ENV_CONFIRM_QUEUE: &str = "SOLID_NOTIFY_CONFIRM_QUEUE";
/// Default confirmation queue.
pub const DEFAULT_CONFIRM_QUEUE: &str = "solid_notify.confirm";
/// Default [`AmqpConfig::connect_timeout`]: 5 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where AMQP notices go and where confirmations come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// Broker URL, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`; `None`
    /// disables the channel. Default: `$SOLID_NOTIFY_AMQP_URL`.
    pub url: Option<String>,
    /// Queue consumers send confirmations to (named in every message's
    /// `reply_to`). Default: `$SOLID_NOTIFY_CONFIRM_QUEUE`, else
    /// [`DEFAULT_CONFIRM_QUEUE`].
    pub confirm_queue: String,
    /// Longest wait for a connection. Default [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            url: std::env::var(ENV_AMQP_URL).ok().filter(|u| !u.is_empty()),
            confirm_queue: std::env::var(ENV_CONFIRM_QUEUE)
                .unwrap_or_else(|_| DEFAULT_CONFIRM_QUEUE.into()),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// The broker's verdict on one publish, awaited after the attempt is recorded.
pub(crate) struct BrokerConfirm(PublisherConfirm);

impl BrokerConfirm {
    /// `Ok` when the broker took the message; `Err(reason)` otherwise.
    pub async fn verdict(self) -> Result<(), String> {
        match self.0.await {
            Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) | Ok(Confirmation::Nack(Some(returned))) => {
                Err(format!(
                    "returned by the broker: {} {}",
                    returned.reply_code, returned.reply_text
                ))
            }
            Ok(Confirmation::Nack(None)) => Err("nacked by the broker".into()),
            Err(e) => Err(format!("broker confirmation lost: {e}")),
        }
    }
}

struct Link {
    _connection: Connection,
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

/// The shared publisher.
pub(crate) struct AmqpChannel {
    config: AmqpConfig,
    link: Mutex<Option<Link>>,
}

impl AmqpChannel {
    pub fn new(config: &AmqpConfig) -> Self {
        AmqpChannel {
            config: config.clone(),
            link: Mutex::new(None),
        }
    }

    /// Whether a broker is configured.
    pub fn enabled(&self) -> bool {
        self.config.url.is_some()
    }

    /// The configuration in force.
    pub fn config(&self) -> &AmqpConfig {
        &self.config
    }

    /// Opens a connection (bounded by the connect timeout).
    pub async fn connect(config: &AmqpConfig) -> Result<Connection, String> {
        let url = config.url.as_deref().ok_or("no AMQP broker configured")?;
        match tokio::time::timeout(
            config.connect_timeout,
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(format!("cannot connect to the broker: {e}")),
            Err(_) => Err(format!(
                "cannot connect to the broker within {:?}",
                config.connect_timeout
            )),
        }
    }

    async fn channel(&self) -> Result<Channel, String> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref()
            && l.channel.status().connected()
        {
            return Ok(l.channel.clone());
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
        *link = Some(Link {
            _connection: connection,
            channel: channel.clone(),
        });
        Ok(channel)
    }

    /// Publishes one attempt; on success the broker's verdict comes later.
    pub async fn publish(
        &self,
        target: &AmqpTarget,
        notice: &Notice,
        body: &str,
    ) -> (Outcome, Option<BrokerConfirm>) {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(reason) => return (Outcome::retry(reason), None),
        };
        let mut headers = FieldTable::default();
        for (name, value) in &target.headers {
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
        let properties = BasicProperties::default()
            .with_message_id(notice.id.to_string().into())
            .with_content_type(target.content_type.as_str().into())
            .with_delivery_mode(if target.persistent { 2 } else { 1 })
            .with_reply_to(self.config.confirm_queue.as_str().into())
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: target.mandatory,
            ..BasicPublishOptions::default()
        };
        match channel
            .basic_publish(
                target.exchange.as_str().into(),
                target.routing_key.as_str().into(),
                options,
                body.as_bytes(),
                properties,
            )
            .await
        {
            Ok(confirm) => (Outcome::success(), Some(BrokerConfirm(confirm))),
            Err(e) => {
                // The link is broken; the next publish reconnects.
                *self.link.lock().await = None;
                (Outcome::retry(format!("AMQP publish failed: {e}")), None)
            }
        }
    }
}
