//! Producer: adding notices inside the caller's own transaction, and the
//! after-commit attempt.
//!
//! [`NoticeTx`] wraps a sea-orm [`DatabaseTransaction`]: business code runs on
//! it unchanged (it is a [`ConnectionTrait`]), notices are added with
//! [`NoticeTx::add_notice`], and [`NoticeTx::commit`] attempts them once the
//! commit succeeded. Dropping or rolling back the wrapper stores and sends
//! nothing. Applications that manage their own transaction can use the two
//! halves directly: [`Notifier::add`] inside it, [`Notifier::dispatch`] after.
//!
//! Bad input never costs the caller its transaction: every field is checked
//! before any SQL runs. Should the database nevertheless abort the
//! transaction (a failed statement on PostgreSQL, a deadlock on MySQL),
//! [`NoticeTx::commit`] returns [`Error::TransactionAborted`], never `Ok`.
//!
//! How the rows travel depends on the backend. On PostgreSQL a [`NoticeTx`]
//! from [`Notifier::begin`] buffers its notices and sends them with the
//! `COMMIT`, in the same round trip ([`pg`]): a notice costs the business
//! transaction no round trip, several notices are one multi-row insert, and a
//! failing insert fails the commit with nothing committed. Elsewhere (and for
//! [`Notifier::wrap`] and [`Notifier::add`]) each notice is inserted when it
//! is added, on PostgreSQL inside a savepoint so that a database error rolls
//! back only the notice. A notice with an idempotency key is written when
//! it is added on every backend ([`crate::state::keyed`]), so that the key's
//! unique index can answer at once with the notice that already holds it.

mod pg;

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

use async_trait::async_trait;
use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, ExecResult, QueryResult, Statement,
    TransactionTrait,
};
use serde::Serialize;
use serde_json::Value;

use crate::{
    Notifier,
    attempt::{AttemptReport, PendingNotice, background, merged_target},
    error::{Error, Result},
    state::{
        insert::{self, NewRow},
        keyed::Keyed,
    },
};

/// A notice to add: definition name, param, and optional overrides.
#[derive(Debug)]
pub struct NewNotice {
    def: String,
    param: std::result::Result<String, serde_json::Error>,
    description: String,
    load_balance_num: Option<i32>,
    load_balance_key: Option<String>,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    target_override: Option<Value>,
}

impl NewNotice {
    /// A notice of definition `def` carrying `param` as JSON.
    pub fn new(def: impl Into<String>, param: &impl Serialize) -> Self {
        NewNotice {
            def: def.into(),
            param: serde_json::to_string(param),
            description: String::new(),
            load_balance_num: None,
            load_balance_key: None,
            idempotency_key: None,
            ordering_key: None,
            target_override: None,
        }
    }

    /// The caller's context, kept with the notice. Default: empty.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Partition number for spreading work over workers (`>= 0`).
    /// Default: chosen by [`Config::load_balance`](crate::Config).
    pub fn load_balance_num(mut self, n: i32) -> Self {
        self.load_balance_num = Some(n);
        self
    }

    /// Key for the `Hash` load-balance strategy: notices with one key share
    /// one partition. Ignored by the other strategies. Default: none.
    pub fn load_balance_key(mut self, key: impl Into<String>) -> Self {
        self.load_balance_key = Some(key.into());
        self
    }

    /// Makes the add idempotent: if the definition already has a notice
    /// with this key, in flight or in history, the add returns that notice's
    /// id and writes nothing. Two transactions adding one key at once end
    /// with one notice (the second waits for the first). The key is also
    /// what receivers de-duplicate by. At most 255 characters, no NUL. A key
    /// is used once per definition until its notice is purged from history.
    /// Default: none (every add writes a notice; receivers get the id as
    /// their key).
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Orders the notice after every older notice of its definition with
    /// this key: it is not sent while one of them is unfinished (and, with
    /// `stop_on_failure`, while one failed for good and was not requeued or
    /// cancelled), nor while any other notice of the key is being sent.
    /// Older means inserted earlier: the database's time of the insert, then
    /// the id. Transactions that add notices of one key one after another
    /// (say, each holding a lock on the customer's row) have them delivered
    /// in that order; notices of one key added by concurrent transactions go
    /// one at a time in an order that is not defined. The definition must have
    /// `ordering = "per_key"` ([`Ordering`](crate::def::Ordering)); an add
    /// with a key to an unordered definition is refused
    /// ([`Error::InvalidNotice`]). At most 255 characters, no NUL, compared
    /// byte for byte. Default: none (no order).
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// A JSON object merged over the definition's target for this notice only
    /// (e.g. `{"url": "…"}` for a per-job callback URL). Default: none.
    pub fn target_override(mut self, target: Value) -> Self {
        self.target_override = Some(target);
        self
    }
}

