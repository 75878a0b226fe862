//! The e-mail client: SMTP or `.eml` files (cargo feature `email`, lettre).

use std::path::PathBuf;

use lettre::{
    AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
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
    /// `.eml` files in this folder ([`folder`]).
    File(PathBuf),
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
                    .map_err(|e| {
                        Error::Config(format!(
                            "SMTP URL {}: {}",
                            crate::redact::url(url),
                            crate::redact::scrub(&e.to_string(), url)
                        ))
                    })?
                    .build(),
            ),
            None if config.file_dir.as_os_str().is_empty() => {
                return Err(Error::Config(format!(
                    "the mail folder is empty ({} set but empty?): name a folder, or set an SMTP URL",
                    super::ENV_MAIL_DIR
                )));
            }
            None => Transport::File(config.file_dir.clone()),
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
            Transport::File(dir) => {
                let (dir, bytes) = (dir.clone(), message.formatted());
                match tokio::task::spawn_blocking(move || folder::write(&dir, &bytes)).await {
                    Ok(Ok(())) => Outcome::success(),
                    Ok(Err(why)) => Outcome::retry(why),
                    Err(e) => Outcome::retry(format!("writing the mail: {e}")),
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

/// The mail folder of the file transport: `.eml` files only its owner
/// reads, in a folder only its owner opens.
mod folder {
    use std::{io::Write, path::Path};

    /// Writes one message into `dir` as a new `.eml` file (mode 0600, never
    /// through a link: created exclusively), after [`check`]ing `dir`;
    /// why not, as a failure reason.
    pub(super) fn write(dir: &Path, bytes: &[u8]) -> Result<(), String> {
        check(dir)?;
        let name = format!("{:016x}{:016x}.eml", fastrand::u64(..), fastrand::u64(..));
        let path = dir.join(name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options
            .open(&path)
            .map_err(|e| format!("writing mail to {}: {e}", dir.display()))?;
        file.write_all(bytes)
            .map_err(|e| format!("writing mail to {}: {e}", dir.display()))
    }

    /// Creates `dir` (mode 0700, its missing parents too) or checks the one
    /// there: a folder, not a symbolic link, owned by this process's user.
    /// (An existing folder keeps its mode: the files in it are 0600.)
    fn check(dir: &Path) -> Result<(), String> {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        // `recursive` answers Ok for a folder that is there already (and
        // follows a link: the checks below look at the link itself).
        builder
            .create(dir)
            .map_err(|e| format!("mail folder {}: {e}", dir.display()))?;
        let meta = std::fs::symlink_metadata(dir)
            .map_err(|e| format!("mail folder {}: {e}", dir.display()))?;
        if meta.file_type().is_symlink() {
            return Err(format!(
                "mail folder {} is a symbolic link: refused (name the folder itself)",
                dir.display()
            ));
        }
        if !meta.is_dir() {
            return Err(format!("mail folder {} is not a folder", dir.display()));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let me = rustix::process::geteuid().as_raw();
            if meta.uid() != me {
                return Err(format!(
                    "mail folder {} belongs to user {}, not to this process's user {me}: refused",
                    dir.display(),
                    meta.uid()
                ));
            }
        }
        Ok(())
    }
}
