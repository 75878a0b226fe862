//! `/healthz` and `/readyz` on the metrics listener of `solid-notify worker
//! --metrics-addr`: answers with the database up, on an old schema, and
//! away (cut or frozen).

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::{
    db_test,
    proxy::Proxy,
    server_test,
    support::{TestDb, eventually, metrics_worker, metrics_worker_at},
};

/// The status and body of `GET base + path`, or None when nothing answered.
async fn get(base: &str, path: &str) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client.get(format!("{base}{path}")).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// Waits until `path` answers `status`; returns the body.
async fn until(base: &str, path: &str, status: u16, what: &str) -> String {
    eventually(30, what, || async {
        get(base, path)
            .await
            .and_then(|(s, body)| (s == status).then_some(body))
    })
    .await
}

fn base(metrics_url: &str) -> String {
    metrics_url.trim_end_matches("/metrics").to_string()
}

db_test!(
    ready_on_a_current_schema_and_not_on_an_old_one,
    |db: Arc<TestDb>| async move {
        let (_worker, metrics) = metrics_worker(&db, &[]).await;
        let base = base(&metrics);
        assert_eq!(get(&base, "/healthz").await.unwrap(), (200, "ok\n".into()));
        assert_eq!(until(&base, "/readyz", 200, "ready").await, "ready\n");

        // The worker has started (its heartbeat is written): a worker that
        // starts on an older schema refuses to (tests/it/schema.rs).
        eventually(30, "the worker's first heartbeat", || async {
            (db.scalar("SELECT COUNT(*) FROM notify_worker").await > 0).then_some(())
        })
        .await;
        // The newest migration's record gone: the schema is older than the
        // build (a restore from an older backup, say).
        let newest: String = db
            .db
            .query_one_raw(Statement::from_string(
                db.db.get_database_backend(),
                "SELECT MAX(version) AS v FROM solid_notify_migrations",
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get("", "v")
            .unwrap();
        let delete = match db.db.get_database_backend() {
            DbBackend::Postgres => "DELETE FROM solid_notify_migrations WHERE version = $1",
            _ => "DELETE FROM solid_notify_migrations WHERE version = ?",
        };
        db.db
            .execute_raw(Statement::from_sql_and_values(
                db.db.get_database_backend(),
                delete,
                [newest.clone().into()],
            ))
            .await
            .unwrap();
        let body = until(&base, "/readyz", 503, "not ready on an old schema").await;
        assert!(body.contains("older than this build"), "{body}");
        assert!(body.contains(&newest), "{body}");
        // Alive all the same: a liveness probe must not restart it.
        assert_eq!(get(&base, "/healthz").await.unwrap().0, 200);

        // Its record back, as the migration job would write it.
        let insert = match db.db.get_database_backend() {
            DbBackend::Postgres => {
                "INSERT INTO solid_notify_migrations (version, applied_at) VALUES ($1, 0)"
            }
            _ => "INSERT INTO solid_notify_migrations (version, applied_at) VALUES (?, 0)",
        };
        db.db
            .execute_raw(Statement::from_sql_and_values(
                db.db.get_database_backend(),
                insert,
                [newest.into()],
            ))
            .await
            .unwrap();
        until(&base, "/readyz", 200, "ready once migrated").await;
    }
);

server_test!(
    not_ready_while_the_database_is_away,
    |db: Arc<TestDb>| async move {
        let proxy = Proxy::start(db.server_addr()).await;
        let url = db.url_via(proxy.port);
        let (_worker, metrics) = metrics_worker_at(&url, &[]).await;
        let base = base(&metrics);
        until(&base, "/readyz", 200, "ready").await;

        // Frozen: the database accepts but never answers.
        proxy.freeze();
        let body = until(&base, "/readyz", 503, "not ready while frozen").await;
        assert!(body.contains("did not answer within 2s"), "{body}");
        assert_eq!(get(&base, "/healthz").await.unwrap().0, 200);
        proxy.thaw();
        until(&base, "/readyz", 200, "ready once thawed").await;

        // Cut: connections refused and reset.
        proxy.cut();
        let body = until(&base, "/readyz", 503, "not ready while cut").await;
        assert!(body.starts_with("not ready"), "{body}");
        assert!(!body.contains(&url), "the URL is not shown: {body}");
        assert_eq!(get(&base, "/healthz").await.unwrap().0, 200);
        proxy.restore();
        until(&base, "/readyz", 200, "ready once restored").await;
    }
);

/// `solid-notify list` with `RUST_LOG=warn` and `flags`: its stderr.
fn list_stderr(db: &TestDb, flags: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
        .args(flags)
        .arg("list")
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .env_remove("SOLID_NOTIFY_SLOW_STATEMENT_LEVEL")
        .env_remove("SOLID_NOTIFY_SLOW_STATEMENT_AFTER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

db_test!(slow_statements_stay_out_of_warn_unless_asked, |db: Arc<
    TestDb,
>| async move {
    // Every statement counts as slow past 0 ms.
    let quiet = list_stderr(&db, &["--slow-statement-after", "0ms"]);
    assert!(!quiet.contains("slow statement"), "{quiet}");
    assert!(!quiet.contains("SELECT"), "{quiet}");
    let loud = list_stderr(
        &db,
        &[
            "--slow-statement-after",
            "0ms",
            "--slow-statement-level",
            "warn",
        ],
    );
    assert!(loud.contains("slow statement"), "{loud}");
    let off = list_stderr(
        &db,
        &[
            "--slow-statement-after",
            "0ms",
            "--slow-statement-level",
            "off",
        ],
    );
    assert!(!off.contains("slow statement"), "{off}");
});
