//! Runs: notices of one ordering key claimed behind the one being sent.
//!
//! On PostgreSQL a sweep's batch of successes claims, with each key's next
//! notice, up to [`RUN`](crate::state::order) - 1 notices right behind it
//! ([`attempt::batch`](super::batch)). Only the first is sent; the others
//! wait here, queued under the id of the notice before them, leased. A
//! recorded success hands the next one on (the batch); any other end of
//! the notice before them (a retry, a final failure, parking, waiting for
//! confirmation, a lost claim, a release, shutdown) releases the whole
//! queue (the sweep or the batch): left leased, they would hold up that
//! notice's own retry until their leases ran out.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use crate::state::Lease;

/// The queues of one sweep, shared by the sweep and its batch.
#[derive(Clone, Default)]
pub(crate) struct Runs {
    queues: Arc<Mutex<HashMap<i64, VecDeque<Lease>>>>,
}

impl Runs {
    fn lock(&self) -> MutexGuard<'_, HashMap<i64, VecDeque<Lease>>> {
        // A panic while holding it left the map whole: every operation
        // below is one insert or remove.
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `run` behind the notice `after` (nothing if empty).
    pub fn queue(&self, after: i64, run: Vec<Lease>) {
        if run.is_empty() {
            return;
        }
        self.lock().insert(after, run.into());
    }

    /// Which of `ids` have notices queued behind them.
    pub fn continuing(&self, ids: impl Iterator<Item = i64>) -> Vec<i64> {
        let queues = self.lock();
        ids.filter(|id| queues.contains_key(id)).collect()
    }

    /// The notice `id` was recorded as delivered: the next one behind it,
    /// the rest now queued behind that one.
    pub fn advance(&self, id: i64) -> Option<Lease> {
        let mut queues = self.lock();
        let mut queue = queues.remove(&id)?;
        let next = queue.pop_front()?;
        if !queue.is_empty() {
            queues.insert(next.id(), queue);
        }
        Some(next)
    }

    /// Takes what is queued behind `id` (to release it).
    pub fn take(&self, id: i64) -> Vec<Lease> {
        self.lock().remove(&id).map(Vec::from).unwrap_or_default()
    }

    /// Takes what is queued behind any of `ids`.
    pub fn take_behind(&self, ids: impl Iterator<Item = i64>) -> Vec<Lease> {
        ids.flat_map(|id| self.take(id)).collect()
    }

    /// Takes everything queued.
    pub fn take_all(&self) -> Vec<Lease> {
        self.lock().drain().flat_map(|(_, q)| q).collect()
    }
}
