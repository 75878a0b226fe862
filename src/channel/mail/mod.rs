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

#[cfg(feature = "email")]
mod client;
#[cfg(feature = "email")]
pub(crate) use client::Mailer;

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

/// E-mail without the `email` feature: its definitions are left to a
/// process built with it (`attempt::available`).
#[cfg(not(feature = "email"))]
pub(crate) struct Mailer;

#[cfg(not(feature = "email"))]
impl Mailer {
    pub fn new(_config: &MailConfig) -> crate::error::Result<Self> {
        Ok(Mailer)
    }

    pub async fn send_notice(
        &self,
        _target: &crate::def::EmailTarget,
        _notice: &crate::handler::Notice,
    ) -> crate::handler::Outcome {
        crate::handler::Outcome::retry(
            "the e-mail channel is not compiled into this process (cargo feature `email`)",
        )
    }
}
