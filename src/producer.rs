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
//! before any SQL runs, and on PostgreSQL the insert runs inside a savepoint.
//! Should the database nevertheless abort the transaction (a failed
//! statement on PostgreSQL, a deadlock on MySQL), [`NoticeTx::commit`]
//! returns [`Error::TransactionAborted`], never `Ok`.

use std::{
    ops::Deref,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
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
    state::insert::{self, NewRow},
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

    /// Key receivers use to de-duplicate (at most 255 characters, no NUL).
    /// Default: the notice id.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
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
            None => self.inner.balancer.pick(notice.load_balance_key.as_deref()),
        };
        let target_override = match &notice.target_override {
            Some(over) => {
                merged_target(&def, over).map_err(|p| invalid(format!("target override: {p}")))?;
                Some(over.to_string())
            }
            None => None,
        };
        let row = NewRow {
            def_id: def.id,
            param,
            description: notice.description,
            load_balance_num,
            idempotency_key: notice.idempotency_key,
            target_override,
            due: self.first_due(),
        };
        insert::check(&row, self.inner.config.max_param_bytes).map_err(invalid)?;
        let id = insert::insert(conn, &row).await.map_err(|e| {
            if e.aborted {
                Error::TransactionAborted(e.error.to_string())
            } else {
                Error::Db(e.error)
            }
        })?;
        Ok(PendingNotice::new(id, row, def))
    }

    /// Attempts committed notices now: in the background, or awaited when
    /// `wait` is set (then each notice's outcome is returned). Notices that
    /// find no background slot ([`Config::max_background_attempts`](crate::Config))
    /// or come during shutdown are due at once for a sweeper.
    pub async fn dispatch(&self, pending: Vec<PendingNotice>, wait: bool) -> Vec<AttemptReport> {
        if pending.is_empty() {
            return Vec::new();
        }
        if pending.iter().any(|p| !p.reserved()) {
            self.wake_workers();
        }
        if wait {
            return background::wait_for(self, pending).await;
        }
        background::after_commit(self, pending);
        Vec::new()
    }

    /// Begins a transaction on the notifier's pool, wrapped for adding
    /// notices (the database's default isolation; on SQLite `BEGIN
    /// IMMEDIATE`: it takes the write lock up front).
    pub async fn begin(&self) -> Result<NoticeTx> {
        Ok(self.wrap(crate::db::begin_business(&self.inner.store.db).await?))
    }

    /// Wraps a transaction the caller already began.
    pub fn wrap(&self, txn: DatabaseTransaction) -> NoticeTx {
        NoticeTx {
            txn,
            notifier: self.clone(),
            pending: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
            aborted: Mutex::new(None),
        }
    }
}

/// A business transaction that can carry notices.
///
/// Use it wherever sea-orm expects a connection (`model.insert(&tx)`); it also
/// derefs to the [`DatabaseTransaction`] for everything else (statements run
/// through the deref are not watched for failures: prefer `&tx`).
pub struct NoticeTx {
    txn: DatabaseTransaction,
    notifier: Notifier,
    pending: Mutex<Vec<PendingNotice>>,
    /// A statement through this wrapper failed: check the transaction is
    /// still alive before committing.
    failed: AtomicBool,
    /// Known to be aborted, and why.
    aborted: Mutex<Option<String>>,
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
        match self.notifier.add(&self.txn, notice).await {
            Ok(pending) => {
                let id = pending.id();
                lock(&self.pending).push(pending);
                Ok(id)
            }
            Err(e) => {
                match &e {
                    Error::TransactionAborted(why) => *lock(&self.aborted) = Some(why.clone()),
                    Error::Db(_) => self.failed.store(true, Ordering::Relaxed),
                    _ => {}
                }
                Err(e)
            }
        }
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
        Ok(self.txn.rollback().await?)
    }

    /// The wrapped transaction.
    pub fn transaction(&self) -> &DatabaseTransaction {
        &self.txn
    }

    async fn commit_inner(self) -> Result<(Notifier, Vec<PendingNotice>)> {
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
        let pending = self
            .pending
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.txn.commit().await?;
        Ok((self.notifier, pending))
    }

    /// After a failed statement: whether the database has aborted the
    /// transaction (PostgreSQL refuses any further statement; MariaDB
    /// reports no transaction after rolling one back on a deadlock).
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

    fn watch<T>(&self, result: std::result::Result<T, DbErr>) -> std::result::Result<T, DbErr> {
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Deref for NoticeTx {
    type Target = DatabaseTransaction;

    fn deref(&self) -> &DatabaseTransaction {
        &self.txn
    }
}

#[async_trait]
impl ConnectionTrait for NoticeTx {
    fn get_database_backend(&self) -> DbBackend {
        self.txn.get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> std::result::Result<ExecResult, DbErr> {
        self.watch(self.txn.execute_raw(stmt).await)
    }

    async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        self.watch(self.txn.execute_unprepared(sql).await)
    }

    async fn query_one_raw(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        self.watch(self.txn.query_one_raw(stmt).await)
    }

    async fn query_all_raw(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        self.watch(self.txn.query_all_raw(stmt).await)
    }

    fn support_returning(&self) -> bool {
        self.txn.support_returning()
    }
}
