//! NoticeTx: a business transaction that can carry notices, and the
//! transactions nested in it.
//!
//! A [`NoticeTx`] is begun by [`Notifier::begin`] (its commit is the
//! database's), wraps a transaction of the caller's ([`Notifier::wrap`]), or
//! is nested in another one by [`begin`](TransactionTrait::begin): a
//! savepoint, whose commit releases it and hands its notices to the
//! transaction around it, and whose rollback (or drop) takes them back.
//! Every level shares what the transaction as a whole knows: whether a
//! savepoint may exist (then every notice is written as it is added and
//! claimed after the commit, see [`producer`](super)), and whether a
//! statement failed or aborted the transaction.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, ExecResult, IsolationLevel,
    QueryResult, Statement, TransactionError, TransactionOptions, TransactionSession,
    TransactionTrait,
};
use serde::Serialize;

use super::{NewNotice, control, insert_error, pending, pg::PgTx};
use crate::{
    attempt::{AttemptReport, PendingNotice, background},
    error::{Error, Result},
    notifier::Notifier,
    state::{
        add,
        insert::{NewRow, Within},
        keyed::Keyed,
    },
};

/// A business transaction that can carry notices.
///
/// Use it wherever sea-orm expects a connection (`model.insert(&tx)`,
/// `Entity::find().all(&tx)`): it is a [`ConnectionTrait`]. Its
/// [`begin`](TransactionTrait::begin) (and `transaction`) opens a nested
/// transaction, a savepoint, which is a `NoticeTx` too: notices added in it
/// are sent only if it is committed and the transaction around it commits.
pub struct NoticeTx {
    kind: Kind,
    notifier: Notifier,
    /// The notices added at this level, and those nested transactions
    /// released into it.
    pending: Arc<Mutex<Vec<PendingNotice>>>,
    shared: Arc<Shared>,
    level: Level,
    /// PostgreSQL, nested: rolls the savepoint back if dropped unfinished.
    guard: Option<SavepointGuard>,
}

enum Kind {
    /// A sea-orm transaction; notices inserted as they are added.
    Sea(DatabaseTransaction),
    /// PostgreSQL: notices buffered and sent with the commit (until a
    /// savepoint may exist). Shared by every level. (Without the `postgres`
    /// feature `PgTx` has no values.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Pg(Arc<PgTx>),
}

enum Level {
    /// Begun by [`Notifier::begin`]: its commit is the database's commit.
    Top,
    /// A transaction the caller began ([`Notifier::wrap`]), maybe nested
    /// in one of theirs.
    Wrapped,
    /// Nested in another `NoticeTx`: a savepoint.
    Nested {
        /// Where its notices go when it is committed.
        parent: Arc<Mutex<Vec<PendingNotice>>>,
        /// The savepoint's name (PostgreSQL; sea-orm names its own).
        savepoint: String,
    },
}

/// What every level of one transaction knows.
#[derive(Default)]
struct Shared {
    /// A savepoint may exist: one was opened by a nested transaction, or a
    /// statement of the caller's named one (or rolled back).
    savepoints: AtomicBool,
    /// A statement failed (not PostgreSQL's buffered kind, whose
    /// connection keeps its own account): is the transaction still alive?
    failed: AtomicBool,
    /// Known to be aborted, and why.
    aborted: Mutex<Option<String>>,
    /// Savepoints opened by nested transactions so far.
    nested: AtomicU32,
    /// Held by each of the caller's statements, and by each add and nested
    /// transaction for its whole sequence of statements (a savepoint, an
    /// insert, its release): nothing of the caller's runs in the middle of
    /// one (a statement sent there would be taken back by the add's
    /// rollback to its savepoint), nor of another add on the same
    /// transaction.
    busy: tokio::sync::Mutex<()>,
}

/// Rolls back to a nested transaction's savepoint when dropped armed.
struct SavepointGuard {
    pg: Arc<PgTx>,
    savepoint: String,
}

