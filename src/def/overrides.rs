//! Which target fields a notice may override, and whether the definition's
//! credentials follow an overridden URL.
//!
//! Producers are untrusted (a plain-SQL producer writes any
//! `target_override`), so an override is an allow-list the definition
//! writes in its target:
//!
//! ```toml
//! target = { url = "https://api.example.com/hooks", overridable = ["url"] }
//! ```
//!
//! - `overridable`: the target fields a notice's override may set. Default:
//!   none (a notice with an override fails for good, naming the field).
//!   `signing_secret` can never be overridden (it names a secret of the
//!   process), nor can these two settings.
//! - `credentials_follow_override` (HTTP): whether the definition's
//!   `headers` and `signing_secret` go to an overridden URL on another
//!   origin (scheme, host and port). Default: `false` (the request goes
//!   without them; an override's own `headers`, when allowed, are sent).

use serde_json::{Map, Value};

use super::Channel;

/// The override policy of a definition (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Target fields a notice may override. Default: none.
    pub fields: Vec<String>,
    /// HTTP: the definition's headers and signature go to another origin
    /// too. Default: `false`.
    pub credentials_follow: bool,
}

/// The target key naming the fields a notice may override.
pub const OVERRIDABLE: &str = "overridable";
/// The target key letting credentials follow an overridden URL.
pub const CREDENTIALS_FOLLOW: &str = "credentials_follow_override";

/// Fields that no definition may let a notice override.
const NEVER: [&str; 3] = ["signing_secret", OVERRIDABLE, CREDENTIALS_FOLLOW];

/// The fields each channel's target has.
pub(super) fn fields_of(channel: Channel) -> &'static [&'static str] {
    match channel {
        Channel::Http => &[
            "url",
            "method",
            "headers",
            "timeout",
            "expected_body",
            "retry_4xx",
        ],
        Channel::Amqp => &[
            "exchange",
            "routing_key",
            "mandatory",
            "persistent",
            "content_type",
            "headers",
        ],
        Channel::Email => &["recipients", "subject"],
        Channel::Handler => &["handler"],
    }
}

impl Overrides {
    /// Takes the policy's keys out of `target` (a target object of
    /// `channel`), leaving the channel's own settings; the problem as text.
    pub fn take(channel: Channel, target: &mut Value) -> Result<Overrides, String> {
        let Some(object) = target.as_object_mut() else {
            return Ok(Overrides::default());
        };
        let fields = match object.remove(OVERRIDABLE) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(field) => Ok(field),
                    other => Err(format!("{OVERRIDABLE}: `{other}` is not a field name")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(format!(
                    "{OVERRIDABLE} must be a list of field names, got `{other}`"
                ));
            }
        };
        for field in &fields {
            if NEVER.contains(&field.as_str()) {
                return Err(format!("{OVERRIDABLE}: `{field}` can never be overridden"));
            }
            if !fields_of(channel).contains(&field.as_str()) {
                return Err(format!(
                    "{OVERRIDABLE}: `{field}` is not a field of the {channel} target (one of {})",
                    fields_of(channel).join(", ")
                ));
            }
        }
        let credentials_follow = match object.remove(CREDENTIALS_FOLLOW) {
            None => false,
            Some(Value::Bool(b)) if channel == Channel::Http || !b => b,
            Some(Value::Bool(_)) => {
                return Err(format!(
                    "{CREDENTIALS_FOLLOW} applies to the http channel only"
                ));
            }
            Some(other) => {
                return Err(format!(
                    "{CREDENTIALS_FOLLOW} must be true or false, got `{other}`"
                ));
            }
        };
        Ok(Overrides {
            fields,
            credentials_follow,
        })
    }

    /// The first field of `over` this policy does not allow, if any.
    pub fn refused<'a>(&self, over: &'a Map<String, Value>) -> Option<&'a str> {
        over.keys()
            .map(String::as_str)
            .find(|k| !self.fields.iter().any(|f| f == k))
    }

    /// The allowed fields, for messages: `url, headers` or `none`.
    pub fn describe(&self) -> String {
        match self.fields.is_empty() {
            true => "none".into(),
            false => self.fields.join(", "),
        }
    }
}

/// `scheme://host:port` of `url` (the port made explicit), or `None` when
/// it does not parse.
pub(crate) fn origin(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    Some(format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str()?,
        url.port_or_known_default()?
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_policy_is_an_allow_list_without_secrets() {
        let mut t =
            json!({"url": "http://x", "overridable": ["url"], "credentials_follow_override": true});
        let o = Overrides::take(Channel::Http, &mut t).unwrap();
        assert_eq!(o.fields, ["url"]);
        assert!(o.credentials_follow);
        assert_eq!(t, json!({"url": "http://x"}), "the keys are taken out");
        for bad in [
            json!({"overridable": ["signing_secret"]}),
            json!({"overridable": ["overridable"]}),
            json!({"overridable": ["nope"]}),
            json!({"overridable": "url"}),
            json!({"overridable": [1]}),
            json!({"credentials_follow_override": "yes"}),
        ] {
            let mut t = bad.clone();
            assert!(Overrides::take(Channel::Http, &mut t).is_err(), "{bad}");
        }
        let mut t = json!({"handler": "h", "credentials_follow_override": true});
        assert!(Overrides::take(Channel::Handler, &mut t).is_err());
        let over = json!({"url": "u", "headers": {}});
        let over = over.as_object().unwrap();
        assert!(
            Overrides::default().refused(over).is_some(),
            "nothing is allowed"
        );
        assert_eq!(o.refused(over), Some("headers"));
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert_eq!(
            origin("http://a.example/x"),
            origin("http://a.example:80/y")
        );
        assert_ne!(origin("http://a.example/x"), origin("https://a.example/x"));
        assert_ne!(
            origin("http://a.example/x"),
            origin("http://a.example.evil/x")
        );
        assert_ne!(
            origin("http://a.example/x"),
            origin("http://a.example:8080/x")
        );
        assert_eq!(origin("not a url"), None);
    }
}
