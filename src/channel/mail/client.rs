//! The e-mail client: SMTP or `.eml` files (cargo feature `email`, lettre).

use std::path::PathBuf;

use lettre::{
    AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
    message::{Mailbox, header::ContentType},
};
use serde_json::Value;

use super::MailConfig;
use crate::{
    def::EmailTarget,
    error::{Error, Result},
    handler::{Notice, Outcome},
};

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
        for (n, address) in to.iter().enumerate() {
            match address.parse::<Mailbox>() {
                Ok(mailbox) => builder = builder.to(mailbox),
                // Not the address itself: it may come from an encrypted
                // param, and the reason is stored in the clear.
                Err(e) => {
                    return Outcome::permanent(format!(
                        "recipient {} of {} is not an address: {e}",
                        n + 1,
                        to.len()
                    ));
                }
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
