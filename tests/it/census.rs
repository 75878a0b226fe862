//! The bad-input census: one table of malformed input at every door (a
//! definition file, a hand-edited `notify_def` row, an `add_notice`, an
//! API body or query, a CLI argument). Each gets a typed error that names
//! the field, nothing panics, and nothing is written: the three tables are
//! the same after the census as before it.

use std::sync::Arc;

use reqwest::StatusCode;
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde_json::{Value, json};
use solid_notify::{
    Error, NewNotice,
    dashboard::DashboardConfig,
    def::{file, store},
};

use crate::{
    dashboard::{client, seed, serve},
    db_test,
    hardening::{TOKEN, post},
    ops::cli,
    support::{Backend, TestDb},
};

/// A valid definition file with `line` added to its table (a key given
/// twice takes the line's value: the base's keys are only those not set).
fn def_file(line: &str) -> String {
    let key = line.split('=').next().unwrap_or("").trim();
    let base = [
        ("channel", "\"http\""),
        ("target", "{ url = \"https://h.example/x\" }"),
        ("retry_interval", "\"5s,1m\""),
        ("max_retry_times", "3"),
    ];
    let mut text = String::from("[census]\n");
    for (k, v) in base {
        if k != key {
            text.push_str(&format!("{k} = {v}\n"));
        }
    }
    text.push_str(line);
    text.push('\n');
    text
}

/// Definition files, each with the field its error must name.
fn bad_files() -> Vec<(String, &'static str)> {
    let mut cases: Vec<(String, &'static str)> = [
        ("channel = \"smoke\"", "channel"),
        ("channel = 5", "channel"),
        ("target = \"http://h\"", "target"),
        ("target = { url = \"ftp://h/x\" }", "target"),
        ("target = { url = \"http://\" }", "target"),
        ("target = { url = \"http://a b/\" }", "target"),
        ("target = { url = \"https://h\", method = \"TRACE\" }", "target"),
        ("target = { url = \"https://h\", timeout = \"soon\" }", "target"),
        ("target = { url = \"https://h\", headers = { \"X A\" = \"v\" } }", "target"),
        ("target = { url = \"https://h\", headers = { \"X-A\" = \"v\\r\\nX-B: w\" } }", "target"),
        ("target = { url = \"https://h\", headers = { \"X-A\" = \"a\\u007fb\" } }", "target"),
        ("target = { url = \"https://h\", headers = { \"X-A\" = { secret = \"\" } } }", "target"),
        ("target = { url = \"https://h\", headers = { \"X-A\" = { secret = \"k\", more = 1 } } }", "target"),
        ("target = { url = \"https://h\", signing_secret = \"\" }", "target"),
        ("target = { url = \"https://h\", signing_secret = \"a b\" }", "target"),
        ("target = { url = \"https://h\", headers = \"Authorization: s3cr3t\" }", "target"),
        ("target = { url = \"https://h\", nope = 1 }", "target"),
        ("target = { url = \"https://h\", overridable = [\"signing_secret\"] }", "target"),
        ("target = { url = \"https://h\", overridable = \"url\" }", "target"),
        ("target = { url = \"https://h\", allow_private_network = \"yes\" }", "target"),
        ("retry_interval = \"\"", "retry_interval"),
        ("retry_interval = \"5 parsecs\"", "retry_interval"),
        ("retry_interval = \"-5s\"", "retry_interval"),
        ("retry_interval = \"5s,,1m\"", "retry_interval"),
        ("max_retry_times = -2", "max_retry_times"),
        ("max_retry_times = 99999999999", "max_retry_times"),
        ("max_retry_times = \"5x\"", "max_retry_times"),
        ("max_retry_interval = -1", "max_retry_interval"),
        ("alert_trigger_type = 7", "alert_trigger_type"),
        ("alert_trigger_type = 3\nalert_trigger_fail_times = 0", "alert_trigger_fail_times"),
        ("alert_trigger_fail_times = -1", "alert_trigger_fail_times"),
        ("email = \"not an address\"", "email"),
        ("email = \"ops@example.com\\u0000\"", "email"),
        ("description = \"a\\u0000b\"", "description"),
        ("max_confirm_delay = -1", "max_confirm_delay"),
        ("circuit = { failures = -1, window = \"1m\", cool_down = \"5m\" }", "circuit_failures"),
        ("circuit = { failures = 3, window = \"0s\", cool_down = \"5m\" }", "circuit_window"),
        ("circuit = { failures = 3, window = \"1m\", cooldown = \"5m\" }", "circuit.cooldown"),
        ("on_error = \"maybe\"", "on_error"),
        ("immediate_retries = 1000", "immediate_retries"),
        ("immediate_retry_delay = \"1y\"", "immediate_retry_delay"),
        ("retry_jitter = \"500%\"", "retry_jitter"),
        ("rate_limit = \"5/fortnight\"", "rate_limit"),
        ("rate_limit = \"0/s\"", "rate_limit"),
        ("ordering = \"sideways\"", "ordering"),
        ("steps = \"not a list\"", "steps"),
        ("steps = []", "steps"),
        ("unknown_key = 1", "unknown_key"),
    ]
    .into_iter()
    .map(|(line, field)| (def_file(line), field))
    .collect();
    // Past what the columns hold.
    cases.push((
        def_file(&format!(
            "retry_interval = \"{}\"",
            vec!["1s"; 100].join(",")
        )),
        "retry_interval",
    ));
    cases.push((
        def_file(&format!("rate_limit = \"{}50/s\"", "0".repeat(40))),
        "rate_limit",
    ));
    cases.push((
        format!("[\"{}\"]\n{}", "n".repeat(192), &def_file("")[9..]),
        "name",
    ));
    cases.push((format!("[\"a\\u0000b\"]\n{}", &def_file("")[9..]), "name"));
    cases.push((format!("[\"a\\r\\nb\"]\n{}", &def_file("")[9..]), "name"));
    cases.push(("[census\nchannel = \"http\"".into(), "census.toml"));
    cases
}

