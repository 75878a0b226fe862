//! Channel: the built-in deliveries (HTTP, e-mail, AMQP) a notifier owns,
//! built once and shared by every attempt.

pub mod amqp;
pub mod http;
pub mod mail;

use crate::{
    def::Target,
    error::Result,
    handler::{Notice, Outcome},
    notifier::Inner,
};

/// The built-in channels of one notifier.
pub(crate) struct Channels {
    pub http: http::HttpChannel,
    pub mail: mail::Mailer,
    pub amqp: amqp::AmqpChannel,
}

impl Channels {
    pub fn new(config: &crate::Config) -> Result<Self> {
        Ok(Channels {
            http: http::HttpChannel::new(config.secrets.clone(), config.allow_private_network)?,
            mail: mail::Mailer::new(&config.mail)?,
            amqp: amqp::AmqpChannel::new(&config.amqp),
        })
    }
}

/// Delivers one attempt through the target's channel (the caller bounds it
/// by `timeout`; the HTTP request carries it too).
pub(crate) async fn send(
    inner: &Inner,
    target: &Target,
    notice: Notice,
    raw_param: &str,
    timeout: std::time::Duration,
    on_error: crate::def::OnError,
) -> Outcome {
    match target {
        Target::Handler(t) => match inner.handlers.get(&t.handler) {
            Some(handler) => handler
                .handle(notice)
                .await
                .unwrap_or_else(|e| on_error.outcome(format!("handler error: {e}"))),
            None => Outcome::retry(format!("handler `{}` is not registered", t.handler)),
        },
        Target::Http(t) => {
            inner
                .channels
                .http
                .send(t, &notice, raw_param, timeout)
                .await
        }
        Target::Email(t) => inner.channels.mail.send_notice(t, &notice).await,
        Target::Amqp(t) => inner.channels.amqp.publish(t, &notice, raw_param).await,
    }
}
