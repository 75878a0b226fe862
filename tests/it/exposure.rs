//! Safe to expose: no credential follows a producer-chosen URL, a
//! receiver's redirect or a producer-chosen secret name; no secret on a
//! page, in `errors` or in `Debug`.

use std::sync::Arc;

use crate::mock::{Mock, MockServer, ResponseTemplate, matchers::method};
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};
use solid_notify::{
    AttemptResult, Config, Error, NewNotice, Notifier, Outcome,
    dashboard::DashboardConfig,
    def::{Channel, DefSpec, store},
};

use crate::{
    db_test,
    support::{TestDb, test_config},
};

async fn def(db: &TestDb, name: &str, channel: Channel, target: Value) {
    let mut spec = DefSpec::new(name, channel, target);
    spec.retry_interval = "1s".into();
    spec.max_retry_times = 0;
    store::sync(&db.db, &[spec]).await.unwrap();
}

async fn receiver(status: u16) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(status))
        .mount(&server)
        .await;
    server
}

async fn send(notifier: &Notifier, notice: NewNotice) -> AttemptResult {
    let tx = notifier.begin().await.unwrap();
    tx.add(notice).await.unwrap();
    tx.commit_and_wait().await.unwrap().pop().unwrap().result
}

/// The HTTP definition `billing_hook` with a bearer token and a signing
/// secret, pointing at `home`; `extra` is merged into its target.
async fn billing_hook(db: &TestDb, home: &MockServer, extra: Value) -> Notifier {
    let mut target = json!({
        "url": format!("{}/billing", home.uri()),
        "headers": {"Authorization": "Bearer t0ken-of-billing"},
        "signing_secret": "billing",
    });
    for (k, v) in extra.as_object().unwrap() {
        target[k] = v.clone();
    }
    def(db, "billing_hook", Channel::Http, target).await;
    let mut config = test_config();
    config
        .secrets
        .insert("billing".into(), "s1gning-key".into());
    db.notifier().config(config).build().unwrap()
}

db_test!(an_override_needs_the_definitions_leave, |db: Arc<
    TestDb,
>| async move {
    let home = receiver(200).await;
    let notifier = billing_hook(&db, &home, json!({})).await;
    let elsewhere = receiver(200).await;
    // Not allowed: refused at the add, nothing written.
    let tx = notifier.begin().await.unwrap();
    let refused = tx
        .add(
            NewNotice::new("billing_hook", &json!({}))
                .target_override(json!({"url": format!("{}/x", elsewhere.uri())})),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidNotice { problem: m, .. }) if m.contains("`url` may not be overridden")),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();
    // A plain-SQL producer writes one anyway: it fails for good at
    // delivery, sending nothing.
    let def_id = db
        .scalar("SELECT id FROM notify_def WHERE name = 'billing_hook'")
        .await;
    db.db
        .execute_unprepared(&format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time, target_override) \
                 VALUES ({def_id}, '{{}}', '2000-01-01 00:00:00', '{{\"url\": \"{}/x\"}}')",
            elsewhere.uri()
        ))
        .await
        .unwrap();
    let reports = notifier.sweep_once(10).await.unwrap();
    assert!(
        matches!(&reports[0].result, AttemptResult::FinalFailure { reason, .. } if reason.contains("may not be overridden")),
        "{reports:?}"
    );
    assert!(elsewhere.received_requests().await.unwrap().is_empty());
    // Nor may a definition allow the secret's name to be overridden.
    let mut spec = DefSpec::new(
        "oracle",
        Channel::Http,
        json!({"url": home.uri(), "overridable": ["signing_secret"]}),
    );
    spec.retry_interval = "1s".into();
    let bad = store::sync(&db.db, &[spec]).await;
    assert!(
        format!("{bad:?}").contains("can never be overridden"),
        "{bad:?}"
    );
});

db_test!(credentials_do_not_follow_an_overridden_url, |db: Arc<
    TestDb,
>| async move {
    let home = receiver(200).await;
    let notifier = billing_hook(&db, &home, json!({"overridable": ["url"]})).await;
    let elsewhere = receiver(200).await;
    // Another origin: no token, no signature.
    let moved = NewNotice::new("billing_hook", &json!({"n": 1}))
        .target_override(json!({"url": format!("{}/callback", elsewhere.uri())}));
    assert_eq!(send(&notifier, moved).await, AttemptResult::Succeeded);
    let got = &elsewhere.received_requests().await.unwrap()[0];
    assert!(
        got.headers.get("authorization").is_none(),
        "{:?}",
        got.headers
    );
    assert!(got.headers.get("x-notice-signature").is_none());
    // The same origin, another path: they are the definition's own.
    let same = NewNotice::new("billing_hook", &json!({"n": 2}))
        .target_override(json!({"url": format!("{}/jobs/7", home.uri())}));
    assert_eq!(send(&notifier, same).await, AttemptResult::Succeeded);
    let got = &home.received_requests().await.unwrap()[0];
    assert_eq!(got.url.path(), "/jobs/7");
    assert!(got.headers.get("authorization").is_some());
    assert!(got.headers.get("x-notice-signature").is_some());
});