/// Hand edits of the `census_row` definition's row, each with the field
/// its problem must name (SQL for `backend`).
fn bad_rows(backend: Backend) -> Vec<(String, &'static str)> {
    let mut cases: Vec<(String, &'static str)> = [
        ("channel = 'smoke'", "channel"),
        ("target = '{'", "target"),
        ("target = '[]'", "target"),
        ("target = '{\"url\":\"ftp://x\"}'", "target"),
        (
            "target = '{\"url\":\"http://h\",\"headers\":{\"X A\":\"v\"}}'",
            "target",
        ),
        ("retry_interval = 'abc'", "retry_interval"),
        ("max_retry_times = -5", "max_retry_times"),
        ("alert_trigger_type = 9", "alert_trigger_type"),
        ("email = 'nobody'", "email"),
        ("on_error = 'maybe'", "on_error"),
        ("ordering = 'sideways'", "ordering"),
        ("rate_limit = '5/fortnight'", "rate_limit"),
        ("steps = '{'", "steps"),
        ("retry_jitter = 500", "retry_jitter"),
        ("immediate_retries = 1000", "immediate_retries"),
        ("circuit_failures = -1", "circuit_failures"),
    ]
    .into_iter()
    .map(|(set, field)| (set.to_string(), field))
    .collect();
    // SQLite stores a cell of any type: the row decodes on its own.
    if backend == Backend::Sqlite {
        cases.push(("max_retry_times = '5x'".into(), "max_retry_times"));
        cases.push(("need_confirm = 'perhaps'".into(), "need_confirm"));
        cases.push(("update_time = 'yesterday'".into(), "update_time"));
    }
    cases
}

/// What the three tables hold, as text.
async fn tables(db: &TestDb) -> String {
    let defs = store::rows(&db.db).await.unwrap();
    format!(
        "{:?}\n{:?}\n{:?}",
        defs.iter().map(|d| &d.row).collect::<Vec<_>>(),
        db.live().await,
        db.history().await
    )
}

fn no_panic(text: &str) {
    assert!(
        !text.contains("panicked") && !text.contains("RUST_BACKTRACE"),
        "{text}"
    );
}

