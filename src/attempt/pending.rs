//! Pending: a notice written in a transaction, to be attempted after its
//! commit (or left to the sweepers), as the producer and the recorder (for
//! an alert notice) hand it to [`background`](super::background).

use std::time::Instant;

use chrono::NaiveDateTime;

use crate::{
    def::DefRef,
    entity::notify_msg,
    state::{clock::Due, insert::NewRow},
    status::Status,
};

/// A notice written in a transaction, to be attempted after its commit.
///
/// Deliberately not `Clone`: one pending notice is one attempt.
#[derive(Debug)]
pub struct PendingNotice {
    pub(crate) id: i64,
    pub(crate) row: NewRow,
    pub(crate) def: DefRef,
    /// Taken before the statement that wrote the row: its reservation
    /// (lease) cannot have begun earlier.
    pub(crate) written: Instant,
    /// How its after-commit attempt gets hold of the row.
    pub(super) start: Start,
    /// PostgreSQL, [`Notifier::begin`](crate::Notifier::begin): the row is
    /// buffered and written with the `COMMIT`.
    pub(crate) on_commit: bool,
    /// Claim the reservation even after a commit the library saw.
    claim_after_commit: bool,
}

/// How an after-commit attempt gets hold of its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// The row was written reserved for this attempt and the library itself
    /// saw its transaction commit ([`NoticeTx`](crate::NoticeTx) from
    /// [`Notifier::begin`]): the reservation is the attempt's lease.
    Held,
    /// Written reserved, in a transaction whose commit the library did not
    /// see ([`Notifier::add`], a wrapped transaction that may be nested):
    /// the attempt first claims the reservation, so that a transaction that
    /// did not commit, or a second dispatch, sends nothing.
    ClaimReservation,
    /// Written due now (an alert): claimed like any due row, so a sweeper
    /// may take it first, and an ambiguous commit never leaves it waiting.
    ClaimDue,
    /// Written due now with an ordering key: claimed only if no older notice
    /// of its key is unfinished (else a sweeper takes it in its turn).
    ClaimInTurn,
    /// Not attempted after commit (after-commit attempts are off, or the
    /// notifier is shutting down): due now for a sweeper.
    Sweeper,
    /// Delayed ([`Due::Later`]): never attempted after commit; a sweeper
    /// takes it once it is due.
    Later,
    /// Nothing was written: an idempotent add found this existing notice.
    Existing,
}

impl PendingNotice {
    /// A notice whose row was written by a statement sent after `written`,
    /// in a transaction whose commit the library has not seen.
    pub(crate) fn new(id: i64, row: NewRow, def: DefRef, written: Instant) -> Self {
        let start = match row.due {
            Due::Reserved(_) => Start::ClaimReservation,
            Due::InTurn => Start::ClaimInTurn,
            Due::Now => Start::Sweeper,
            Due::Later(_) => Start::Later,
        };
        PendingNotice {
            id,
            row,
            def,
            written,
            start,
            on_commit: false,
            claim_after_commit: false,
        }
    }

    /// An idempotent add that found notice `id` with the same key: nothing
    /// was written, nothing is attempted.
    pub(crate) fn existing(id: i64, row: NewRow, def: DefRef) -> Self {
        PendingNotice {
            start: Start::Existing,
            ..PendingNotice::new(id, row, def, Instant::now())
        }
    }

    /// An alert notice written due now; attempted after its commit when
    /// `attempt_here`, else left to sweepers.
    pub(crate) fn alert(id: i64, row: NewRow, def: DefRef, attempt_here: bool) -> Self {
        PendingNotice {
            start: if attempt_here {
                Start::ClaimDue
            } else {
                Start::Sweeper
            },
            ..PendingNotice::new(id, row, def, Instant::now())
        }
    }

    /// The same notice, its transaction seen to commit by the library.
    pub(crate) fn committed(self) -> Self {
        let start = match self.start {
            Start::ClaimReservation if !self.claim_after_commit => Start::Held,
            other => other,
        };
        PendingNotice { start, ..self }
    }

    /// The same notice, whose row the caller could still roll back to a
    /// savepoint of its own: its attempt claims the reservation even after
    /// a commit the library saw.
    pub(crate) fn claim_after_commit(self) -> Self {
        PendingNotice {
            claim_after_commit: true,
            ..self
        }
    }

    /// The notice's id: the new notice's, or for an idempotent add that
    /// found one, the existing notice's.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Whether the add wrote a new notice (`false`: an idempotent add found
    /// an existing notice with its key and wrote nothing).
    pub fn is_new(&self) -> bool {
        self.start != Start::Existing
    }

    /// Whether the row was written reserved for an after-commit attempt.
    pub(crate) fn reserved(&self) -> bool {
        self.is_new() && self.row.due.reserved()
    }

    /// Whether an after-commit attempt may run in this process.
    pub(super) fn attempted_here(&self) -> bool {
        !matches!(self.start, Start::Sweeper | Start::Later | Start::Existing)
    }

    /// Whether the add wrote a delayed notice, never attempted after commit.
    pub(super) fn is_later(&self) -> bool {
        self.start == Start::Later
    }

    /// A delayed notice: about how long until it is due, from now (at most
    /// that long: its insert came after `written`, by the database's clock
    /// for [`NewNotice::delay`](crate::NewNotice::delay), by this host's
    /// for [`NewNotice::not_before`](crate::NewNotice::not_before)).
    /// `None` for any other notice.
    pub(crate) fn due_in(&self) -> Option<std::time::Duration> {
        use crate::state::clock::Later;
        if !self.is_later() {
            return None;
        }
        match self.row.due {
            Due::Later(Later::By(d)) => Some(d.saturating_sub(self.written.elapsed())),
            Due::Later(Later::At(t)) => Some(
                (t - chrono::Utc::now().naive_utc())
                    .to_std()
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    /// The row as inserted (times are not known here and are not used),
    /// its param moved out of this pending notice, which keeps no copy of
    /// it while the attempt runs.
    pub(super) fn take_model(&mut self) -> notify_msg::Model {
        let leased = self.reserved();
        let r = &mut self.row;
        notify_msg::Model {
            id: self.id,
            def_id: r.def_id,
            param: std::mem::take(&mut r.param),
            description: r.description.clone(),
            errors: String::new(),
            status: Status::NotSent,
            retry_times: 0,
            last_call_time: None,
            next_call_time: NaiveDateTime::MIN,
            create_time: NaiveDateTime::MIN,
            version: 0,
            load_balance_num: r.load_balance_num,
            idempotency_key: r.idempotency_key.clone(),
            target_override: r.target_override.clone(),
            leased,
            trace_context: r.trace_context.clone(),
            ordering_key: r.ordering_key.clone(),
            step: 0,
            step_result: None,
            not_before: None,
            origin: r.origin,
        }
    }
}
