//! Store: reading definitions from `notify_def` and syncing files into it.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ConnectionTrait, EntityTrait, IntoActiveModel, QueryOrder,
    TransactionSession, TransactionTrait,
};
use serde::Serialize;

use super::{Def, DefSpec};
use crate::{
    entity::notify_def,
    error::{DefinitionError, Result},
};

/// What [`sync`] did, by definition name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// New rows.
    pub inserted: Vec<String>,
    /// Rows whose columns changed.
    pub updated: Vec<String>,
    /// Rows already equal to their spec.
    pub unchanged: Vec<String>,
    /// Rows in the table with no spec: left alone (never deleted by a sync).
    pub only_in_table: Vec<String>,
}

/// Upserts `specs` into `notify_def` by name, in one transaction.
///
/// Every spec is validated first; if any is invalid nothing is written.
pub async fn sync<C>(db: &C, specs: &[DefSpec]) -> Result<SyncReport>
where
    C: ConnectionTrait + TransactionTrait,
{
    for spec in specs {
        spec.validate(0, "sync")?;
    }
    let txn = db.begin().await?;
    let mut existing: BTreeMap<String, notify_def::Model> = notify_def::Entity::find()
        .all(&txn)
        .await?
        .into_iter()
        .map(|row| (row.name.clone(), row))
        .collect();
    let mut report = SyncReport::default();
    let now = Utc::now().naive_utc();
    for spec in specs {
        match existing.remove(&spec.name) {
            Some(row) if DefSpec::from_row(&row).as_ref() == Ok(spec) => {
                report.unchanged.push(spec.name.clone());
            }
            Some(row) => {
                let mut active = row.into_active_model();
                write_spec(&mut active, spec);
                active.update_time = Set(now);
                active.update(&txn).await?;
                report.updated.push(spec.name.clone());
            }
            None => {
                let mut active = notify_def::ActiveModel {
                    create_time: Set(now),
                    update_time: Set(now),
                    ..Default::default()
                };
                write_spec(&mut active, spec);
                active.insert(&txn).await?;
                report.inserted.push(spec.name.clone());
            }
        }
    }
    txn.commit().await?;
    report.only_in_table = existing.into_keys().collect();
    Ok(report)
}

fn write_spec(active: &mut notify_def::ActiveModel, spec: &DefSpec) {
    // Validation guarantees every number fits its i32/i16 column.
    let int = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    active.name = Set(spec.name.clone());
    active.channel = Set(spec.channel.clone());
    active.target = Set(spec.target.to_string());
    active.retry_interval = Set(spec.retry_interval.clone());
    active.max_retry_times = Set(int(spec.max_retry_times));
    active.max_retry_interval = Set(int(spec.max_retry_interval));
    active.alert_trigger_type = Set(i16::try_from(spec.alert_trigger_type).unwrap_or(i16::MAX));
    active.alert_trigger_fail_times = Set(int(spec.alert_trigger_fail_times));
    active.email = Set(spec.email.clone());
    active.need_confirm = Set(spec.need_confirm);
    active.max_confirm_delay = Set(int(spec.max_confirm_delay));
    active.description = Set(spec.description.clone());
    active.circuit_failures = Set(int(spec.circuit_failures));
    active.circuit_window = Set(int(spec.circuit_window));
    active.circuit_cool_down = Set(int(spec.circuit_cool_down));
    active.on_error = Set(spec.on_error.clone());
    active.immediate_retries = Set(int(spec.immediate_retries));
    active.immediate_retry_delay = Set(int(spec.immediate_retry_delay));
    active.retry_jitter = Set(i16::try_from(spec.retry_jitter).unwrap_or(i16::MAX));
    active.rate_limit = Set(spec.rate_limit.clone());
    active.ordering = Set(spec.ordering.clone());
    active.stop_on_failure = Set(spec.stop_on_failure);
    active.steps = Set(match &spec.steps {
        serde_json::Value::Null => String::new(),
        steps => steps.to_string(),
    });
}

/// Validates a stored row.
pub fn validate_row(row: &notify_def::Model) -> Result<Def, DefinitionError> {
    let mut def = DefSpec::from_row(row)?.validate(row.id, &format!("notify_def#{}", row.id))?;
    def.paused_until = row.paused_until;
    Ok(def)
}

/// Every row of `notify_def`, as stored, by name.
pub async fn rows<C: ConnectionTrait>(db: &C) -> Result<Vec<notify_def::Model>> {
    Ok(notify_def::Entity::find()
        .order_by_asc(notify_def::Column::Name)
        .all(db)
        .await?)
}

/// Most definitions [`page`] answers at once: 100,000.
pub const MAX_DEFS_PAGE: u64 = 100_000;

/// A page of `notify_def` rows by name: those whose name contains
/// `search` (when given), after the name `after` (when given), at most
/// `limit`. With 100,000 definitions a page reads what it shows.
pub async fn page<C: ConnectionTrait>(
    db: &C,
    search: Option<&str>,
    after: Option<&str>,
    limit: u64,
) -> Result<Vec<notify_def::Model>> {
    use sea_orm::{
        QueryFilter, QuerySelect,
        sea_query::{Expr, ExprTrait},
    };
    if !(1..=MAX_DEFS_PAGE).contains(&limit) {
        return Err(crate::Error::Config(format!(
            "limit: {limit} is not between 1 and {MAX_DEFS_PAGE}"
        )));
    }
    let mut select = notify_def::Entity::find().order_by_asc(notify_def::Column::Name);
    if let Some(search) = search.filter(|s| !s.is_empty()) {
        select =
            select.filter(Expr::col(notify_def::Column::Name).like(crate::db::containing(search)));
    }
    if let Some(after) = after.filter(|s| !s.is_empty()) {
        select = select.filter(Expr::col(notify_def::Column::Name).gt(after));
    }
    Ok(select.limit(limit).all(db).await?)
}

/// Every row of `notify_def` by name, each with its validation result.
pub async fn list<C: ConnectionTrait>(
    db: &C,
) -> Result<Vec<(notify_def::Model, Result<Def, DefinitionError>)>> {
    Ok(rows(db)
        .await?
        .into_iter()
        .map(|row| {
            let def = validate_row(&row);
            (row, def)
        })
        .collect())
}
