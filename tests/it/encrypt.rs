//! Payloads encrypted at rest (`encrypt = true`): the tables hold no
//! plaintext, delivery gets it, keys rotate (`solid-notify rekey`), a
//! missing key parks the notice, and the dashboard, the API and `show`
//! never show the plaintext.

use solid_notify::ops::Audit;
use std::sync::Arc;

use sea_orm::{ConnectionTrait, EntityTrait};
use serde_json::{Value, json};
use solid_notify::{
    Config, NewNotice, Outcome, Status, WorkerConfig,
    crypto::{Keys, sealed_key},
    dashboard::DashboardConfig,
    def::{Channel, DefSpec, store},
    entity::{notify_msg, notify_msg_history},
};

use crate::{
    dashboard::{client, serve},
    db_test,
    faults::{fast, quiet, start},
    ops::cli,
    receiver::{Receiver, Reply},
    support::{Recorder, TestDb, eventually},
};

const MARKER: &str = "PLAINTEXT-4111-1111";
const K1: [u8; 32] = [7; 32];
const K2: [u8; 32] = [9; 32];

fn b64(key: [u8; 32]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(key)
}

fn keys(list: &[(&str, [u8; 32])]) -> Keys {
    list.iter()
        .fold(Keys::new(), |keys, (id, key)| keys.with(id, *key).unwrap())
}

fn with_keys(keys: Keys) -> Config {
    Config { keys, ..quiet() }
}

/// Every row of both notice tables, every column, as the database returns
/// it; on SQLite, the bytes of the database file and its journal too.
async fn raw(db: &TestDb) -> String {
    let mut all = String::new();
    for row in notify_msg::Entity::find().all(&db.db).await.unwrap() {
        all.push_str(&format!("{row:?}\n"));
    }
    for row in notify_msg_history::Entity::find()
        .all(&db.db)
        .await
        .unwrap()
    {
        all.push_str(&format!("{row:?}\n"));
    }
    if let Some(path) = db.url.strip_prefix("sqlite://") {
        let path = path.split('?').next().unwrap();
        for file in [path.to_string(), format!("{path}-wal")] {
            if let Ok(bytes) = std::fs::read(&file) {
                all.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    all
}

/// Stored params by notice id, both tables.
async fn stored(db: &TestDb) -> Vec<(i64, String, Status)> {
    let mut rows: Vec<(i64, String, Status)> = notify_msg::Entity::find()
        .all(&db.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.id, r.param, r.status))
        .collect();
    rows.extend(
        notify_msg_history::Entity::find()
            .all(&db.db)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.param, r.status)),
    );
    rows
}

/// A receiver answering 200 and keeping each body.
async fn receiver() -> (Receiver, Arc<std::sync::Mutex<Vec<String>>>) {
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = bodies.clone();
    let receiver = Receiver::start(move |r| {
        keep.lock().unwrap().push(r.body.clone());
        Reply::ok()
    })
    .await;
    (receiver, bodies)
}

