//! HTTP channel against a real HTTP server on 127.0.0.1 (tests/common/mock.rs).

use std::{sync::Arc, time::Duration};

use crate::mock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{method, path},
};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use solid_notify::{
    AttemptResult, NewNotice, Notifier, Status,
    def::{Channel, DefSpec, store},
};

use crate::{
    db_test,
    support::{KillOnDrop, TestDb, eventually, test_config},
};

async fn http_def(db: &TestDb, name: &str, target: Value, edit: impl FnOnce(&mut DefSpec)) {
    let mut spec = DefSpec::new(name, Channel::Http, target);
    spec.retry_interval = "1s".into();
    edit(&mut spec);
    store::sync(&db.db, &[spec]).await.unwrap();
}

/// An HTTP receiver on 127.0.0.1 that answers every POST with 200.
async fn accepting_receiver() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

async fn send(notifier: &Notifier, notice: NewNotice) -> (i64, AttemptResult) {
    let tx = notifier.begin().await.unwrap();
    let id = tx.add(notice).await.unwrap();
    let report = tx.commit_and_wait().await.unwrap().pop().unwrap();
    (id, report.result)
}

fn reason(result: &AttemptResult) -> &str {
    match result {
        AttemptResult::WillRetry { reason, .. } | AttemptResult::FinalFailure { reason, .. } => {
            reason
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

db_test!(
    success_carries_body_and_headers,
    |db: Arc<TestDb>| async move {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/hook"))
            .respond_with(ResponseTemplate::new(200))
            .mount(&server)
            .await;
        let target =
            json!({"url": format!("{}/hook", server.uri()), "headers": {"x-tenant": "acme"}});
        http_def(&db, "hook", target, |_| {}).await;
        let notifier = db.notifier().build().unwrap();
        let notice = NewNotice::new("hook", &json!({"order": 42})).idempotency_key("order-42");
        let (id, result) = send(&notifier, notice).await;
        assert_eq!(result, AttemptResult::Succeeded);
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 1);
        let req = &requests[0];
        let header = |name: &str| {
            req.headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            serde_json::from_slice::<Value>(&req.body).unwrap(),
            json!({"order": 42})
        );
        assert_eq!(header("x-notice-id"), Some(id.to_string()));
        assert_eq!(header("x-notice-def").as_deref(), Some("hook"));
        assert_eq!(header("x-notice-attempt").as_deref(), Some("1"));
        assert_eq!(header("idempotency-key").as_deref(), Some("order-42"));
        assert_eq!(header("x-tenant").as_deref(), Some("acme"));
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
        assert_eq!(db.history_of(id).await.unwrap().status, Status::Succeeded);
    }
);

db_test!(
    server_error_is_retried_then_succeeds,
    |db: Arc<TestDb>| async move {
        let server = MockServer::start().await;
        Mock::given(path("/flaky"))
            .respond_with(ResponseTemplate::new(500).set_body_string("database down"))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(path("/flaky"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;
        http_def(
            &db,
            "flaky",
            json!({"url": format!("{}/flaky", server.uri())}),
            |_| {},
        )
        .await;
        let notifier = db.notifier().build().unwrap();
        let (id, first) = send(&notifier, NewNotice::new("flaky", &json!({}))).await;
        assert!(
            matches!(first, AttemptResult::WillRetry { attempt: 1, .. }),
            "{first:?}"
        );
        assert_eq!(
            reason(&first),
            "HTTP 500 Internal Server Error: database down"
        );
        let done = eventually(10, "retry delivered", || async {
            notifier.sweep_once(10).await.unwrap();
            db.history_of(id).await
        })
        .await;
        assert_eq!((done.status, done.retry_times), (Status::Succeeded, 1));
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].headers.get("x-notice-attempt").unwrap(), "2");
    }
);

db_test!(
    client_error_is_permanent_and_timeout_retryable,
    |db: Arc<TestDb>| async move {
        let server = MockServer::start().await;
        Mock::given(path("/bad"))
            .respond_with(ResponseTemplate::new(400).set_body_string("missing field"))
            .mount(&server)
            .await;
        Mock::given(path("/busy"))
            .respond_with(ResponseTemplate::new(429))
            .mount(&server)
            .await;
        Mock::given(path("/slow"))
            .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(3)))
            .mount(&server)
            .await;
        let url = |p: &str| format!("{}/{p}", server.uri());
        http_def(&db, "bad", json!({"url": url("bad")}), |_| {}).await;
        http_def(&db, "busy", json!({"url": url("busy")}), |_| {}).await;
        http_def(
            &db,
            "slow",
            json!({"url": url("slow"), "timeout": "1s"}),
            |_| {},
        )
        .await;
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        http_def(
            &db,
            "refused",
            json!({"url": format!("http://{closed}/x")}),
            |_| {},
        )
        .await;
        let notifier = db.notifier().build().unwrap();

        let (id, bad) = send(&notifier, NewNotice::new("bad", &json!({}))).await;
        assert!(
            matches!(bad, AttemptResult::FinalFailure { attempt: 1, .. }),
            "{bad:?}"
        );
        assert_eq!(reason(&bad), "HTTP 400 Bad Request: missing field");
        assert_eq!(
            db.history_of(id).await.unwrap().status,
            Status::FinalFailure
        );

        let (_, busy) = send(&notifier, NewNotice::new("busy", &json!({}))).await;
        assert!(reason(&busy).starts_with("HTTP 429"), "{busy:?}");
        assert!(matches!(busy, AttemptResult::WillRetry { .. }));

        let (_, slow) = send(&notifier, NewNotice::new("slow", &json!({}))).await;
        assert!(matches!(slow, AttemptResult::WillRetry { .. }), "{slow:?}");
        assert_eq!(reason(&slow), "HTTP timeout after 1s");

        let (_, refused) = send(&notifier, NewNotice::new("refused", &json!({}))).await;
        assert!(
            matches!(refused, AttemptResult::WillRetry { .. }),
            "{refused:?}"
        );
        assert!(
            reason(&refused).starts_with("HTTP request failed"),
            "{refused:?}"
        );
    }
);

