//! A real HTTP receiver on 127.0.0.1:0 (axum) that answers notices by a
//! script and records, per notice, every request: when it started and ended,
//! what it answered, and whether it overlapped another request for the same
//! notice. Shared by the integration tests and `examples/chaos.rs`.
//!
//! A request counts as running from the moment its handler starts until it
//! answers or its connection is dropped by the sender (the handler's future
//! is dropped then, and a guard records the end).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode},
    routing::post,
};

/// What the script is told about a request.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: i64,
    pub attempt: u32,
    pub body: String,
}

/// What to answer, and after how long.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply {
            status: 200,
            delay: Duration::ZERO,
        }
    }

    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// One request as seen by the receiver.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: i64,
    pub attempt: u32,
    pub status: u16,
    pub started: Instant,
    pub ended: Option<Instant>,
    /// Answered (false: the sender dropped the connection first).
    pub answered: bool,
    /// The W3C `traceparent` header, if sent.
    pub traceparent: Option<String>,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
    /// The `X-Notice-Step` header, if sent.
    pub step: Option<String>,
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

struct Shared {
    script: Box<Script>,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    active: HashMap<i64, u32>,
    overlapped: Vec<i64>,
    seen: Vec<Seen>,
}

/// The running receiver.
pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Running {
    shared: Arc<Shared>,
    index: usize,
    id: i64,
    answered: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut log = self.shared.log.lock().unwrap();
        if let Some(n) = log.active.get_mut(&self.id) {
            *n -= 1;
        }
        let seen = &mut log.seen[self.index];
        seen.ended = Some(Instant::now());
        seen.answered = self.answered;
    }
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: String) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(-1)
    };
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let request = Request {
        id: header("x-notice-id"),
        attempt: u32::try_from(header("x-notice-attempt")).unwrap_or(0),
        body,
    };
    let reply = (shared.script)(&request);
    let index = {
        let mut log = shared.log.lock().unwrap();
        let active = log.active.entry(request.id).or_default();
        *active += 1;
        if *active > 1 {
            log.overlapped.push(request.id);
        }
        log.seen.push(Seen {
            id: request.id,
            attempt: request.attempt,
            status: reply.status,
            started: Instant::now(),
            ended: None,
            answered: false,
            traceparent: text("traceparent"),
            idempotency_key: text("idempotency-key"),
            step: text("x-notice-step"),
        });
        log.seen.len() - 1
    };
    let mut running = Running {
        shared: shared.clone(),
        index,
        id: request.id,
        answered: false,
    };
    tokio::time::sleep(reply.delay).await;
    running.answered = true;
    drop(running);
    StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl Receiver {
    /// A receiver that answers each notice's first request after `delay`
    /// and every later one at once.
    pub async fn first_slow(delay: Duration) -> Receiver {
        Receiver::start(move |r| {
            if r.attempt == 1 {
                Reply::ok().after(delay)
            } else {
                Reply::ok()
            }
        })
        .await
    }
    /// Starts a receiver answering each request with `script(request)`.
    pub async fn start(script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Receiver {
        let shared = Arc::new(Shared {
            script: Box::new(script),
            log: Mutex::default(),
        });
        let app = Router::new()
            .route("/", post(handle))
            .route("/{*path}", post(handle))
            // Notices of any size (axum's default stops at 2 MB).
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Receiver { url, shared, task }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.log.lock().unwrap().seen.clone()
    }

    /// Notices that had two requests running at once (one entry per overlap).
    pub fn overlaps(&self) -> Vec<i64> {
        self.shared.log.lock().unwrap().overlapped.clone()
    }

    /// Requests answered with a 2xx, per notice.
    pub fn successes(&self) -> HashMap<i64, usize> {
        let mut out = HashMap::new();
        for s in self.seen() {
            if s.answered && (200..300).contains(&s.status) {
                *out.entry(s.id).or_default() += 1;
            }
        }
        out
    }

    /// Notices answered with a 2xx at least once.
    pub fn delivered(&self) -> HashSet<i64> {
        self.successes().into_keys().collect()
    }

    /// Successful requests beyond one per notice.
    pub fn duplicates(&self) -> usize {
        self.successes().values().map(|n| n - 1).sum()
    }

    /// Requests for `id` so far.
    pub fn count_for(&self, id: i64) -> usize {
        self.seen().iter().filter(|s| s.id == id).count()
    }

    /// Requests running right now.
    pub fn running(&self) -> u32 {
        self.shared.log.lock().unwrap().active.values().sum()
    }
}