db_test!(
    the_tables_hold_no_plaintext_and_delivery_gets_it,
    |db: Arc<TestDb>| async move {
        let (hook, bodies) = receiver().await;
        let mut pii = DefSpec::new("pii", Channel::Http, json!({ "url": hook.url }));
        pii.encrypt = true;
        pii.retry_interval = "1s".into();
        // Two steps: the first passes a result derived from the param on.
        let mut steps = DefSpec::new("pii_steps", Channel::Handler, json!({}));
        steps.encrypt = true;
        steps.alert_trigger_type = 1;
        steps.email = "ops@example.com".into();
        steps.retry_interval = "1s".into();
        steps.steps = json!([
            {"channel": "handler", "target": {"handler": "enrich"}},
            {"channel": "handler", "target": {"handler": "use"}},
        ]);
        store::sync(&db.db, &[pii, steps]).await.unwrap();
        let config = with_keys(keys(&[("k1", K1)]));
        let used = Recorder::default();
        let notifier = db
            .notifier()
            .config(config.clone())
            .handler(
                "enrich",
                Recorder::default().handler(|n| {
                    Outcome::success().with_result(json!({"derived": n.param["card"]}))
                }),
            )
            .handler(
                "use",
                used.handler(|n| {
                    // The first try fails: an alert quotes the param.
                    match n.attempt {
                        1 => Outcome::retry("not yet"),
                        _ => Outcome::success(),
                    }
                }),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let a = tx
            .add(NewNotice::new("pii", &json!({"card": MARKER})))
            .await
            .unwrap();
        let b = tx
            .add(NewNotice::new("pii_steps", &json!({"card": MARKER})))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // At rest before delivery: sealed, with its key named.
        assert!(!raw(&db).await.contains(MARKER), "plaintext in the table");
        for (_, param, _) in stored(&db).await {
            assert_eq!(sealed_key(&param).as_deref(), Some("k1"), "{param}");
        }
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        eventually(30, "both delivered", || async {
            let done = |id| {
                let db = db.clone();
                async move { db.history_of(id).await.map(|r| r.status) }
            };
            (done(a).await == Some(Status::Succeeded) && done(b).await == Some(Status::Succeeded))
                .then_some(())
        })
        .await;
        eventually(30, "the alert sent", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        running.stop().await;
        // Delivery got the plaintext: the HTTP body, and the step result.
        let body: Value = serde_json::from_str(&bodies.lock().unwrap()[0]).unwrap();
        assert_eq!(body, json!({"card": MARKER}));
        let last = used.calls().last().cloned().unwrap();
        assert_eq!(last.param, json!({"card": MARKER}));
        assert_eq!(last.previous_result, Some(json!({"derived": MARKER})));
        // At rest after: history (the step result too), the alert notice.
        let after = raw(&db).await;
        assert!(!after.contains(MARKER), "plaintext at rest after delivery");
        let history = db.history().await;
        let done = history.iter().find(|r| r.id == b).unwrap();
        assert_eq!(
            sealed_key(done.step_result.as_deref().unwrap()).as_deref(),
            Some("k1")
        );
        let alert = history
            .iter()
            .find(|r| r.description == solid_notify::alert::ALERT_DESCRIPTION)
            .expect("an alert notice");
        assert!(
            alert.param.contains("encrypted (key k1)"),
            "{}",
            alert.param
        );

        // Viewers see that it is encrypted, never what.
        let (base, stop) = serve(&db, DashboardConfig::default()).await;
        let http = client();
        for path in [
            format!("/notices/{b}"),
            format!("/api/notices/{b}"),
            "/notices?place=history".to_string(),
            "/api/notices?place=history".to_string(),
        ] {
            let page = http
                .get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(!page.contains(MARKER), "{path}: {page}");
            assert!(page.contains("encrypted (key k1)"), "{path}: {page}");
        }
        stop.cancel();
        let (ok, out, err) = cli(&db, &["show", &b.to_string(), "--json"]);
        assert!(ok, "{err}");
        assert!(!out.contains(MARKER), "{out}");
        let shown: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(shown["param"], "encrypted (key k1)");
        assert_eq!(shown["encrypted"], true);
        assert_eq!(shown["step_result"], "encrypted (key k1)");
        // Without a key, a producer is refused; nothing is written.
        let keyless = db.notifier().config(quiet()).build().unwrap();
        let before = db.counts().await;
        let tx = keyless.begin().await.unwrap();
        let err = tx
            .add(NewNotice::new("pii", &json!({"card": MARKER})))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no encryption key"), "{err}");
        tx.commit().await.unwrap();
        assert_eq!(db.counts().await, before);
    }
);

db_test!(
    keys_rotate_with_rekey_and_a_missing_key_parks_the_notice,
    |db: Arc<TestDb>| async move {
        let (hook, bodies) = receiver().await;
        let mut pii = DefSpec::new("pii", Channel::Http, json!({ "url": hook.url }));
        pii.encrypt = true;
        store::sync(&db.db, &[pii]).await.unwrap();
        let add = async |keys: Keys, n: usize| {
            let notifier = db.notifier().config(with_keys(keys)).build().unwrap();
            let tx = notifier.begin().await.unwrap();
            let mut ids = Vec::new();
            for i in 0..n {
                let param = json!({"card": MARKER, "i": i});
                ids.push(tx.add(NewNotice::new("pii", &param)).await.unwrap());
            }
            tx.commit().await.unwrap();
            ids
        };
        // Three under k1, then k2 becomes current with k1 kept: two more.
        let mut ids = add(keys(&[("k1", K1)]), 3).await;
        ids.extend(add(keys(&[("k2", K2), ("k1", K1)]), 2).await);
        let by_key = |rows: &[(i64, String, Status)], key: &str| {
            rows.iter()
                .filter(|(_, p, _)| sealed_key(p).as_deref() == Some(key))
                .count()
        };
        let rows = stored(&db).await;
        assert_eq!((by_key(&rows, "k1"), by_key(&rows, "k2")), (3, 2));
        // A plain-SQL producer's row: it cannot seal.
        let def_id = db
            .scalar("SELECT id FROM notify_def WHERE name = 'pii'")
            .await;
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, next_call_time, create_time) \
                 VALUES ({def_id}, '{{\"card\":\"{MARKER}\",\"sql\":true}}', {now}, {now})",
                now = db.now_sql()
            ))
            .await
            .unwrap();
        // Rotation: rekey seals everything with k2 (the k1 rows again, the
        // plain-SQL row for the first time).
        let env = format!("k2:{},k1:{}", b64(K2), b64(K1));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_solid-notify"))
            .args(["rekey", "--batch-size", "2", "--json"])
            .env("DATABASE_URL", &db.url)
            .env("SOLID_NOTIFY_KEYS", &env)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (&report["resealed"], &report["sealed"], &report["left"]),
            (&json!(3), &json!(1), &json!({"k1": 0})),
            "{report}"
        );
        let rows = stored(&db).await;
        assert_eq!((by_key(&rows, "k1"), by_key(&rows, "k2")), (0, 6));
        assert!(!raw(&db).await.contains(MARKER));
        // Only k2 now: all six are delivered, in plaintext.
        let notifier = db
            .notifier()
            .config(with_keys(keys(&[("k2", K2)])))
            .build()
            .unwrap();
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        eventually(30, "six delivered", || async {
            (bodies.lock().unwrap().len() >= 6).then_some(())
        })
        .await;
        // A notice sealed with k1, which this worker does not have: parked
        // with the reason, never sent.
        let lost = add(keys(&[("k1", K1)]), 1).await[0];
        // And a plain-SQL row again: it cannot be sealed, and is delivered
        // as written (documented; `rekey` seals such rows at rest).
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO notify_msg (def_id, param, next_call_time, create_time) \
                 VALUES ({def_id}, '{{\"card\":\"x\",\"late\":true}}', {now}, {now})",
                now = db.now_sql()
            ))
            .await
            .unwrap();
        let parked = eventually(30, "the k1 notice parked, the plain one sent", || async {
            let parked: Vec<_> = db
                .history()
                .await
                .into_iter()
                .filter(|r| r.status == Status::Parked)
                .collect();
            (parked.len() == 1 && bodies.lock().unwrap().len() == 7).then_some(parked)
        })
        .await;
        running.stop().await;
        assert_eq!(parked[0].id, lost);
        assert!(
            parked[0].errors.contains("key `k1` is not configured here"),
            "{}",
            parked[0].errors
        );
        let bodies = bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 7, "nothing garbled or parked was sent");
        for body in &bodies[..6] {
            let body: Value = serde_json::from_str(body).unwrap();
            assert_eq!(body["card"], MARKER);
        }
        let late: Value = serde_json::from_str(&bodies[6]).unwrap();
        assert_eq!(late, json!({"card": "x", "late": true}));
        for id in &ids {
            assert_eq!(db.history_of(*id).await.unwrap().status, Status::Succeeded);
        }
    }
);

