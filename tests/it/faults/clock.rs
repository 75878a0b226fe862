//! Scenario 7: the database's clock decides what is due and when a lease
//! ends. Two `solid-notify worker` processes run with their wall clocks
//! shifted by libfaketime, one ten minutes ahead and one ten minutes behind
//! (their monotonic clocks stay true). Neither sends a notice early, and
//! they never send one notice at the same time.
//!
//! PostgreSQL and MariaDB only: SQLite has no server, so its clock is that
//! of the process running each statement. Processes sharing a SQLite file
//! share one host, hence one clock; a faked clock there does move what that
//! process sees as due.

use std::{
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use crate::{
    receiver::Receiver,
    server_test,
    support::{KillOnDrop, TestDb, eventually},
};

use super::http_def;

/// Debian's libfaketime (package `faketime`; `.ci/run` installs it).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A `solid-notify worker` process whose wall clock is `offset` off
/// (libfaketime syntax: `+10m`, `-10m`).
fn skewed_worker(db: &TestDb, offset: &str) -> KillOnDrop {
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: install Debian's faketime (.ci/run does)"
    );
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args([
                "worker",
                "--allow-private-network",
                "--mode",
                "fixed-delay",
                "--delay",
                "20ms",
                "--concurrency",
                "4",
                "--lease",
                "6s",
                "--attempt-timeout",
                "3s",
            ])
            .env("DATABASE_URL", &db.url)
            .env("LD_PRELOAD", FAKETIME)
            .env("FAKETIME", offset)
            .env("DONT_FAKE_MONOTONIC", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

server_test!(skewed_clocks_never_overlap, |db: Arc<TestDb>| async move {
    // Every first request takes 1.5 s, a quarter of the 6 s lease.
    let receiver = Receiver::first_slow(Duration::from_millis(1500)).await;
    http_def(&db, "hook", &receiver.url, |_| {}).await;
    // Two notices not due for two minutes by the database's clock: a worker
    // ten minutes ahead that trusted its own clock would send them now.
    let later = match db.backend {
        crate::support::Backend::Postgres => "(now() AT TIME ZONE 'UTC') + interval '2 minutes'",
        crate::support::Backend::MySql => "UTC_TIMESTAMP(6) + INTERVAL 2 MINUTE",
        crate::support::Backend::Sqlite => unreachable!("server databases only"),
    };
    sea_orm::ConnectionTrait::execute_unprepared(
        &db.db,
        &format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time) \
             SELECT id, '{{\"later\":1}}', {later} FROM notify_def WHERE name = 'hook' \
             UNION ALL SELECT id, '{{\"later\":2}}', {later} FROM notify_def WHERE name = 'hook'"
        ),
    )
    .await
    .unwrap();
    let mut workers = [skewed_worker(&db, "+10m"), skewed_worker(&db, "-10m")];
    // Notices due now, inserted in four rounds while both workers run.
    let notices = 24;
    for _ in 0..4 {
        db.insert_due("hook", notices / 4, |_| 0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eventually(60, "every due notice delivered", || async {
        (db.counts().await.1 == notices as u64).then_some(())
    })
    .await;
    // Both workers swept many times since the later notices were written.
    let (left, done) = db.counts().await;
    assert_eq!((left, done), (2, notices as u64));
    assert!(
        db.live().await.iter().all(|r| r.version == 0),
        "a notice not due yet was claimed"
    );
    for w in &mut workers {
        assert!(matches!(w.0.try_wait(), Ok(None)), "a skewed worker died");
    }
    assert_eq!(
        receiver.overlaps(),
        Vec::<i64>::new(),
        "two requests at once"
    );
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(receiver.delivered().len(), notices);
});