db_test!(expected_body_is_checked, |db: Arc<TestDb>| async move {
    let server = MockServer::start().await;
    Mock::given(path("/ok"))
        .respond_with(ResponseTemplate::new(200).set_body_string("success\n"))
        .mount(&server)
        .await;
    Mock::given(path("/meh"))
        .respond_with(ResponseTemplate::new(200).set_body_string("queued"))
        .mount(&server)
        .await;
    let target =
        |p: &str| json!({"url": format!("{}/{p}", server.uri()), "expected_body": "success"});
    http_def(&db, "ok", target("ok"), |_| {}).await;
    http_def(&db, "meh", target("meh"), |_| {}).await;
    let notifier = db.notifier().build().unwrap();
    assert_eq!(
        send(&notifier, NewNotice::new("ok", &json!({}))).await.1,
        AttemptResult::Succeeded
    );
    let (_, meh) = send(&notifier, NewNotice::new("meh", &json!({}))).await;
    assert!(matches!(meh, AttemptResult::WillRetry { .. }), "{meh:?}");
    assert!(
        reason(&meh).contains("`queued` is not the expected `success`"),
        "{meh:?}"
    );
});

db_test!(
    signature_verifies_with_the_secret,
    |db: Arc<TestDb>| async move {
        let server = MockServer::start().await;
        Mock::given(path("/signed"))
            .respond_with(ResponseTemplate::new(200))
            .mount(&server)
            .await;
        let target =
            json!({"url": format!("{}/signed", server.uri()), "signing_secret": "hook_secret"});
        http_def(&db, "signed", target, |_| {}).await;
        let row = store::list(&db.db)
            .await
            .unwrap()
            .into_iter()
            .find(|(r, _)| r.name == "signed")
            .unwrap()
            .0;
        assert!(
            !row.target.contains("s3cr3t"),
            "the secret is not in notify_def"
        );
        let mut config = test_config();
        config.secrets.insert("hook_secret".into(), "s3cr3t".into());
        let notifier = db.notifier().config(config).build().unwrap();
        assert_eq!(
            send(&notifier, NewNotice::new("signed", &json!({"a": 1})))
                .await
                .1,
            AttemptResult::Succeeded
        );

        let req = &server.received_requests().await.unwrap()[0];
        let timestamp = req
            .headers
            .get("x-notice-timestamp")
            .unwrap()
            .to_str()
            .unwrap();
        let signature = req
            .headers
            .get("x-notice-signature")
            .unwrap()
            .to_str()
            .unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cr3t").unwrap();
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(&req.body);
        let hex = signature.strip_prefix("sha256=").unwrap();
        mac.verify_slice(&hex::decode(hex).unwrap())
            .expect("signature verifies");
        let mut wrong = Hmac::<Sha256>::new_from_slice(b"other").unwrap();
        wrong.update(timestamp.as_bytes());
        wrong.update(b".");
        wrong.update(&req.body);
        assert!(wrong.verify_slice(&hex::decode(hex).unwrap()).is_err());
    }
);

db_test!(per_notice_url_override, |db: Arc<TestDb>| async move {
    let server = accepting_receiver().await;
    http_def(
        &db,
        "callback",
        json!({"url": format!("{}/default", server.uri()), "overridable": ["url"]}),
        |_| {},
    )
    .await;
    let notifier = db.notifier().config(test_config()).build().unwrap();
    let own = NewNotice::new("callback", &json!({"job": 7}))
        .target_override(json!({"url": format!("{}/jobs/7/done", server.uri())}));
    assert_eq!(send(&notifier, own).await.1, AttemptResult::Succeeded);
    assert_eq!(
        send(&notifier, NewNotice::new("callback", &json!({"job": 8})))
            .await
            .1,
        AttemptResult::Succeeded
    );
    let paths: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.url.path().to_string())
        .collect();
    assert_eq!(paths, ["/jobs/7/done", "/default"]);
});

db_test!(cli_worker_delivers_and_stops_on_sigterm, |db: Arc<
    TestDb,
>| async move {
    let server = accepting_receiver().await;
    http_def(
        &db,
        "cli_hook",
        json!({"url": format!("{}/cli", server.uri())}),
        |_| {},
    )
    .await;
    db.insert_due("cli_hook", 25, |_| 0).await;
    let mut child = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args([
                "worker",
                "--allow-private-network",
                "--mode",
                "fixed-delay",
                "--delay",
                "100ms",
                "--batch-size",
                "10",
            ])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    eventually(30, "the CLI worker drained the notices", || async {
        (db.counts().await == (0, 25)).then_some(())
    })
    .await;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("worker stopped: 25 claimed, 25 succeeded"),
        "{stderr}"
    );
    assert_eq!(server.received_requests().await.unwrap().len(), 25);
});