impl SavepointGuard {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for SavepointGuard {
    fn drop(&mut self) {
        self.pg.undo_later(std::mem::take(&mut self.savepoint));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A library error as sea-orm's traits report it.
fn db_err(e: Error) -> DbErr {
    match e {
        Error::Db(e) => e,
        other => DbErr::Custom(other.to_string()),
    }
}

impl NoticeTx {
    fn new(notifier: Notifier, kind: Kind, level: Level) -> Self {
        NoticeTx {
            kind,
            notifier,
            pending: Arc::default(),
            shared: Arc::default(),
            level,
            guard: None,
        }
    }

    /// [`Notifier::begin`] on PostgreSQL.
    #[cfg(feature = "postgres")]
    pub(super) fn top_pg(notifier: Notifier, pg: PgTx) -> Self {
        NoticeTx::new(notifier, Kind::Pg(Arc::new(pg)), Level::Top)
    }

    /// [`Notifier::begin`] elsewhere.
    pub(super) fn top_sea(notifier: Notifier, txn: DatabaseTransaction) -> Self {
        NoticeTx::new(notifier, Kind::Sea(txn), Level::Top)
    }

    /// [`Notifier::wrap`].
    pub(super) fn wrapped(notifier: Notifier, txn: DatabaseTransaction) -> Self {
        NoticeTx::new(notifier, Kind::Sea(txn), Level::Wrapped)
    }

    /// Adds a notice of definition `def` with `param` and a description.
    /// Returns the new notice id.
    ///
    /// ```no_run
    /// # async fn run(notifier: solid_notify::Notifier) -> Result<(), solid_notify::Error> {
    /// use sea_orm::TransactionTrait;
    /// let tx = notifier.begin().await?;
    /// tx.add_notice("order_paid", &serde_json::json!({"order": 42}), "checkout")
    ///     .await?;
    /// // A notice added in a nested transaction that rolls back is never sent.
    /// let gift = tx.begin().await?;
    /// gift.add_notice("gift_wrap", &serde_json::json!({"order": 42}), "checkout")
    ///     .await?;
    /// gift.rollback().await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn add_notice(
        &self,
        def: &str,
        param: &impl Serialize,
        description: &str,
    ) -> Result<i64> {
        self.add(NewNotice::new(def, param).description(description))
            .await
    }

    /// Adds a notice built with overrides. Returns the new notice id.
    ///
    /// In a transaction the database has aborted already (a failed
    /// statement on PostgreSQL, a deadlock on MySQL, an error that rolled
    /// SQLite's back) it fails with [`Error::TransactionAborted`] and writes
    /// nothing.
    pub async fn add(&self, notice: NewNotice) -> Result<i64> {
        let _busy = self.shared.busy.lock().await;
        self.alive().await?;
        let pending = match &self.kind {
            Kind::Sea(txn) => match self.notifier.add(txn, notice).await {
                Ok(pending) => pending,
                Err(e) => {
                    self.note_error(&e);
                    return Err(e);
                }
            },
            Kind::Pg(pg) => self.add_pg(pg, notice).await?,
        };
        let id = pending.id();
        lock(&self.pending).push(pending);
        Ok(id)
    }

    /// PostgreSQL: a keyed notice is written now (so that the key's index
    /// decides, and an ordered notice's insert time is its add's), and so
    /// is every notice once a savepoint may exist; the others are buffered
    /// for the commit.
    async fn add_pg(&self, pg: &Arc<PgTx>, notice: NewNotice) -> Result<PendingNotice> {
        let (row, def) = self.notifier.prepare(&Quiet(self), notice).await?;
        if row.idempotency_key.is_some() || row.ordering_key.is_some() {
            // Inside a savepoint (an error rolls back only the notice). The
            // caller may still roll back to a savepoint of its own, so the
            // attempt after the commit claims the row first.
            let written = Instant::now();
            let inserted = pg_keyed(self, &row).await?;
            return Ok(pending(inserted, row, def, written).claim_after_commit());
        }
        let id = pg.next_id(&self.notifier.producing.ids).await?;
        if self.shared.savepoints.load(Ordering::SeqCst) {
            let written = Instant::now();
            pg.write_now(&[(id, row.clone())]).await?;
            return Ok(PendingNotice::new(id, row, def, written).claim_after_commit());
        }
        // Written with the commit; `written` is set again then.
        let mut p = PendingNotice::new(id, row, def, Instant::now());
        p.on_commit = true;
        Ok(p)
    }

    /// `Err` when the transaction is known to be aborted; after a failed
    /// statement the database is asked first.
    async fn alive(&self) -> Result<()> {
        match &self.kind {
            Kind::Pg(pg) => pg.alive().await.map_err(Error::TransactionAborted),
            Kind::Sea(txn) => {
                if let Some(why) = lock(&self.shared.aborted).clone() {
                    return Err(Error::TransactionAborted(why));
                }
                let bound = self.notifier.config().db_timeout;
                if self.shared.failed.swap(false, Ordering::SeqCst)
                    && let Some(why) = probe_within(txn, bound).await
                {
                    *lock(&self.shared.aborted) = Some(why.clone());
                    return Err(Error::TransactionAborted(why));
                }
                Ok(())
            }
        }
    }

    /// Notes a failed add (sea-orm transactions).
    fn note_error(&self, e: &Error) {
        match e {
            Error::TransactionAborted(why) => {
                lock(&self.shared.aborted).get_or_insert_with(|| why.clone());
            }
            Error::Db(e) => self.failed_with(e),
            _ => {}
        }
    }

    /// Notes a failed statement (and a known rollback).
    fn failed_with(&self, e: &DbErr) {
        self.shared.failed.store(true, Ordering::SeqCst);
        if crate::db::rolled_back_transaction(e) {
            lock(&self.shared.aborted).get_or_insert_with(|| e.to_string());
        }
    }

    fn watch<T>(&self, result: std::result::Result<T, DbErr>) -> std::result::Result<T, DbErr> {
        if let Err(e) = &result {
            self.failed_with(e);
        }
        result
    }

    /// From now on a savepoint may exist. On PostgreSQL the notices
    /// buffered so far are written at once, before the statement that
    /// opens it (a rollback to it must not take them back); should that
    /// fail, the transaction can only be rolled back, as a failed write at
    /// the commit would have left it.
    async fn enter_savepoints(&self) -> Result<()> {
        if self.shared.savepoints.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let Kind::Pg(pg) = &self.kind else {
            return Ok(());
        };
        let rows: Vec<(i64, NewRow)> = lock(&self.pending)
            .iter()
            .filter(|p| p.on_commit)
            .map(|p| (p.id, p.row.clone()))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let written = Instant::now();
        if let Err(e) = pg.write_now(&rows).await {
            let why = format!("writing the notices added before a savepoint failed: {e}");
            pg.break_with(why.clone()).await;
            return Err(Error::TransactionAborted(why));
        }
        for p in lock(&self.pending).iter_mut().filter(|p| p.on_commit) {
            p.on_commit = false;
            p.written = written;
        }
        Ok(())
    }

    /// Before a statement of the caller's: one that may open a savepoint,
    /// roll work back or end the transaction ends the cheaper path
    /// ([`control`]). Should writing the buffered notices fail, the
    /// transaction can only be rolled back (its commit will say so), and
    /// the caller's statement still runs: it may be that rollback.
    async fn before(&self, sql: &str) {
        if (control::may_take_back(sql) || control::may_commit(sql))
            && let Err(e) = self.enter_savepoints().await
        {
            tracing::warn!(error = %e, "the notices buffered before a savepoint could not be written; the transaction can only be rolled back");
        }
    }

    /// Runs a statement of the caller's (`sql` is its text): one at a time
    /// with the library's own sequences of statements ([`Shared::busy`]),
    /// with [`before`](Self::before) and [`after`](Self::after) around it.
    async fn callers<T>(
        &self,
        sql: &str,
        run: impl Future<Output = std::result::Result<T, DbErr>>,
    ) -> std::result::Result<T, DbErr> {
        let _busy = self.shared.busy.lock().await;
        self.before(sql).await;
        let done = run.await;
        self.after(sql).await;
        done
    }

    /// After a statement of the caller's: one that may have rolled the
    /// whole transaction back makes the next add or commit ask the
    /// database whether a transaction is still open.
    async fn after(&self, sql: &str) {
        if !control::may_end(sql) {
            return;
        }
        let why = "a statement of the caller's may have rolled the transaction back".to_string();
        match &self.kind {
            Kind::Sea(_) => self.shared.failed.store(true, Ordering::SeqCst),
            Kind::Pg(pg) => pg.check_later(why).await,
        }
    }

    fn is_nested(&self) -> bool {
        matches!(self.level, Level::Nested { .. })
    }

    /// A transaction nested in this one: a savepoint.
    async fn nested(&self) -> Result<NoticeTx> {
        let _busy = self.shared.busy.lock().await;
        self.alive().await?;
        self.enter_savepoints().await?;
        let n = self.shared.nested.fetch_add(1, Ordering::SeqCst) + 1;
        let savepoint = format!("solid_notify_sp{n}");
        let (kind, guard) = match &self.kind {
            Kind::Sea(txn) => {
                let bound = self.notifier.config().db_timeout;
                let nested = crate::db::bounded(bound, txn.begin()).await;
                (Kind::Sea(self.watch(nested)?), None)
            }
            Kind::Pg(pg) => {
                pg.open_savepoint(&savepoint).await?;
                let guard = SavepointGuard {
                    pg: pg.clone(),
                    savepoint: savepoint.clone(),
                };
                (Kind::Pg(pg.clone()), Some(guard))
            }
        };
        Ok(NoticeTx {
            kind,
            notifier: self.notifier.clone(),
            pending: Arc::default(),
            shared: self.shared.clone(),
            level: Level::Nested {
                parent: self.pending.clone(),
                savepoint,
            },
            guard,
        })
    }

    /// Commits, then attempts the added notices in the background.
    /// Returns their ids.
    ///
    /// A nested transaction's commit releases its savepoint and hands its
    /// notices to the transaction around it, which attempts them after its
    /// own commit.
    pub async fn commit(self) -> Result<Vec<i64>> {
        if self.is_nested() {
            return self.release().await;
        }
        let (notifier, pending) = self.commit_inner().await?;
        let ids = pending.iter().map(PendingNotice::id).collect();
        notifier.dispatch(pending, false).await;
        Ok(ids)
    }

    /// Commits, then attempts the added notices and waits for each outcome.
    /// A nested transaction's is its [`commit`](Self::commit), and reports
    /// nothing.
    pub async fn commit_and_wait(self) -> Result<Vec<AttemptReport>> {
        if self.is_nested() {
            self.release().await?;
            return Ok(Vec::new());
        }
        let (notifier, pending) = self.commit_inner().await?;
        Ok(notifier.dispatch(pending, true).await)
    }

    /// Rolls back: no notice added in it is stored or sent. A nested
    /// transaction rolls back to its savepoint; the one around it goes on.
    pub async fn rollback(self) -> Result<()> {
        let NoticeTx {
            kind,
            level,
            guard,
            shared,
            ..
        } = self;
        if let Some(guard) = guard {
            guard.disarm();
        }
        let _busy = shared.busy.lock().await;
        match (kind, level) {
            (Kind::Pg(pg), Level::Nested { savepoint, .. }) => {
                pg.end_savepoint(&savepoint, true).await?;
                Ok(())
            }
            (Kind::Pg(pg), _) => Ok(pg.rollback().await?),
            (Kind::Sea(txn), _) => Ok(txn.rollback().await?),
        }
    }

    /// A nested transaction's commit: the savepoint released, its notices
    /// handed to the transaction around it.
    async fn release(self) -> Result<Vec<i64>> {
        let NoticeTx {
            kind,
            notifier,
            pending,
            shared,
            level,
            guard,
        } = self;
        let Level::Nested { parent, savepoint } = level else {
            return Ok(Vec::new());
        };
        let bound = notifier.config().db_timeout;
        let _busy = shared.busy.lock().await;
        let released = match kind {
            Kind::Sea(txn) => crate::db::bounded(bound, txn.commit()).await,
            Kind::Pg(pg) => pg.end_savepoint(&savepoint, false).await,
        };
        if let Err(e) = released {
            // Left to the transaction around it: its savepoint stays, and a
            // sea-orm transaction dropped unreleased rolls back to it.
            shared.failed.store(true, Ordering::SeqCst);
            return Err(Error::Db(e));
        }
        if let Some(guard) = guard {
            guard.disarm();
        }
        let moved = std::mem::take(&mut *lock(&pending));
        let ids = moved.iter().map(PendingNotice::id).collect();
        lock(&parent).extend(moved);
        Ok(ids)
    }

    async fn commit_inner(self) -> Result<(Notifier, Vec<PendingNotice>)> {
        let NoticeTx {
            kind,
            notifier,
            pending,
            shared,
            level,
            ..
        } = self;
        let mut pending = std::mem::take(&mut *lock(&pending));
        let bound = notifier.config().db_timeout;
        let savepoints = shared.savepoints.load(Ordering::SeqCst);
        let committed = match kind {
            Kind::Sea(txn) if savepoints && txn.get_database_backend() == DbBackend::Sqlite => {
                // Before the commit, under the write lock: a notice a
                // savepoint took back must not be claimed after it, as
                // SQLite gives its id to the next row inserted (in this
                // transaction or, once committed, in another).
                match crate::db::bounded(bound, still_written(&txn, pending)).await {
                    Ok(kept) => {
                        pending = kept;
                        commit_sea(txn, &shared, bound).await
                    }
                    Err(e) => {
                        tokio::time::timeout(bound, txn.rollback()).await.ok();
                        return Err(Error::TransactionAborted(format!(
                            "checking its notices before the commit failed: {e}"
                        )));
                    }
                }
            }
            Kind::Sea(txn) => commit_sea(txn, &shared, bound).await,
            Kind::Pg(pg) => {
                let rows: Vec<_> = pending
                    .iter()
                    .filter(|p| p.on_commit)
                    .map(|p| (p.id, p.row.clone()))
                    .collect();
                let written = Instant::now();
                for p in pending.iter_mut().filter(|p| p.on_commit) {
                    p.written = written;
                }
                pg.commit(&rows).await
            }
        };
        if let Err(e) = committed {
            if matches!(e, Error::CommitOutcomeUnknown(_)) {
                // If it did commit, its notices are due at once for any
                // worker; if not, this changes nothing.
                background::not_attempted(&notifier.engine, pending);
            }
            return Err(e);
        }
        // Where a savepoint may have taken a row back, each attempt claims
        // its row first: only a committed row can be claimed.
        let top = matches!(level, Level::Top);
        pending = pending
            .into_iter()
            .map(|p| {
                if savepoints {
                    p.claim_after_commit()
                } else {
                    p
                }
            })
            .map(|p| if top { p.committed() } else { p })
            .collect();
        Ok((notifier, pending))
    }
}

/// SQLite, inside the transaction: the pending notices whose row is still
/// there as written (same id, definition and param). Of two notices of one
/// id (a row taken back by a savepoint left its id to a later one), the one
/// whose row it is; were both alike, one.
async fn still_written(
    txn: &DatabaseTransaction,
    pending: Vec<PendingNotice>,
) -> std::result::Result<Vec<PendingNotice>, DbErr> {
    use sea_orm::{EntityTrait, ExprTrait, QueryFilter, QuerySelect, sea_query::Expr};
    let ids: Vec<i64> = pending
        .iter()
        .filter(|p| p.is_new())
        .map(PendingNotice::id)
        .collect();
    let mut rows: std::collections::HashMap<i64, (i64, String)> = Default::default();
    for chunk in ids.chunks(500) {
        let found: Vec<(i64, i64, String)> = crate::entity::notify_msg::Entity::find()
            .select_only()
            .columns([
                crate::entity::notify_msg::Column::Id,
                crate::entity::notify_msg::Column::DefId,
                crate::entity::notify_msg::Column::Param,
            ])
            .filter(Expr::col(crate::entity::notify_msg::Column::Id).is_in(chunk.iter().copied()))
            .into_tuple()
            .all(txn)
            .await?;
        rows.extend(found.into_iter().map(|(id, def, param)| (id, (def, param))));
    }
    let mut taken = std::collections::HashSet::new();
    let mut kept: Vec<PendingNotice> = pending
        .into_iter()
        .rev()
        .filter(|p| {
            if !p.is_new() {
                return true;
            }
            let matches = rows
                .get(&p.id())
                .is_some_and(|(def, param)| *def == p.row.def_id && *param == p.row.param);
            matches && taken.insert(p.id())
        })
        .collect();
    kept.reverse();
    Ok(kept)
}

/// Commits a sea-orm transaction: never `Ok` for one the database aborted;
/// [`Error::CommitOutcomeUnknown`] past `bound`.
async fn commit_sea(txn: DatabaseTransaction, shared: &Shared, bound: Duration) -> Result<()> {
    let aborted = lock(&shared.aborted).clone();
    let aborted = match aborted {
        Some(why) => Some(why),
        None if shared.failed.load(Ordering::SeqCst) => probe_within(&txn, bound).await,
        None => None,
    };
    if let Some(why) = aborted {
        tokio::time::timeout(bound, txn.rollback()).await.ok();
        return Err(Error::TransactionAborted(why));
    }
    crate::db::bounded(bound, txn.commit()).await.map_err(|e| {
        if crate::db::connection_lost(&e) {
            Error::CommitOutcomeUnknown(e.to_string())
        } else {
            // A COMMIT the database refused rolled the transaction back
            // (a transaction dropped uncommitted is rolled back too).
            Error::TransactionAborted(format!("COMMIT failed: {e}"))
        }
    })
}

/// After a failed statement (or one of the caller's that may have rolled
/// the transaction back): whether the database has aborted the
/// transaction, or none is open any more, and why. PostgreSQL takes a
/// savepoint only in an open transaction that is not aborted
/// ([`PROBE`](super::pg::PROBE)); MariaDB reports no
/// transaction after rolling one back on a deadlock (where
/// `@@in_transaction` does not exist, MySQL 8, the deadlock itself was
/// noted); SQLite, which rolls a transaction back on some errors (a full
/// disk, an I/O error), accepts a `BEGIN` only outside one (the
/// transaction so begun is rolled back at once).
async fn probe(txn: &DatabaseTransaction) -> Option<String> {
    let backend = txn.get_database_backend();
    #[cfg(feature = "postgres")]
    if backend == DbBackend::Postgres {
        return match txn.execute_unprepared(super::pg::PROBE[0]).await {
            Ok(_) => txn
                .execute_unprepared(super::pg::PROBE[1])
                .await
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(format!(
                "no open transaction takes a savepoint (it was aborted or rolled back): {e}"
            )),
        };
    }
    let sql = match backend {
        // MariaDB's variable is unsigned; MySQL 8 has none (an error: no
        // answer, as where the deadlock itself was noted).
        DbBackend::MySql => "SELECT CAST(@@in_transaction AS SIGNED)",
        _ => "BEGIN",
    };
    let asked = txn
        .query_one_raw(Statement::from_string(backend, sql))
        .await;
    let gone = || Some("no transaction is open any more: it was rolled back".to_string());
    match (backend, asked) {
        (DbBackend::MySql, Ok(Some(row))) => match row.try_get_by_index::<i64>(0) {
            Ok(0) => Some("the server rolled the transaction back".into()),
            _ => None,
        },
        (DbBackend::Sqlite, Ok(_)) => {
            txn.execute_unprepared("ROLLBACK").await.ok();
            gone()
        }
        _ => None,
    }
}

/// [`probe`], within `bound`: a check that does not answer in time counts as
/// an aborted transaction (it can then only be rolled back), never as a
/// live one.
async fn probe_within(txn: &DatabaseTransaction, bound: Duration) -> Option<String> {
    tokio::time::timeout(bound, probe(txn))
        .await
        .unwrap_or_else(|_| {
            Some(format!(
                "the check that the transaction is still open did not answer within {bound:?}"
            ))
        })
}

/// PostgreSQL, [`Notifier::begin`]: writes a keyed notice now, inside a
/// savepoint of its own.
async fn pg_keyed(tx: &NoticeTx, row: &NewRow) -> Result<Keyed> {
    let quiet = Quiet(tx);
    quiet
        .execute_unprepared("SAVEPOINT solid_notify_key")
        .await?;
    match add::write(&quiet, row, Within::Transaction).await {
        Ok(inserted) => {
            quiet
                .execute_unprepared("RELEASE SAVEPOINT solid_notify_key")
                .await?;
            Ok(inserted)
        }
        Err(e) => {
            if let Err(undo) = quiet
                .execute_unprepared("ROLLBACK TO SAVEPOINT solid_notify_key")
                .await
            {
                return Err(Error::TransactionAborted(format!(
                    "{}; then {undo}",
                    insert_error(e)
                )));
            }
            quiet
                .execute_unprepared("RELEASE SAVEPOINT solid_notify_key")
                .await
                .ok();
            Err(insert_error(e))
        }
    }
}

/// The transaction as the library itself uses it: no statement of its own
/// counts as the caller's ([`NoticeTx::before`]).
struct Quiet<'a>(&'a NoticeTx);

#[async_trait]
impl ConnectionTrait for Quiet<'_> {
    fn get_database_backend(&self) -> DbBackend {
        self.0.get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        match &self.0.kind {
            Kind::Sea(txn) => self.0.watch(txn.execute_raw(stmt).await),
            Kind::Pg(pg) => pg.execute(stmt).await,
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        match &self.0.kind {
            Kind::Sea(txn) => self.0.watch(txn.execute_unprepared(sql).await),
            Kind::Pg(pg) => pg.execute_unprepared(sql).await,
        }
    }

    async fn query_one_raw(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        match &self.0.kind {
            Kind::Sea(txn) => self.0.watch(txn.query_one_raw(stmt).await),
            Kind::Pg(pg) => pg.query_one(stmt).await,
        }
    }

    async fn query_all_raw(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        match &self.0.kind {
            Kind::Sea(txn) => self.0.watch(txn.query_all_raw(stmt).await),
            Kind::Pg(pg) => pg.query_all(stmt).await,
        }
    }

    fn support_returning(&self) -> bool {
        self.0.support_returning()
    }
}

#[async_trait]
impl ConnectionTrait for NoticeTx {
    fn get_database_backend(&self) -> DbBackend {
        match &self.kind {
            Kind::Sea(txn) => txn.get_database_backend(),
            Kind::Pg(_) => DbBackend::Postgres,
        }
    }