impl Notifier {
    /// Writes a notice through `conn` (normally the caller's transaction)
    /// without attempting it; pass the result to [`Notifier::dispatch`] after
    /// the commit. A checking error writes nothing and leaves the
    /// transaction as it was; a database error rolls back only the notice
    /// (a savepoint on PostgreSQL).
    pub async fn add<C>(&self, conn: &C, notice: NewNotice) -> Result<PendingNotice>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        let (row, def) = self.prepare(conn, notice).await?;
        let written = std::time::Instant::now();
        let inserted = insert::insert(conn, &row).await.map_err(|e| {
            if e.aborted {
                Error::TransactionAborted(e.error.to_string())
            } else {
                Error::Db(e.error)
            }
        })?;
        Ok(pending(inserted, row, def, written))
    }

    /// Checks a notice and builds its row; no SQL but the definition lookup
    /// (through `conn`, cached).
    async fn prepare<C: ConnectionTrait>(
        &self,
        conn: &C,
        notice: NewNotice,
    ) -> Result<(NewRow, crate::def::DefRef)> {
        let def = self.inner.defs.by_name(conn, &notice.def).await?;
        let invalid = |problem: String| Error::InvalidNotice {
            def: notice.def.clone(),
            problem,
        };
        let param = notice.param.map_err(|source| Error::Param {
            def: notice.def.clone(),
            source,
        })?;
        let load_balance_num = match notice.load_balance_num {
            Some(n) => n,
            // One key's notices share a partition by default, so the worker
            // that finishes one is the one that claims the next.
            None => self.inner.balancer.pick(
                notice
                    .load_balance_key
                    .as_deref()
                    .or(notice.ordering_key.as_deref()),
            ),
        };
        let target_override = match &notice.target_override {
            Some(_) if def.multi_step() => {
                return Err(invalid(format!(
                    "target override: `{}` has {} steps; an override applies to one target",
                    def.name,
                    def.steps.len()
                )));
            }
            Some(over) => {
                merged_target(&def, over).map_err(|p| invalid(format!("target override: {p}")))?;
                Some(over.to_string())
            }
            None => None,
        };
        if notice.ordering_key.is_some() && def.ordering == crate::def::Ordering::Unordered {
            return Err(invalid(
                "ordering_key is set, but the definition is not ordered (ordering = \"per_key\")"
                    .into(),
            ));
        }
        let row = NewRow {
            def_id: def.id,
            param,
            description: notice.description,
            load_balance_num,
            idempotency_key: notice.idempotency_key,
            target_override,
            trace_context: crate::trace::capture(),
            due: self.first_due(notice.ordering_key.is_some()),
            ordering_key: notice.ordering_key,
        };
        insert::check(&row, self.inner.config.max_param_bytes).map_err(invalid)?;
        Ok((row, def))
    }

    /// Attempts committed notices now: in the background, or awaited when
    /// `wait` is set (then each notice's outcome is returned). Notices that
    /// find no background slot ([`Config::max_background_attempts`](crate::Config))
    /// or come during shutdown are due at once for a sweeper.
    pub async fn dispatch(&self, pending: Vec<PendingNotice>, wait: bool) -> Vec<AttemptReport> {
        if pending.is_empty() {
            return Vec::new();
        }
        if pending.iter().any(|p| p.is_new() && !p.reserved()) {
            self.wake_workers();
        }
        if wait {
            return background::wait_for(self, pending).await;
        }
        background::after_commit(self, pending);
        Vec::new()
    }

    /// Begins a transaction on the notifier's pool, wrapped for adding
    /// notices (the database's default isolation). On PostgreSQL nothing is
    /// sent until the first statement, and notices travel with the `COMMIT`;
    /// on SQLite it is `BEGIN IMMEDIATE` (the write lock up front).
    pub async fn begin(&self) -> Result<NoticeTx> {
        let db = &self.inner.store.db;
        let kind = if db.get_database_backend() == DbBackend::Postgres {
            Kind::Pg(pg::PgTx::new(db.get_postgres_connection_pool()).await?)
        } else {
            Kind::Sea(SeaTx::new(crate::db::begin_business(db).await?))
        };
        Ok(NoticeTx {
            kind,
            notifier: self.clone(),
            pending: Mutex::new(Vec::new()),
            top_level: true,
        })
    }

    /// Wraps a transaction the caller already began (notices are inserted
    /// as they are added, in a savepoint on PostgreSQL). It may be nested in
    /// an outer transaction, so after its commit each attempt first claims
    /// its notice: a notice whose outer transaction rolled back is never
    /// sent.
    pub fn wrap(&self, txn: DatabaseTransaction) -> NoticeTx {
        NoticeTx {
            kind: Kind::Sea(SeaTx::new(txn)),
            notifier: self.clone(),
            pending: Mutex::new(Vec::new()),
            top_level: false,
        }
    }
}

