//! `examples/axum_orders.rs` as a black box: the built example runs on a
//! fresh database of each backend, takes orders over HTTP and delivers their
//! notices to a receiver on 127.0.0.1; the gift-wrap notices of nested
//! transactions it rolled back are never stored nor sent; SIGTERM stops it
//! with exit code 0.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

use crate::{
    db_test,
    receiver::{Receiver, Reply},
    support::{KillOnDrop, TestDb, eventually},
};

/// The example's binary, next to this test's: `target/<profile>/deps/it-…`
/// and `target/<profile>/examples/axum_orders`. Missing or older than its
/// source, the test fails (it never runs a stale build, nor skips).
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("axum_orders{}", std::env::consts::EXE_SUFFIX));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/axum_orders.rs");
    let hint = "build it first: `cargo build --features full --example axum_orders` \
                (`cargo test --workspace --features full` builds the examples; \
                `cargo test --test it` alone does not)";
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("the example {} is missing ({e}): {hint}", binary.display()));
    let edited = std::fs::metadata(&source)
        .and_then(|m| m.modified())
        .expect("the example's source");
    assert!(
        built >= edited,
        "the example {} is older than {}: {hint}",
        binary.display(),
        source.display()
    );
    binary
}

/// Lines a child process writes, read by a thread of their own (so the
/// child never blocks on a full pipe).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn read_from(&self, pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<()> {
        let lines = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                lines.0.lock().unwrap().push(line);
            }
        })
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

