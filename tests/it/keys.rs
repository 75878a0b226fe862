//! Blocked keys: the ordering keys held back by a final failure (ordered
//! definitions with `stop_on_failure`). `ops::keys`, the CLI, the JSON API,
//! the dashboard page and the `solid_notify_blocked_keys` gauge agree on a
//! seeded set; a requeue or cancel of the head releases the key.

use solid_notify::ops::Audit;
use std::sync::Arc;

use serde_json::{Value, json};
use solid_notify::{NewNotice, Notifier, Outcome, Status, ops::keys};

use crate::{
    db_test,
    faults::quiet,
    ops::cli,
    support::{Recorder, TestDb, eventually, metrics_worker},
};

/// What [`seed`] leaves blocked: `(def, key, waiting)`.
pub const BLOCKED: [(&str, &str, u64); 3] = [
    ("ord_stop", "a", 2),
    ("ord_stop", "b", 0),
    ("ord_stop", "x\r\ny", 1),
];

/// Ordered notices, some failing for good: `ord_stop` (stop_on_failure)
/// has keys `a` (a failure, two waiting behind it), `b` (a failure alone),
/// a hostile key with CR/LF (a failure, one waiting), and `c` (all sent);
/// `ord_go` (stop_on_failure off) and `plain` (unordered) have failures
/// that block nothing. Returns the notifier and the head of `a`.
pub async fn seed(db: &TestDb) -> (Notifier, i64) {
    for (name, stop) in [("ord_stop", true), ("ord_go", false)] {
        db.def(name, "fate", |s| {
            s.ordering = "per_key".into();
            s.stop_on_failure = stop;
        })
        .await;
    }
    db.def("plain", "fate", |_| {}).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .config(quiet())
        .handler(
            "fate",
            rec.handler(|n| match n.param["fate"].as_str() {
                Some("fail") => Outcome::permanent("receiver refused it"),
                _ => Outcome::success(),
            }),
        )
        .build()
        .unwrap();
    let mut head = 0;
    for (def, key, fates) in [
        ("ord_stop", Some("a"), &["fail", "ok", "ok"][..]),
        ("ord_stop", Some("b"), &["fail"][..]),
        ("ord_stop", Some("x\r\ny"), &["fail", "ok"][..]),
        ("ord_stop", Some("c"), &["ok", "ok"][..]),
        ("ord_go", Some("a"), &["fail", "ok"][..]),
        ("plain", None, &["fail"][..]),
    ] {
        // One transaction per notice: their order is their commits'.
        for fate in fates {
            let tx = notifier.begin().await.unwrap();
            let mut notice = NewNotice::new(def, &json!({ "fate": fate }));
            if let Some(key) = key {
                notice = notice.ordering_key(key);
            }
            let id = tx.add(notice).await.unwrap();
            tx.commit().await.unwrap();
            if (def, key, *fate) == ("ord_stop", Some("a"), "fail") {
                head = id;
            }
        }
    }
    // Until nothing more can go: the heads fail, what they hold waits.
    while db.attempt_due(&notifier).await > 0 {}
    (notifier, head)
}

/// `(def, key, waiting)` of each key, sorted.
fn triples(keys: impl IntoIterator<Item = (String, String, u64)>) -> Vec<(String, String, u64)> {
    let mut all: Vec<_> = keys.into_iter().collect();
    all.sort();
    all
}

fn expected() -> Vec<(String, String, u64)> {
    triples(BLOCKED.map(|(d, k, n)| (d.to_string(), k.to_string(), n)))
}

db_test!(
    the_cli_the_api_the_page_and_the_gauge_agree_on_blocked_keys,
    |db: Arc<TestDb>| async move {
        let (notifier, head) = seed(&db).await;
        let found = keys::blocked(&db.db, None, 100).await.unwrap().keys;
        let page = keys::blocked(&db.db, None, 2).await.unwrap();
        assert_eq!((page.keys.len(), page.more), (2, true));
        assert_eq!(
            triples(
                found
                    .iter()
                    .map(|k| (k.def.clone(), k.ordering_key.clone(), k.waiting))
            ),
            expected()
        );
        let a = found.iter().find(|k| k.ordering_key == "a").unwrap();
        assert_eq!((a.head_id, a.head_status), (head, Status::FinalFailure));

        // The CLI, as JSON and as text (the hostile key escaped).
        let (ok, out, err) = cli(&db, &["keys", "blocked", "--json"]);
        assert!(ok, "{err}");
        let listed: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(listed["more"], false);
        let listed = listed["keys"].as_array().unwrap().clone();
        let from_json = |v: &[Value]| {
            triples(v.iter().map(|k| {
                (
                    k["def"].as_str().unwrap().to_string(),
                    k["ordering_key"].as_str().unwrap().to_string(),
                    k["waiting"].as_u64().unwrap(),
                )
            }))
        };
        assert_eq!(from_json(&listed), expected());
        let (ok, out, err) = cli(&db, &["keys", "blocked", "--def", "ord_stop"]);
        assert!(ok, "{err}");
        assert_eq!(out.lines().count(), 4, "a header and three keys: {out}");
        assert!(out.contains(r"x\r\ny"), "the key's CR/LF escaped: {out}");
        let (ok, out, _) = cli(&db, &["keys", "blocked", "--def", "ord_go"]);
        assert!(ok);
        assert!(out.contains("no blocked key"), "{out}");

        // The JSON API and the page.
        let (base, stop) = crate::dashboard::serve(&db, Default::default()).await;
        let http = crate::dashboard::client();
        let api: Value = http
            .get(format!("{base}/api/keys/blocked"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(from_json(api["keys"].as_array().unwrap()), expected());
        let page = http
            .get(format!("{base}/keys/blocked"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("3 blocked"), "{page}");
        assert!(
            page.contains(r#"data-key="a" data-def="ord_stop" data-waiting="2""#),
            "{page}"
        );
        assert!(
            page.contains(r#"data-key="x\r\ny""#),
            "the key escaped: {page}"
        );
        assert!(!page.contains("x\r\ny"), "no raw CR/LF: {page}");
        stop.cancel();

        // The gauge.
        let (_worker, metrics) = metrics_worker(&db, &[]).await;
        eventually(10, "the gauge counts the blocked keys", || async {
            let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
            text.contains(r#"solid_notify_blocked_keys{def="ord_stop"} 3"#)
                .then_some(())
        })
        .await;

        // A cancel of a head releases its key: the notices behind it go.
        notifier.cancel(head, &Audit::operator()).await.unwrap();
        while db.attempt_due(&notifier).await > 0 {}
        let left = keys::blocked(&db.db, None, 100).await.unwrap().keys;
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().all(|k| k.ordering_key != "a"));
        eventually(10, "the gauge follows", || async {
            let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
            text.contains(r#"solid_notify_blocked_keys{def="ord_stop"} 2"#)
                .then_some(())
        })
        .await;
    }
);
