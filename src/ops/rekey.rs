//! Rekey: seal every stored param and step result again with the current
//! key ([`crate::crypto`]), in batches, after a key rotation; and seal the
//! plaintext ones of definitions with `encrypt = true` (rows written before
//! it was turned on, or by a plain-SQL producer).
//!
//! Each row is written on its own, guarded by the value read: a row that
//! changed meanwhile is left for the next run. A row in flight that an
//! attempt holds (leased: claimed, or reserved for its producer's
//! after-commit attempt) is left for the next run too, untouched. The
//! version is not bumped. Rows in flight and in history are both done.
//! The report counts, per key other than the current one, the values still
//! sealed with it when the run ended (rows requeued or added meanwhile): run
//! again until there are none before dropping a key.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, EntityTrait, ExprTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
    sea_query::{Condition, Expr, LikeExpr},
};
use serde::Serialize;

use crate::{
    crypto::{CryptoError, Keys, SEALED_PREFIX, sealed_key},
    entity::{notify_def, notify_msg, notify_msg_history},
    error::{Error, Result},
};

/// Default rows read per batch: 100 (params may be up to
/// [`Config::max_param_bytes`](crate::Config::max_param_bytes) each, so a
/// batch holds at most this many of them).
pub const DEFAULT_REKEY_BATCH: u64 = 100;
/// Most rows read per batch: 1,000.
pub const MAX_REKEY_BATCH: u64 = 1_000;

/// What a rekey did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RekeyReport {
    /// The key everything is sealed with now.
    pub current: String,
    /// Values sealed again with the current key (a param and a step result
    /// count as two).
    pub resealed: u64,
    /// Plaintext values of encrypted definitions sealed for the first time.
    pub sealed: u64,
    /// Values read that were sealed with the current key already (the
    /// row's other value needed sealing; rows with nothing to do are not
    /// read).
    pub unchanged: u64,
    /// Rows that changed while being rekeyed: left for the next run.
    pub skipped: u64,
    /// Values that cannot be opened here (their key is missing, or they
    /// were altered), by notice id (the first 20).
    pub failed: Vec<(i64, String)>,
    /// How many values could not be opened in all.
    pub failed_count: u64,
    /// Values still sealed with each key other than the current one when
    /// the run ended (held by an attempt, changed, added or requeued
    /// meanwhile, or not openable): drop a key only once it has none.
    pub left: std::collections::BTreeMap<String, u64>,
}

impl RekeyReport {
    /// Counts a value of notice `id` that could not be opened (or read),
    /// keeping the first 20 reasons.
    fn not_opened(&mut self, id: i64, why: String) {
        self.failed_count += 1;
        if self.failed.len() < 20 {
            self.failed.push((id, why));
        }
    }
}

/// Rows of one table, one batch: id, definition, param, step result.
type Row = (i64, i64, String, Option<String>);

/// Seals every param and step result of `db` with the current key of
/// `keys`, reading `batch` rows at a time; see the [module docs](self).
pub async fn rekey(db: &DatabaseConnection, keys: &Keys, batch: u64) -> Result<RekeyReport> {
    let current = keys
        .current_id()
        .ok_or(Error::Crypto {
            def: "*".into(),
            source: CryptoError::NoKey,
        })?
        .to_string();
    let batch = batch.clamp(1, MAX_REKEY_BATCH);
    let encrypted: Vec<i64> = notify_def::Entity::find()
        .select_only()
        .column(notify_def::Column::Id)
        .filter(Expr::col(notify_def::Column::Encrypt).eq(true))
        .into_tuple()
        .all(db)
        .await?;
    let mut report = RekeyReport {
        current,
        ..RekeyReport::default()
    };
    for table in ["notify_msg", "notify_msg_history"] {
        let mut after = i64::MIN;
        loop {
            let rows = read(db, table, &encrypted, &report.current, after, batch).await?;
            let Some(last) = rows.last().and_then(|row| row.try_get_by_index(0).ok()) else {
                break;
            };
            after = last;
            for row in &rows {
                // Each row on its own: one whose cells cannot be read as
                // text (a plain-SQL producer's, on SQLite) is reported and
                // left as it is.
                match (
                    row.try_get_by_index(0),
                    row.try_get_by_index(1),
                    row.try_get_by_index(2),
                    row.try_get_by_index(3),
                ) {
                    (Ok(id), Ok(def_id), Ok(param), Ok(result)) => {
                        let row = (id, def_id, param, result);
                        rekey_row(db, table, keys, &encrypted, row, &mut report).await?;
                    }
                    (id, ..) => report.not_opened(
                        id.unwrap_or_default(),
                        "the row cannot be read (a cell of another type)".into(),
                    ),
                }
            }
        }
    }
    for id in keys.ids() {
        if id != report.current {
            let n = sealed_with(db, id).await?;
            report.left.insert(id.to_string(), n);
        }
    }
    Ok(report)
}

