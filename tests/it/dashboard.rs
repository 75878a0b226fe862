//! The dashboard over real HTTP on 127.0.0.1, against each database:
//! pages, escaping, the JSON API with keyset pages, auth and its rate
//! limit, CSRF, read-only refusals, actions with their audit lines.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use reqwest::{StatusCode, header, redirect::Policy};
use serde_json::{Value, json};
use solid_notify::{
    NewNotice, Notifier, Outcome, Status,
    dashboard::{self, DashboardConfig},
};
use tokio_util::sync::CancellationToken;

use crate::{
    db_test,
    faults::quiet,
    support::{Recorder, TestDb},
};

/// A param that must never reach a page unescaped.
pub const SCRIPT: &str = "<script>alert('x')</script>";

/// What [`seed`] leaves: ids of the billing final failures.
pub struct Seeded {
    pub final_failures: Vec<i64>,
}

/// A known mix: `orders` has 3 notices due and 4 succeeded; `billing` has 2
/// failing in flight (retry in an hour) and 3 final failures whose param
/// and description hold a `<script>` payload.
pub async fn seed(db: &TestDb) -> Seeded {
    db.def("orders", "script", |_| {}).await;
    db.def("billing", "script", |s| s.retry_interval = "1h".into())
        .await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "script",
            rec.handler(|n| match n.param["fate"].as_str() {
                Some("ok") => Outcome::success(),
                Some("retry") => Outcome::retry("receiver down"),
                _ => Outcome::permanent("receiver refused it"),
            }),
        )
        .build()
        .unwrap();
    let add = |def: &'static str, fate: &'static str, n: usize| {
        let notifier = notifier.clone();
        async move {
            let tx = notifier.begin().await.unwrap();
            let mut ids = Vec::new();
            for i in 0..n {
                let param = json!({ "fate": fate, "i": i, "note": SCRIPT });
                let notice = NewNotice::new(def, &param).description(SCRIPT);
                ids.push(tx.add(notice).await.unwrap());
            }
            tx.commit().await.unwrap();
            ids
        }
    };
    add("orders", "ok", 4).await;
    add("billing", "retry", 2).await;
    let final_failures = add("billing", "fail", 3).await;
    assert_eq!(db.attempt_due(&notifier).await, 9);
    add("orders", "ok", 3).await;
    Seeded { final_failures }
}

/// The dashboard on 127.0.0.1, any port.
pub async fn serve(db: &TestDb, config: DashboardConfig) -> (String, CancellationToken) {
    let notifier = Notifier::builder(db.db.clone()).build().unwrap();
    let stop = CancellationToken::new();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (bound, _task) = dashboard::serve(notifier, addr, config, stop.clone())
        .await
        .unwrap();
    (format!("http://{bound}"), stop)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The `sn_csrf` cookie a response sets.
pub fn csrf_cookie(response: &reqwest::Response) -> String {
    response
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("sn_csrf="))
        .and_then(|v| v.split(';').next())
        .expect("sn_csrf cookie")
        .to_string()
}

async fn text(response: reqwest::Response) -> (StatusCode, String) {
    (response.status(), response.text().await.unwrap())
}

