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
    /// The URL to call (`http://` or `https://`), or a reference to a
    /// secret of the process that holds it ([`TargetUrl`]).
    pub url: TargetUrl,
    /// HTTP method. Default: `POST`.
    #[serde(default = "HttpTarget::default_method")]
    pub method: String,
    /// Extra request headers: a value is text, or a reference to a secret
    /// of the process (`{ secret = "NAME" }`, see [`HeaderValue`]). Values
    /// are never shown on pages, in the API or in logs. Default: none.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValue>,
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
    /// Let the request go to a private, loopback, link-local or otherwise
    /// non-public address (after DNS resolution), as
    /// [`Config::allow_private_network`](crate::Config) does for every
    /// definition. It holds for the definition's own URL only: a notice's
    /// override to another origin never carries it. Default: `false`.
    #[serde(default)]
    pub allow_private_network: bool,
}

/// A header value of an HTTP target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderValue {
    /// The value itself.
    Text(String),
    /// `{ secret = "NAME" }`: the secret `NAME`, read when sending from
    /// [`Config::secrets`](crate::Config) or else the environment variable
    /// `SOLID_NOTIFY_SECRET_<NAME>`, so that the value never lives in
    /// `notify_def`. A notice's override may not name one.
    Secret(SecretRef),
}

/// The URL of an HTTP target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetUrl {
    /// The URL itself, shown with its password and query values hidden
    /// ([`crate::redact::url`]).
    Text(String),
    /// `{ secret = "NAME" }`: a URL that is itself the credential (Slack,
    /// Discord and Teams incoming webhooks put it in the path), read when
    /// sending as a header's secret is ([`HeaderValue::Secret`]); pages,
    /// the API and logs show only its name. A notice's override may not
    /// change it.
    Secret(SecretRef),
}

impl TargetUrl {
    /// The URL, when it is written in the definition (not a secret).
    pub fn text(&self) -> Option<&str> {
        match self {
            TargetUrl::Text(url) => Some(url),
            TargetUrl::Secret(_) => None,
        }
    }
}

impl From<&str> for TargetUrl {
    fn from(url: &str) -> Self {
        TargetUrl::Text(url.to_string())
    }
}

impl From<String> for TargetUrl {
    fn from(url: String) -> Self {
        TargetUrl::Text(url)
    }
}

/// Checks a URL an HTTP target calls: `http://` or `https://`, with a host.
pub fn check_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "url `{}` is not an http(s) URL",
            crate::redact::url(url)
        ));
    }
    if url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(|h| !h.is_empty()))
        != Some(true)
        || url.contains(char::is_whitespace)
    {
        return Err(format!(
            "url `{}` is not a URL with a host",
            crate::redact::url(url)
        ));
    }
    Ok(())
}

/// A reference to a secret of the process, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The secret's name: 1 to 128 characters, no whitespace or control
    /// characters.
    pub secret: String,
}

/// `message` with what lies between its first and last double quote (a
/// value serde refused, which may be a secret, quotes and all) replaced by
/// `…`.
fn unquoted(message: &str) -> String {
    match (message.find('"'), message.rfind('"')) {
        (Some(first), Some(last)) if first < last => {
            format!("{}\"…\"{}", &message[..first], &message[last + 1..])
        }
        _ => message.to_string(),
    }
}

/// Longest secret name: 128 characters.
pub const MAX_SECRET_NAME: usize = 128;

