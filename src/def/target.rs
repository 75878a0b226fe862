//! Target: the channel of a definition and that channel's settings.
//!
//! `notify_def.channel` names the channel and `notify_def.target` holds a JSON
//! object with its settings; both are validated together into a [`Target`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The four delivery channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// An HTTP request (reqwest).
    Http,
    /// A message published to RabbitMQ (lapin).
    Amqp,
    /// An e-mail (lettre).
    Email,
    /// A Rust handler registered in the process by name.
    Handler,
}

impl Channel {
    /// Every channel, in the order they are documented.
    pub const ALL: [Channel; 4] = [
        Channel::Http,
        Channel::Amqp,
        Channel::Email,
        Channel::Handler,
    ];

    /// The name stored in `notify_def.channel`.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Http => "http",
            Channel::Amqp => "amqp",
            Channel::Email => "email",
            Channel::Handler => "handler",
        }
    }

    /// Parses a stored channel name.
    pub fn parse(name: &str) -> Option<Channel> {
        Channel::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Settings of the `http` channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTarget {
    /// The URL to call (`http://` or `https://`).
    pub url: String,
    /// HTTP method. Default: `POST`.
    #[serde(default = "HttpTarget::default_method")]
    pub method: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Request timeout such as `10s`. Default: `10s`.
    #[serde(default)]
    pub timeout: Option<String>,
    /// When set, a 2xx answer only counts as success if its body is exactly this
    /// (surrounding whitespace ignored), e.g. `success`.
    #[serde(default)]
    pub expected_body: Option<String>,
    /// Retry 4xx answers (other than 408/429, always retried) instead of
    /// failing for good. Default: `false`.
    #[serde(default)]
    pub retry_4xx: bool,
    /// Name of the HMAC-SHA256 signing secret, looked up in
    /// [`Config::secrets`](crate::Config) and then in the environment (the
    /// secret itself never lives in `notify_def`); when set, requests carry
    /// `X-Notice-Signature`. Default: no signature.
    #[serde(default)]
    pub signing_secret: Option<String>,
}

impl HttpTarget {
    fn default_method() -> String {
        "POST".into()
    }
}

/// Settings of the `amqp` channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpTarget {
    /// Exchange to publish to. Default: `""` (the default exchange).
    #[serde(default)]
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Return unroutable messages as failures. Default: `true`.
    #[serde(default = "yes")]
    pub mandatory: bool,
    /// Persistent delivery mode. Default: `true`.
    #[serde(default = "yes")]
    pub persistent: bool,
    /// Content type. Default: `application/json`.
    #[serde(default = "AmqpTarget::default_content_type")]
    pub content_type: String,
    /// Extra message headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl AmqpTarget {
    fn default_content_type() -> String {
        "application/json".into()
    }
}

fn yes() -> bool {
    true
}

/// Settings of the `email` channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailTarget {
    /// Recipients; when empty they come from the param's `to` field.
    #[serde(default)]
    pub recipients: Vec<String>,
    /// Subject; when absent it comes from the param's `subject` field.
    #[serde(default)]
    pub subject: Option<String>,
}

/// Settings of the `handler` channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerTarget {
    /// Name the Rust handler was registered under.
    pub handler: String,
}

/// A validated channel plus its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// See [`HttpTarget`].
    Http(HttpTarget),
    /// See [`AmqpTarget`].
    Amqp(AmqpTarget),
    /// See [`EmailTarget`].
    Email(EmailTarget),
    /// See [`HandlerTarget`].
    Handler(HandlerTarget),
}

impl Target {
    /// Validates `target` as the settings of `channel`.
    ///
    /// Returns the problem as text; the caller adds where it came from.
    pub fn parse(channel: Channel, target: &Value) -> Result<Target, String> {
        if !target.is_object() {
            // Not echoed: it may hold a secret.
            return Err("must be a JSON object".into());
        }
        let target = target.clone();
        let parsed = match channel {
            Channel::Http => serde_json::from_value(target).map(Target::Http),
            Channel::Amqp => serde_json::from_value(target).map(Target::Amqp),
            Channel::Email => serde_json::from_value(target).map(Target::Email),
            Channel::Handler => serde_json::from_value(target).map(Target::Handler),
        }
        .map_err(|e| e.to_string())?;
        parsed.check()?;
        Ok(parsed)
    }

    /// The channel this target belongs to.
    pub fn channel(&self) -> Channel {
        match self {
            Target::Http(_) => Channel::Http,
            Target::Amqp(_) => Channel::Amqp,
            Target::Email(_) => Channel::Email,
            Target::Handler(_) => Channel::Handler,
        }
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Target::Http(t) => {
                if !(t.url.starts_with("http://") || t.url.starts_with("https://")) {
                    return Err(format!(
                        "url `{}` is not an http(s) URL",
                        crate::redact::url(&t.url)
                    ));
                }
                if reqwest::Url::parse(&t.url)
                    .ok()
                    .and_then(|u| u.host_str().map(|h| !h.is_empty()))
                    != Some(true)
                    || t.url.contains(char::is_whitespace)
                {
                    return Err(format!(
                        "url `{}` is not a URL with a host",
                        crate::redact::url(&t.url)
                    ));
                }
                const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
                if !METHODS.contains(&t.method.as_str()) {
                    return Err(format!(
                        "method `{}` is not one of {}",
                        t.method,
                        METHODS.join(", ")
                    ));
                }
                if let Some(timeout) = &t.timeout {
                    crate::schedule::parse_interval(timeout).map_err(|e| format!("timeout {e}"))?;
                }
                Ok(())
            }
            Target::Amqp(t) if t.routing_key.is_empty() && t.exchange.is_empty() => {
                Err("routing_key is empty and no exchange is given".into())
            }
            Target::Email(t) => t
                .recipients
                .iter()
                .try_for_each(|r| super::parse_address(r).map(drop)),
            Target::Handler(t) if t.handler.trim().is_empty() => Err("handler is empty".into()),
            _ => Ok(()),
        }
    }
}
