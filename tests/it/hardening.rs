//! Safe to expose, the dashboard's and the limits' side: API bodies are
//! strict, a filter that matches everything counts as none, the
//! authenticated user is the audit actor, a pause means what it says,
//! searches are bounded, cross-site reads are refused, pages are never
//! framed or sniffed, and absurd limits are typed errors, not panics.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use solid_notify::{
    Error, NewNotice, Notifier, WorkerConfig,
    dashboard::{DashboardConfig, MAX_SEARCH_CHARS, PARAM_EXCERPT},
    def::store,
    ops::{NoticeFilter, Page, Place, find},
    worker::{MAX_BATCH_SIZE, Worker},
};

use crate::{
    dashboard::{client, seed, serve},
    db_test,
    faults::quiet,
    support::TestDb,
};

pub(crate) const TOKEN: &str = "s3cret";

/// POSTs `body` to the dashboard at `base` as `alice` with [`TOKEN`].
pub(crate) async fn post(base: &str, path: &str, body: Value) -> (StatusCode, String) {
    let response = client()
        .post(format!("{base}{path}"))
        .basic_auth("alice", Some(TOKEN))
        .json(&body)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

db_test!(
    api_bodies_are_strict_and_name_what_they_refuse,
    |db: Arc<TestDb>| async move {
        let seeded = seed(&db).await;
        let config = DashboardConfig {
            allow_actions: true,
            token: Some(TOKEN.into()),
            ..DashboardConfig::default()
        };
        let (base, stop) = serve(&db, config).await;
        let before = (db.live().await, db.history().await);
        // A typo is refused, naming the field; it never widens the action or
        // turns a dry run into one.
        for (body, field) in [
            (
                json!({"place": "in_flight", "def": "billing", "dryRun": true, "reason": "typo"}),
                "dryRun",
            ),
            (
                json!({"place": "in_flight", "definition": "billing", "reason": "typo"}),
                "definition",
            ),
            (
                json!({"place": "in_flight", "def": "billing", "limit": "1", "reason": "paging"}),
                "limit",
            ),
            (
                json!({"place": "in_flight", "def": "billing", "reason": "r", "actor": "mallory"}),
                "actor",
            ),
        ] {
            let (status, text) = post(&base, "/api/bulk", body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
            assert!(text.contains(&format!("`{field}`")), "{text}");
        }
        // Search text that finds no id or key would act on every notice whose
        // param holds it: refused unless said with `param` (a dry run counts).
        let (status, text) = post(
            &base,
            "/api/bulk",
            json!({"place": "in_flight", "q": "987654", "reason": "meant an id"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("`param`"), "{text}");
        // q with an empty or a real param/key; a reason of invisible
        // characters only.
        for body in [
            json!({"place": "in_flight", "q": "987654", "param": " ", "reason": "r"}),
            json!({"place": "in_flight", "q": "foo", "param": "bar", "reason": "r"}),
            json!({"place": "in_flight", "def": "billing", "reason": "\u{200b}\u{ad}\u{1}"}),
        ] {
            let (status, text) = post(&base, "/api/bulk", body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        }
        // Filters given that match everything count as none.
        for body in [
            json!({"place": "in_flight", "older_than": "0s", "reason": "r"}),
            json!({"place": "history", "since": "1000000000y", "reason": "r"}),
            json!({"place": "in_flight", "until": "0s", "reason": "r"}),
        ] {
            let (status, text) = post(&base, "/api/bulk", body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
            assert!(text.contains("match every notice"), "{text}");
        }
        assert_eq!(
            (db.live().await, db.history().await),
            before,
            "a refused body changed notices"
        );

        // The audit actor is who logged in, never a field; a reason is one
        // line of plain text.
        let id = seeded.final_failures[0];
        let (status, text) = post(
            &base,
            &format!("/api/notices/{id}/requeue"),
            json!({"reason": "x", "actor": "mallory"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(db.live().await.iter().all(|r| r.id != id));
        let (status, text) = post(
            &base,
            &format!("/api/notices/{id}/requeue"),
            json!({"reason": "line one\nrequeued by root: fake\u{1b}[2J\u{202e}"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let row = db.live().await.into_iter().find(|r| r.id == id).unwrap();
        assert!(
            row.errors
                .contains("requeued by alice: line one requeued by root: fake [2J"),
            "{}",
            row.errors
        );
        assert!(!row.errors.contains('\u{1b}') && !row.errors.contains('\u{202e}'));
        // Client errors answer 4xx, never 500.
        let (status, _) = post(
            &base,
            "/api/notices/987654321/requeue",
            json!({"reason": "x"}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, text) = post(
            &base,
            &format!("/api/notices/{id}/requeue"),
            json!({"reason": "again"}),
        )
        .await;
        assert!(status.is_client_error(), "{status}: {text}");

        // A pause that would not pause, or would end before it starts, is
        // refused naming `until`; nothing is paused.
        for until in ["1999-01-01", "9000y", "0s"] {
            let (status, text) = post(
                &base,
                "/api/defs/orders/pause",
                json!({"reason": "maintenance", "until": until}),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{until}: {text}");
            assert!(text.contains("until"), "{text}");
        }
        let (status, text) = post(
            &base,
            "/api/defs/orders/pause",
            json!({"reason": "maintenance", "untill": "1h"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        let orders = store::page(&db.db, Some("orders"), None, 10).await.unwrap();
        assert_eq!(orders[0].paused_until, None, "paused after a refusal");
        stop.cancel();
    }
);

/// A GET as a browser sends it, with its `Sec-Fetch-*` headers.
async fn fetch(base: &str, path: &str, site: &str, mode: &str, dest: &str) -> reqwest::Response {
    client()
        .get(format!("{base}{path}"))
        .header("sec-fetch-site", site)
        .header("sec-fetch-mode", mode)
        .header("sec-fetch-dest", dest)
        .send()
        .await
        .unwrap()
}

fn secured(response: &reqwest::Response) -> bool {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    header("x-content-type-options") == "nosniff"
        && header("content-security-policy").contains("frame-ancestors 'none'")
        && header("x-frame-options") == "DENY"
}

db_test!(
    cross_site_reads_are_refused_and_pages_are_never_framed,
    |db: Arc<TestDb>| async move {
        seed(&db).await;
        let (base, stop) = serve(&db, DashboardConfig::default()).await;
        // What another site's page can make the browser send: an image, a
        // fetch, a frame. Refused before any query runs.
        for site in ["cross-site", "same-site"] {
            for (mode, dest) in [
                ("no-cors", "image"),
                ("cors", "empty"),
                ("navigate", "iframe"),
            ] {
                for path in ["/", "/notices?q=x", "/api/notices?q=x", "/api/defs"] {
                    let response = fetch(&base, path, site, mode, dest).await;
                    assert_eq!(
                        response.status(),
                        StatusCode::FORBIDDEN,
                        "{site} {mode} {dest} {path}"
                    );
                    assert!(secured(&response), "{path}: no security headers");
                }
            }
        }
        // Following a link from elsewhere opens a page, never the API.
        let page = fetch(&base, "/notices", "cross-site", "navigate", "document").await;
        assert_eq!(page.status(), StatusCode::OK);
        assert!(secured(&page));
        let api = fetch(&base, "/api/notices", "cross-site", "navigate", "document").await;
        assert_eq!(api.status(), StatusCode::FORBIDDEN);
        // Nor the bulk confirmation, which counts and pins.
        let bulk = fetch(
            &base,
            "/bulk?place=history&param=x",
            "cross-site",
            "navigate",
            "document",
        )
        .await;
        assert_eq!(bulk.status(), StatusCode::FORBIDDEN);
        // The dashboard's own pages and tools without the headers are served.
        let own = fetch(&base, "/api/notices", "same-origin", "cors", "empty").await;
        assert_eq!(own.status(), StatusCode::OK);
        let tool = client()
            .get(format!("{base}/api/notices"))
            .send()
            .await
            .unwrap();
        assert_eq!(tool.status(), StatusCode::OK);
        assert!(secured(&tool));
        stop.cancel();
        // Refusals carry the headers too (here: a token is needed).
        let (base, stop) = serve(
            &db,
            DashboardConfig {
                token: Some(TOKEN.into()),
                ..DashboardConfig::default()
            },
        )
        .await;
        let refused = client().get(format!("{base}/")).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(secured(&refused));
        stop.cancel();
    }
);

db_test!(
    searches_and_listings_are_bounded,
    |db: Arc<TestDb>| async move {
        db.def("orders", "script", |_| {}).await;
        let notifier = db.notifier().config(quiet()).build().unwrap();
        let blob = "x".repeat(1_000_000);
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add(NewNotice::new("orders", &json!({ "blob": blob })))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let (base, stop) = serve(&db, DashboardConfig::default()).await;
        let http = client();
        // A search longer than the cap is refused before it reaches the
        // database (on SQLite 16,000 characters over 1 MB took 51 s).
        for path in ["/api/notices?q=", "/notices?q=", "/api/notices?param="] {
            let long = "y".repeat(16_000);
            let response = http
                .get(format!("{base}{path}{long}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
            let text = response.text().await.unwrap();
            assert!(
                text.contains(&format!("at most {MAX_SEARCH_CHARS} characters")),
                "{text}"
            );
        }
        let at_cap = "y".repeat(MAX_SEARCH_CHARS);
        let response = http
            .get(format!("{base}/api/notices?q={at_cap}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // A listing holds an excerpt of each param; the notice's own page the
        // whole.
        let get_json = async |path: String| -> Value {
            let response = http.get(format!("{base}{path}")).send().await.unwrap();
            response.json().await.unwrap()
        };
        let listing = get_json("/api/notices?limit=500".into()).await;
        let notices = listing["notices"].as_array().unwrap();
        assert_eq!(notices.len(), 1);
        let shown = notices[0]["param"].to_string();
        assert!(
            shown.len() <= PARAM_EXCERPT as usize + 16,
            "the listing holds {} bytes of param",
            shown.len()
        );
        assert!(shown.contains("xxxx"), "{shown}");
        assert_eq!(notices[0]["param_cut"], true);
        let whole = get_json(format!("/api/notices/{id}")).await;
        assert_eq!(
            whole["param"]["blob"].as_str().map(str::len),
            Some(1_000_000)
        );
        assert_eq!(whole["param_cut"], false);
        stop.cancel();
    }
);

db_test!(absurd_limits_are_typed_errors_not_panics, |db: Arc<
    TestDb,
>| async move {
    let notifier = Notifier::builder(db.db.clone()).build().unwrap();
    for batch_size in [0, MAX_BATCH_SIZE + 1, u64::MAX] {
        let made = Worker::new(
            notifier.clone(),
            WorkerConfig {
                batch_size,
                ..WorkerConfig::default()
            },
        );
        assert!(
            matches!(&made, Err(Error::Config(m)) if m.starts_with("batch_size")),
            "{batch_size}: {:?}",
            made.as_ref().err()
        );
    }
    let made = Worker::new(
        notifier.clone(),
        WorkerConfig {
            concurrency: usize::MAX,
            ..WorkerConfig::default()
        },
    );
    assert!(matches!(&made, Err(Error::Config(m)) if m.starts_with("concurrency")));
    for limit in [0, u64::MAX] {
        let page = Page {
            before_id: None,
            limit,
        };
        let listed = find::list(&db.db, Place::History, &NoticeFilter::default(), page).await;
        assert!(
            matches!(&listed, Err(Error::Config(m)) if m.starts_with("limit")),
            "{listed:?}"
        );
        let defs = store::page(&db.db, None, None, limit).await;
        assert!(
            matches!(&defs, Err(Error::Config(m)) if m.starts_with("limit")),
            "{:?}",
            defs.err()
        );
    }
    // sweep_once caps what it is asked for instead of overflowing.
    assert!(notifier.sweep_once(u64::MAX).await.unwrap().is_empty());
});

/// `--help`, the top level's and a command's, names the variable that sets
/// the database URL, never its value (the password in it).
#[test]
fn help_never_shows_the_database_url() {
    for args in [&["--help"][..], &["worker", "--help"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(args)
            .env("DATABASE_URL", "postgres://user:hunter2@127.0.0.1:5432/app")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("DATABASE_URL"), "{args:?}: {text}");
        assert!(!text.contains("hunter2"), "{args:?}: {text}");
    }
}
