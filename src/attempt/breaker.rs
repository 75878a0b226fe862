//! Breaker: the in-memory side of a definition's circuit, as this process
//! sees it; every attempt consults it and feeds it its outcome. The
//! controller that opens, probes and closes a tripped circuit lives above
//! the attempt layer ([`crate::circuit`]) and is started through the
//! engine's trip callback.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::Instant,
};

use crate::{def::DefRef, handler::Outcome};

#[derive(Debug)]
enum Local {
    /// Counting failures since the last success (their times).
    Closed(VecDeque<Instant>),
    /// Tripped here, the pause not yet committed: every attempt is
    /// released (a claim may still pass the pause check).
    Opening,
    /// Open here since then: attempts claimed before are released, not
    /// delivered (later claims passed the pause in the claiming statement,
    /// or an operator resumed the definition).
    Open(Instant),
    /// The probe is running (or another process holds the circuit).
    Probing,
}

/// The circuits as this process sees them, by definition id.
#[derive(Debug, Default)]
pub(crate) struct Breakers {
    state: Mutex<HashMap<i64, Local>>,
}

impl Breakers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Local>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether an attempt of `def_id` claimed at `claimed_at` must be
    /// released rather than delivered.
    pub fn is_open(&self, def_id: i64, claimed_at: Instant) -> bool {
        match self.lock().get(&def_id) {
            Some(Local::Opening) => true,
            Some(Local::Open(since)) => claimed_at < *since,
            _ => false,
        }
    }

    /// Whether this process is probing `def_id` (its pause must not stop
    /// the probe).
    pub fn is_probing(&self, def_id: i64) -> bool {
        matches!(self.lock().get(&def_id), Some(Local::Probing))
    }

    /// Counts one delivery's outcome. `true`: this failure trips the
    /// circuit (the caller opens it).
    pub fn observe(&self, def: &DefRef, outcome: &Outcome) -> bool {
        let Some(circuit) = def.circuit else {
            return false;
        };
        let failed = match outcome {
            // The receiver (or handler) is failing: errors, panics and
            // timeouts arrive here as retries.
            Outcome::Retry { .. } => true,
            Outcome::Success { .. } => false,
            // A notice refused for good says nothing about the receiver.
            Outcome::Permanent { .. } => return false,
        };
        let mut state = self.lock();
        let entry = state
            .entry(def.id)
            .or_insert_with(|| Local::Closed(VecDeque::new()));
        let Local::Closed(failures) = entry else {
            return false;
        };
        if !failed {
            failures.clear();
            return false;
        }
        let now = Instant::now();
        failures.push_back(now);
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > circuit.window)
        {
            failures.pop_front();
        }
        if failures.len() < circuit.failures as usize {
            return false;
        }
        *entry = Local::Opening;
        true
    }

    fn set(&self, def_id: i64, local: Local) {
        self.lock().insert(def_id, local);
    }

    /// The circuit of `def_id` is open here from now on: attempts claimed
    /// before are released.
    pub fn opened(&self, def_id: i64) {
        self.set(def_id, Local::Open(Instant::now()));
    }

    /// The circuit of `def_id` counts failures again from none.
    pub fn closed(&self, def_id: i64) {
        self.set(def_id, Local::Closed(VecDeque::new()));
    }

    /// This process probes `def_id` now.
    pub fn probing(&self, def_id: i64) {
        self.set(def_id, Local::Probing);
    }
}
