//! Operations without SQL: status, find, bulk requeue and cancel with audit
//! lines, purge with archive, pause and resume, metrics, connect timeout.

mod bulk;
mod command;
mod find;
mod metrics;
mod pause;
mod purge;

use solid_notify::ops::{Audit, BulkAction, NoticeFilter};

use crate::support::TestDb;

fn filter_def(def: &str) -> NoticeFilter {
    NoticeFilter {
        def: Some(def.into()),
        ..NoticeFilter::default()
    }
}

/// `n` notices of `def`, moved to history as cancelled by a bulk cancel.
async fn cancelled(db: &TestDb, notifier: &solid_notify::Notifier, def: &str, n: usize) {
    db.insert_due(def, n, |_| 0).await;
    let report = notifier
        .cancel_where(&BulkAction::new(
            filter_def(def),
            Audit::new("setup", "seed"),
        ))
        .await
        .unwrap();
    assert_eq!(report.changed, n as u64);
}

pub fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sn-ops-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn cli(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("USER", "cli-user")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