/// `LIKE` pattern of the values sealed with key `id` (a `_` in it taken
/// literally). MariaDB compares text without case: keep key ids that
/// differ only in case apart.
fn sealed_by(id: &str) -> LikeExpr {
    let start = format!("{SEALED_PREFIX}\"key\":\"{id}\",")
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    LikeExpr::new(format!("{start}%")).escape('\\')
}

/// Values (params and step results, both tables) sealed with key `id`.
async fn sealed_with(db: &DatabaseConnection, id: &str) -> Result<u64> {
    use notify_msg::Column;
    let pattern = sealed_by(id);
    let mut n = 0;
    for column in [Column::Param, Column::StepResult] {
        let with = Expr::col(column).like(pattern.clone());
        n += notify_msg::Entity::find()
            .filter(with.clone())
            .count(db)
            .await?;
        n += notify_msg_history::Entity::find()
            .filter(with)
            .count(db)
            .await?;
    }
    Ok(n)
}

/// The next `batch` rows of `table` after id `after` that may need sealing:
/// of an encrypted definition, or holding a sealed value. Each is its id,
/// definition, param and step result, read one by one by the caller.
async fn read(
    db: &DatabaseConnection,
    table: &str,
    encrypted: &[i64],
    current: &str,
    after: i64,
    batch: u64,
) -> Result<Vec<sea_orm::QueryResult>> {
    use notify_msg::Column;
    let sealed = format!("{SEALED_PREFIX}%");
    let current = sealed_by(current);
    // A value that needs sealing: sealed with another key, or plaintext of
    // an encrypted definition.
    let needs = |column: Column| {
        Condition::all()
            .add(Expr::col(column).is_not_null())
            .add(Expr::col(column).not_like(current.clone()))
            .add(
                Condition::any()
                    .add(Expr::col(column).like(sealed.as_str()))
                    .add(Expr::col(Column::DefId).is_in(encrypted.iter().copied())),
            )
    };
    let mut cond = Condition::all().add(Expr::col(Column::Id).gt(after)).add(
        Condition::any()
            .add(needs(Column::Param))
            .add(needs(Column::StepResult)),
    );
    if table == "notify_msg" {
        // Held by an attempt (or reserved for its producer's): next run.
        cond = cond.add(Expr::col(Column::Leased).eq(false));
    }
    macro_rules! page {
        ($entity:ty) => {
            db.query_all(&sea_orm::QueryTrait::into_query(
                <$entity>::find()
                    .select_only()
                    .expr(Expr::col(Column::Id))
                    .expr(Expr::col(Column::DefId))
                    .expr(Expr::col(Column::Param))
                    .expr(Expr::col(Column::StepResult))
                    .filter(cond)
                    .order_by(Expr::col(Column::Id), sea_orm::Order::Asc)
                    .limit(batch),
            ))
            .await?
        };
    }
    Ok(match table {
        "notify_msg" => page!(notify_msg::Entity),
        _ => page!(notify_msg_history::Entity),
    })
}

/// `stored` sealed with the current key: `None` when it already is, or
/// needs nothing (plaintext of a definition that is not encrypted).
fn resealed(
    keys: &Keys,
    stored: &str,
    def_id: i64,
    encrypted: bool,
    current: &str,
) -> std::result::Result<Option<(String, bool)>, CryptoError> {
    match sealed_key(stored) {
        Some(key) if key == current => Ok(None),
        Some(_) => {
            let plain = keys.open(stored, def_id)?;
            Ok(Some((keys.seal(&plain, def_id)?, false)))
        }
        None if encrypted => Ok(Some((keys.seal(stored, def_id)?, true))),
        None => Ok(None),
    }
}

async fn rekey_row(
    db: &DatabaseConnection,
    table: &str,
    keys: &Keys,
    encrypted: &[i64],
    (id, def_id, param, step_result): Row,
    report: &mut RekeyReport,
) -> Result<()> {
    let current = report.current.clone();
    let is_encrypted = encrypted.contains(&def_id);
    let mut sets: Vec<(&str, String, String)> = Vec::new();
    for (column, stored) in [("param", Some(param)), ("step_result", step_result)] {
        let Some(stored) = stored else { continue };
        match resealed(keys, &stored, def_id, is_encrypted, &current) {
            Ok(None) => report.unchanged += u64::from(sealed_key(&stored).is_some()),
            Ok(Some((new, first))) => {
                match first {
                    true => report.sealed += 1,
                    false => report.resealed += 1,
                }
                sets.push((column, stored, new));
            }
            Err(e) => report.not_opened(id, format!("{column}: {e}")),
        }
    }
    if sets.is_empty() {
        return Ok(());
    }
    let live = table == "notify_msg";
    if !crate::state::operator::reseal(db, live, id, &sets).await? {
        // It changed (or left the table) meanwhile: counted as skipped,
        // not as done.
        report.skipped += 1;
        for (_, old, _) in &sets {
            match sealed_key(old) {
                Some(_) => report.resealed -= 1,
                None => report.sealed -= 1,
            }
        }
    }
    Ok(())
}
