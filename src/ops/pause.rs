//! Pause and resume a definition. A paused definition's notices stay in
//! flight untouched: no worker claims them (the claim checks
//! `notify_def.paused_until` by the database's clock), no retry is charged,
//! and after-commit attempts leave them for a sweeper. They are delivered
//! after the pause ends or [`resume`](crate::Notifier::resume) is called.

use super::{Audit, find};
pub use crate::state::pause::PauseEnd;
use crate::{
    error::{Error, Result},
    notifier::Notifier,
    state::{clock, pause},
};

/// A pause's end must be after now and before the stored "until resumed"
/// time (year 9999); a database would otherwise store NULL (no pause) or
/// refuse it with an error that names no field.
fn check_end(end: PauseEnd) -> Result<()> {
    let now = chrono::Utc::now().naive_utc();
    let at = match end {
        PauseEnd::OnResume => return Ok(()),
        PauseEnd::At(at) => Some(at),
        PauseEnd::After(d) => chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| now.checked_add_signed(d)),
    };
    match at {
        Some(at) if at <= now => Err(Error::Config(format!("until: {at} is not in the future"))),
        Some(at) if at < clock::far_future() => Ok(()),
        _ => Err(Error::Config(
            "until: too far ahead (at most year 9998); leave it out to pause until resumed".into(),
        )),
    }
}

impl Notifier {
    /// Pauses definition `def` until `end`, recording `audit` (who and why)
    /// in `notify_def.pause_reason`. Attempts already running finish.
    pub async fn pause(&self, def: &str, end: PauseEnd, audit: &Audit) -> Result<()> {
        check_end(end)?;
        let db = &self.engine.store.db;
        let id = find::def_id(db, def).await?;
        pause::set(db, id, Some(end), Some(format!("paused by {audit}"))).await?;
        self.engine.defs.invalidate();
        Ok(())
    }

    /// Ends the pause of definition `def` (a no-op if it is not paused) and
    /// wakes the workers: its due notices are claimed again at once.
    pub async fn resume(&self, def: &str) -> Result<()> {
        let db = &self.engine.store.db;
        let id = find::def_id(db, def).await?;
        pause::set(db, id, None, None).await?;
        self.engine.defs.invalidate();
        self.wake_everyone().await;
        Ok(())
    }

    /// Wakes the workers of this process and, on PostgreSQL, of every
    /// process (`NOTIFY`); without it they would see newly due notices at
    /// their next poll.
    pub(crate) async fn wake_everyone(&self) {
        self.engine.wake_everyone().await;
    }
}
