//! Ordered delivery per key: with `ordering = "per_key"`, the notices of one
//! definition sharing an `ordering_key` are sent one at a time, oldest
//! first, across every worker, while other keys keep flowing.

mod runs;
mod set_aside;
mod turns;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;
use solid_notify::{NewNotice, Notice, Notifier, Outcome};

use crate::{faults::quiet, support::TestDb};

/// What the receiver saw: every call in the order calls started, and how
/// often two calls of one key overlapped.
#[derive(Default)]
struct Seen {
    calls: Vec<(String, i64, bool)>,
    started: Vec<i64>,
    running: HashMap<String, usize>,
    overlaps: usize,
}

type Shared = Arc<Mutex<Seen>>;

/// A handler recording `(key, seq, succeeded)`; `verdict` decides each call.
fn recording(
    seen: Shared,
    verdict: impl Fn(&Notice, i64) -> Outcome + Send + Sync + 'static,
) -> impl Fn(Notice) -> futures::future::BoxFuture<'static, Result<Outcome, solid_notify::BoxError>>
+ Send
+ Sync
+ 'static {
    let verdict = Arc::new(verdict);
    move |n: Notice| {
        let (seen, verdict) = (seen.clone(), verdict.clone());
        Box::pin(async move {
            let key = n.ordering_key.clone().unwrap_or_default();
            let seq = n.param["seq"].as_i64().unwrap();
            {
                let mut s = seen.lock().unwrap();
                s.started.push(seq);
                let running = s.running.entry(key.clone()).or_default();
                *running += 1;
                if *running > 1 {
                    s.overlaps += 1;
                }
            }
            let pause = n.param["ms"].as_u64().unwrap_or(fastrand::u64(0..15));
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let outcome = verdict(&n, seq);
            let mut s = seen.lock().unwrap();
            *s.running.get_mut(&key).unwrap() -= 1;
            let ok = matches!(outcome, Outcome::Success { .. });
            s.calls.push((key, seq, ok));
            Ok(outcome)
        })
    }
}

/// Each key's calls in order, as `(seq, succeeded)`.
fn per_key(seen: &Shared) -> BTreeMap<String, Vec<(i64, bool)>> {
    let mut keys: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    for (key, seq, ok) in &seen.lock().unwrap().calls {
        keys.entry(key.clone()).or_default().push((*seq, *ok));
    }
    keys
}

/// Asserts that a key's calls went strictly in turn: each seq is called
/// only after every smaller one succeeded, and succeeds once.
fn assert_in_turn(key: &str, calls: &[(i64, bool)], upto: i64) {
    let mut next = 0;
    for (seq, ok) in calls {
        assert_eq!(
            *seq, next,
            "key {key}: called {seq} before {next} succeeded: {calls:?}"
        );
        if *ok {
            next += 1;
        }
    }
    assert_eq!(next, upto, "key {key}: {calls:?}");
}

/// Notifiers (without after-commit attempts) whose handler of `ordered`
/// records every call in `seen` and succeeds.
fn succeeding<'a>(db: &'a TestDb, seen: &Shared) -> impl Fn() -> Notifier + 'a {
    let handler = Arc::new(recording(seen.clone(), |_, _| Outcome::success()));
    move || {
        let handler = handler.clone();
        db.notifier()
            .config(quiet())
            .handler("ordered", move |n: Notice| handler(n))
            .build()
            .unwrap()
    }
}

fn ordered(key: &str, seq: i64) -> NewNotice {
    NewNotice::new("ordered", &json!({ "seq": seq })).ordering_key(key)
}