db_test!(credentials_follow_when_the_definition_says_so, |db: Arc<
    TestDb,
>| async move {
    let home = receiver(200).await;
    let notifier = billing_hook(
        &db,
        &home,
        json!({"overridable": ["url"], "credentials_follow_override": true}),
    )
    .await;
    let elsewhere = receiver(200).await;
    let moved = NewNotice::new("billing_hook", &json!({}))
        .target_override(json!({"url": format!("{}/callback", elsewhere.uri())}));
    assert_eq!(send(&notifier, moved).await, AttemptResult::Succeeded);
    let got = &elsewhere.received_requests().await.unwrap()[0];
    assert!(got.headers.get("authorization").is_some());
    assert!(got.headers.get("x-notice-signature").is_some());
});

db_test!(a_redirect_is_not_followed, |db: Arc<TestDb>| async move {
    let inside = receiver(200).await;
    let home = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("location", format!("{}/internal", inside.uri()).as_str()),
        )
        .mount(&home)
        .await;
    let notifier = billing_hook(&db, &home, json!({})).await;
    let result = send(&notifier, NewNotice::new("billing_hook", &json!({}))).await;
    assert!(
        matches!(&result, AttemptResult::FinalFailure { reason, .. } if reason.contains("307")),
        "{result:?}"
    );
    assert!(inside.received_requests().await.unwrap().is_empty());
});

db_test!(
    a_handler_cannot_be_repointed,
    |db: Arc<TestDb>| async move {
        def(&db, "ship", Channel::Handler, json!({"handler": "ship"})).await;
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let admin = calls.clone();
        let notifier = db
            .notifier()
            .config(test_config())
            .handler("ship", |_n| async { Ok(Outcome::success()) })
            .handler("admin", move |_n| {
                admin.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok(Outcome::success()) }
            })
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let refused = tx
            .add(NewNotice::new("ship", &json!({})).target_override(json!({"handler": "admin"})))
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidNotice { .. })),
            "{refused:?}"
        );
        tx.rollback().await.unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
);

