//! Mail: the e-mail channel and the transport that alerts use too.
//!
//! With an SMTP URL (`smtp://user:pass@host:587?tls=required`,
//! `smtps://host:465`, `smtp://127.0.0.1:2525` for a plain local relay) mail
//! goes over SMTP through a pooled lettre transport; SMTP 4xx answers and
//! connection problems are retried, 5xx answers fail for good. Without one,
//! every message is written as an `.eml` file into [`MailConfig::file_dir`]:
//! the embedded default.
//!
//! A notice of the `email` channel takes its recipients from the target (or
//! the param's `to`, a string or a list), its subject from the target (or the
//! param's `subject`), and its body from the param's `body` (or the whole param
//! as pretty JSON).

use std::path::PathBuf;

use lettre::{
    AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
    message::{Mailbox, header::ContentType},
};
use serde_json::Value;

use crate::{
    def::EmailTarget,
    error::{Error, Result},
    handler::{Notice, Outcome},
};

/// Environment variable with the SMTP URL (unset: file transport).
pub const ENV_SMTP_URL: &str = "SOLID_NOTIFY_SMTP_URL";
/// Environment variable with the sender address.
pub const ENV_MAIL_FROM: &str = "SOLID_NOTIFY_MAIL_FROM";
/// Environment variable with the file transport's folder.
pub const ENV_MAIL_DIR: &str = "SOLID_NOTIFY_MAIL_DIR";
/// Sender used when none is configured.
pub const DEFAULT_FROM: &str = "solid-notify <solid-notify@localhost>";

/// Where e-mail (notices and alerts) goes. `Debug` hides the SMTP
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct MailConfig {
    /// SMTP URL; `None` writes `.eml` files instead.
    /// Default: `$SOLID_NOTIFY_SMTP_URL`.
    pub smtp_url: Option<String>,
    /// Sender. Default: `$SOLID_NOTIFY_MAIL_FROM`, else [`DEFAULT_FROM`].
    pub from: String,
    /// Folder of the file transport. Default: `$SOLID_NOTIFY_MAIL_DIR`, else
    /// `solid-notify-mail` in the system temp folder.
    pub file_dir: PathBuf,
}

impl std::fmt::Debug for MailConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailConfig")
            .field(
                "smtp_url",
                &self.smtp_url.as_deref().map(crate::redact::url),
            )
            .field("from", &self.from)
            .field("file_dir", &self.file_dir)
            .finish()
    }
}

impl Default for MailConfig {
    fn default() -> Self {
        MailConfig {
            smtp_url: std::env::var(ENV_SMTP_URL).ok().filter(|u| !u.is_empty()),
            from: std::env::var(ENV_MAIL_FROM).unwrap_or_else(|_| DEFAULT_FROM.into()),
            file_dir: std::env::var_os(ENV_MAIL_DIR)
                .map(PathBuf::from)
                .unwrap_or_else(|| std::env::temp_dir().join("solid-notify-mail")),
        }
    }
}

enum Transport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    File(AsyncFileTransport<Tokio1Executor>, PathBuf),
}

/// Sends messages over the configured transport.
pub(crate) struct Mailer {
    from: Mailbox,
    transport: Transport,
}

impl Mailer {
    pub fn new(config: &MailConfig) -> Result<Self> {
        let from = config
            .from
            .parse()
            .map_err(|e| Error::Config(format!("mail sender `{}`: {e}", config.from)))?;
        let transport = match &config.smtp_url {
            Some(url) => Transport::Smtp(
                AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                    .map_err(|e| Error::Config(format!("SMTP URL: {e}")))?
                    .build(),
            ),
            None => Transport::File(
                AsyncFileTransport::new(&config.file_dir),
                config.file_dir.clone(),
            ),
        };
        Ok(Mailer { from, transport })
    }

    /// Sends a plain-text mail; the outcome says whether to retry.
    pub async fn send(&self, to: &[String], subject: &str, body: String) -> Outcome {
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for address in to {
            match address.parse::<Mailbox>() {
                Ok(mailbox) => builder = builder.to(mailbox),
                Err(e) => return Outcome::permanent(format!("recipient `{address}`: {e}")),
            }
        }
        let message = match builder.body(body) {
            Ok(message) => message,
            Err(e) => return Outcome::permanent(format!("cannot build the e-mail: {e}")),
        };
        match &self.transport {
            Transport::Smtp(smtp) => match smtp.send(message).await {
                Ok(_) => Outcome::success(),
                Err(e) if e.is_permanent() => Outcome::permanent(format!("SMTP: {e}")),
                Err(e) => Outcome::retry(format!("SMTP: {e}")),
            },
            Transport::File(file, dir) => {
                if let Err(e) = tokio::fs::create_dir_all(dir).await {
                    return Outcome::retry(format!("mail folder {}: {e}", dir.display()));
                }
                match file.send(message).await {
                    Ok(_) => Outcome::success(),
                    Err(e) => Outcome::retry(format!("writing mail to {}: {e}", dir.display())),
                }
            }
        }
    }

    /// Sends a notice of the `email` channel.
    pub async fn send_notice(&self, target: &EmailTarget, notice: &Notice) -> Outcome {
        let param = &notice.param;
        let to = if target.recipients.is_empty() {
            match &param["to"] {
                Value::String(one) => vec![one.clone()],
                Value::Array(many) => many
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            }
        } else {
            target.recipients.clone()
        };
        if to.is_empty() {
            return Outcome::permanent("no recipients: set target.recipients or the param's `to`");
        }
        let subject = target
            .subject
            .clone()
            .or_else(|| param["subject"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{} #{}", notice.def, notice.id));
        let body = match &param["body"] {
            Value::String(body) => body.clone(),
            _ => serde_json::to_string_pretty(param).unwrap_or_default(),
        };
        self.send(&to, &subject, body).await
    }
}
