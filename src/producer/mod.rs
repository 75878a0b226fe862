//! Producer: adding notices inside the caller's own transaction, and the
//! after-commit attempt.
//!
//! [`NoticeTx`] wraps a sea-orm [`DatabaseTransaction`]: business code runs on
//! it unchanged (it is a [`ConnectionTrait`], and its
//! [`begin`](sea_orm::TransactionTrait::begin) opens a nested transaction,
//! a savepoint, as sea-orm's own do), notices are added with
//! [`NoticeTx::add_notice`], and [`NoticeTx::commit`] attempts them once the
//! commit succeeded. Dropping or rolling back the wrapper stores and sends
//! nothing. Applications that manage their own transaction can use the two
//! halves directly: [`Notifier::add`] inside it, [`Notifier::dispatch`] after.
//!
//! **Only what committed is sent.** A notice added inside a savepoint or a
//! nested transaction that is rolled back is neither stored nor sent. Once
//! a transaction may hold a savepoint (a nested transaction, or a statement
//! of the caller's that names one), every notice of it is written as it is
//! added and claimed by its after-commit attempt before anything is sent:
//! the claim finds the row only if it committed. A transaction that never
//! opens a savepoint keeps the cheaper path below.
//!
//! Bad input never costs the caller its transaction: every field is checked
//! before any SQL runs. An add into a transaction the database has aborted
//! already (a failed statement on PostgreSQL, a deadlock on MySQL, an
//! error that rolled SQLite's back) fails with [`Error::TransactionAborted`]
//! and writes nothing; so does [`NoticeTx::commit`], which never returns
//! `Ok` for such a transaction.
//!
//! How the rows travel depends on the backend. On PostgreSQL a [`NoticeTx`]
//! from [`Notifier::begin`] buffers its notices and sends them with the
//! `COMMIT`, in the same round trip (`pg`): a notice costs the business
//! transaction no round trip, several notices are one multi-row insert, and a
//! failing insert fails the commit with nothing committed. Elsewhere (and for
//! [`Notifier::wrap`] and [`Notifier::add`]) each notice is inserted when it
//! is added, on PostgreSQL inside a savepoint so that a database error rolls
//! back only the notice. A notice with an idempotency key is written when
//! it is added on every backend (`crate::state::keyed`), so that the key's
//! unique index can answer at once with the notice that already holds it.

mod control;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(not(feature = "postgres"))]
#[path = "pg_off.rs"]
mod pg;
mod tx;

use std::any::TypeId;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, TransactionTrait,
};
use serde::Serialize;
use serde_json::Value;

pub use tx::NoticeTx;