db_test!(secrets_stay_off_pages_and_out_of_errors, |db: Arc<
    TestDb,
>| async move {
    // A key in the URL's query, a token in a header.
    def(
        &db,
        "keyed",
        Channel::Http,
        json!({
            "url": "http://127.0.0.1:9/hook?api_key=k3y-in-query",
            "headers": {"X-Api-Key": "h3ader-key"},
        }),
    )
    .await;
    let notifier = db.notifier().config(test_config()).build().unwrap();
    let result = send(&notifier, NewNotice::new("keyed", &json!({}))).await;
    let AttemptResult::FinalFailure { reason, .. } = &result else {
        panic!("{result:?}")
    };
    assert!(!reason.contains("k3y-in-query"), "{reason}");
    let (base, stop) = crate::dashboard::serve(&db, DashboardConfig::default()).await;
    let http = crate::dashboard::client();
    for page in ["/defs", "/api/defs", "/notices", "/api/notices"] {
        let text = http
            .get(format!("{base}{page}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !text.contains("k3y-in-query") && !text.contains("h3ader-key"),
            "{page} shows a secret: {text}"
        );
    }
    stop.cancel();
});

db_test!(
    a_url_kept_as_a_secret_is_never_shown,
    |db: Arc<TestDb>| async move {
        // A Slack-style incoming webhook: the path is the credential.
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let failing = fail.clone();
        let hook = crate::receiver::Receiver::start(move |_| {
            match failing.load(std::sync::atomic::Ordering::SeqCst) {
                true => crate::receiver::Reply::status(500),
                false => crate::receiver::Reply::ok(),
            }
        })
        .await;
        let secret_url = hook.url.replace("/hook", "/services/T1/B2/SECRETX");
        def(
            &db,
            "slack",
            Channel::Http,
            json!({ "url": {"secret": "SLACK_HOOK"} }),
        )
        .await;
        let mut config = test_config();
        config.secrets.insert("SLACK_HOOK".into(), secret_url);
        let notifier = db.notifier().config(config).build().unwrap();
        let result = send(&notifier, NewNotice::new("slack", &json!({"text": "hi"}))).await;
        assert!(matches!(result, AttemptResult::Succeeded), "{result:?}");
        assert_eq!(hook.seen().len(), 1, "delivered to the secret URL");
        // A failure's reason, and every page, name the secret, never its URL.
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let result = send(&notifier, NewNotice::new("slack", &json!({"text": "hi"}))).await;
        let AttemptResult::FinalFailure { reason, .. } = &result else {
            panic!("{result:?}")
        };
        assert!(!reason.contains("SECRETX"), "{reason}");
        // Without the secret: a retry that names it.
        let keyless = db.notifier().config(test_config()).build().unwrap();
        let result = send(&keyless, NewNotice::new("slack", &json!({}))).await;
        assert!(
            matches!(&result, AttemptResult::FinalFailure { reason, .. } if reason.contains("secret `SLACK_HOOK` is not configured")),
            "{result:?}"
        );
        // A notice may not move it.
        let tx = notifier.begin().await.unwrap();
        let moved = tx
            .add(
                NewNotice::new("slack", &json!({}))
                    .target_override(json!({"url": "http://127.0.0.1:9/elsewhere"})),
            )
            .await;
        assert!(moved.is_err(), "{moved:?}");
        tx.rollback().await.unwrap();
        let (base, stop) = crate::dashboard::serve(&db, DashboardConfig::default()).await;
        let http = crate::dashboard::client();
        for page in [
            "/defs",
            "/api/defs",
            "/notices?place=history",
            "/api/notices?place=history",
        ] {
            let text = http
                .get(format!("{base}{page}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(
                !text.contains("SECRETX") && !text.contains("/services/"),
                "{page}: {text}"
            );
        }
        stop.cancel();
        let errors = db
            .history()
            .await
            .into_iter()
            .map(|r| r.errors)
            .collect::<String>();
        assert!(!errors.contains("SECRETX"), "{errors}");
    }
);

db_test!(
    an_amqp_url_written_without_slashes_shows_no_password,
    |db: Arc<TestDb>| async move {
        def(
            &db,
            "queue",
            Channel::Amqp,
            json!({ "exchange": "", "routing_key": "q" }),
        )
        .await;
        let mut config = test_config();
        config.amqp.url = Some("amqp:guest:s3cr3tpw@127.0.0.1:5672".into());
        config.amqp.connect_timeout = std::time::Duration::from_secs(2);
        let notifier = db.notifier().config(config).build().unwrap();
        let result = send(&notifier, NewNotice::new("queue", &json!({}))).await;
        let AttemptResult::FinalFailure { reason, .. } = &result else {
            panic!("{result:?}")
        };
        assert!(!reason.contains("s3cr3tpw"), "{reason}");
        assert!(reason.contains("not valid"), "{reason}");
        let errors = db
            .history()
            .await
            .into_iter()
            .map(|r| r.errors)
            .collect::<String>();
        assert!(!errors.contains("s3cr3tpw"), "{errors}");
    }
);

#[test]
fn debug_hides_passwords_and_secrets() {
    let mut config = Config::default();
    config
        .secrets
        .insert("billing".into(), "s1gning-key".into());
    config.mail.smtp_url = Some("smtp://user:smtp-pa55@127.0.0.1:25".into());
    config.amqp.url = Some("amqp://guest:amqp-pa55@127.0.0.1:5672/%2f".into());
    let shown = format!("{config:?}");
    for secret in ["s1gning-key", "smtp-pa55", "amqp-pa55"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("billing"), "names stay: {shown}");
}

db_test!(an_override_cannot_route_by_host_header, |db: Arc<
    TestDb,
>| async move {
    let home = receiver(200).await;
    let notifier = billing_hook(&db, &home, json!({"overridable": ["headers"]})).await;
    let tx = notifier.begin().await.unwrap();
    let refused = tx
        .add(
            NewNotice::new("billing_hook", &json!({}))
                .target_override(json!({"headers": {"HOST": "attacker.example"}})),
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidNotice { problem, .. }) if problem.contains("HOST")),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();
    assert!(home.received_requests().await.unwrap().is_empty());
});

db_test!(
    a_notices_override_is_shown_without_its_secrets,
    |db: Arc<TestDb>| async move {
        let home = receiver(200).await;
        let notifier = billing_hook(&db, &home, json!({"overridable": ["headers"]})).await;
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add(
                NewNotice::new("billing_hook", &json!({}))
                    .target_override(json!({"headers": {"Authorization": "Bearer pr0ducer"}})),
            )
            .await
            .unwrap();
        tx.commit_and_wait().await.unwrap();
        let got = &home.received_requests().await.unwrap()[0];
        assert_eq!(
            got.headers.get("authorization").unwrap(),
            "Bearer pr0ducer",
            "sent as the producer asked"
        );
        let (base, stop) = crate::dashboard::serve(&db, DashboardConfig::default()).await;
        let http = crate::dashboard::client();
        for page in [format!("/notices/{id}"), format!("/api/notices/{id}")] {
            let response = http.get(format!("{base}{page}")).send().await.unwrap();
            assert!(response.status().is_success(), "{page}");
            let text = response.text().await.unwrap();
            assert!(!text.contains("pr0ducer"), "{page} shows a secret: {text}");
        }
        stop.cancel();
    }
);

/// `result` a final failure whose reason holds `text`.
fn failed_for_good(result: &AttemptResult, text: &str) {
    assert!(
        matches!(result, AttemptResult::FinalFailure { reason, .. } if reason.contains(text)),
        "{result:?}"
    );
}

db_test!(
    a_secret_urls_host_is_never_said,
    |db: Arc<TestDb>| async move {
        let inside = receiver(200).await;
        let port = inside.address().port();
        // A name the guard resolves to a private address, and a private IP
        // literal, each kept as a secret.
        let urls = [
            ("by_name", format!("http://localhost:{port}/T0ken")),
            ("by_ip", format!("http://127.0.0.1:{port}/T0ken")),
        ];
        for (name, _) in &urls {
            def(
                &db,
                name,
                Channel::Http,
                json!({"url": {"secret": format!("{name}_url")}}),
            )
            .await;
        }
        let guarded = db
            .notifier()
            .config(Config {
                allow_private_network: false,
                secrets: urls
                    .iter()
                    .map(|(name, url)| (format!("{name}_url"), url.clone()))
                    .collect(),
                ..test_config()
            })
            .build()
            .unwrap();
        for (name, _) in &urls {
            let result = send(&guarded, NewNotice::new(*name, &json!({}))).await;
            failed_for_good(&result, "not a public address");
            failed_for_good(&result, &format!("secret `{name}_url`"));
            let reason = format!("{result:?}");
            for said in ["localhost", "127.0.0.1", &port.to_string(), "T0ken"] {
                assert!(!reason.contains(said), "{name}: `{said}` said in {reason}");
            }
            let errors: String = db
                .db
                .query_one_raw(sea_orm::Statement::from_string(
                    db.db.get_database_backend(),
                    format!(
                        "SELECT h.errors FROM notify_msg_history h JOIN notify_def d \
                     ON d.id = h.def_id WHERE d.name = '{name}'"
                    ),
                ))
                .await
                .unwrap()
                .expect("moved to history")
                .try_get_by_index(0)
                .unwrap();
            for said in ["localhost", "127.0.0.1", "T0ken"] {
                assert!(
                    !errors.contains(said),
                    "{name}: `{said}` in its log: {errors}"
                );
            }
        }
        assert!(inside.received_requests().await.unwrap().is_empty());

        // Nor in a receiver's answer: a redirect's body echoes the URL.
        let echoing = MockServer::start().await;
        let secret_url = format!("http://127.0.0.1:{}/T0ken", echoing.address().port());
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(302)
                    .set_body_string(format!("Found. Redirecting to {secret_url}")),
            )
            .mount(&echoing)
            .await;
        def(
            &db,
            "echoed",
            Channel::Http,
            json!({"url": {"secret": "echoed_url"}}),
        )
        .await;
        let open = db
            .notifier()
            .config(Config {
                secrets: [("echoed_url".to_string(), secret_url.clone())].into(),
                ..test_config()
            })
            .build()
            .unwrap();
        let result = send(&open, NewNotice::new("echoed", &json!({}))).await;
        failed_for_good(&result, "302");
        failed_for_good(&result, "secret `echoed_url`");
        let reason = format!("{result:?}");
        assert!(!reason.contains("T0ken"), "{reason}");
        assert!(!reason.contains("127.0.0.1"), "{reason}");
        assert_eq!(echoing.received_requests().await.unwrap().len(), 1);
    }
);