db_test!(
    orders_commit_with_their_notices_and_rolled_back_gift_wraps_are_never_sent,
    |db: Arc<TestDb>| async move {
        let binary = example_binary();
        // The suite's `orders` table (id, item) is not the example's: the
        // example creates its own when there is none.
        db.db.execute_unprepared("DROP TABLE orders").await.unwrap();

        // Every request the receiver gets, as (notice id, JSON body).
        let bodies: Arc<Mutex<Vec<(i64, Value)>>> = Arc::default();
        let receiver = Receiver::start({
            let bodies = bodies.clone();
            move |request| {
                let body = serde_json::from_str(&request.body).unwrap_or(Value::Null);
                bodies.lock().unwrap().push((request.id, body));
                Reply::ok()
            }
        })
        .await;

        let mut child = KillOnDrop(
            Command::new(&binary)
                .env("DATABASE_URL", &db.url)
                .env("LISTEN", "127.0.0.1:0")
                .env("ORDER_WEBHOOK_URL", &receiver.url)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display())),
        );
        let stdout = Lines::default();
        let stderr = Lines::default();
        let stdout_thread = stdout.read_from(child.0.stdout.take().unwrap());
        stderr.read_from(child.0.stderr.take().unwrap());

        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let listening = stdout.all().iter().find_map(|line| {
                line.strip_prefix("listening on http://")
                    .map(str::to_string)
            });
            if let Some(addr) = listening {
                break addr;
            }
            if let Some(status) = child.0.try_wait().unwrap() {
                panic!("the example exited ({status}): {:#?}", stderr.all());
            }
            assert!(
                Instant::now() < deadline,
                "the example printed no `listening on` line within 60 s: {:#?}",
                stderr.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let url = format!("http://{addr}/orders");
        let client = reqwest::Client::new();
        let post = |body: Value| {
            let request = client.post(&url).json(&body);
            async move {
                let response = request.send().await.expect("POST /orders");
                let status = response.status().as_u16();
                (
                    status,
                    response.json::<Value>().await.unwrap_or(Value::Null),
                )
            }
        };

        let too_long = "Congratulations on the new flat, and many happy returns!";
        assert!(too_long.chars().count() > 40); // the example's CARD_MAX_CHARS
        let longer = too_long.repeat(2);
        // (item, qty, gift note, whether the gift-wrap step commits)
        let cases = [
            ("lamp", 1, None, false),
            ("chair", 2, Some("Happy birthday!"), true),
            ("desk", 1, Some(too_long), false),
            ("book", 3, Some(longer.as_str()), false),
        ];
        let mut orders = Vec::new();
        for (item, qty, note, wrapped) in cases {
            let mut body = json!({"item": item, "qty": qty});
            if let Some(note) = note {
                body["gift_note"] = json!(note);
            }
            let (status, answer) = post(body).await;
            assert_eq!(status, 201, "{item}: {answer}: {:#?}", stderr.all());
            assert_eq!(answer["gift_wrap"], json!(wrapped), "{item}: {answer}");
            let id = answer["id"].as_i64().expect("an order id");
            orders.push((id, item, qty, note, wrapped));
        }
        // A body that is no order: refused, nothing written.
        let (status, answer) = post(json!({"item": "", "qty": 0})).await;
        assert_eq!(status, 422, "{answer}");

        // Every stored notice has finished: one per order, and one per
        // committed gift wrap. A notice of a rolled-back step, had it been
        // stored, would be counted here too, delivered or not.
        let expected = orders.len() + orders.iter().filter(|o| o.4).count();
        eventually(30, "every notice delivered and in history", || async {
            let (live, done) = db.counts().await;
            let received = bodies.lock().unwrap().len();
            (live == 0 && done as usize >= expected && received >= expected).then_some(())
        })
        .await;
        assert_eq!(db.counts().await, (0, expected as u64), "notices stored");

        let bodies = bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), expected, "deliveries: {bodies:#?}");
        let seen = receiver.seen();
        for (id, item, qty, note, wrapped) in &orders {
            let placed: Vec<_> = bodies
                .iter()
                .filter(|(_, b)| b.get("item").is_some() && b["order"] == json!(id))
                .collect();
            assert_eq!(placed.len(), 1, "order {id}: {bodies:#?}");
            let (notice, body) = placed[0];
            assert_eq!(body, &json!({"order": id, "item": item, "qty": qty}));
            let key = seen.iter().find(|s| s.id == *notice).unwrap();
            assert_eq!(key.idempotency_key, Some(format!("order-{id}")));

            let gifts: Vec<_> = bodies
                .iter()
                .filter(|(_, b)| b.get("gift_note").is_some() && b["order"] == json!(id))
                .collect();
            if *wrapped {
                assert_eq!(gifts.len(), 1, "order {id}: {bodies:#?}");
                assert_eq!(gifts[0].1, json!({"order": id, "gift_note": note}));
            } else {
                assert!(
                    gifts.is_empty(),
                    "a rolled-back gift wrap was sent: {gifts:#?}"
                );
            }
        }

        // The order rows, each with the gift note only where its step
        // committed.
        let rows = db
            .db
            .query_all_raw(sea_orm::Statement::from_string(
                db.db.get_database_backend(),
                "SELECT id, item, qty, gift_note FROM orders ORDER BY id",
            ))
            .await
            .unwrap();
        let rows: Vec<(i64, String, i32, Option<String>)> = rows
            .iter()
            .map(|r| {
                (
                    r.try_get("", "id").unwrap(),
                    r.try_get("", "item").unwrap(),
                    r.try_get("", "qty").unwrap(),
                    r.try_get("", "gift_note").unwrap(),
                )
            })
            .collect();
        let want: Vec<_> = orders
            .iter()
            .map(|(id, item, qty, note, wrapped)| {
                let note = note.filter(|_| *wrapped).map(str::to_string);
                (*id, item.to_string(), *qty, note)
            })
            .collect();
        assert_eq!(rows, want);

        // SIGTERM: a graceful stop, exit code 0.
        let pid = child.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the example did not stop within 30 s of SIGTERM: {:#?}",
                stderr.all()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "{status}: {:#?}", stderr.all());
        stdout_thread.join().unwrap();
        let printed = stdout.all();
        assert!(
            printed.iter().any(|l| l == "SIGTERM: shutting down")
                && printed.iter().any(|l| l.starts_with("stopped (")),
            "{printed:#?}"
        );
        // Nothing came after the orders' notices.
        assert_eq!(receiver.seen().len(), expected);
    }
);
