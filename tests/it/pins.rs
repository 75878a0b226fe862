//! Operators act on what they saw: a bulk action confirmed on the
//! dashboard, through the JSON API or with the CLI changes exactly the
//! notices its count showed, each only if unchanged since, or fewer; never
//! a notice added or changed after the count. Each test counts rows.

use solid_notify::ops::Audit;
use std::sync::Arc;

use reqwest::{StatusCode, header};
use serde_json::{Value, json};
use solid_notify::{NewNotice, Notifier, Outcome, Status, dashboard::DashboardConfig};

use crate::{
    dashboard::{client, csrf_cookie, serve},
    db_test,
    faults::quiet,
    ops::{cli, tempdir},
    support::{Backend, Recorder, TestDb},
};

/// A notifier without after-commit attempts whose `ship` handler fails
/// for good the notices whose param says `"fate": "fail"`.
async fn shipping(db: &TestDb) -> Notifier {
    db.def("ship", "ship", |s| s.max_retry_times = 0).await;
    db.notifier()
        .config(quiet())
        .handler(
            "ship",
            Recorder::default().handler(|n| match n.param["fate"].as_str() {
                Some("fail") => Outcome::permanent("refused"),
                _ => Outcome::success(),
            }),
        )
        .build()
        .unwrap()
}

/// Adds notices of `ship` with these params in one transaction.
async fn add(notifier: &Notifier, params: &[Value]) -> Vec<i64> {
    let tx = notifier.begin().await.unwrap();
    let mut ids = Vec::new();
    for param in params {
        ids.push(tx.add(NewNotice::new("ship", param)).await.unwrap());
    }
    tx.commit().await.unwrap();
    ids
}

/// What a dashboard confirmation page shows: the count, and the form's
/// hidden fields (whatever the page carries to its action) with the CSRF
/// cookie.
struct Confirmation {
    matched: u64,
    fields: Vec<(String, String)>,
    csrf: String,
}

