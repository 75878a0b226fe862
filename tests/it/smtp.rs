//! A real SMTP server for tests: aiosmtpd (from PyPI; `.ci/run` installs it)
//! on a free port of 127.0.0.1, storing what it receives in a Maildir.

use std::{
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct SmtpServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

#[derive(Debug, Clone)]
pub struct Mail {
    pub to: String,
    pub subject: String,
    pub body: String,
}

impl SmtpServer {
    pub async fn start() -> SmtpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("sn_smtp_{}_{port}", std::process::id()));
        for sub in ["tmp", "new", "cur"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let mut server = SmtpServer {
            port,
            dir,
            child: None,
        };
        server.resume().await;
        server
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port and folder.
    pub async fn resume(&mut self) {
        let python = std::env::var("SN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let child = Command::new(python)
            .args([
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{}", self.port),
            ])
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start aiosmtpd (pip install aiosmtpd; .ci/run does)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "aiosmtpd did not start on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Every message received so far.
    pub fn messages(&self) -> Vec<Mail> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("new")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
            .map(|raw| parse(&raw))
            .collect()
    }

    pub fn to(&self, address: &str) -> Vec<Mail> {
        self.messages()
            .into_iter()
            .filter(|m| m.to.contains(address))
            .collect()
    }
}

pub fn parse(raw: &[u8]) -> Mail {
    let mail = mailparse::parse_mail(raw).expect("parse mail");
    let header = |name: &str| {
        mail.headers
            .iter()
            .find(|h| h.get_key_ref().eq_ignore_ascii_case(name))
            .map(|h| h.get_value())
            .unwrap_or_default()
    };
    Mail {
        to: header("To"),
        subject: header("Subject"),
        body: mail.get_body().unwrap_or_default(),
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        self.stop();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