/// Checks a secret's name (see [`SecretRef::secret`]).
pub fn check_secret_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_SECRET_NAME
        && !name.chars().any(|c| c.is_control() || c.is_whitespace());
    match ok {
        true => Ok(()),
        false => Err(format!(
            "secret name `{}` must be 1 to {MAX_SECRET_NAME} characters without whitespace or control characters",
            name.escape_debug()
                .to_string()
                .chars()
                .take(MAX_SECRET_NAME + 8)
                .collect::<String>()
        )),
    }
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
        .map_err(|e| unquoted(&e.to_string()))?;
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
                match &t.url {
                    TargetUrl::Text(url) => check_url(url)?,
                    TargetUrl::Secret(r) => {
                        check_secret_name(&r.secret).map_err(|e| format!("url: {e}"))?
                    }
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
                for (name, value) in &t.headers {
                    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(format!(
                            "headers: `{}` is not a header name",
                            name.escape_debug()
                        ));
                    }
                    match value {
                        // Not echoed: it may be a secret.
                        HeaderValue::Text(text) if http::HeaderValue::from_str(text).is_err() => {
                            return Err(format!(
                                "headers.{name}: the value is not a header value (no CR, LF, NUL or other control characters)"
                            ));
                        }
                        HeaderValue::Secret(r) => check_secret_name(&r.secret)
                            .map_err(|e| format!("headers.{name}: {e}"))?,
                        HeaderValue::Text(_) => {}
                    }
                }
                if let Some(name) = &t.signing_secret {
                    check_secret_name(name).map_err(|e| format!("signing_secret: {e}"))?;
                }
                Ok(())
            }
            Target::Amqp(t) if t.routing_key.is_empty() && t.exchange.is_empty() => {
                Err("routing_key is empty and no exchange is given".into())
            }
            Target::Email(t) => t
                .recipients
                .iter()
                .try_for_each(|r| parse_address(r).map(drop)),
            Target::Handler(t) if t.handler.trim().is_empty() => Err("handler is empty".into()),
            _ => Ok(()),
        }
    }
}

/// Validates one e-mail address (lettre's parser).
pub(crate) fn parse_address(text: &str) -> Result<lettre::Address, String> {
    text.trim()
        .parse()
        .map_err(|e| format!("`{text}` is not an e-mail address: {e}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn http(target: Value) -> Result<Target, String> {
        Target::parse(Channel::Http, &target)
    }

    #[test]
    fn headers_urls_and_secret_names_are_checked_before_any_send() {
        for (target, names) in [
            (json!({"url": "http://", }), "url"),
            (json!({"url": "http://a b/"}), "url"),
            (
                json!({"url": "http://h", "headers": {"X A": "v"}}),
                "header name",
            ),
            (
                json!({"url": "http://h", "headers": {"X\r\nB": "v"}}),
                "header name",
            ),
            (
                json!({"url": "http://h", "headers": {"": "v"}}),
                "header name",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": "v\r\nX-B: w"}}),
                "headers.X-A",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": "a\u{7f}"}}),
                "headers.X-A",
            ),
            (
                json!({"url": "http://h", "headers": "Authorization: s3cr3t"}),
                "invalid type",
            ),
            (
                json!({"url": "http://h", "headers": "a\"b\" s3cr3t \"c"}),
                "invalid type",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": "a\0b"}}),
                "headers.X-A",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": {"secret": ""}}}),
                "headers.X-A",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": {"secret": "a b"}}}),
                "headers.X-A",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": {"secret": "k", "x": 1}}}),
                "did not match",
            ),
            (
                json!({"url": "http://h", "headers": {"X-A": 5}}),
                "did not match",
            ),
            (
                json!({"url": "http://h", "signing_secret": ""}),
                "signing_secret",
            ),
            (
                json!({"url": "http://h", "signing_secret": "a\nb"}),
                "signing_secret",
            ),
            (
                json!({"url": "http://h", "allow_private_network": "yes"}),
                "invalid type",
            ),
        ] {
            let problem = http(target.clone()).expect_err(&target.to_string());
            let names = if names == "header name" {
                "is not a header name"
            } else {
                names
            };
            assert!(problem.contains(names), "{target}: {problem}");
            assert!(
                !problem.contains("v\r\n") && !problem.contains("s3cr3t"),
                "{problem}"
            );
        }
        let ok = http(json!({
            "url": "https://h/x",
            "headers": {"Authorization": {"secret": "billing.token"}, "X-A": "Café plain"},
            "signing_secret": "stripe/webhook:v2",
            "allow_private_network": true
        }))
        .unwrap();
        let Target::Http(t) = ok else { panic!() };
        assert_eq!(
            t.headers["Authorization"],
            HeaderValue::Secret(SecretRef {
                secret: "billing.token".into()
            })
        );
        assert!(t.allow_private_network);
    }

    #[test]
    fn http_target_checks() {
        let t = |v: Value| Target::parse(Channel::Http, &v);
        assert!(t(json!({"url": "http://127.0.0.1:1/x"})).is_ok());
        assert!(t(json!({"url": "ftp://x"})).is_err());
        assert!(t(json!({"url": "http://x", "method": "BREW"})).is_err());
        assert!(t(json!({"url": "http://x", "timeout": "soon"})).is_err());
    }
}