    async fn execute_raw(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        let sql = stmt.sql.clone();
        self.callers(&sql, Quiet(self).execute_raw(stmt)).await
    }

    async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        self.callers(sql, Quiet(self).execute_unprepared(sql)).await
    }

    async fn query_one_raw(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        let sql = stmt.sql.clone();
        self.callers(&sql, Quiet(self).query_one_raw(stmt)).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        let sql = stmt.sql.clone();
        self.callers(&sql, Quiet(self).query_all_raw(stmt)).await
    }

    fn support_returning(&self) -> bool {
        match &self.kind {
            Kind::Sea(txn) => txn.support_returning(),
            Kind::Pg(_) => true,
        }
    }
}

/// Nested transactions: savepoints, each a [`NoticeTx`]. Isolation and
/// access modes apply to a whole transaction, so the nested ones ignore
/// them.
#[async_trait]
impl TransactionTrait for NoticeTx {
    type Transaction = NoticeTx;

    async fn begin(&self) -> std::result::Result<NoticeTx, DbErr> {
        self.nested().await.map_err(db_err)
    }

    async fn begin_with_config(
        &self,
        _isolation_level: Option<IsolationLevel>,
        _access_mode: Option<AccessMode>,
    ) -> std::result::Result<NoticeTx, DbErr> {
        self.nested().await.map_err(db_err)
    }

