//! Faults: the two promises (a committed notice is never lost; no two
//! senders run one attempt at the same time) under the faults a user meets:
//! bad input, a broken alert definition, shutdown mid-attempt, slow hooks and
//! receivers, a database that goes away, a bad AMQP publish, clock skew,
//! late confirmations, overflow, unknown definitions. Each test injects the
//! fault and counts rows and requests.

mod alerts;
mod amqp;
mod clock;
mod database;
mod memory;
mod overflow;
mod overlap;
mod park;
mod partition;
mod producer;
mod small;

use std::{sync::Arc, time::Duration};

use serde_json::json;
use solid_notify::{
    Config, Notifier, Worker, WorkerConfig,
    def::{Channel, DefSpec, store},
    worker::Mode,
};
use tokio_util::sync::CancellationToken;

use crate::support::{TestDb, test_config};

/// An `http` definition posting to `url`, retried every second.
pub async fn http_def(db: &TestDb, name: &str, url: &str, edit: impl FnOnce(&mut DefSpec)) {
    let mut spec = DefSpec::new(name, Channel::Http, json!({ "url": url }));
    spec.retry_interval = "1s".into();
    edit(&mut spec);
    store::sync(&db.db, &[spec]).await.unwrap();
}

/// Test settings without after-commit attempts (workers do the work).
pub fn quiet() -> Config {
    Config {
        immediate_attempt: false,
        ..test_config()
    }
}

/// A worker sweeping every 20 ms.
pub fn fast(config: WorkerConfig) -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(20),
        confirm_listener: false,
        ..config
    }
}

/// A running worker and how to stop it.
pub struct Running {
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
    stats: Arc<solid_notify::worker::WorkerStats>,
}

impl Running {
    /// The worker's counters.
    pub fn stats(&self) -> Arc<solid_notify::worker::WorkerStats> {
        self.stats.clone()
    }

    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("worker stops")
            .unwrap();
    }
}

/// Starts a worker over `notifier` on its own task.
pub fn start(notifier: Notifier, config: WorkerConfig) -> Running {
    let worker = Arc::new(Worker::new(notifier, config).unwrap());
    let stop = CancellationToken::new();
    let stats = worker.stats();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await.expect("the worker refused to start") }
    });
    Running { stop, task, stats }
}