db_test!(private_addresses_are_refused_unless_allowed, |db: Arc<
    TestDb,
>| async move {
    let inside = receiver(200).await;
    let port = inside.address().port();
    def(
        &db,
        "by_ip",
        Channel::Http,
        json!({"url": format!("http://127.0.0.1:{port}/ip")}),
    )
    .await;
    def(
        &db,
        "by_name",
        Channel::Http,
        json!({"url": format!("http://localhost:{port}/name")}),
    )
    .await;
    def(
        &db,
        "metadata",
        Channel::Http,
        json!({"url": "http://169.254.169.254/latest/meta-data"}),
    )
    .await;
    def(
        &db,
        "let_in",
        Channel::Http,
        json!({
            "url": format!("http://127.0.0.1:{port}/allowed"),
            "allow_private_network": true,
            "overridable": ["url"],
        }),
    )
    .await;
    let guarded = db
        .notifier()
        .config(Config {
            allow_private_network: false,
            ..test_config()
        })
        .build()
        .unwrap();
    for name in ["by_ip", "by_name", "metadata"] {
        let result = send(&guarded, NewNotice::new(name, &json!({}))).await;
        failed_for_good(&result, "not a public address");
        failed_for_good(&result, "allow_private_network");
    }
    assert_eq!(
        inside.received_requests().await.unwrap().len(),
        0,
        "the guard let one through"
    );

    // The definition's leave holds for its own URL, not for an override's.
    let result = send(&guarded, NewNotice::new("let_in", &json!({}))).await;
    assert_eq!(result, AttemptResult::Succeeded);
    let other = receiver(200).await;
    let moved = NewNotice::new("let_in", &json!({})).target_override(
        json!({"url": format!("http://127.0.0.1:{}/moved", other.address().port())}),
    );
    failed_for_good(&send(&guarded, moved).await, "not a public address");
    assert_eq!(other.received_requests().await.unwrap().len(), 0);
    let paths: Vec<String> = inside
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.url.path().to_string())
        .collect();
    assert_eq!(paths, ["/allowed"]);

    // The config lifts the guard for every definition.
    let open = db.notifier().build().unwrap();
    for name in ["by_ip", "by_name"] {
        assert_eq!(
            send(&open, NewNotice::new(name, &json!({}))).await,
            AttemptResult::Succeeded
        );
    }
    assert_eq!(inside.received_requests().await.unwrap().len(), 3);
});