use crate::{
    attempt::{AttemptReport, PendingNotice, background, merged_target},
    error::{Error, Result},
    notifier::Notifier,
    state::{
        add,
        clock::{Due, Later},
        insert::{self, InsertError, NewRow, Within},
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
    later: Option<When>,
    /// Who adds it: a producer, unless the library adds it through this
    /// path itself ([`NewNotice::written_by`]).
    origin: crate::status::Origin,
}

/// A delayed notice's time, as the producer gave it.
#[derive(Debug, Clone, Copy)]
enum When {
    At(chrono::DateTime<chrono::Utc>),
    By(std::time::Duration),
}

/// The longest a notice may be delayed ([`NewNotice::not_before`],
/// [`NewNotice::delay`]): 10 years of 366 days. A later time, or a
/// `not_before` as far in the past, is refused ([`Error::InvalidNotice`])
/// as a mistake.
pub const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(10 * 366 * 86_400);

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
            later: None,
            origin: crate::status::Origin::Producer,
        }
    }

    /// The library's own notice (an alert it adds as a producer would).
    pub(crate) fn written_by(mut self, origin: crate::status::Origin) -> Self {
        self.origin = origin;
        self
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

    /// Delays the notice: no attempt starts before `time` (UTC), neither
    /// after its commit nor in a sweep; workers sleeping until their next
    /// poll wake for it on time. Until then it is *scheduled*: listed,
    /// shown and cancelled like any notice, and a requeue sends it now (it
    /// clears the time). The database's clock decides when `time` has
    /// come: a time already past is due at once for a sweeper (workers are
    /// woken at commit), not attempted after commit. With an
    /// [`ordering_key`](Self::ordering_key), it
    /// holds the younger notices of its key until it is sent. At most
    /// [`MAX_DELAY`] ahead. Overrides an earlier [`delay`](Self::delay).
    /// Default: due at once.
    pub fn not_before(mut self, time: chrono::DateTime<chrono::Utc>) -> Self {
        self.later = Some(When::At(time));
        self
    }

    /// Delays the notice by `delay` from its insert, by the database's
    /// clock: as [`not_before`](Self::not_before), at the insert's time
    /// plus `delay`. Zero adds a notice due at once. At most
    /// [`MAX_DELAY`]. Overrides an earlier `not_before`. Default: none.
    pub fn delay(mut self, delay: std::time::Duration) -> Self {
        self.later = Some(When::By(delay));
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
    /// (a savepoint on PostgreSQL). But an insert abandoned past its bound
    /// ([`Config::db_timeout`](crate::Config::db_timeout): a lost
    /// connection, [`Error::Db`]) may still land: roll the transaction back
    /// then, or its commit may store the notice. The after-commit attempt claims the
    /// notice first, so a notice whose transaction (or an enclosing one, or
    /// a savepoint around the add) rolled back is never sent.
    ///
    /// In a transaction the database has aborted already, the add fails
    /// with [`Error::TransactionAborted`] and writes nothing: PostgreSQL
    /// refuses the statement, and on MySQL/MariaDB the insert checks that a
    /// transaction is still open (a deadlock victim is rolled back by the
    /// server and left in autocommit, where an insert would commit on its
    /// own). On SQLite only a failure this library saw is known (through a
    /// [`NoticeTx`]): give `add` a transaction whose statements all
    /// succeeded. `conn` may also be a plain [`DatabaseConnection`]: the
    /// notice then commits at once.
    pub async fn add<C>(&self, conn: &C, notice: NewNotice) -> Result<PendingNotice>
    where
        C: ConnectionTrait + TransactionTrait + 'static,
    {
        let within = if TypeId::of::<C>() == TypeId::of::<DatabaseConnection>()
            || !self.checks_transaction(conn).await
        {
            Within::Any
        } else {
            Within::Transaction
        };
        let bound = self.config().db_timeout;
        let prepared = tokio::time::timeout(bound, self.prepare(conn, notice))
            .await
            .unwrap_or_else(|_| Err(Error::Db(crate::db::timed_out(bound))));
        let (row, def) = prepared.map_err(|e| match e {
            // The definition's lookup, through the caller's transaction.
            Error::Db(e) if crate::db::in_aborted_transaction(&e) => {
                Error::TransactionAborted(e.to_string())
            }
            other => other,
        })?;
        let written = std::time::Instant::now();
        let inserted = tokio::time::timeout(bound, add::insert(conn, &row, within))
            .await
            .unwrap_or_else(|_| {
                // Abandoned mid-statement: whether it ran is unknown.
                Err(InsertError::Db {
                    error: crate::db::timed_out(bound),
                    aborted: false,
                })
            })
            .map_err(insert_error)?;
        Ok(pending(inserted, row, def, written))
    }

    /// Whether an insert through `conn` can check that a transaction is
    /// open ([`Within::Transaction`]): everywhere but on MySQL proper, which
    /// lacks MariaDB's `@@in_transaction` (asked once, through `conn`).
    async fn checks_transaction<C: ConnectionTrait>(&self, conn: &C) -> bool {
        if conn.get_database_backend() != DbBackend::MySql {
            return true;
        }
        if let Some(known) = self.producing.mariadb.get() {
            return *known;
        }
        let bound = self.config().db_timeout;
        let asked = conn.query_one_raw(sea_orm::Statement::from_string(
            DbBackend::MySql,
            "SELECT VERSION()",
        ));
        match tokio::time::timeout(bound, asked).await {
            Ok(Ok(Some(row))) => {
                let mariadb = row
                    .try_get_by_index::<String>(0)
                    .is_ok_and(|v| v.contains("MariaDB"));
                *self.producing.mariadb.get_or_init(|| mariadb)
            }
            // Unknown for now: no check (asked again next time).
            _ => false,
        }
    }

    /// Checks a notice and builds its row; no SQL but the definition lookup
    /// (through `conn`, cached).
    async fn prepare<C: ConnectionTrait>(
        &self,
        conn: &C,
        notice: NewNotice,
    ) -> Result<(NewRow, crate::def::DefRef)> {
        let def = self.defs().by_name(conn, &notice.def).await?;
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
            None => self.producing.balancer.pick(
                notice
                    .load_balance_key
                    .as_deref()
                    .or(notice.ordering_key.as_deref()),
            ),
        };
        let target_override =
            override_text(&def, notice.target_override.as_ref()).map_err(invalid)?;
        if notice.ordering_key.is_some() && def.ordering == crate::def::Ordering::Unordered {
            return Err(invalid(
                "ordering_key is set, but the definition is not ordered (ordering = \"per_key\")"
                    .into(),
            ));
        }
        let later = later_due(notice.later).map_err(invalid)?;
        let row = NewRow {
            def_id: def.id,
            param,
            description: notice.description,
            load_balance_num,
            idempotency_key: notice.idempotency_key,
            target_override,
            trace_context: crate::trace::capture(),
            due: match later {
                Some(later) => Due::Later(later),
                None => self.engine.first_due(notice.ordering_key.is_some()),
            },
            ordering_key: notice.ordering_key,
            origin: notice.origin,
        };
        insert::check(&row, self.config().max_param_bytes).map_err(invalid)?;
        let row = self.sealed(row, &def)?;
        Ok((row, def))
    }

    /// `row` as stored: its param sealed when the definition encrypts.
    fn sealed(&self, row: NewRow, def: &crate::def::DefRef) -> Result<NewRow> {
        Ok(match def.encrypt {
            false => row,
            // Sealed once checked: the size limit is the plaintext's.
            true => NewRow {
                param: self
                    .config()
                    .keys
                    .seal(&row.param, def.id)
                    .map_err(|source| Error::Crypto {
                        def: def.name.clone(),
                        source,
                    })?,
                ..row
            },
        })
    }

    /// Attempts committed notices now: in the background, or awaited when
    /// `wait` is set (then each notice's outcome is returned). Notices that
    /// find no background slot ([`Config::max_background_attempts`](crate::Config))
    /// or come during shutdown are due at once for a sweeper.
    pub async fn dispatch(&self, pending: Vec<PendingNotice>, wait: bool) -> Vec<AttemptReport> {
        if pending.is_empty() {
            return Vec::new();
        }
        if pending
            .iter()
            .any(|p| p.is_new() && !p.reserved() && p.due_in().is_none())
        {
            self.wake_workers();
        }
        // Delayed notices: this process's workers sleep until then at the
        // latest (the others learn it from the database).
        if let Some(first) = pending.iter().filter_map(PendingNotice::due_in).min() {
            self.signals().due_after(first);
        }
        if wait {
            return background::wait_for(&self.engine, pending).await;
        }
        background::after_commit(&self.engine, pending);
        Vec::new()
    }

    /// Begins a transaction on the notifier's pool, wrapped for adding
    /// notices (the database's default isolation). On PostgreSQL nothing is
    /// sent until the first statement, and notices travel with the `COMMIT`
    /// (until a savepoint is opened); on SQLite it is `BEGIN IMMEDIATE` (the
    /// write lock up front). The first call checks the database
    /// ([`check_database`](Self::check_database)): no transaction begins on
    /// a schema older than this build, or behind a pooler it cannot use.
    ///
    /// ```no_run
    /// # async fn run(notifier: solid_notify::Notifier) -> Result<(), solid_notify::Error> {
    /// use sea_orm::ConnectionTrait;
    /// let tx = notifier.begin().await?;
    /// tx.execute_unprepared("UPDATE orders SET paid = 1 WHERE id = 42").await?;
    /// tx.add_notice("order_paid", &serde_json::json!({"order": 42}), "checkout")
    ///     .await?;
    /// tx.commit().await?; // the order and its notice, or neither
    /// # Ok(()) }
    /// ```
    pub async fn begin(&self) -> Result<NoticeTx> {
        self.check_database().await?;
        let db = &self.store().db;
        #[cfg(feature = "postgres")]
        if db.get_database_backend() == DbBackend::Postgres {
            let pg = pg::PgTx::new(db.pool().get_postgres_connection_pool(), db.bound()).await?;
            return Ok(NoticeTx::top_pg(self.clone(), pg));
        }
        let txn = crate::db::begin_bounded(
            db.pool(),
            crate::db::business_options(db.pool()),
            db.bound(),
        )
        .await?;
        Ok(NoticeTx::top_sea(self.clone(), txn))
    }

    /// Wraps a transaction the caller already began (notices are inserted
    /// as they are added, in a savepoint on PostgreSQL). It may be nested in
    /// an outer transaction, so after its commit each attempt first claims
    /// its notice: a notice whose outer transaction rolled back is never
    /// sent.
    pub fn wrap(&self, txn: DatabaseTransaction) -> NoticeTx {
        NoticeTx::wrapped(self.clone(), txn)
    }
}

