//! Channel: the built-in deliveries (HTTP, e-mail, AMQP) a notifier owns,
//! built once and shared by every attempt.

pub mod amqp;
#[cfg(feature = "http")]
pub mod http;
pub mod mail;

#[cfg(feature = "http")]
use http::HttpChannel;

use crate::{
    def::Target,
    error::Result,
    handler::{Handlers, Notice, Outcome},
};

/// The built-in channels of one engine.
pub(crate) struct Channels {
    pub http: HttpChannel,
    pub mail: mail::Mailer,
    pub amqp: amqp::AmqpChannel,
}

impl Channels {
    /// The channels of one notifier: HTTP with its signing and header
    /// `secrets` (reaching private addresses only when
    /// `allow_private_network`), e-mail over `mail`, AMQP over `amqp`.
    pub fn new(
        secrets: std::collections::HashMap<String, String>,
        allow_private_network: bool,
        mail: &mail::MailConfig,
        amqp: &amqp::AmqpConfig,
    ) -> Result<Self> {
        Ok(Channels {
            http: HttpChannel::new(secrets, allow_private_network)?,
            mail: mail::Mailer::new(mail)?,
            amqp: amqp::AmqpChannel::new(amqp),
        })
    }
}

impl Channels {
    /// Delivers one attempt through the target's channel, or the registered
    /// handler it names (the caller bounds it by `timeout`; the HTTP request
    /// carries it too).
    pub async fn send(
        &self,
        handlers: &Handlers,
        target: &Target,
        notice: Notice,
        raw_param: &str,
        timeout: std::time::Duration,
        on_error: crate::def::OnError,
    ) -> Outcome {
        match target {
            Target::Handler(t) => match handlers.get(&t.handler) {
                Some(handler) => handler
                    .handle(notice)
                    .await
                    .unwrap_or_else(|e| on_error.outcome(format!("handler error: {e}"))),
                None => Outcome::retry(format!("handler `{}` is not registered", t.handler)),
            },
            Target::Http(t) => self.http.send(t, &notice, raw_param, timeout).await,
            Target::Email(t) => self.mail.send_notice(t, &notice).await,
            Target::Amqp(t) => self.amqp.publish(t, &notice, raw_param).await,
        }
    }
}

/// HTTP without the `http` feature: its definitions are left to a process
/// built with it (`attempt::available`).
#[cfg(not(feature = "http"))]
pub(crate) struct HttpChannel;

#[cfg(not(feature = "http"))]
impl HttpChannel {
    pub fn new(
        _secrets: std::collections::HashMap<String, String>,
        _allow_private_network: bool,
    ) -> Result<Self> {
        Ok(HttpChannel)
    }

    pub async fn send(
        &self,
        _target: &crate::def::HttpTarget,
        _notice: &Notice,
        _body: &str,
        _timeout: std::time::Duration,
    ) -> Outcome {
        Outcome::retry("the HTTP channel is not compiled into this process (cargo feature `http`)")
    }
}
