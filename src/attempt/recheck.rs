//! Recheck: the keys of committed ordered notices that their after-commit
//! attempt did not take, checked again in the background
//! ([`Store::finished_keys`](crate::state::Store::finished_keys)), one check at a time.
//!
//! A burst of commits (a producer adding many notices to busy keys) would
//! otherwise start one task and two or three statements per commit, all at
//! once, each holding a pooled connection the producers need. Here keys
//! gather in a set while a check runs; the next check takes all of them
//! (in statements of up to 500 keys), so the checks follow the commits
//! at the database's pace and a key added many times is checked once.
//!
//! Every key is checked after it was queued, so after the attempt that
//! queued it ended, which is what the check needs (checked while that
//! attempt's claim runs, its row lock would make the claim skip the row).
//!
//! What one check at a time costs: a check that waits for a row lock (a
//! head notice a batch of successes is claiming, for a few milliseconds)
//! holds up the keys queued behind it for as long; a chunk of keys whose
//! check fails is logged and left to the recheck (`order::TURN_RECHECK`),
//! as a commit's own check was before.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio_util::task::TaskTracker;

use crate::state::Store;

/// Keys queued for a check, and whether a task is checking.
#[derive(Debug, Default)]
pub(crate) struct Rechecks {
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    keys: HashSet<(i64, String)>,
    running: bool,
}

impl Rechecks {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds no invariant a panic could break halfway.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `keys` (`(def_id, ordering_key)`) and starts a task on
    /// `tasks` to check them unless one is running (it takes them next).
    pub(crate) fn queue(
        self: &Arc<Self>,
        store: &Store,
        tasks: &TaskTracker,
        keys: impl IntoIterator<Item = (i64, String)>,
    ) {
        let mut queue = self.lock();
        queue.keys.extend(keys);
        if queue.running || queue.keys.is_empty() {
            return;
        }
        queue.running = true;
        drop(queue);
        // Should the task end otherwise (a panic, its runtime shut down,
        // or dropped before it ever ran), the next queue starts another.
        let mut running = Running(Some(self.clone()));
        let store = store.clone();
        tasks.spawn(async move {
            while let Some(keys) = running.take_keys() {
                store.finished_keys(keys).await;
            }
        });
    }
}

/// The checking task's hold on `running`.
struct Running(Option<Arc<Rechecks>>);

impl Running {
    /// The keys queued, all of them; `None` when there are none, having
    /// cleared `running` under the same lock (a key queued after that
    /// starts a new task).
    fn take_keys(&mut self) -> Option<Vec<(i64, String)>> {
        let rechecks = self.0.take()?;
        let mut queue = rechecks.lock();
        if queue.keys.is_empty() {
            queue.running = false;
            return None;
        }
        let keys = queue.keys.drain().collect();
        drop(queue);
        self.0 = Some(rechecks);
        Some(keys)
    }
}

impl Drop for Running {
    /// A task ended some other way: the next queue starts another.
    fn drop(&mut self) {
        if let Some(rechecks) = self.0.take() {
            rechecks.lock().running = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(keys: &[(i64, &str)]) -> Arc<Rechecks> {
        let rechecks = Arc::new(Rechecks::default());
        let mut queue = rechecks.lock();
        queue.running = true;
        queue
            .keys
            .extend(keys.iter().map(|(d, k)| (*d, k.to_string())));
        drop(queue);
        rechecks
    }

    #[test]
    fn a_check_takes_every_key_queued_once_and_the_last_take_clears_running() {
        let rechecks = queued(&[(1, "a"), (1, "a"), (2, "a"), (1, "b")]);
        let mut running = Running(Some(rechecks.clone()));
        let mut keys = running.take_keys().expect("three keys");
        keys.sort();
        assert_eq!(
            keys,
            [
                (1, "a".to_string()),
                (1, "b".to_string()),
                (2, "a".to_string())
            ]
        );
        assert!(rechecks.lock().running, "still checking");
        assert_eq!(running.take_keys(), None);
        assert!(!rechecks.lock().running);
        drop(running);
        assert!(!rechecks.lock().running);
    }

    #[test]
    fn a_task_that_ends_mid_check_clears_running() {
        let rechecks = queued(&[(1, "a")]);
        let mut running = Running(Some(rechecks.clone()));
        assert!(running.take_keys().is_some());
        rechecks.lock().keys.insert((1, "b".to_string()));
        drop(running);
        let queue = rechecks.lock();
        assert!(!queue.running, "the next queue starts a task");
        assert_eq!(queue.keys.len(), 1, "and it finds the key left");
    }
}