/// A business transaction that can carry notices.
///
/// Use it wherever sea-orm expects a connection (`model.insert(&tx)`,
/// `Entity::find().all(&tx)`): it is a [`ConnectionTrait`].
pub struct NoticeTx {
    kind: Kind,
    notifier: Notifier,
    pending: Mutex<Vec<PendingNotice>>,
    /// Begun by [`Notifier::begin`]: its commit is the database's commit.
    top_level: bool,
}

enum Kind {
    /// A sea-orm transaction; notices inserted as they are added.
    Sea(SeaTx),
    /// PostgreSQL: notices buffered and sent with the commit.
    Pg(pg::PgTx),
}

struct SeaTx {
    txn: DatabaseTransaction,
    /// A statement through the wrapper failed: check the transaction is
    /// still alive before committing.
    failed: AtomicBool,
    /// Known to be aborted, and why.
    aborted: Mutex<Option<String>>,
}

impl SeaTx {
    fn new(txn: DatabaseTransaction) -> Self {
        SeaTx {
            txn,
            failed: AtomicBool::new(false),
            aborted: Mutex::new(None),
        }
    }

    fn watch<T>(&self, result: std::result::Result<T, DbErr>) -> std::result::Result<T, DbErr> {
        if let Err(e) = &result {
            self.failed_with(e);
        }
        result
    }

    /// Notes a failed statement (and a known rollback).
    fn failed_with(&self, e: &DbErr) {
        self.failed.store(true, Ordering::Relaxed);
        if crate::db::rolled_back_transaction(e) {
            lock(&self.aborted).get_or_insert_with(|| e.to_string());
        }
    }

    /// After a failed statement: whether the database has aborted the
    /// transaction (PostgreSQL refuses any further statement; MariaDB
    /// reports no transaction after rolling one back on a deadlock; where
    /// `@@in_transaction` does not exist, MySQL 8, the deadlock itself was
    /// noted by [`watch`](Self::watch)).
    async fn probe(&self) -> Option<String> {
        let backend = self.txn.get_database_backend();
        let sql = match backend {
            DbBackend::Postgres => "SELECT 1",
            DbBackend::MySql => "SELECT @@in_transaction",
            _ => return None,
        };
        match self
            .txn
            .query_one_raw(Statement::from_string(backend, sql))
            .await
        {
            Err(e) if backend == DbBackend::Postgres => Some(e.to_string()),
            Ok(Some(row)) if backend == DbBackend::MySql => match row.try_get_by_index::<i64>(0) {
                Ok(0) => Some("the server rolled the transaction back".into()),
                _ => None,
            },
            _ => None,
        }
    }

    async fn commit(self) -> Result<()> {
        let aborted = lock(&self.aborted).take();
        let aborted = match aborted {
            Some(why) => Some(why),
            None if self.failed.load(Ordering::Relaxed) => self.probe().await,
            None => None,
        };
        if let Some(why) = aborted {
            self.txn.rollback().await.ok();
            return Err(Error::TransactionAborted(why));
        }
        self.txn.commit().await.map_err(|e| {
            if crate::db::connection_lost(&e) {
                Error::CommitOutcomeUnknown(e.to_string())
            } else {
                // A COMMIT the database refused rolled the transaction back
                // (a transaction dropped uncommitted is rolled back too).
                Error::TransactionAborted(format!("COMMIT failed: {e}"))
            }
        })
    }
}

impl NoticeTx {
    /// Adds a notice of definition `def` with `param` and a description.
    /// Returns the new notice id.
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
    pub async fn add(&self, notice: NewNotice) -> Result<i64> {
        let added = match &self.kind {
            Kind::Sea(sea) => match self.notifier.add(&sea.txn, notice).await {
                Err(e) => {
                    match &e {
                        Error::TransactionAborted(why) => *lock(&sea.aborted) = Some(why.clone()),
                        Error::Db(e) => sea.failed_with(e),
                        _ => {}
                    }
                    Err(e)
                }
                ok => ok,
            },
            Kind::Pg(pg) => {
                let (row, def) = self.notifier.prepare(self, notice).await?;
                if row.idempotency_key.is_some() || row.ordering_key.is_some() {
                    // Keyed: written now, so that the key's index decides
                    // (and an ordered notice's insert time is its add's,
                    // in the order of the adds), inside a savepoint (an
                    // error rolls back only the notice). The caller may
                    // still roll back to a savepoint of its own, so the
                    // attempt after the commit claims the row first.
                    let written = std::time::Instant::now();
                    let inserted = pg_keyed(self, &row).await?;
                    Ok(pending(inserted, row, def, written).claim_after_commit())
                } else {
                    let id = pg.next_id(&self.notifier.inner.ids).await?;
                    // Written with the commit; `written` is set again then.
                    let mut p = PendingNotice::new(id, row, def, std::time::Instant::now());
                    p.on_commit = true;
                    Ok(p)
                }
            }
        };
        let pending = added?;
        let id = pending.id();
        lock(&self.pending).push(pending);
        Ok(id)
    }

