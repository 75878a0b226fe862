//! The built-in channels whose cargo feature is off: each has the shape of
//! the real one and delivers nothing. A definition that needs one is not
//! attempted in this process at all ([`crate::attempt::available`]): its
//! notices are left to a process built with the feature, like a handler not
//! registered here.

#[cfg(any(not(feature = "http"), not(feature = "amqp"), not(feature = "email")))]
use crate::handler::Outcome;

/// Why a channel delivers nothing in this build.
#[cfg(any(not(feature = "http"), not(feature = "amqp"), not(feature = "email")))]
pub(crate) fn compiled_out(channel: &str, feature: &str) -> String {
    format!("the {channel} channel is not compiled into this process (cargo feature `{feature}`)")
}

/// HTTP without the `http` feature.
#[cfg(not(feature = "http"))]
pub(crate) struct HttpChannel;

#[cfg(not(feature = "http"))]
impl HttpChannel {
    pub fn new(
        _secrets: std::collections::HashMap<String, String>,
        _allow_private_network: bool,
    ) -> crate::error::Result<Self> {
        Ok(HttpChannel)
    }

    pub async fn send(
        &self,
        _target: &crate::def::HttpTarget,
        _notice: &crate::handler::Notice,
        _body: &str,
        _timeout: std::time::Duration,
    ) -> Outcome {
        Outcome::retry(compiled_out("HTTP", "http"))
    }
}

/// AMQP without the `amqp` feature: never enabled.
#[cfg(not(feature = "amqp"))]
pub(crate) struct AmqpChannel;

#[cfg(not(feature = "amqp"))]
impl AmqpChannel {
    pub fn new(_config: &super::amqp::AmqpConfig) -> Self {
        AmqpChannel
    }

    pub fn enabled(&self) -> bool {
        false
    }

    pub async fn publish(
        &self,
        _target: &crate::def::AmqpTarget,
        _notice: &crate::handler::Notice,
        _body: &str,
    ) -> Outcome {
        Outcome::retry(compiled_out("AMQP", "amqp"))
    }
}

/// E-mail without the `email` feature.
#[cfg(not(feature = "email"))]
pub(crate) struct Mailer;

#[cfg(not(feature = "email"))]
impl Mailer {
    pub fn new(_config: &super::mail::MailConfig) -> crate::error::Result<Self> {
        Ok(Mailer)
    }

    pub async fn send_notice(
        &self,
        _target: &crate::def::EmailTarget,
        _notice: &crate::handler::Notice,
    ) -> Outcome {
        Outcome::retry(compiled_out("e-mail", "email"))
    }
}
