//! The dashboard in a real browser: `solid-notify serve` on PostgreSQL with a
//! known mix of notices, driven by headless Chromium (Debian's, through
//! playwright-core: `tests/browser/dashboard.mjs`). Screenshots of each
//! page land in `target/dashboard-screenshots/`.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
};

use serde_json::Value;
use solid_notify::Status;

use crate::{
    dashboard::seed,
    pg_test,
    support::{KillOnDrop, TestDb},
};

/// Starts `solid-notify serve` on `db` and returns it with its base URL.
fn serve(db: &TestDb) -> (KillOnDrop, String) {
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(["serve", "--addr", "127.0.0.1:0", "--allow-actions"])
            .env("DATABASE_URL", &db.url)
            .env_remove("SOLID_NOTIFY_DASHBOARD_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("solid-notify serve starts"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("dashboard: ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim_end_matches('/')
        .to_string();
    (child, url)
}

pg_test!(a_browser_sees_the_counts_and_bulk_requeues, |db: Arc<
    TestDb,
>| async move {
    // The blocked keys first: their notices are all finished or held when
    // the dashboard's seed sweeps.
    crate::keys::seed(&db).await;
    let seeded = seed(&db).await;
    let (_server, url) = serve(&db);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shots = root.join("target/dashboard-screenshots");
    let script = root.join("tests/browser/dashboard.mjs");
    let ran = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .arg(&url)
            .arg(&shots)
            .stderr(Stdio::inherit())
            .output()
            .expect("node runs (.ci/run installs it and playwright-core)")
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "the browser script failed: {out}");
    let seen: Value = serde_json::from_str(out.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {out}"));

    // 1. The overview showed the seeded counts.
    let count = |def: &str, what: &str| seen["overview"][def][what].as_i64();
    assert_eq!(count("orders", "in_flight"), Some(3), "{seen}");
    assert_eq!(count("orders", "succeeded_24h"), Some(4), "{seen}");
    assert_eq!(count("billing", "failing"), Some(2), "{seen}");
    assert_eq!(count("billing", "failed_24h"), Some(3), "{seen}");
    // 2. The filter listed the final failures, whose log shows why.
    assert_eq!(seen["listed"], 3, "{seen}");
    assert_eq!(seen["detail_log"], 1, "{seen}");
    // 3. The confirmation counted them; the requeue changed them all.
    assert_eq!(
        (seen["matched"].as_i64(), seen["changed"].as_i64()),
        (Some(3), Some(3))
    );
    // 4. In the database: back in flight, due, with the audit line.
    let live = db.live().await;
    for id in &seeded.final_failures {
        assert!(db.history_of(*id).await.is_none(), "{id} left history");
        let row = live.iter().find(|r| r.id == *id).expect("in flight");
        assert_eq!(row.status, Status::NotSent);
        assert!(
            row.errors.contains("requeued by dashboard: browser replay"),
            "{}",
            row.errors
        );
    }
    // Billing's and orders', and the ordered notices held behind keys.
    let held: u64 = crate::keys::BLOCKED.iter().map(|(_, _, n)| n).sum();
    assert_eq!(seen["in_flight_rows"], 3 + 2 + 3 + held, "{seen}");
    // 5. The blocked keys page agrees with the CLI; a cancel of key b's
    // head from its row releases it.
    let (ok, out, err) = crate::ops::cli(&db, &["keys", "blocked", "--json"]);
    assert!(ok, "{err}");
    let cli: Value = serde_json::from_str(&out).unwrap();
    let mut from_cli: Vec<Value> = cli["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            // The page shows keys with control characters escaped.
            let key = k["ordering_key"]
                .as_str()
                .unwrap()
                .escape_debug()
                .to_string();
            serde_json::json!([k["def"], key, k["waiting"]])
        })
        .collect();
    from_cli.sort_by_key(|v| v.to_string());
    let shown = |key: &str| {
        let mut rows = seen[key].as_array().cloned().unwrap_or_default();
        rows.sort_by_key(|v| v.to_string());
        rows
    };
    assert_eq!(
        from_cli.len(),
        2,
        "key b was cancelled from the page: {out}"
    );
    assert_eq!(shown("blocked").len(), 3, "{seen}");
    assert_eq!(shown("blocked_after"), from_cli, "{seen}");
    assert!(shown("blocked").iter().any(|r| r[1] == "b"), "{seen}");
    // 6. Another site's image, fetch and frame: refused, nothing framed.
    assert_eq!(seen["cross_site"]["frame"], 403, "{seen}");
    assert_eq!(seen["cross_site"]["fetch"], 403, "{seen}");
    // An image's answer is 403, or dropped by the browser before the page.
    assert!(
        seen["cross_site"]["img"] == 403 || seen["cross_site"]["img"].is_string(),
        "{seen}"
    );
    assert_eq!(seen["framed_rows"], 0, "{seen}");
});
