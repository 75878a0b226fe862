//! Events: the notice rows that carry a definition's operational events
//! ([`crate::event`]) to its `events_to` definition, built before the
//! transaction that writes them with the change they report.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{engine::Engine, pending::PendingNotice};
use crate::{
    alert::ALERT_DEF,
    def::{Def, DefRef},
    error::Error,
    event::Event,
    state::insert::NewRow,
    status::Origin,
};

/// Event rows to write, with the definition that receives them.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventRows {
    /// The rows, in the order the events happened.
    pub rows: Vec<NewRow>,
    /// Their definition (the same for all of them).
    pub to: Option<DefRef>,
}

impl EventRows {
    /// The pending notices of the rows written with ids `ids`, to attempt
    /// after their commit (waking the workers).
    pub fn pending(&self, engine: &Arc<Engine>, ids: &[i64]) -> Vec<PendingNotice> {
        let Some(to) = &self.to else {
            return Vec::new();
        };
        if ids.is_empty() {
            return Vec::new();
        }
        engine.wake_workers();
        let here = engine.attempts_after_commit();
        ids.iter()
            .zip(&self.rows)
            .map(|(id, row)| PendingNotice::alert(*id, row.clone(), to.clone(), here))
            .collect()
    }
}

/// The definition that receives `source`'s events: `None` when it names
/// none, when it is the alert definition, or when the notice the events are
/// about (`description`) is itself an event (no loop). A name that is not
/// a valid definition is logged and sends nothing (`events` are counted as
/// dropped); the database is asked again while it is away, until `give_up`.
pub(crate) async fn target(
    engine: &Arc<Engine>,
    source: &Def,
    origin: Option<Origin>,
    events: usize,
    give_up: &CancellationToken,
) -> Result<Option<DefRef>, Error> {
    let Some(name) = &source.events_to else {
        return Ok(None);
    };
    if source.name == ALERT_DEF || origin.is_some_and(|o| o != Origin::Producer) {
        return Ok(None);
    }
    match crate::db::retry_db(give_up, || engine.defs.by_name(&engine.store.db, name)).await {
        Ok(to) => Ok(Some(to)),
        Err(e @ Error::Db(_)) => Err(e),
        Err(e) => {
            tracing::error!(def = %source.name, events_to = %name, error = %e, "cannot send operational events: events_to does not name a valid definition");
            crate::counters::events_dropped(events as u64);
            Ok(None)
        }
    }
}

/// Seals the param of `row`, an event notice of `to`, when `to` has
/// `encrypt = true`, like any notice of it. Without a key here it is
/// written as it is, and logged: delivered all the same, and `rekey` seals
/// it at rest.
pub(crate) fn seal_for(keys: &crate::crypto::Keys, to: &Def, row: &mut NewRow) {
    if !to.encrypt {
        return;
    }
    match keys.seal(&row.param, to.id) {
        Ok(sealed) => row.param = sealed,
        Err(e) => {
            tracing::warn!(events_to = %to.name, error = %e, "operational event written unsealed");
        }
    }
}

/// A token already cancelled: an operator's call asks the database once,
/// and fails at once while it is away, instead of waiting for it.
pub(crate) fn once() -> CancellationToken {
    let token = CancellationToken::new();
    token.cancel();
    token
}

/// The rows of `events` about `source` (see [`target`]).
pub(crate) async fn rows(
    engine: &Arc<Engine>,
    source: &Def,
    origin: Option<Origin>,
    events: &[Event],
    give_up: &CancellationToken,
) -> Result<EventRows, Error> {
    if events.is_empty() {
        return Ok(EventRows::default());
    }
    let Some(to) = target(engine, source, origin, events.len(), give_up).await? else {
        return Ok(EventRows::default());
    };
    let at = crate::state::clock::app_now();
    let link = engine.settings.dashboard_url.as_deref();
    let mut rows: Vec<NewRow> = events.iter().map(|e| e.row(&to, at, link)).collect();
    for row in &mut rows {
        seal_for(&engine.settings.keys, &to, row);
    }
    Ok(EventRows { rows, to: Some(to) })
}