/// The text of a notice's target override, checked against `def`; `Err`
/// with the problem (a definition of several steps takes none).
fn override_text(
    def: &crate::def::DefRef,
    over: Option<&Value>,
) -> std::result::Result<Option<String>, String> {
    match over {
        Some(_) if def.multi_step() => Err(format!(
            "target override: `{}` has {} steps; an override applies to one target",
            def.name,
            def.steps.len()
        )),
        Some(over) => {
            merged_target(def, over).map_err(|p| format!("target override: {p}"))?;
            Ok(Some(over.to_string()))
        }
        None => Ok(None),
    }
}

/// When a delayed notice is due, as the producer gave it; `Err` with the
/// problem when that is past the limit of [`MAX_DELAY`].
fn later_due(later: Option<When>) -> std::result::Result<Option<Later>, String> {
    Ok(match later {
        None => None,
        Some(When::By(d)) if d > MAX_DELAY => {
            return Err(format!(
                "delay of {d:?} is over the limit of {MAX_DELAY:?} (MAX_DELAY)"
            ));
        }
        Some(When::By(d)) if d.is_zero() => None,
        Some(When::By(d)) => Some(Later::By(d)),
        Some(When::At(t)) => {
            let apart = (t - chrono::Utc::now()).abs().to_std().unwrap_or(MAX_DELAY);
            if apart >= MAX_DELAY {
                return Err(format!(
                    "not_before {t} is {MAX_DELAY:?} (MAX_DELAY) or more away from now"
                ));
            }
            // Even a time this host sees as past: the database's clock
            // decides, and it may be behind this host's.
            Some(Later::At(ceil_micros(t.naive_utc())))
        }
    })
}

/// `t` rounded up to a whole microsecond, the finest time every backend
/// keeps: stored, it is never earlier than asked.
fn ceil_micros(t: chrono::NaiveDateTime) -> chrono::NaiveDateTime {
    let nanos = t.and_utc().timestamp_subsec_nanos() % 1_000;
    match nanos {
        0 => t,
        n => t + chrono::Duration::nanoseconds(i64::from(1_000 - n)),
    }
}

/// An insert's failure as the producer reports it.
fn insert_error(e: InsertError) -> Error {
    match e {
        InsertError::Db {
            error,
            aborted: true,
        } => Error::TransactionAborted(error.to_string()),
        InsertError::Db { error, .. } => Error::Db(error),
        InsertError::NoTransaction => Error::TransactionAborted(
            "no transaction was open any more (the server rolled it back, or a statement \
             ended it); nothing was written"
                .into(),
        ),
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