db_test!(
    header_values_can_be_secret_references,
    |db: Arc<TestDb>| async move {
        let home = receiver(200).await;
        def(
            &db,
            "keyed",
            Channel::Http,
            json!({
                "url": format!("{}/keyed", home.uri()),
                "headers": {"X-Api-Key": {"secret": "crm.key"}, "X-Plain": "p"},
                "overridable": ["headers"],
            }),
        )
        .await;
        let elsewhere = receiver(200).await;
        def(
            &db,
            "keyed_follow",
            Channel::Http,
            json!({
                "url": format!("{}/keyed", home.uri()),
                "headers": {"X-Api-Key": {"secret": "crm.key"}, "X-Plain": "p"},
                "overridable": ["url"],
                "credentials_follow_override": true,
            }),
        )
        .await;
        // The row holds the name, never the value.
        let stored = store::rows(&db.db).await.unwrap();
        let row = stored.iter().find(|d| d.name == "keyed").unwrap();
        assert!(row.target.contains("crm.key") && !row.target.contains("k3y-value"));

        // Missing: retried, naming the secret.
        let without = db.notifier().build().unwrap();
        let result = send(&without, NewNotice::new("keyed", &json!({}))).await;
        assert!(
            matches!(&result, AttemptResult::FinalFailure { reason, .. } if reason.contains("secret `crm.key` is not configured")),
            "{result:?}"
        );
        assert_eq!(home.received_requests().await.unwrap().len(), 0);

        let mut config = test_config();
        config.secrets.insert("crm.key".into(), "k3y-value".into());
        config.secrets.insert("other".into(), "0ther-value".into());
        let notifier = db.notifier().config(config).build().unwrap();
        assert_eq!(
            send(&notifier, NewNotice::new("keyed", &json!({}))).await,
            AttemptResult::Succeeded
        );
        let requests = home.received_requests().await.unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].headers["x-api-key"], "k3y-value");
        assert_eq!(requests[0].headers["x-plain"], "p");

        // A secret stays with its own origin, even where the definition lets
        // its credentials follow a moved URL.
        let moved = NewNotice::new("keyed_follow", &json!({}))
            .target_override(json!({"url": format!("{}/moved", elsewhere.uri())}));
        assert_eq!(send(&notifier, moved).await, AttemptResult::Succeeded);
        let there = elsewhere.received_requests().await.unwrap();
        assert_eq!(there.len(), 1);
        assert!(
            there[0].headers.get("x-api-key").is_none(),
            "the secret followed"
        );
        assert_eq!(there[0].headers["x-plain"], "p");

        // A notice may override the headers with text, never name a secret.
        let tx = notifier.begin().await.unwrap();
        let refused = tx
            .add(
                NewNotice::new("keyed", &json!({}))
                    .target_override(json!({"headers": {"X-Api-Key": {"secret": "other"}}})),
            )
            .await;
        assert!(
            matches!(&refused, Err(Error::InvalidNotice { problem, .. }) if problem.contains("may not name a secret")),
            "{refused:?}"
        );
        tx.rollback().await.unwrap();
        // Nor by plain SQL: the row fails for good at the attempt, unsent.
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'keyed'")
            .await;
        db.db
        .execute_unprepared(&format!(
            "INSERT INTO notify_msg (def_id, param, target_override) VALUES ({def_id}, '{{}}', '{{\"headers\":{{\"X-Api-Key\":{{\"secret\":\"other\"}}}}}}')"
        ))
        .await
        .unwrap();
        db.attempt_due(&notifier).await;
        let history = db.history().await;
        let last = history.iter().max_by_key(|h| h.id).unwrap();
        assert!(
            last.errors.contains("may not name a secret"),
            "{}",
            last.errors
        );
        assert_eq!(
            home.received_requests().await.unwrap().len(),
            1,
            "sent with a notice's secret"
        );
        let errors: String = history.iter().map(|h| h.errors.clone()).collect();
        assert!(!errors.contains("k3y-value") && !errors.contains("0ther-value"));
    }
);

