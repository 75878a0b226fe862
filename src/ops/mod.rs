//! Operations: what an operator does without SQL, as methods on
//! [`Notifier`]: find and inspect notices ([`Notifier::list`],
//! [`Notifier::status`]), requeue or cancel one or many with an audit line
//! ([`Notifier::requeue`], [`Notifier::requeue_where`]), purge old history
//! ([`Notifier::purge`]), pause and resume a definition
//! ([`Notifier::pause`]), see the blocked keys and the overview. The
//! `solid-notify` command and the dashboard are thin faces on these calls.
//! Every write goes through the state layer, guarded by the version read,
//! and names who acted and why ([`Audit`]).
//!
//! ```no_run
//! # async fn run(notifier: solid_notify::Notifier) -> Result<(), solid_notify::Error> {
//! use solid_notify::ops::{Audit, Page, PauseEnd, Place};
//! let failed = notifier.list(Place::History, &Default::default(), Page::default()).await?;
//! for notice in &failed {
//!     println!("{} {:?} {:?}", notice.id, notice.def, notice.status);
//! }
//! notifier.requeue(42, &Audit::operator()).await?; // a final failure, due again with a fresh budget
//! let audit = Audit::new("alice", "receiver down for maintenance");
//! notifier.pause("order_paid", PauseEnd::OnResume, &audit).await?;
//! # Ok(()) }
//! ```

#[doc(hidden)]
pub mod bulk;
mod calls;
#[doc(hidden)]
pub mod find;
#[doc(hidden)]
pub mod keys;
#[doc(hidden)]
pub mod overview;
#[doc(hidden)]
pub mod pause;
#[doc(hidden)]
pub mod purge;
#[doc(hidden)]
pub mod rekey;
mod released;

/// A worker's heartbeat row (`notify_worker`): its id (`host:pid:random`),
/// host, pid, when it started and was last seen, and its counts.
pub use crate::entity::notify_worker::Model as WorkerRow;
pub use crate::state::partitions::{
    Converted, DEFAULT_AHEAD, DEFAULT_COPY_BATCH, Layout, PARTITION_LOCK_TIMEOUT, Partitioning,
    Period, PeriodPartition,
};
pub use bulk::{BulkAction, BulkReport, Pinned, PinnedAction};
pub use find::{NoticeFilter, NoticeView, Page, Place};
pub use keys::{BlockedKey, BlockedKeys};
pub use overview::{DefSummary, Hour, Others, Overview, OverviewQuery, WorkerView};
pub use pause::PauseEnd;
pub use purge::{Purge, PurgeReport, Retention, spawn_retention};
pub use rekey::RekeyReport;

use crate::{
    error::{Error, Result},
    notifier::Notifier,
};

#[doc(hidden)]
/// The UTC time `d` ago by this host's clock (the earliest time there is,
/// for a `d` too large to subtract).
pub fn ago(d: std::time::Duration) -> chrono::NaiveDateTime {
    let now = chrono::Utc::now().naive_utc();
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(chrono::NaiveDateTime::MIN)
}

#[doc(hidden)]
/// A time as an operator writes it: a UTC time (`2026-11-23T18:00:00Z`,
/// `2026-11-23 18:00`, `2026-11-23`) or a duration (`2h`, `30m`) whose
/// meaning depends on the use: that long ago for a filter, that long from
/// now for a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// This UTC time.
    At(chrono::NaiveDateTime),
    /// A duration.
    Offset(std::time::Duration),
}

impl When {
    /// Parses an operator's time; the error says what is accepted.
    pub fn parse(text: &str) -> std::result::Result<When, String> {
        use chrono::NaiveDateTime;
        let text = text.trim();
        if let Ok(d) = humantime::parse_duration(text) {
            return Ok(When::Offset(d));
        }
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
            return Ok(When::At(t.naive_utc()));
        }
        for format in [
            "%Y-%m-%d %H:%M:%S%.f",
            "%Y-%m-%dT%H:%M:%S%.f",
            "%Y-%m-%d %H:%M",
            "%Y-%m-%dT%H:%M",
        ] {
            if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
                return Ok(When::At(t));
            }
        }
        if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
            return Ok(When::At(d.and_time(chrono::NaiveTime::MIN)));
        }
        Err(format!(
            "`{text}` is neither a UTC time (2026-11-23T18:00:00Z, 2026-11-23 18:00) nor a duration (2h, 30m)"
        ))
    }

    /// As a point in the past: a duration means that long ago.
    pub fn ago(self) -> chrono::NaiveDateTime {
        match self {
            When::At(t) => t,
            When::Offset(d) => ago(d),
        }
    }
}

