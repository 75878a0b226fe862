//! Producer: adding notices inside the caller's own transaction, and the
//! after-commit attempt.
//!
//! [`NoticeTx`] wraps a sea-orm [`DatabaseTransaction`]: business code runs on
//! it unchanged (it is a [`ConnectionTrait`]), notices are added with
//! [`NoticeTx::add_notice`], and [`NoticeTx::commit`] attempts them once the
//! commit succeeded. Dropping or rolling back the wrapper stores and sends
//! nothing. Applications that manage their own transaction can use the two
//! halves directly: [`Notifier::add`] inside it, [`Notifier::dispatch`] after.

use std::{ops::Deref, sync::Mutex};

use async_trait::async_trait;
use chrono::Utc;
use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait, ExecResult, QueryResult,
    Statement,
};
use serde::Serialize;
use serde_json::Value;

use crate::{
    Notifier, Status,
    def::{DefRef, Target},
    dispatch::AttemptReport,
    entity::notify_msg,
    error::{Error, Result},
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

    /// Key receivers use to de-duplicate (at most 255 characters).
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

/// A notice written in a transaction, to be attempted after its commit.
#[derive(Debug, Clone)]
pub struct PendingNotice {
    pub(crate) row: notify_msg::Model,
    pub(crate) def: DefRef,
}

impl PendingNotice {
    /// The new notice's id.
    pub fn id(&self) -> i64 {
        self.row.id
    }
}

/// Merges `over` into the definition's target (top-level keys replace).
pub(crate) fn merged_target(def: &DefRef, over: &Value) -> std::result::Result<Target, String> {
    let mut target = def.target_json.clone();
    if let (Some(base), Some(over)) = (target.as_object_mut(), over.as_object()) {
        for (k, v) in over {
            base.insert(k.clone(), v.clone());
        }
    } else {
        return Err("target override must be a JSON object".into());
    }
    Target::parse(def.target.channel(), &target)
}

impl Notifier {
    /// Writes a notice through `conn` (normally the caller's transaction)
    /// without attempting it; pass the result to [`Notifier::dispatch`] after
    /// the commit. Errors leave the transaction usable and write nothing.
    pub async fn add<C: ConnectionTrait>(
        &self,
        conn: &C,
        notice: NewNotice,
    ) -> Result<PendingNotice> {
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
            Some(n) if n < 0 => {
                return Err(invalid("load_balance_num must not be negative".into()));
            }
            Some(n) => n,
            None => self.inner.balancer.pick(notice.load_balance_key.as_deref()),
        };
        if notice
            .idempotency_key
            .as_ref()
            .is_some_and(|k| k.len() > 255)
        {
            return Err(invalid("idempotency_key is longer than 255 bytes".into()));
        }
        let target_override = match &notice.target_override {
            Some(over) => {
                merged_target(&def, over).map_err(|p| invalid(format!("target override: {p}")))?;
                Some(over.to_string())
            }
            None => None,
        };
        let now = Utc::now().naive_utc();
        let config = &self.inner.config;
        let next_call_time = if config.immediate_attempt {
            now + config.lease
        } else {
            now
        };
        let mut row = notify_msg::Model {
            id: 0,
            def_id: def.id,
            param,
            description: notice.description,
            errors: String::new(),
            status: Status::NotSent,
            retry_times: 0,
            last_call_time: None,
            next_call_time,
            create_time: now,
            version: 0,
            load_balance_num,
            idempotency_key: notice.idempotency_key,
            target_override,
        };
        let mut active: notify_msg::ActiveModel = row.clone().into();
        active.id = sea_orm::ActiveValue::NotSet;
        row.id = notify_msg::Entity::insert(active)
            .exec(conn)
            .await?
            .last_insert_id;
        Ok(PendingNotice { row, def })
    }

    /// Attempts committed notices now: in the background, or awaited when
    /// `wait` is set (then each notice's outcome is returned). Background
    /// attempts beyond [`Config::max_background_attempts`](crate::Config) are
    /// left to the sweeper.
    pub async fn dispatch(&self, pending: Vec<PendingNotice>, wait: bool) -> Vec<AttemptReport> {
        if !self.inner.config.immediate_attempt || pending.is_empty() {
            return Vec::new();
        }
        if wait {
            let attempts = pending.into_iter().map(|p| self.attempt_pending(p));
            return futures::future::join_all(attempts).await;
        }
        self.spawn_attempts(pending);
        Vec::new()
    }

    /// Starts background attempts of committed notices, as far as
    /// [`Config::max_background_attempts`](crate::Config) allows; the rest is
    /// left to the sweeper.
    pub(crate) fn spawn_attempts(&self, pending: Vec<PendingNotice>) {
        let inner = &self.inner;
        if !inner.config.immediate_attempt || inner.background_tasks.is_closed() {
            return;
        }
        for p in pending {
            let Ok(permit) = self.inner.background.clone().try_acquire_owned() else {
                tracing::debug!(
                    notice_id = p.id(),
                    "no background slot; left to the sweeper"
                );
                continue;
            };
            let stop = inner.stop_background.clone();
            let attempt = self.clone().attempt_boxed(p, permit);
            inner.background_tasks.spawn(async move {
                tokio::select! {
                    _ = attempt => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    }

    /// A boxed (hence `Send` by its type) background attempt: attempts can
    /// queue alert notices that are attempted in turn.
    fn attempt_boxed(
        self,
        p: PendingNotice,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            self.attempt_pending(p).await;
            drop(permit);
        })
    }

    async fn attempt_pending(&self, p: PendingNotice) -> AttemptReport {
        self.attempt_with_def(p.row, p.def).await
    }

    /// Begins a transaction on the notifier's pool, wrapped for adding notices
    /// (on SQLite as `BEGIN IMMEDIATE`: it takes the write lock up front).
    pub async fn begin(&self) -> Result<NoticeTx> {
        Ok(self.wrap(crate::db::begin(&self.inner.db).await?))
    }

    /// Wraps a transaction the caller already began.
    pub fn wrap(&self, txn: DatabaseTransaction) -> NoticeTx {
        NoticeTx {
            txn,
            notifier: self.clone(),
            pending: Mutex::new(Vec::new()),
        }
    }
}

/// A business transaction that can carry notices.
///
/// Use it wherever sea-orm expects a connection (`model.insert(&tx)`); it also
/// derefs to the [`DatabaseTransaction`] for everything else.
pub struct NoticeTx {
    txn: DatabaseTransaction,
    notifier: Notifier,
    pending: Mutex<Vec<PendingNotice>>,
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
        let pending = self.notifier.add(&self.txn, notice).await?;
        let id = pending.id();
        self.lock_pending().push(pending);
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
        Ok(self.txn.rollback().await?)
    }

    /// The wrapped transaction.
    pub fn transaction(&self) -> &DatabaseTransaction {
        &self.txn
    }

    async fn commit_inner(self) -> Result<(Notifier, Vec<PendingNotice>)> {
        let pending = self
            .pending
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.txn.commit().await?;
        Ok((self.notifier, pending))
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Vec<PendingNotice>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
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
        self.txn.execute_raw(stmt).await
    }

    async fn execute_unprepared(&self, sql: &str) -> std::result::Result<ExecResult, DbErr> {
        self.txn.execute_unprepared(sql).await
    }

    async fn query_one_raw(
        &self,
        stmt: Statement,
    ) -> std::result::Result<Option<QueryResult>, DbErr> {
        self.txn.query_one_raw(stmt).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        self.txn.query_all_raw(stmt).await
    }

    fn support_returning(&self) -> bool {
        self.txn.support_returning()
    }
}