db_test!(pages_and_api_read_only, |db: Arc<TestDb>| async move {
    let seeded = seed(&db).await;
    let (base, stop) = serve(&db, DashboardConfig::default()).await;
    let http = client();
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    // Overview: each definition's counts.
    let (status, page) = text(get("/").await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"data-def="orders""#), "{page}");
    let overview: Value = get("/api/overview").await.unwrap().json().await.unwrap();
    let def = |name: &str| {
        overview["defs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(def("orders")["total"], 3);
    assert_eq!(def("billing")["failing"], 2);
    let day = |d: &Value, key: &str| -> i64 {
        d["last_24h"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h[key].as_i64().unwrap())
            .sum()
    };
    assert_eq!(day(&def("orders"), "succeeded"), 4);
    assert_eq!(day(&def("billing"), "failed"), 3);

    // Lists and detail escape user data.
    let (status, page) = text(
        get("/notices?place=history&def=billing&status=final_failure")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for id in &seeded.final_failures {
        assert!(page.contains(&format!(r#"data-id="{id}""#)), "{id}: {page}");
    }
    assert!(!page.contains("<script>alert"), "unescaped: {page}");
    assert!(page.contains("&lt;script&gt;"), "{page}");
    let id = seeded.final_failures[0];
    let (status, page) = text(get(&format!("/notices/{id}")).await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("<script>alert"), "unescaped: {page}");
    assert!(
        page.contains("receiver refused it"),
        "the failure log: {page}"
    );
    assert!(!page.contains("Requeue"), "read-only shows no actions");
    assert_eq!(
        get("/notices/987654321").await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get("/notices?place=nowhere").await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    for path in [
        "/defs",
        "/notices?place=in_flight&q=receiver",
        "/assets/style.css",
    ] {
        assert_eq!(get(path).await.unwrap().status(), StatusCode::OK, "{path}");
    }

    // Keyset pages: newest first, no overlap, nothing skipped.
    let mut seen = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let mut path = "/api/notices?place=history&def=billing&limit=2".to_string();
        if let Some(b) = before {
            path += &format!("&before_id={b}");
        }
        let page: Value = get(&path).await.unwrap().json().await.unwrap();
        seen.extend(
            page["notices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n["id"].as_i64().unwrap()),
        );
        match page["next_before_id"].as_i64() {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    let mut expected = seeded.final_failures.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(seen, expected);

    // Search by id, by key-less param text.
    let found: Value = get(&format!("/api/notices?place=history&q={id}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(found["notices"].as_array().unwrap().len(), 1);

    // Without a token only loopback names are served (DNS rebinding).
    let rebound = http
        .get(format!("{base}/api/overview"))
        .header(header::HOST, "attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);

    // Read-only: every write refused, nothing changed.
    let response = get(&format!("/notices/{id}")).await.unwrap();
    let token = csrf_cookie(&response);
    let refused = http
        .post(format!("{base}/notices/{id}/requeue"))
        .header(header::COOKIE, format!("sn_csrf={token}"))
        .form(&[("csrf", token.as_str()), ("reason", "try")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let refused = http
        .post(format!("{base}/api/bulk"))
        .json(&json!({ "place": "history", "reason": "try" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        db.history_of(id).await.unwrap().status,
        Status::FinalFailure
    );
    stop.cancel();
});

db_test!(actions_need_auth_csrf_and_leave_audit_lines, |db: Arc<
    TestDb,
>| async move {
    let seeded = seed(&db).await;
    let config = DashboardConfig {
        allow_actions: true,
        token: Some("s3cret".into()),
        ..DashboardConfig::default()
    };
    let (base, stop) = serve(&db, config).await;
    let http = client();

    // No credentials, wrong ones: 401, with a basic-auth challenge.
    let anonymous = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert!(anonymous.headers().contains_key(header::WWW_AUTHENTICATE));
    let wrong = http
        .get(format!("{base}/"))
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let bearer = http
        .get(format!("{base}/api/overview"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), StatusCode::OK);

    // A form without the CSRF token, or with another one, changes nothing.
    let id = seeded.final_failures[0];
    let detail = http
        .get(format!("{base}/notices/{id}"))
        .basic_auth("alice", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(detail.status(), StatusCode::OK);
    let token = csrf_cookie(&detail);
    let page = detail.text().await.unwrap();
    assert!(
        page.contains(&format!(r#"name="csrf" value="{token}""#)),
        "{page}"
    );
    let post = |path: String, cookie: Option<&str>, field: Option<&str>| {
        let mut request = http
            .post(format!("{base}{path}"))
            .basic_auth("alice", Some("s3cret"));
        if let Some(c) = cookie {
            request = request.header(header::COOKIE, format!("sn_csrf={c}"));
        }
        let mut form = vec![("reason", "replay INC-7".to_string())];
        if let Some(f) = field {
            form.push(("csrf", f.to_string()));
        }
        request.form(&form).send()
    };
    let forged = "0".repeat(32);
    for (cookie, field) in [
        (None, None),
        (Some(token.as_str()), None),
        (None, Some(token.as_str())),
        (Some(token.as_str()), Some(forged.as_str())),
    ] {
        let response = post(format!("/notices/{id}/requeue"), cookie, field)
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::FORBIDDEN,
            "{cookie:?} {field:?}"
        );
    }
    assert_eq!(
        db.history_of(id).await.unwrap().status,
        Status::FinalFailure
    );

    // Another site's page cannot post, even with the right token pair.
    let cross = http
        .post(format!("{base}/notices/{id}/requeue"))
        .basic_auth("alice", Some("s3cret"))
        .header(header::COOKIE, format!("sn_csrf={token}"))
        .header("sec-fetch-site", "same-site")
        .form(&[("csrf", token.as_str()), ("reason", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    let foreign = http
        .post(format!("{base}/api/notices/{id}/requeue"))
        .bearer_auth("s3cret")
        .header(header::ORIGIN, "http://attacker.example")
        .json(&json!({ "reason": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        db.history_of(id).await.unwrap().status,
        Status::FinalFailure
    );

    // With it: requeued, the audit line names alice and the reason.
    let done = post(format!("/notices/{id}/requeue"), Some(&token), Some(&token))
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(db.history_of(id).await.is_none());
    let row = db.live().await.into_iter().find(|r| r.id == id).unwrap();
    assert!(
        row.errors.contains("requeued by alice: replay INC-7"),
        "{}",
        row.errors
    );

    // API writes must be JSON.
    let plain = http
        .post(format!(
            "{base}/api/notices/{}/requeue",
            seeded.final_failures[1]
        ))
        .bearer_auth("s3cret")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(r#"{"reason":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // A bulk API call names its place and a filter (or all).
    for body in [
        json!({ "reason": "x" }),
        json!({ "place": "in_flight", "reason": "x" }),
    ] {
        let refused = http
            .post(format!("{base}/api/bulk"))
            .bearer_auth("s3cret")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    assert_eq!(db.live().await.len(), 3 + 2 + 1, "nothing cancelled");

    // Bulk: the confirmation counts, the POST requeues the rest.
    let confirm = http
        .get(format!(
            "{base}/bulk?place=history&def=billing&status=final_failure"
        ))
        .basic_auth("alice", Some("s3cret"))
        .header(header::COOKIE, format!("sn_csrf={token}"))
        .send()
        .await
        .unwrap();
    let page = confirm.text().await.unwrap();
    assert!(page.contains(r#"data-matched="2""#), "{page}");
    let report: Value = http
        .post(format!("{base}/api/bulk"))
        .basic_auth("bob", Some("s3cret"))
        .json(&json!({
            "place": "history", "def": "billing", "status": "final_failure",
            "reason": "bulk replay"
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (report["matched"].as_u64(), report["changed"].as_u64()),
        (Some(2), Some(2))
    );
    for id in &seeded.final_failures[1..] {
        let row = db.live().await.into_iter().find(|r| r.id == *id).unwrap();
        assert!(
            row.errors.contains("requeued by bob: bulk replay"),
            "{}",
            row.errors
        );
    }

    // Pause and resume through the API.
    let paused = http
        .post(format!("{base}/api/defs/orders/pause"))
        .bearer_auth("s3cret")
        .json(&json!({ "reason": "maintenance", "until": "1h" }))
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), StatusCode::OK);
    let defs: Value = http
        .get(format!("{base}/api/overview"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let orders = defs["defs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "orders")
        .unwrap()
        .clone();
    assert!(orders["paused_until"].is_string(), "{orders}");

    // Failed logins are limited per address: after five, even the right
    // token waits.
    for _ in 0..dashboard::MAX_FAILED_LOGINS {
        let r = http
            .get(format!("{base}/"))
            .bearer_auth("nope")
            .send()
            .await
            .unwrap();
        assert!(matches!(
            r.status(),
            StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS
        ));
    }
    let blocked = http
        .get(format!("{base}/"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    stop.cancel();
});

#[tokio::test]
async fn refuses_a_public_address_without_a_token() {
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    let notifier = Notifier::builder(db).build().unwrap();
    let addr: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let refused = dashboard::serve(
        notifier,
        addr,
        DashboardConfig::default(),
        CancellationToken::new(),
    )
    .await;
    let error = refused.expect_err("refused").to_string();
    assert!(error.contains("without a token"), "{error}");
}

db_test!(
    workers_write_heartbeats_and_stale_ones_show_as_gone,
    |db: Arc<TestDb>| async move {
        use sea_orm::{ActiveValue::Set, EntityTrait};
        use solid_notify::{WorkerConfig, entity::notify_worker, ops::overview::overview};
        let (notifier, _rec) = db.shipping().await;
        db.insert_due("ship", 5, |_| 0).await;
        // A worker gone an hour ago, and one gone two days ago.
        let now = chrono::Utc::now().naive_utc();
        for (id, ago) in [("old:1:0001", 1), ("ancient:2:0002", 48)] {
            let at = now - chrono::Duration::hours(ago);
            notify_worker::Entity::insert(notify_worker::ActiveModel {
                id: Set(id.into()),
                host: Set("elsewhere".into()),
                pid: Set(1),
                started_at: Set(at),
                seen_at: Set(at),
                sweeps: Set(3),
                claimed: Set(0),
                succeeded: Set(0),
                failed: Set(0),
                beat_secs: Set(5.0),
            })
            .exec(&db.db)
            .await
            .unwrap();
        }
        let worker = crate::faults::start(
            notifier,
            crate::faults::fast(WorkerConfig {
                heartbeat_every: Duration::from_millis(100),
                ..WorkerConfig::default()
            }),
        );
        let seen = crate::support::eventually(20, "a heartbeat counting 5 successes", || async {
            let o = overview(&db.db).await.unwrap();
            let me = o.workers.iter().find(|w| w.row.host != "elsewhere")?;
            (me.row.succeeded == 5).then_some(o)
        })
        .await;
        let me = seen
            .workers
            .iter()
            .find(|w| w.row.host != "elsewhere")
            .unwrap();
        assert!(
            me.alive && me.row.sweeps > 0 && me.row.claimed == 5,
            "{me:?}"
        );
        let old = seen
            .workers
            .iter()
            .find(|w| w.row.id == "old:1:0001")
            .unwrap();
        assert!(!old.alive, "an hour silent is gone");
        assert!(
            seen.workers.iter().all(|w| w.row.id != "ancient:2:0002"),
            "a day silent is deleted"
        );
        worker.stop.cancel();
        worker.task.await.unwrap();
    }
);
