//! Park check: every worker looks, once a minute, for due notices whose
//! definition is unknown, deleted or invalid, and parks them
//! ([`attempt::park`](crate::attempt::park)).

use crate::{
    attempt::park::park,
    error::Result,
    notifier::Notifier,
    report::AttemptReport,
    state::{DefSelect, DueFilter, claim},
};

impl Notifier {
    #[doc(hidden)]
    /// Parks up to `limit` due notices whose definition is unknown, deleted
    /// or invalid (rereading `notify_def` first, so a definition created a
    /// moment ago is not mistaken for a missing one). Every worker does this
    /// once a minute; returns what was done to each notice.
    pub async fn park_orphans(&self, limit: u64) -> Result<Vec<AttemptReport>> {
        let inner = &self.engine;
        inner.defs.invalidate();
        let invalid = inner.defs.invalid(&inner.store.db).await?;
        let filter = DueFilter {
            defs: DefSelect::Orphans(invalid),
            ..DueFilter::default()
        };
        // Parking sends nothing: no turn to wait for.
        let leases = claim::claim_any_turn(
            &inner.store,
            &filter,
            limit,
            super::DEFAULT_MAX_IN_FLIGHT_BYTES,
        )
        .await?;
        Ok(park(&self.engine, leases, &inner.lifecycle.stop.give_up).await)
    }
}