#[doc(hidden)]
/// Longest audit actor kept, in characters: 100.
pub const MAX_AUDIT_ACTOR: usize = 100;
#[doc(hidden)]
/// Longest audit reason kept, in characters: 500.
pub const MAX_AUDIT_REASON: usize = 500;

/// `text` with control characters (and the line separators, invisible
/// characters and bidirectional overrides that break or reorder what a
/// terminal shows) as spaces, trimmed, cut to `max` characters.
fn clean(text: &str, max: usize) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{00AD}'
                    | '\u{061C}'
                    | '\u{115F}'..='\u{1160}'
                    | '\u{180E}'
                    | '\u{200B}'..='\u{200F}'
                    | '\u{2028}'..='\u{202E}'
                    | '\u{2060}'..='\u{206F}'
                    | '\u{3164}'
                    | '\u{FE00}'..='\u{FE0F}'
                    | '\u{FEFF}'
                    | '\u{FFA0}'
                    | '\u{FFF9}'..='\u{FFFB}'
                    | '\u{E0000}'..='\u{E0FFF}'
            )
    };
    let one_line: String = text
        .chars()
        .map(|c| if hidden(c) { ' ' } else { c })
        .take(max)
        .collect();
    one_line.trim().to_string()
}

/// Who did an operator action, and why: the audit line's text,
/// `ACTOR: REASON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// Who (a user name, a tool).
    pub actor: String,
    /// Why.
    pub reason: String,
}

impl Audit {
    /// `actor`, `reason`, cleaned: control characters (newlines, escape
    /// sequences) become spaces, the ends are trimmed, and each is cut to
    /// [`MAX_AUDIT_ACTOR`] / [`MAX_AUDIT_REASON`] characters, so an audit
    /// line is one line of plain text wherever it is printed.
    pub fn new(actor: impl Into<String>, reason: impl Into<String>) -> Self {
        Audit {
            actor: clean(&actor.into(), MAX_AUDIT_ACTOR),
            reason: clean(&reason.into(), MAX_AUDIT_REASON),
        }
    }

    /// The default of [`Notifier::requeue`] and [`Notifier::cancel`]:
    /// actor `an operator`, no reason.
    pub fn operator() -> Self {
        Audit::new("an operator", "")
    }
}

impl std::fmt::Display for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reason.is_empty() {
            f.write_str(&self.actor)
        } else {
            write!(f, "{}: {}", self.actor, self.reason)
        }
    }
}

/// An operation stopped by `error` after doing `done`: what was written
/// stays written.
#[derive(Debug, thiserror::Error)]
#[error("{error} (stopped after: {done})")]
pub struct Interrupted<R: std::fmt::Display + std::fmt::Debug> {
    /// What was done before the error.
    pub done: R,
    /// Why it stopped.
    pub error: Error,
}

impl<R: std::fmt::Display + std::fmt::Debug + Default> Interrupted<R> {
    fn before(error: Error) -> Self {
        Interrupted {
            done: R::default(),
            error,
        }
    }
}

impl Notifier {
    /// Moves a finished notice (final failure, cancelled or parked) back into
    /// `notify_msg`, due at once, with a fresh retry budget and its failure
    /// log kept, plus the line `requeued by AUDIT`. Its id stays the same,
    /// so receivers still see one notice. A *scheduled* notice (delayed,
    /// its time still ahead) is made due at once instead, with the line
    /// `sent now (was scheduled) by AUDIT` ([`Audit::operator`] when no one
    /// in particular acts).
    pub async fn requeue(&self, id: i64, audit: &Audit) -> Result<()> {
        self.one(id, audit, true).await
    }