    /// Commits, then attempts the added notices in the background.
    /// Returns their ids.
    pub async fn commit(self) -> Result<Vec<i64>> {
        let (notifier, pending) = self.commit_inner().await?;
        let ids = pending.iter().map(PendingNotice::id).collect();
        notifier.dispatch(pending, false).await;
        Ok(ids)
    }

    /// Commits, then attempts the added notices and waits for each outcome.
    pub async fn commit_and_wait(self) -> Result<Vec<AttemptReport>> {
        let (notifier, pending) = self.commit_inner().await?;
        Ok(notifier.dispatch(pending, true).await)
    }

    /// Rolls back: no notice is stored or sent.
    pub async fn rollback(self) -> Result<()> {
        match self.kind {
            Kind::Sea(sea) => Ok(sea.txn.rollback().await?),
            Kind::Pg(pg) => Ok(pg.rollback().await?),
        }
    }

    async fn commit_inner(self) -> Result<(Notifier, Vec<PendingNotice>)> {
        let mut pending = self
            .pending
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let committed = match self.kind {
            Kind::Sea(sea) => sea.commit().await,
            Kind::Pg(pg) => {
                let rows: Vec<_> = pending
                    .iter()
                    .filter(|p| p.on_commit)
                    .map(|p| (p.id, p.row.clone()))
                    .collect();
                let written = std::time::Instant::now();
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
                background::not_attempted(&self.notifier, pending);
            }
            return Err(e);
        }
        if self.top_level {
            pending = pending.into_iter().map(PendingNotice::committed).collect();
        }
        Ok((self.notifier, pending))
    }
}

/// PostgreSQL, [`Notifier::begin`]: writes a keyed notice now, inside a
/// savepoint of its own.
async fn pg_keyed(tx: &NoticeTx, row: &NewRow) -> Result<Keyed> {
    tx.execute_unprepared("SAVEPOINT solid_notify_key").await?;
    match insert::write(tx, row).await {
        Ok(inserted) => {
            tx.execute_unprepared("RELEASE SAVEPOINT solid_notify_key")
                .await?;
            Ok(inserted)
        }
        Err(e) => {
            if let Err(undo) = tx
                .execute_unprepared("ROLLBACK TO SAVEPOINT solid_notify_key")
                .await
            {
                return Err(Error::TransactionAborted(format!("{e}; then {undo}")));
            }
            tx.execute_unprepared("RELEASE SAVEPOINT solid_notify_key")
                .await
                .ok();
            Err(Error::Db(e))
        }
    }
}

/// The pending notice of an add: the new row's, or the existing notice an
/// idempotent add found (nothing to attempt).
fn pending(
    inserted: Keyed,
    row: NewRow,
    def: crate::def::DefRef,
    written: std::time::Instant,
) -> PendingNotice {
    match inserted {
        Keyed::New(id) => PendingNotice::new(id, row, def, written),
        Keyed::Existing(id) => PendingNotice::existing(id, row, def),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl ConnectionTrait for NoticeTx {
    fn get_database_backend(&self) -> DbBackend {
        match &self.kind {
            Kind::Sea(sea) => sea.txn.get_database_backend(),
            Kind::Pg(_) => DbBackend::Postgres,
        }
    }

    async fn execute_raw(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        match &self.kind {
            Kind::Sea(sea) => sea.watch(sea.txn.execute_raw(stmt).await),
            Kind::Pg(pg) => pg.execute(stmt).await,
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        match &self.kind {
            Kind::Sea(sea) => sea.watch(sea.txn.execute_unprepared(sql).await),
            Kind::Pg(pg) => pg.execute_unprepared(sql).await,
        }
    }

    async fn query_one_raw(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        match &self.kind {
            Kind::Sea(sea) => sea.watch(sea.txn.query_one_raw(stmt).await),
            Kind::Pg(pg) => pg.query_one(stmt).await,
        }
    }

    async fn query_all_raw(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        match &self.kind {
            Kind::Sea(sea) => sea.watch(sea.txn.query_all_raw(stmt).await),
            Kind::Pg(pg) => pg.query_all(stmt).await,
        }
    }

    fn support_returning(&self) -> bool {
        match &self.kind {
            Kind::Sea(sea) => sea.txn.support_returning(),
            Kind::Pg(_) => true,
        }
    }
}
