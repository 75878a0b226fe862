//! No request or connection from outside stops the rest: text the
//! database would refuse is a 400 naming the field, a bulk filter that
//! matches everything through an odd value counts as none, every write
//! refuses unknown fields, half-open connections starve no request, and a
//! search past its time frees its place.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use reqwest::StatusCode;
use serde_json::json;
use solid_notify::{
    Error, NewNotice,
    dashboard::{DashboardConfig, MAX_SEARCHES},
    def::store,
    ops::{NoticeFilter, Page, Place, find},
};
use tokio::io::AsyncWriteExt;

use crate::{
    dashboard::{client, seed, serve},
    db_test,
    faults::quiet,
    hardening::{TOKEN, post},
    support::{Backend, TestDb},
};

fn acting() -> DashboardConfig {
    DashboardConfig {
        allow_actions: true,
        token: Some(TOKEN.into()),
        ..DashboardConfig::default()
    }
}

db_test!(a_nul_anywhere_is_a_400_naming_the_field, |db: Arc<
    TestDb,
>| async move {
    seed(&db).await;
    let before = (db.live().await, db.history().await);
    let (base, stop) = serve(&db, acting()).await;
    let http = client();
    for (path, field) in [
        ("/api/notices?q=a%00b", "q"),
        ("/api/notices?def=a%00b", "def"),
        ("/api/notices?key=a%00b", "key"),
        ("/api/notices?param=a%00b", "param"),
        ("/api/notices?place=history&param=%00", "param"),
        ("/notices?q=a%00b", "q"),
        ("/notices?param=%00", "param"),
        ("/api/defs?q=a%00b", "search"),
        ("/api/defs?after=a%00b", "after"),
        ("/defs?q=a%00b", "search"),
        ("/api/keys/blocked?def=a%00b", "def"),
        ("/keys/blocked?def=a%00b", "def"),
        ("/api/overview?q=a%00b", "search"),
        ("/?q=a%00b", "search"),
    ] {
        let response = http
            .get(format!("{base}{path}"))
            .basic_auth("alice", Some(TOKEN))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        assert!(
            text.contains(field) && text.contains("NUL"),
            "{path}: {text}"
        );
        assert!(
            !text.contains("invalid byte sequence") && !text.contains("Query Error"),
            "{path}: {text}"
        );
    }
    for (path, body, field) in [
        ("/api/defs/a%00b/pause", json!({"reason": "r"}), "def"),
        ("/api/defs/a%00b/resume", json!({}), "def"),
        (
            "/api/bulk",
            json!({"place": "in_flight", "param": "\u{0}", "reason": "r"}),
            "param",
        ),
        (
            "/api/bulk",
            json!({"place": "history", "key": "a\u{0}", "reason": "r", "dry_run": true}),
            "key",
        ),
    ] {
        let (status, text) = post(&base, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        assert!(
            text.contains(field) && text.contains("NUL"),
            "{path}: {text}"
        );
    }
    stop.cancel();
    // The library's own calls: a typed error naming the field.
    let nul = |field: &str, e: Error| {
        assert!(
            matches!(&e, Error::InvalidInput { field: f, .. } if f == field),
            "{field}: {e:?}"
        );
    };
    let list =
        async |f: NoticeFilter| find::list(&db.db, Place::InFlight, &f, Page::default()).await;
    nul(
        "param_contains",
        list(NoticeFilter {
            param_contains: Some("\0".into()),
            ..NoticeFilter::default()
        })
        .await
        .unwrap_err(),
    );
    nul(
        "def",
        list(NoticeFilter {
            def: Some("a\0".into()),
            ..NoticeFilter::default()
        })
        .await
        .unwrap_err(),
    );
    nul("key", find::by_key(&db.db, "k\0", None).await.unwrap_err());
    nul(
        "search",
        store::page(&db.db, Some("\0"), None, 10).await.unwrap_err(),
    );
    assert_eq!(
        (db.live().await, db.history().await),
        before,
        "nothing changed"
    );
});

db_test!(
    a_bulk_filter_that_matches_everything_counts_as_none,
    |db: Arc<TestDb>| async move {
        seed(&db).await;
        let before = (db.live().await, db.history().await);
        let (base, stop) = serve(&db, acting()).await;
        // Every param is a JSON object: `{` matches each one; every notice
        // is younger than the year 2000.
        for place in ["in_flight", "history"] {
            for filter in [
                json!({"param": "{"}),
                json!({"since": "2000-01-01T00:00:00Z"}),
                json!({"param": "{", "since": "2000-01-01T00:00:00Z"}),
            ] {
                let mut body = json!({"place": place, "reason": "sweep"});
                for (k, v) in filter.as_object().unwrap() {
                    body[k] = v.clone();
                }
                let (status, text) = post(&base, "/api/bulk", body).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{place} {filter}: {text}");
                assert!(text.contains("match every notice"), "{text}");
            }
        }
        assert_eq!(
            (db.live().await, db.history().await),
            before,
            "nothing changed"
        );
        // Said outright, it acts.
        let (status, text) = post(
            &base,
            "/api/bulk",
            json!({"place": "in_flight", "param": "{", "reason": "sweep", "all": true, "dry_run": true}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        stop.cancel();
        // The CLI too.
        let (ok, out, err) = crate::ops::cli(
            &db,
            &["cancel", "--param-contains", "{", "--reason", "sweep"],
        );
        assert!(!ok && err.contains("match every notice"), "{out} {err}");
        assert_eq!(
            (db.live().await, db.history().await),
            before,
            "nothing changed"
        );
    }
);

db_test!(
    resume_refuses_unknown_fields,
    |db: Arc<TestDb>| async move {
        db.def("orders", "h", |_| {}).await;
        let (base, stop) = serve(&db, acting()).await;
        let paused = || async {
            db.scalar("SELECT COUNT(*) FROM notify_def WHERE name = 'orders' AND paused_until IS NOT NULL")
            .await
        };
        let (status, text) = post(&base, "/api/defs/orders/pause", json!({"reason": "r"})).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (status, text) = post(&base, "/api/defs/orders/resume", json!({"dry_run": true})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("dry_run"), "{text}");
        assert_eq!(paused().await, 1, "still paused");
        let (status, text) =
            post(&base, "/api/defs/orders/resume", json!({"reason": "done"})).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(paused().await, 0);
        let (status, text) = post(&base, "/api/defs/orders/resume", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        stop.cancel();
    }
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_open_connections_starve_no_request() {
    crate::support::run(Backend::Sqlite, |db| async move {
        // `solid-notify serve` with 1,024 file descriptors, as many
        // systems give a process.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let _serve = crate::support::KillOnDrop(
            std::process::Command::new("sh")
                .args(["-c", "ulimit -n 1024 && exec \"$0\" \"$@\""])
                .arg(env!("CARGO_BIN_EXE_solid-notify"))
                .args(["serve", "--addr", &addr])
                .env("DATABASE_URL", &db.url)
                .env("RUST_LOG", "error")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let base = format!("http://{addr}");
        let http = client();
        crate::support::eventually(30, "serve listening", || async {
            http.get(format!("{base}/api/overview"))
                .send()
                .await
                .ok()
                .filter(|r| r.status() == StatusCode::OK)
        })
        .await;
        // 1,100 clients that send half a request head and wait.
        let mut held = Vec::new();
        for _ in 0..1_100 {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            held.push(stream);
        }
        let started = Instant::now();
        let response = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
            .get(format!("{base}/api/overview"))
            .send()
            .await
            .expect("answered within 2 s");
        assert_eq!(response.status(), StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(held);
    })
    .await
}

db_test!(
    a_search_past_its_time_frees_its_place,
    |db: Arc<TestDb>| async move {
        db.def("orders", "h", |_| {}).await;
        let notifier = db.notifier().config(quiet()).build().unwrap();
        // Params whose search by a near miss takes long (each position is
        // compared almost all the way).
        let blob = "a".repeat(200_000);
        for _ in 0..16 {
            let tx = notifier.begin().await.unwrap();
            for _ in 0..10 {
                tx.add(NewNotice::new("orders", &json!({ "blob": blob })))
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
        let config = DashboardConfig {
            search_timeout: Some(Duration::from_millis(300)),
            ..DashboardConfig::default()
        };
        let (base, stop) = serve(&db, config).await;
        let near_miss = format!("{}b", "a".repeat(250));
        let slow = format!("{base}/api/notices?param={near_miss}");
        let http = client();
        let searches = (0..MAX_SEARCHES).map(|_| http.get(&slow).send());
        for answer in futures::future::join_all(searches).await {
            let answer = answer.unwrap();
            assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        // Each was stopped in the database: their places are free again at
        // once (not when a statement of seconds ends). A place is free when
        // a listing gets one, whether or not it then answers within its
        // own 300 ms (on a loaded machine a listing of one may not); "too
        // many searches at once" means the places are still held.
        // (Uninterrupted, one such search over these 160 notices takes
        // about 24 s on SQLite on a quiet 2-core machine, more on a loaded
        // one: 15 s still tells the two apart, and leaves a loaded machine
        // room to give the places back.)
        let listing = format!("{base}/api/notices?limit=1");
        crate::support::eventually(15, "every place free again", || async {
            let listings = (0..MAX_SEARCHES).map(|_| async {
                let response = http.get(&listing).send().await.unwrap();
                let status = response.status();
                let body = response.text().await.unwrap();
                status == StatusCode::OK || body.contains("the search took more than")
            });
            futures::future::join_all(listings)
                .await
                .into_iter()
                .all(|placed| placed)
                .then_some(())
        })
        .await;
        stop.cancel();
    }
);

/// A receiver on 127.0.0.1 that answers every request `200 OK` with a body
/// that never ends (16 KiB chunks, until the client hangs up); the bytes
/// it managed to write.
async fn endless_receiver() -> (String, Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/endless", listener.local_addr().unwrap());
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = written.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                // The request (headers and a small body) in one read is
                // enough: the answer does not depend on it.
                let mut request = vec![0; 64 * 1024];
                if socket.read(&mut request).await.is_err() {
                    return;
                }
                let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head).await.is_err() {
                    return;
                }
                let chunk = format!("4000\r\n{}\r\n", "x".repeat(0x4000));
                while socket.write_all(chunk.as_bytes()).await.is_ok() {
                    counted.fetch_add(0x4000, Relaxed);
                }
            });
        }
    });
    (url, written)
}

db_test!(
    an_endless_answer_is_read_no_further_than_its_limit,
    |db: Arc<TestDb>| async move {
        let (url, written) = endless_receiver().await;
        let mut spec = solid_notify::def::DefSpec::new(
            "endless",
            solid_notify::def::Channel::Http,
            json!({"url": url, "timeout": "5s"}),
        );
        spec.max_retry_times = 0;
        store::sync(&db.db, &[spec]).await.unwrap();
        let notifier = db.notifier().build().unwrap();
        let tx = notifier.begin().await.unwrap();
        tx.add(NewNotice::new("endless", &json!({}))).await.unwrap();
        let started = Instant::now();
        let report = tx.commit_and_wait().await.unwrap().pop().unwrap();
        // Read up to its limit, then left: a success, long before the
        // request's 5 s (reading on would end in a timeout).
        assert_eq!(report.result, solid_notify::AttemptResult::Succeeded);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "took {:?}",
            started.elapsed()
        );
        // The receiver could write no more than what the connection buffers
        // hold beyond the limit.
        let sent = written.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 64 * 1024 * 1024, "{sent} bytes written");
    }
);