    async fn begin_with_options(
        &self,
        _options: TransactionOptions,
    ) -> std::result::Result<NoticeTx, DbErr> {
        self.nested().await.map_err(db_err)
    }

    async fn transaction<F, T, E>(&self, callback: F) -> std::result::Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c NoticeTx,
            )
                -> Pin<Box<dyn Future<Output = std::result::Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        let nested = self.begin().await.map_err(TransactionError::Connection)?;
        match callback(&nested).await {
            Ok(value) => {
                TransactionSession::commit(nested)
                    .await
                    .map_err(TransactionError::Connection)?;
                Ok(value)
            }
            Err(e) => {
                TransactionSession::rollback(nested)
                    .await
                    .map_err(TransactionError::Connection)?;
                Err(TransactionError::Transaction(e))
            }
        }
    }

    async fn transaction_with_config<F, T, E>(
        &self,
        callback: F,
        _isolation_level: Option<IsolationLevel>,
        _access_mode: Option<AccessMode>,
    ) -> std::result::Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c NoticeTx,
            )
                -> Pin<Box<dyn Future<Output = std::result::Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        self.transaction(callback).await
    }
}

#[async_trait]
impl TransactionSession for NoticeTx {
    /// [`NoticeTx::commit`]: a nested transaction releases its savepoint.
    async fn commit(self) -> std::result::Result<(), DbErr> {
        NoticeTx::commit(self).await.map(drop).map_err(db_err)
    }

    /// [`NoticeTx::rollback`].
    async fn rollback(self) -> std::result::Result<(), DbErr> {
        NoticeTx::rollback(self).await.map_err(db_err)
    }
}
