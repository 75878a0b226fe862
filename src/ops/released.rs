//! Released: the `key.released` events ([`crate::event`]) an operator's
//! requeue or cancel writes, in its own transaction, for each ordering key
//! it leaves with no final failure or parked notice in history.

use std::collections::HashMap;

use chrono::NaiveDateTime;

use crate::{
    attempt::events,
    def::{DefRef, Ordering},
    error::Result,
    event::{Event, EventKind},
    notifier::Notifier,
    state::insert::NewRow,
};

/// The definitions whose keys can be released and that send events, with
/// where their events go.
pub(crate) struct KeyEvents {
    by_def: HashMap<i64, (DefRef, DefRef)>,
    reason: String,
    at: NaiveDateTime,
    link: Option<String>,
    keys: crate::crypto::Keys,
}

impl KeyEvents {
    /// The `key.released` row of `key` of definition `def_id`, if that
    /// definition sends events.
    pub(crate) fn row(&self, def_id: i64, key: &str) -> Option<NewRow> {
        let (source, to) = self.by_def.get(&def_id)?;
        let mut event = Event::new(EventKind::KeyReleased, source, self.reason.clone());
        event.key = Some(key.to_string());
        let mut row = event.row(to, self.at, self.link.as_deref());
        events::seal_for(&self.keys, to, &mut row);
        Some(row)
    }
}

impl Notifier {
    /// The key events of an operator's change described by `reason`
    /// (`requeued by …`); `None` when no ordered definition with
    /// `stop_on_failure` sends events (no extra query is made then).
    pub(crate) async fn key_events(&self, reason: &str) -> Result<Option<KeyEvents>> {
        let mut by_def = HashMap::new();
        for def in self.defs().all(&self.store().db).await? {
            if !matches!(
                def.ordering,
                Ordering::PerKey {
                    stop_on_failure: true
                }
            ) {
                continue;
            }
            if let Some(to) = self.events_target(&def).await? {
                by_def.insert(def.id, (def, to));
            }
        }
        Ok((!by_def.is_empty()).then(|| KeyEvents {
            by_def,
            reason: reason.to_string(),
            at: crate::state::clock::app_now(),
            link: self.config().dashboard_url.clone(),
            keys: self.config().keys.clone(),
        }))
    }
}