/// The value of `attribute` in an HTML tag's text, unescaped.
fn attribute(tag: &str, attribute: &str) -> Option<String> {
    let marker = format!(r#"{attribute}=""#);
    let at = tag.find(&marker)? + marker.len();
    let value = tag[at..].split('"').next()?;
    Some(
        value
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&amp;", "&"),
    )
}

async fn confirm(base: &str, query: &str) -> Confirmation {
    let response = client()
        .get(format!("{base}/bulk?{query}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let csrf = csrf_cookie(&response);
    let page = response.text().await.unwrap();
    let matched = attribute(&page, "data-matched")
        .unwrap_or_else(|| panic!("no count: {page}"))
        .parse()
        .unwrap();
    let fields = page
        .split('<')
        .filter(|tag| tag.starts_with("input") && tag.contains(r#"type="hidden""#))
        .filter_map(|tag| Some((attribute(tag, "name")?, attribute(tag, "value")?)))
        .collect();
    Confirmation {
        matched,
        fields,
        csrf,
    }
}

/// Submits a confirmation as its form would; the report's
/// `(changed, skipped)`, or the refusal's status.
async fn submit(base: &str, confirmation: &Confirmation) -> Result<(u64, u64), StatusCode> {
    let mut form = confirmation.fields.clone();
    form.push(("reason".into(), "bulk fix".into()));
    let response = client()
        .post(format!("{base}/bulk"))
        .header(header::COOKIE, format!("sn_csrf={}", confirmation.csrf))
        .form(&form)
        .send()
        .await
        .unwrap();
    if response.status() != StatusCode::OK {
        return Err(response.status());
    }
    let page = response.text().await.unwrap();
    let number = |name: &str| -> u64 {
        attribute(&page, name)
            .unwrap_or_else(|| panic!("{name}: {page}"))
            .parse()
            .unwrap()
    };
    Ok((number("data-changed"), number("data-skipped")))
}

fn actions() -> DashboardConfig {
    DashboardConfig {
        allow_actions: true,
        ..DashboardConfig::default()
    }
}

db_test!(
    a_confirmed_cancel_never_reaches_a_notice_added_after_its_count,
    |db: Arc<TestDb>| async move {
        let notifier = shipping(&db).await;
        // Another process: its own pool, so on PostgreSQL its own block of
        // ids. Its transaction takes an id before the counted notices
        // (PostgreSQL) and commits after the count, below their ids.
        let other = TestDb::connect_to(&db.url).await;
        let other = Notifier::builder(other).config(quiet()).build().unwrap();
        let late_tx = if db.backend == Backend::Postgres {
            let tx = other.begin().await.unwrap();
            tx.add_notice("ship", &json!({"late": true}), "")
                .await
                .unwrap();
            Some(tx)
        } else {
            None
        };
        let counted = add(&notifier, &[json!({}), json!({})]).await;
        let (base, stop) = serve(&db, actions()).await;
        let confirmation = confirm(&base, "place=in_flight&def=ship").await;
        assert_eq!(confirmation.matched, 2);
        let late = match late_tx {
            Some(tx) => tx.commit().await.unwrap()[0],
            None => add(&other, &[json!({"late": true})]).await[0],
        };
        if db.backend == Backend::Postgres {
            assert!(
                late < counted[0],
                "the late notice's id is below the count's"
            );
        }
        assert_eq!(submit(&base, &confirmation).await, Ok((2, 0)));
        let live: Vec<i64> = db.live().await.iter().map(|r| r.id).collect();
        assert_eq!(
            live,
            [late],
            "the notice added after the count is untouched"
        );
        for id in counted {
            assert_eq!(db.history_of(id).await.unwrap().status, Status::Cancelled);
        }
        // A confirmation is used once.
        assert_eq!(
            submit(&base, &confirmation).await,
            Err(StatusCode::CONFLICT)
        );
        assert_eq!(db.live().await.len(), 1);
        stop.cancel();
    }
);

db_test!(
    a_confirmed_search_acts_on_the_notice_it_found_or_on_none,
    |db: Arc<TestDb>| async move {
        let notifier = shipping(&db).await;
        // The search `order-7` finds the notice with that idempotency key;
        // two others only mention it in their param.
        let tx = notifier.begin().await.unwrap();
        let keyed = tx
            .add(NewNotice::new("ship", &json!({})).idempotency_key("order-7"))
            .await
            .unwrap();
        let mention = [
            tx.add_notice("ship", &json!({"see": "order-7"}), "")
                .await
                .unwrap(),
            tx.add_notice("ship", &json!({"ref": "order-7"}), "")
                .await
                .unwrap(),
        ];
        tx.commit().await.unwrap();
        let (base, stop) = serve(&db, actions()).await;
        let confirmation = confirm(&base, "place=in_flight&q=order-7").await;
        assert_eq!(confirmation.matched, 1);
        // Meanwhile the notice found leaves the list (another operator).
        notifier.cancel(keyed, &Audit::operator()).await.unwrap();
        assert_eq!(submit(&base, &confirmation).await, Ok((0, 1)));
        for id in mention {
            assert!(
                db.live().await.iter().any(|r| r.id == id),
                "notice {id} only mentions the search: untouched"
            );
        }
        stop.cancel();
    }
);

db_test!(
    a_confirmed_requeue_of_a_status_changes_no_notice_that_reached_it_later,
    |db: Arc<TestDb>| async move {
        let notifier = shipping(&db).await;
        let fail = json!({"fate": "fail"});
        let ids = add(&notifier, &[fail.clone(), fail.clone(), fail.clone(), fail]).await;
        // The oldest is set aside (cancelled) before anything is sent; the
        // other three fail for good and are counted.
        notifier.cancel(ids[0], &Audit::operator()).await.unwrap();
        db.attempt_due(&notifier).await;
        let (base, stop) = serve(&db, actions()).await;
        let confirmation = confirm(&base, "place=history&def=ship&status=final_failure").await;
        assert_eq!(confirmation.matched, 3);
        // After the count the oldest is replayed and fails for good too:
        // a final failure now, with an id below every counted one.
        notifier.requeue(ids[0], &Audit::operator()).await.unwrap();
        db.attempt_due(&notifier).await;
        assert_eq!(
            db.history_of(ids[0]).await.unwrap().status,
            Status::FinalFailure
        );
        assert_eq!(submit(&base, &confirmation).await, Ok((3, 0)));
        let live: Vec<i64> = db.live().await.iter().map(|r| r.id).collect();
        assert_eq!(live, ids[1..], "exactly the three counted are requeued");
        assert_eq!(
            db.history_of(ids[0]).await.unwrap().status,
            Status::FinalFailure
        );
        stop.cancel();
    }
);

db_test!(
    the_api_and_the_cli_act_on_what_their_dry_run_pinned,
    |db: Arc<TestDb>| async move {
        let notifier = shipping(&db).await;
        let counted = add(&notifier, &[json!({}), json!({})]).await;
        let (base, stop) = serve(&db, actions()).await;
        let http = client();
        let dry: Value = http
            .post(format!("{base}/api/bulk"))
            .json(&json!({ "place": "in_flight", "def": "ship", "dry_run": true }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(dry["matched"], json!(2), "{dry}");
        let pin = dry["pin"].as_str().unwrap().to_string();
        let late = add(&notifier, &[json!({})]).await[0];
        // One of the counted notices moves on meanwhile.
        notifier
            .cancel(counted[1], &Audit::operator())
            .await
            .unwrap();
        let done: Value = http
            .post(format!("{base}/api/bulk"))
            .json(&json!({ "pin": pin, "reason": "bulk fix" }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (&done["matched"], &done["changed"], &done["skipped"]),
            (&json!(2), &json!(1), &json!(1)),
            "{done}"
        );
        assert_eq!(done["skipped_ids"], json!([counted[1]]), "{done}");
        let used = http
            .post(format!("{base}/api/bulk"))
            .json(&json!({ "pin": pin, "reason": "again" }))
            .send()
            .await
            .unwrap();
        assert_eq!(used.status(), StatusCode::CONFLICT);
        stop.cancel();
        let live: Vec<i64> = db.live().await.iter().map(|r| r.id).collect();
        assert_eq!(live, [late]);

        // The CLI: a dry run pins to a file, the action takes the file.
        let file = tempdir().join(format!("pin-{}.json", std::process::id()));
        let file = file.to_str().unwrap();
        let (ok, out, err) = cli(
            &db,
            &["cancel", "--def", "ship", "--dry-run", "--pin", file],
        );
        assert!(ok, "{err}");
        assert!(out.starts_with("1 matched"), "{out}");
        let later = add(&notifier, &[json!({})]).await[0];
        let (ok, out, err) = cli(&db, &["cancel", "--pinned", file, "--reason", "bulk fix"]);
        assert!(ok, "{err}");
        assert!(out.contains("1 matched, 1 changed, 0 skipped"), "{out}");
        let live: Vec<i64> = db.live().await.iter().map(|r| r.id).collect();
        assert_eq!(
            live,
            [later],
            "the notice added after the dry run is untouched"
        );
        let (ok, _, err) = cli(&db, &["requeue", "--pinned", file, "--reason", "x"]);
        assert!(!ok && err.contains("not a Requeue"), "{err}");
        std::fs::remove_file(file).ok();

        // A dry run pins only what an action would take: a text filter
        // that matches every notice is refused before a file is written.
        let (ok, _, err) = cli(
            &db,
            &[
                "cancel",
                "--param-contains",
                "{",
                "--dry-run",
                "--pin",
                file,
            ],
        );
        assert!(
            !ok && err.contains("the filters given match every notice"),
            "{err}"
        );
        assert!(!std::path::Path::new(file).exists(), "pinned all the same");
    }
);
