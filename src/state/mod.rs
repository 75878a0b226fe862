//! State: the only code that writes `notify_msg` and `notify_msg_history`
//! (and `notify_worker`, the workers' heartbeats: [`heartbeat`]).
//!
//! Every transition is one guarded statement, or one small transaction, that
//! names the `version` it expects and bumps it by one; a write that finds
//! another version changes nothing and reports the claim as lost. Times come
//! from the database's clock ([`clock`]).
//!
//! | from | transition | to | here |
//! |---|---|---|---|
//! | — | insert, in the caller's transaction | 0, due now or reserved for the after-commit attempt | [`insert`] |
//! | 0 / 2 / 4 due (or reserved) | claim: version + 1, `leased`, lease from the DB clock | same status, leased | [`claim`] |
//! | 0, next of its key after a success, in turn | claim for the sweep that recorded the success, in the same statement (PostgreSQL) | same status, leased | `batch::succeed_many`, `order::next_of_moved_pg` |
//! | 0 not leased, right behind that next notice | claimed with it, a run of up to `order::RUN`; those between the first and the last hold no key (`in_run_at`, migration 17), the sweep sends each once the one before is recorded | same status, leased | `order::next_of_moved_pg`, [`crate::attempt`] (runs) |
//! | 0 due, not in its key's turn | set aside: next check later, version unchanged | same status | [`claim`], [`order`]; on PostgreSQL also at insert, third in line or later (trigger, migration 14) |
//! | 0 set aside | promote: due now, once in turn, version unchanged | same status | `order::promote`; on PostgreSQL a batch of successes promotes in its own statement (`batch::succeed_many`) |
//! | leased | release: due now | same status | `Lease::release_for` |
//! | leased, over its rate limit | release until the next window, uncharged | same status | `Lease::release_for`, `rate` |
//! | leased | retry at T: errors + line, `retry_times` + 1 | 2 | `Lease::retry` |
//! | leased | succeed | history 1 | `Lease::succeed`, `batch::succeed_many` |
//! | leased | fail for good (+ alert notice, same transaction) | history 3 | `Lease::fail_for_good` |
//! | leased | await confirmation until a deadline | 4 | `Lease::await_confirmation` |
//! | 4 | confirm | history 1 | `confirm::confirm` |
//! | 4 | reject or deadline passed | claimed, then 2 or history 3 as any failure | `claim::claim_one` |
//! | any in flight | cancel | history 5 | `operator::cancel` |
//! | leased, definition unusable | park (reason in errors, + one alert) | history 6 | `batch::park_many` |
//! | history 3 / 5 / 6 | requeue (audit line) | 0, due now, fresh retry budget | `operator::requeue` |
//! | any, not held | reseal `param` / `step_result` with the current key (no version bump) | unchanged | `operator::reseal` |
//! | history 1 / 5 (3 when asked) | purge, after archiving | deleted | `retention::delete_history` |
//!
//! A definition paused in `notify_def` ([`pause`]) is skipped by every claim
//! of due rows until it resumes: its notices stay as they are.
//!
//! A claimed row is a `Lease`: the only way to change it is to call one of
//! its transitions, each of which consumes it (and hands it back, with the
//! error, when the database could not be reached, so the caller may try
//! again). A lease dropped without a transition is released in the
//! background, or left to run out.

pub(crate) mod add;
pub mod batch;
pub mod claim;
pub mod clock;
mod columns;
pub mod confirm;
#[cfg(test)]
mod conformance;
pub mod errors_log;
pub(crate) mod floor;
pub mod heartbeat;
pub mod ids;
pub mod insert;
pub(crate) mod keyed;
mod lease;
pub mod operator;
pub mod order;
pub mod partitions;
pub mod pause;
pub(crate) mod rate;
pub(crate) mod retention;
mod version;

use std::{sync::Arc, time::Duration};

use sea_orm::{DatabaseConnection, DbBackend};

pub use claim::{DefSelect, DueFilter};
pub(crate) use lease::{
    DELIVERY_COPIES, Deadline, Final, Held, Lease, Lost, Retry, Scheduled, Written,
};

/// Where notices are stored, and how long a claim holds one.
#[derive(Clone)]
pub(crate) struct Store {
    /// The pool, every call bounded ([`crate::db::Db`]).
    pub db: crate::db::Db,
    pub lease: Duration,
    /// Bumped whenever notices become due through this store's notifier;
    /// workers built on it watch it (in-process wake-ups).
    pub wakes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Store {
    /// A store on `db` whose calls each take at most `bound`.
    pub fn new(db: DatabaseConnection, lease: Duration, bound: Duration) -> Self {
        Store {
            db: crate::db::Db::new(db, bound),
            lease,
            wakes: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Wakes the workers built on this store's notifier: notices are due.
    pub fn wake_workers(&self) {
        self.wakes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// After notices left `notify_msg`, given as `(def_id, ordering_key)`:
    /// promotes the next notice of each key ([`order::promote`]) and wakes
    /// the workers. Nothing to do for notices without a key. A failed
    /// promotion is logged: the notice is then due within
    /// [`order::TURN_RECHECK`].
    pub async fn finished<'a>(&self, rows: impl IntoIterator<Item = (i64, &'a Option<String>)>) {
        let keys: Vec<(i64, String)> = rows
            .into_iter()
            .filter_map(|(def, key)| key.as_ref().map(|key| (def, key.clone())))
            .collect();
        self.finished_keys(keys).await;
    }

    /// [`finished`](Self::finished) for these `(def_id, ordering_key)`, each
    /// key once, in chunks of [`order::PROMOTE_CHUNK`] keys: the workers are
    /// woken after each chunk, and a chunk that fails leaves only its own
    /// keys to [`order::TURN_RECHECK`].
    pub(crate) async fn finished_keys(&self, mut keys: Vec<(i64, String)>) {
        keys.sort_unstable();
        keys.dedup();
        for chunk in keys.chunks(order::PROMOTE_CHUNK) {
            if let Err(e) = order::promote(&self.db, chunk).await {
                tracing::warn!(error = %e, keys = chunk.len(), "cannot promote the next notices of finished ordering keys; they are due within {:?}", order::TURN_RECHECK);
            }
            self.wake_workers();
        }
    }

    /// After notices now in history (given by id) were cancelled, or final
    /// failures holding their keys back were cancelled: [`finished`](Self::finished)
    /// for their keys.
    pub async fn finished_ids(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        use crate::entity::notify_msg_history::{Column, Entity};
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};
        let select = Entity::find()
            .select_only()
            .columns([Column::DefId, Column::OrderingKey])
            .filter(Column::Id.is_in(ids.iter().copied()))
            .filter(Column::OrderingKey.is_not_null());
        match operator::readable_keys(&self.db, select).await {
            Ok(keys) => self.finished_keys(keys).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ordering keys of finished notices; their next notices are due within {:?}", order::TURN_RECHECK)
            }
        }
    }

    pub fn backend(&self) -> DbBackend {
        self.db.pool().get_database_backend()
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .field("lease", &self.lease)
            .finish()
    }
}
