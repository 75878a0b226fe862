//! The `solid-notify` binary: show, list and bulk actions from the command
//! line; an unreachable database fails within the connect timeout.

use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::ops::Place;

use super::{cli, tempdir};
use crate::{db_test, support::TestDb};

db_test!(
    cli_shows_lists_and_acts_in_bulk,
    |db: Arc<TestDb>| async move {
        let (notifier, _rec) = db.shipping().await;
        db.insert_due("ship", 6, |_| 0).await;
        let (ok, out, err) = cli(&db, &["list", "--def", "ship", "--json"]);
        assert!(ok, "{err}");
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(listed.len(), 6);
        let id = listed[0]["id"].as_i64().unwrap();

        let (ok, _, err) = cli(&db, &["cancel", "--def", "ship"]);
        assert!(!ok && err.contains("--reason is required"), "{err}");
        let (ok, _, err) = cli(&db, &["cancel", "--reason", "everything?"]);
        assert!(!ok && err.contains("at least one filter"), "{err}");
        let (ok, out, err) = cli(
            &db,
            &[
                "cancel",
                "--def",
                "ship",
                "--reason",
                "bad batch",
                "--dry-run",
                "--json",
            ],
        );
        assert!(ok, "{err}");
        let dry: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (dry["matched"].as_i64(), dry["changed"].as_i64()),
            (Some(6), Some(0))
        );
        assert_eq!(db.counts().await, (6, 0));
        let (ok, out, err) = cli(&db, &["cancel", "--def", "ship", "--reason", "bad batch"]);
        assert!(ok, "{err}");
        assert!(out.contains("6 matched, 6 changed, 0 skipped"), "{out}");

        let (ok, out, err) = cli(&db, &["show", &id.to_string(), "--json"]);
        assert!(ok, "{err}");
        let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(shown["status"], json!("cancelled"));
        assert_eq!(shown["place"], json!("history"));
        assert!(
            shown["errors"][0]
                .as_str()
                .unwrap()
                .ends_with("cancelled by cli-user: bad batch")
        );
        let (ok, out, _) = cli(
            &db,
            &["history", "list", "--status", "cancelled", "--since", "1h"],
        );
        assert!(ok && out.lines().count() == 7, "{out}");

        let ids = tempdir().join("ids.txt");
        std::fs::write(&ids, format!("# replay\n{id}\n")).unwrap();
        let (ok, out, err) = cli(
            &db,
            &[
                "requeue",
                "--ids",
                ids.to_str().unwrap(),
                "--reason",
                "one more time",
                "--actor",
                "zoe",
            ],
        );
        assert!(ok, "{err}");
        assert!(out.contains("1 matched, 1 changed"), "{out}");
        let view = notifier.status(id).await.unwrap();
        assert_eq!(view.place, Place::InFlight);
        assert!(
            view.errors
                .last()
                .unwrap()
                .ends_with("requeued by zoe: one more time")
        );
        let (ok, _, err) = cli(&db, &["requeue", &id.to_string()]);
        assert!(!ok && err.contains("not_sent"), "{err}");

        let (ok, _, err) = cli(
            &db,
            &["pause", "ship", "--until", "1h", "--reason", "deploy"],
        );
        assert!(ok, "{err}");
        let (_, out, _) = cli(&db, &["defs", "list"]);
        assert!(out.contains("PAUSED until"), "{out}");
        let (ok, _, err) = cli(&db, &["resume", "ship"]);
        assert!(ok, "{err}");
        let (ok, out, err) = cli(&db, &["purge", "--older-than", "30d", "--dry-run"]);
        assert!(ok && out.contains("0 would be deleted"), "{out}{err}");
    }
);

#[test]
fn an_unreachable_database_fails_within_the_timeout() {
    // Accepts connections (the kernel completes the handshake) and never
    // answers: the hang a firewalled or stuck server gives.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for url in [
        format!("postgres://u:secret@127.0.0.1:{port}/db"),
        format!("mysql://u:secret@127.0.0.1:{port}/db"),
    ] {
        let started = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(["list", "--connect-timeout", "1s"])
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(
            err.contains(&format!(
                "cannot reach the database at 127.0.0.1:{port}/db within 1s"
            )),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
    }
    drop(silent);
}
