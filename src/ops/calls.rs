//! The operator's reads and maintenance as methods on [`Notifier`]: one
//! style for every operator call (the writes are in the other files of
//! [`ops`](super)).

use super::{
    Interrupted, NoticeFilter, NoticeView, Page, Place, Purge, PurgeReport, find,
    keys::{self, BlockedKeys},
    overview::{self, Overview, OverviewQuery},
    purge,
};
use crate::{
    error::Result,
    notifier::Notifier,
    state::partitions::{self, Converted, Layout, Partitioning},
};

impl Notifier {
    /// A page of notices at `place` matching `filter`, newest first.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming `limit` when it is 0
    /// or more than 100,000; database errors.
    pub async fn list(
        &self,
        place: Place,
        filter: &NoticeFilter,
        page: Page,
    ) -> Result<Vec<NoticeView>> {
        find::list(&self.store().db, place, filter, page).await
    }

    /// Every notice, in flight or in history, added with idempotency key
    /// `key` (of definition `def` only, when given), newest first.
    pub async fn find_by_key(&self, key: &str, def: Option<&str>) -> Result<Vec<NoticeView>> {
        find::by_key(&self.store().db, key, def).await
    }

    /// The ordering keys held back by a final failure or parked notice (of
    /// definition `def`, or of all), oldest head first, at most `limit`
    /// (1 to 1,000).
    pub async fn blocked_keys(&self, def: Option<&str>, limit: u64) -> Result<BlockedKeys> {
        let db = &self.store().db;
        let def_id = match def {
            Some(name) => Some(find::def_id(db, name).await?),
            None => None,
        };
        keys::blocked(db, def_id, limit).await
    }

    /// Each definition's counts, pauses and recent hours, and the workers
    /// seen (the dashboard's first page); `query` picks the definitions
    /// shown, the rest are summed.
    pub async fn overview(&self, query: &OverviewQuery) -> Result<Overview> {
        overview::overview_of(&self.store().db, query).await
    }

    /// Deletes finished notices as `purge` says (archiving them first when
    /// it names an archive). On an error, what was deleted stays deleted
    /// and the error carries the report so far.
    pub async fn purge(
        &self,
        purge: &Purge,
    ) -> std::result::Result<PurgeReport, Interrupted<PurgeReport>> {
        purge::purge(self.db(), purge).await
    }

    /// Partitions `notify_msg_history` by the time each notice finished
    /// (PostgreSQL), online: a partitioned copy is filled in batches while
    /// a trigger mirrors every change, then swapped in under a lock held
    /// for milliseconds. Run again, it resumes an interrupted conversion,
    /// or on a partitioned history makes the periods ahead. Retention then
    /// drops whole periods ([`purge`](Self::purge)).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) on MySQL/MariaDB and SQLite,
    /// or when the copy does not match the table (not swapped); database
    /// errors (a lock not taken in 30 tries of 2 s among them).
    pub async fn partition_history(&self, how: &Partitioning) -> Result<Converted> {
        partitions::convert(self.db(), how).await
    }

    /// How `notify_msg_history` is partitioned: `None` when it is one
    /// table (always on MySQL/MariaDB and SQLite).
    pub async fn history_layout(&self) -> Result<Option<Layout>> {
        partitions::layout(self.db()).await
    }

    /// Seals every param and step result with the current key of
    /// [`Config::keys`](crate::Config::keys), `batch` rows at a time (1 to
    /// 1,000); what each old key still seals is in the report.
    pub async fn rekey(&self, batch: u64) -> Result<super::rekey::RekeyReport> {
        super::rekey::rekey(self.db(), &self.config().keys, batch).await
    }
}