db_test!(
    an_unreadable_definition_row_parks_only_its_own_notices,
    |db: Arc<TestDb>| async move {
        use solid_notify::{Status, WorkerConfig};
        db.def("good", "h", |_| {}).await;
        db.def("bad", "h", |_| {}).await;
        db.insert_due("good", 3, |_| 0).await;
        db.insert_due("bad", 2, |_| 0).await;
        // SQLite keeps a cell of the wrong type as given; the other databases
        // refuse it, and take a value of the right type that is invalid.
        let cells = match db.backend {
            crate::support::Backend::Sqlite => "max_retry_times = '5x', update_time = 'yesterday'",
            _ => "max_retry_times = -5",
        };
        db.db
            .execute_unprepared(&format!("UPDATE notify_def SET {cells} WHERE name = 'bad'"))
            .await
            .unwrap();
        let listed = store::list(&db.db).await.unwrap();
        for (row, def) in &listed {
            match row.name.as_str() {
                "bad" => {
                    let problem = def.as_ref().unwrap_err();
                    assert_eq!(problem.field, "max_retry_times", "{problem}");
                }
                _ => assert!(def.is_ok(), "{}: {def:?}", row.name),
            }
        }
        let rec = crate::support::Recorder::default();
        let notifier = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..test_config()
            })
            .handler("h", rec.handler(|_| Outcome::success()))
            .build()
            .unwrap();
        let running = crate::faults::start(
            notifier.clone(),
            crate::faults::fast(WorkerConfig::default()),
        );
        let history = crate::support::eventually(30, "good delivered, bad parked", || async {
            let history = db.history().await;
            (history.len() == 5).then_some(history)
        })
        .await;
        running.stop().await;
        assert_eq!(rec.count(), 3);
        let parked: Vec<_> = history
            .iter()
            .filter(|h| h.status == Status::Parked)
            .collect();
        assert_eq!(parked.len(), 2);
        assert!(
            parked.iter().all(|h| h.errors.contains("max_retry_times")),
            "{parked:?}"
        );

        // The page and the CLI name the row and the field.
        let (base, stop) = crate::dashboard::serve(&db, DashboardConfig::default()).await;
        let page = crate::dashboard::client()
            .get(format!("{base}/defs"))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        let page = page.text().await.unwrap();
        assert!(
            page.contains("max_retry_times") && page.contains("good"),
            "{page}"
        );
        stop.cancel();
        let (ok, out, err) = crate::ops::cli(&db, &["defs", "list", "--json"]);
        assert!(ok, "{err}");
        assert!(
            out.contains("max_retry_times") && out.contains("\"good\""),
            "{out}"
        );
    }
);
