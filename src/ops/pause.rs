//! Pause and resume a definition. A paused definition's notices stay in
//! flight untouched: no worker claims them (the claim checks
//! `notify_def.paused_until` by the database's clock), no retry is charged,
//! and after-commit attempts leave them for a sweeper. They are delivered
//! after the pause ends or [`resume`](crate::Notifier::resume) is called.

use super::{Audit, find};
pub use crate::state::pause::PauseEnd;
use crate::{
    attempt::events::EventRows,
    def::Def,
    error::{Error, Result},
    event::{Event, EventKind},
    notifier::Notifier,
    state::{clock, insert::insert_all, pause},
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
    ///
    /// With `events_to`, a `definition.paused` event is written in the same
    /// transaction (`docs/events.md`).
    pub async fn pause(&self, def: &str, end: PauseEnd, audit: &Audit) -> Result<()> {
        check_end(end)?;
        let db = &self.store().db;
        let id = find::def_id(db, def).await?;
        let reason = format!("paused by {audit}");
        let until = match end {
            PauseEnd::OnResume => None,
            PauseEnd::At(at) => Some(at),
            PauseEnd::After(d) => chrono::Duration::from_std(d)
                .ok()
                .map(|d| crate::state::clock::app_now() + d),
        };
        let paused = self
            .event_rows(id, |def| {
                let mut e = Event::new(EventKind::DefinitionPaused, def, reason.clone());
                e.paused_until = until;
                e
            })
            .await?;
        let txn = crate::db::begin(db).await?;
        pause::set(&txn, id, Some(end), Some(reason)).await?;
        let ids = insert_all(&txn, &paused.rows).await?;
        txn.commit().await?;
        self.defs().invalidate();
        self.events_written(ids.len()).await;
        Ok(())
    }

    /// Ends the pause of definition `def` (a no-op if it is not paused) and
    /// wakes the workers: its due notices are claimed again at once.
    ///
    /// With `events_to`, a `definition.resumed` event is written in the
    /// same transaction when a pause held, naming who resumed it and why.
    pub async fn resume(&self, def: &str, audit: &Audit) -> Result<()> {
        let db = &self.store().db;
        let id = find::def_id(db, def).await?;
        let resumed = self
            .event_rows(id, |def| {
                Event::new(
                    EventKind::DefinitionResumed,
                    def,
                    format!("resumed by {audit}"),
                )
            })
            .await?;
        let txn = crate::db::begin(db).await?;
        let ids = match pause::lift_if_paused(&txn, id).await? {
            true => insert_all(&txn, &resumed.rows).await?,
            false => Vec::new(),
        };
        txn.commit().await?;
        self.defs().invalidate();
        self.events_written(ids.len()).await;
        self.wake_everyone().await;
        Ok(())
    }

    /// The row of the event `build` makes about definition `def_id`, when
    /// the definition sends events (an invalid one sends none: its
    /// `events_to` cannot be trusted).
    async fn event_rows(
        &self,
        def_id: i64,
        build: impl FnOnce(&Def) -> Event,
    ) -> Result<EventRows> {
        let db = &self.store().db;
        let source = match self.defs().by_id(db, def_id).await {
            // Created since the cache last looked: asked again.
            Err(Error::UnknownDefId(_)) => {
                self.defs().invalidate();
                self.defs().by_id(db, def_id).await
            }
            other => other,
        };
        let source = match source {
            Ok(source) => source,
            // The change is not made without its event.
            Err(e @ Error::Db(_)) => return Err(e),
            Err(_) => return Ok(EventRows::default()),
        };
        let event = build(&source);
        self.events_of(&source, &[event]).await
    }

    /// Counts the events written and wakes the workers, which send them (a
    /// one-shot CLI process does not attempt them itself: it may exit
    /// mid-delivery).
    pub(crate) async fn events_written(&self, n: usize) {
        crate::counters::events_written(n as u64);
        if n > 0 {
            self.wake_everyone().await;
        }
    }
}