db_test!(
    the_bad_input_census_gets_typed_errors_naming_the_field_and_writes_nothing,
    |db: Arc<TestDb>| async move {
        seed(&db).await;
        db.def("census_row", "script", |_| {}).await;
        let before = tables(&db).await;
        let mut census = 0;

        // 1. Definition files: refused by the parser or by the sync, which
        // writes nothing.
        let mut wrong = Vec::new();
        for (text, field) in bad_files() {
            census += 1;
            let error = match file::parse(&text, "census.toml") {
                Err(e) => e,
                Ok(specs) => match store::sync(&db.db, &specs).await {
                    Err(e) => e,
                    Ok(_) => {
                        wrong.push(format!("accepted:\n{text}"));
                        continue;
                    }
                },
            };
            let shown = error.to_string();
            if matches!(error, Error::Db(_))
                || !shown.contains(field)
                || shown.contains("v\r\n")
                || shown.contains("s3cr3t")
            {
                wrong.push(format!("{text}\nnames no `{field}`: {shown}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
        assert_eq!(tables(&db).await, before, "a definition file wrote");

        // 2. Hand-edited rows: the row alone is invalid, naming the field;
        // every other definition still reads.
        let id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'census_row'")
            .await;
        let original = db
            .db
            .query_one_raw(sea_orm::Statement::from_string(
                db.db.get_database_backend(),
                format!("SELECT * FROM notify_def WHERE id = {id}"),
            ))
            .await
            .unwrap()
            .is_some();
        assert!(original);
        for (set, field) in bad_rows(db.backend) {
            census += 1;
            let tx = db.db.begin().await.unwrap();
            tx.execute_unprepared(&format!("UPDATE notify_def SET {set} WHERE id = {id}"))
                .await
                .unwrap_or_else(|e| panic!("{set}: {e}"));
            let listed = store::list(&tx).await.expect(&set);
            for (row, def) in &listed {
                match (row.id == id, def) {
                    (true, Err(problem))
                        if problem.field == field && problem.def == "census_row" => {}
                    (true, _) => wrong.push(format!("{set}: {def:?}")),
                    (false, Ok(_)) => {}
                    (false, Err(e)) => wrong.push(format!("{set} spoiled {}: {e}", row.name)),
                }
            }
            tx.rollback().await.unwrap();
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert_eq!(tables(&db).await, before, "a row edit stayed");

        // 3. add_notice: a typed error naming the field; the caller's
        // transaction goes on, and nothing of it is written.
        let notifier = db.notifier().build().unwrap();
        let long = "k".repeat(256);
        let adds: Vec<(NewNotice, &str)> = vec![
            (NewNotice::new("no_such_def", &json!({})), "no_such_def"),
            (
                NewNotice::new("orders", &json!({})).load_balance_num(-1),
                "load_balance_num",
            ),
            (
                NewNotice::new("orders", &json!({})).idempotency_key(long.clone()),
                "idempotency_key",
            ),
            (
                NewNotice::new("orders", &json!({})).idempotency_key("k\0"),
                "idempotency_key",
            ),
            (
                NewNotice::new("orders", &json!({})).ordering_key(long.clone()),
                "ordering_key",
            ),
            (
                NewNotice::new("orders", &json!({})).ordering_key("k\0"),
                "ordering_key",
            ),
            (
                NewNotice::new("orders", &json!({})).description("a\0b"),
                "description",
            ),
            (
                NewNotice::new("orders", &json!({})).description("d".repeat(2 << 20)),
                "description",
            ),
            (
                NewNotice::new("orders", &json!({"big": "x".repeat(2 << 20)})),
                "param",
            ),
            (
                NewNotice::new("orders", &json!({})).target_override(json!({"handler": 5})),
                "handler",
            ),
            (
                NewNotice::new("orders", &json!({})).target_override(json!("script")),
                "override",
            ),
            (
                NewNotice::new("orders", &json!({})).target_override(json!([])),
                "override",
            ),
        ];
        let tx = notifier.begin().await.unwrap();
        db.insert_order(&tx, 1).await;
        for (notice, field) in adds {
            census += 1;
            match tx.add(notice).await {
                Err(
                    e @ (Error::InvalidNotice { .. } | Error::UnknownDef(_) | Error::Param { .. }),
                ) if e.to_string().contains(field) => {}
                other => wrong.push(format!("{field}: {other:?}")),
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // The transaction is intact: it commits the order, and only it.
        tx.commit().await.unwrap();
        assert_eq!(db.count_orders().await, 1);
        assert_eq!(tables(&db).await, before, "a refused notice was written");

        // 4. The API: 400 or 404 naming the field, never 500.
        let config = DashboardConfig {
            allow_actions: true,
            token: Some(TOKEN.into()),
            ..DashboardConfig::default()
        };
        let (base, stop) = serve(&db, config).await;
        let some_id = db.live().await[0].id;
        let bodies: Vec<(String, Value, &str)> = vec![
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "dryRun": true, "reason": "r"}),
                "dryRun",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "definition": "orders", "reason": "r"}),
                "definition",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "actor": "m", "reason": "r"}),
                "actor",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "limit": 5, "reason": "r"}),
                "limit",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "sideways", "def": "orders", "reason": "r"}),
                "place",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "status": "lost", "reason": "r"}),
                "status",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "older_than": "soon", "reason": "r"}),
                "older_than",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "older_than": "0s", "reason": "r"}),
                "filter",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "since": "1000000000y", "reason": "r"}),
                "filter",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "since": "yesterday-ish", "reason": "r"}),
                "since",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "partition": "one", "reason": "r"}),
                "partition",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders"}),
                "reason",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "reason": "\u{1b}\u{7}\n\u{202e}"}),
                "reason",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": 5, "reason": "r"}),
                "def",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "dry_run": "yes", "reason": "r"}),
                "dry_run",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "q": "zzz-nothing", "reason": "r"}),
                "q",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "q": "1", "key": "k", "reason": "r"}),
                "q",
            ),
            (
                "/api/bulk".into(),
                json!({"place": "in_flight", "def": "orders", "reason": ["r"]}),
                "reason",
            ),
            ("/api/bulk".into(), json!([1, 2]), "body"),
            (
                format!("/api/notices/{some_id}/cancel"),
                json!({}),
                "reason",
            ),
            (
                format!("/api/notices/{some_id}/cancel"),
                json!({"reason": "r", "actor": "m"}),
                "actor",
            ),
            (
                format!("/api/notices/{some_id}/requeue"),
                json!({"reason": "r"}),
                "notice",
            ),
            (
                "/api/notices/999999999/cancel".into(),
                json!({"reason": "r"}),
                "999999999",
            ),
            (
                "/api/notices/abc/cancel".into(),
                json!({"reason": "r"}),
                "id",
            ),
            (
                "/api/notices/-1/requeue".into(),
                json!({"reason": "r"}),
                "-1",
            ),
            (
                "/api/defs/orders/pause".into(),
                json!({"reason": "r", "until": "9000y"}),
                "until",
            ),
            (
                "/api/defs/orders/pause".into(),
                json!({"reason": "r", "until": "1999-01-01T00:00:00Z"}),
                "until",
            ),
            (
                "/api/defs/orders/pause".into(),
                json!({"reason": "r", "until": "tomorrow"}),
                "until",
            ),
            (
                "/api/defs/orders/pause".into(),
                json!({"reason": "r", "for": "2h"}),
                "for",
            ),
            ("/api/defs/orders/pause".into(), json!({}), "reason"),
            (
                "/api/defs/no_such_def/pause".into(),
                json!({"reason": "r"}),
                "no_such_def",
            ),
        ];
        for (path, body, field) in bodies {
            census += 1;
            let (status, text) = post(&base, &path, body.clone()).await;
            // A client error (400, 404, or 409 for a notice in another
            // state), never 500, and never done.
            if !status.is_client_error() || !text.contains(field) {
                wrong.push(format!("{path} {body}: `{field}`? {status} {text}"));
            }
        }
        let queries = [
            ("/api/notices?limit=-1", "limit"),
            ("/api/notices?limit=abc", "limit"),
            ("/api/notices?limit=18446744073709551616", "limit"),
            ("/api/notices?status=lost", "status"),
            ("/api/notices?place=sideways", "place"),
            ("/api/notices?before_id=x", "before_id"),
            ("/api/notices?partition=one", "partition"),
            ("/api/notices?older_than=soon", "older_than"),
            ("/api/notices/abc", "id"),
            ("/api/notices/999999999", "999999999"),
        ];
        let long_q = format!("/api/notices?q={}", "x".repeat(10_000));
        for (path, field) in queries.iter().copied().chain([(long_q.as_str(), "q")]) {
            census += 1;
            let response = client()
                .get(format!("{base}{path}"))
                .basic_auth("alice", Some(TOKEN))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let text = response.text().await.unwrap();
            if !(status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND)
                || !text.contains(field)
            {
                let text: String = text.chars().take(300).collect();
                wrong.push(format!(
                    "{}: `{field}`? {status} {text}",
                    &path[..path.len().min(80)]
                ));
            }
        }
        stop.cancel();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));

        // 5. The CLI: a failure naming the argument, no panic.
        let dir = std::env::temp_dir().join(format!(
            "sn-census-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let bad_defs = dir.join("bad.toml");
        std::fs::write(
            &bad_defs,
            def_file("target = { url = \"https://h\", headers = { \"X A\" = \"v\" } }"),
        )
        .unwrap();
        let bad_defs = bad_defs.to_string_lossy().into_owned();
        let dir_arg = dir.to_string_lossy().into_owned();
        let args: Vec<(Vec<&str>, &str)> = vec![
            (vec!["list", "--limit", "18446744073709551615"], "limit"),
            (vec!["list", "--limit", "-1"], "'-1'"),
            (vec!["list", "--limit", "0"], "limit"),
            (vec!["list", "--status", "lost"], "status"),
            (vec!["list", "--older-than", "soon"], "older"),
            (vec!["history", "list", "--limit", "abc"], "limit"),
            (vec!["show", "abc"], "ID"),
            (
                vec!["pause", "orders", "--until", "9000y", "--reason", "r"],
                "until",
            ),
            (
                vec![
                    "pause",
                    "orders",
                    "--until",
                    "1999-01-01T00:00:00Z",
                    "--reason",
                    "r",
                ],
                "until",
            ),
            (vec!["pause", "no_such_def", "--reason", "r"], "no_such_def"),
            (vec!["cancel", "--def", "orders"], "reason"),
            (
                vec!["cancel", "--older-than", "0s", "--reason", "r"],
                "older-than",
            ),
            (
                vec![
                    "cancel",
                    "--def",
                    "orders",
                    "--reason",
                    "\u{1b}\u{7}\u{202e}",
                ],
                "reason",
            ),
            (vec!["requeue", "--id", "abc"], "id"),
            (vec!["purge", "--older-than", "soon"], "older"),
            (
                vec!["purge", "--older-than", "30d", "--batch-size", "0"],
                "batch",
            ),
            (vec!["defs", "sync", "--check", &dir_arg], "X A"),
            (vec!["defs", "sync", &dir_arg], "target"),
            (vec!["defs", "list", "--limit", "0"], "limit"),
            (
                vec!["worker", "--batch-size", "18446744073709551615"],
                "batch",
            ),
            (vec!["worker", "--batch-size", "0"], "batch"),
            (vec!["worker", "--concurrency", "0"], "concurrency"),
            (vec!["worker", "--lease", "1ms"], "lease"),
            (vec!["worker", "--cron", "every tuesday"], "cron"),
            (vec!["worker", "--partitions", "x"], "partitions"),
        ];
        assert!(std::path::Path::new(&bad_defs).exists());
        for (args, field) in args {
            census += 1;
            let (ok, out, err) = cli(&db, &args);
            no_panic(&err);
            if ok || !err.to_lowercase().contains(&field.to_lowercase()) {
                wrong.push(format!("{args:?}: `{field}`? ok={ok} {out} {err}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));

        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(tables(&db).await, before, "the census wrote");
        assert!(census >= 100, "only {census} cases");
        eprintln!("census: {census} malformed inputs, each refused by name");
    }
);