db_test!(
    events_to_an_encrypted_definition_are_sealed_at_rest,
    |db: Arc<TestDb>| async move {
        let (hook, bodies) = receiver().await;
        let mut ops = DefSpec::new("ops", Channel::Http, json!({ "url": hook.url }));
        ops.encrypt = true;
        let mut orders = DefSpec::new("orders", Channel::Handler, json!({"handler": "orders"}));
        orders.ordering = "per_key".into();
        orders.max_retry_times = 0;
        orders.events_to = "ops".into();
        store::sync(&db.db, &[ops, orders]).await.unwrap();
        let notifier = db
            .notifier()
            .config(with_keys(keys(&[("k1", K1)])))
            .handler(
                "orders",
                Recorder::default().handler(|_| Outcome::permanent("refused")),
            )
            .build()
            .unwrap();
        let running = start(notifier.clone(), fast(WorkerConfig::default()));
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add(NewNotice::new("orders", &json!({})).ordering_key("cust-4711"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // notice.failed and key.blocked, written by the recorder.
        eventually(30, "two events delivered", || async {
            (bodies.lock().unwrap().len() >= 2).then_some(())
        })
        .await;
        // key.released, written by the operator's cancel.
        notifier.cancel(id, &Audit::operator()).await.unwrap();
        eventually(30, "three events delivered", || async {
            (bodies.lock().unwrap().len() >= 3).then_some(())
        })
        .await;
        eventually(30, "nothing left in flight", || async {
            (db.counts().await.0 == 0).then_some(())
        })
        .await;
        running.stop().await;
        let mut kinds: Vec<String> = bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| serde_json::from_str::<Value>(b).unwrap()["type"].to_string())
            .collect();
        kinds.sort();
        assert_eq!(
            kinds,
            ["\"key.blocked\"", "\"key.released\"", "\"notice.failed\""],
            "delivered opened"
        );
        let events: Vec<_> = db
            .history()
            .await
            .into_iter()
            .filter(|r| r.description.starts_with("solid-notify event "))
            .collect();
        assert_eq!(events.len(), 3);
        for event in events {
            assert_eq!(
                sealed_key(&event.param).as_deref(),
                Some("k1"),
                "{} stored unsealed: {}",
                event.description,
                event.param
            );
        }
    }
);

db_test!(
    a_wrong_key_parks_the_notices_and_spends_no_retry,
    |db: Arc<TestDb>| async move {
        let (hook, bodies) = receiver().await;
        let mut pii = DefSpec::new("pii", Channel::Http, json!({ "url": hook.url }));
        pii.encrypt = true;
        pii.max_retry_times = 10;
        store::sync(&db.db, &[pii]).await.unwrap();
        // Left to the worker below: no after-commit attempt here.
        let producer = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..with_keys(keys(&[("k1", K1)]))
            })
            .build()
            .unwrap();
        let tx = producer.begin().await.unwrap();
        let mut ids = Vec::new();
        for i in 0..20 {
            let param = json!({"card": MARKER, "i": i});
            ids.push(tx.add(NewNotice::new("pii", &param)).await.unwrap());
        }
        tx.commit().await.unwrap();
        // A worker given key id k1 with other bytes: every notice parked,
        // none failed for good, nothing sent.
        let wrong = db
            .notifier()
            .config(with_keys(keys(&[("k1", K2)])))
            .build()
            .unwrap();
        let running = start(wrong, fast(WorkerConfig::default()));
        let parked = eventually(30, "twenty parked", || async {
            let parked: Vec<_> = db
                .history()
                .await
                .into_iter()
                .filter(|r| r.status == Status::Parked)
                .collect();
            (parked.len() == 20).then_some(parked)
        })
        .await;
        running.stop().await;
        assert!(
            bodies.lock().unwrap().is_empty(),
            "nothing garbled was sent"
        );
        for row in &parked {
            assert_eq!(row.retry_times, 0, "no retry spent");
            assert!(
                row.errors.contains("does not open with key `k1`"),
                "the reason names the key: {}",
                row.errors
            );
        }
        // With the right key, a requeue delivers each once.
        let right = db
            .notifier()
            .config(with_keys(keys(&[("k1", K1)])))
            .build()
            .unwrap();
        let (ok, out, err) = cli(
            &db,
            &["requeue", "--status", "parked", "--reason", "right key"],
        );
        assert!(ok, "{out} {err}");
        let running = start(right, fast(WorkerConfig::default()));
        eventually(30, "twenty delivered", || async {
            (bodies.lock().unwrap().len() == 20).then_some(())
        })
        .await;
        running.stop().await;
        for id in &ids {
            assert_eq!(db.history_of(*id).await.unwrap().status, Status::Succeeded);
        }
    }
);