    /// Cancels a notice in flight: it moves to history with status 5 and is
    /// not attempted again. An attempt already running may still deliver it;
    /// its outcome is then discarded (its claim is gone).
    ///
    /// A final failure or parked notice in history is cancelled in place
    /// (status 5, an audit line): it is given up for good, and with
    /// `stop_on_failure` the later notices of its ordering key go on. The
    /// audit line names who cancelled it and why.
    pub async fn cancel(&self, id: i64, audit: &Audit) -> Result<()> {
        self.one(id, audit, false).await
    }

    /// Requeues (`requeue`) or cancels notice `id`, each try guarded by the
    /// version read; a conflict once `crate::db::CONFLICT_TRIES` tries lost.
    async fn one(&self, id: i64, audit: &Audit, requeue: bool) -> Result<()> {
        for _ in 0..crate::db::CONFLICT_TRIES {
            let view = find::show(&self.store().db, id).await?;
            match (requeue, view.place) {
                (true, Place::History) if view.status.is_requeueable() => {}
                (false, Place::InFlight) => {}
                (false, Place::History)
                    if matches!(
                        view.status,
                        crate::status::Status::FinalFailure | crate::status::Status::Parked
                    ) =>
                {
                    if self.cancel_finished_one(id, &view, audit).await? {
                        return Ok(());
                    }
                    continue;
                }
                // A delayed notice never attempted (scheduled, by this
                // host's clock or the database's): sent now.
                (true, Place::InFlight)
                    if view.not_before.is_some()
                        && view.status == crate::status::Status::NotSent
                        && view.retry_times == 0
                        && !view.claim_live =>
                {
                    if self.send_scheduled_now(id, &view, audit).await? {
                        return Ok(());
                    }
                    continue;
                }
                (true, _) => {
                    return Err(Error::WrongState {
                        id,
                        status: view.status,
                        problem: "only final failures, cancelled and parked notices, and scheduled notices, can be requeued",
                    });
                }
                (false, Place::History) => {
                    return Err(Error::WrongState {
                        id,
                        status: view.status,
                        problem: "it has finished already",
                    });
                }
            }
            if self.one_by_id(id, audit, requeue).await? {
                return Ok(());
            }
        }
        Err(Error::Conflict(id))
    }

    /// Cancels the finished notice `id` (a final failure or parked) in
    /// place, as `view` read it: whether it changed (else its version moved).
    async fn cancel_finished_one(&self, id: i64, view: &NoticeView, audit: &Audit) -> Result<bool> {
        let seen = as_seen(id, view);
        let note = format!("cancelled by {audit}");
        let keys = self.key_events(&note).await?;
        let on_release = keys
            .as_ref()
            .map(|k| move |d: i64, key: &str| k.row(d, key));
        let (done, events) = crate::state::operator::cancel_finished(
            self.store(),
            std::slice::from_ref(&seen),
            &note,
            crate::state::clock::app_now(),
            on_release.as_ref().map(|f| f as _),
        )
        .await?;
        self.events_written(events).await;
        Ok(done.len() == 1)
    }

    /// Makes the scheduled notice `id` due at once, as `view` read it:
    /// whether it changed (then every worker is woken).
    async fn send_scheduled_now(&self, id: i64, view: &NoticeView, audit: &Audit) -> Result<bool> {
        let seen = as_seen(id, view);
        let note = format!("sent now (was scheduled) by {audit}");
        let changed = crate::state::operator::send_now(
            self.store(),
            &seen,
            &note,
            crate::state::clock::app_now(),
        )
        .await?;
        if changed {
            self.wake_everyone().await;
        }
        Ok(changed)
    }

    /// Requeues (`requeue`) or cancels notice `id` as a bulk action on its
    /// id alone: whether it changed.
    async fn one_by_id(&self, id: i64, audit: &Audit, requeue: bool) -> Result<bool> {
        let action = BulkAction::new(
            NoticeFilter {
                ids: Some(vec![id]),
                ..NoticeFilter::default()
            },
            audit.clone(),
        );
        let report = if requeue {
            self.requeue_where(&action).await
        } else {
            self.cancel_where(&action).await
        }
        .map_err(|e| e.error)?;
        Ok(report.changed == 1)
    }
}

/// What an operator's write saw of notice `id`: its version and errors, as
/// `view` read them.
fn as_seen(id: i64, view: &NoticeView) -> crate::state::operator::Seen {
    crate::state::operator::Seen {
        id,
        version: view.version,
        errors: view.errors.join("\n"),
    }
}
