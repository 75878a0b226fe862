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
/// Every spec is validated first; if any is invalid nothing is written. An
/// `events_to` must name a definition of `specs` or one already stored.
pub async fn sync<C>(db: &C, specs: &[DefSpec]) -> Result<SyncReport>
where
    C: ConnectionTrait + TransactionTrait,
{
    for spec in specs {
        spec.check_columns("sync")?;
        spec.validate(0, "sync")?;
    }
    let txn = db.begin().await?;
    let mut existing: BTreeMap<String, notify_def::Model> = notify_def::Entity::find()
        .all(&txn)
        .await?
        .into_iter()
        .map(|row| (row.name.clone(), row))
        .collect();
    for spec in specs {
        let to = spec.events_to.as_str();
        if !to.is_empty() && !existing.contains_key(to) && !specs.iter().any(|s| s.name == to) {
            return Err(DefinitionError {
                origin: "sync".into(),
                def: spec.name.clone(),
                field: "events_to".into(),
                problem: format!("no definition is named `{to}`"),
            }
            .into());
        }
    }
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
    active.events_to = Set(spec.events_to.clone());
    active.encrypt = Set(spec.encrypt);
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

/// A `notify_def` row as read. A row with a cell that does not decode (a
/// hand-edited cell of the wrong type, which SQLite stores as given) is
/// read on its own: its id and name, the other columns at their zero
/// values, and the problem naming the column. It parks only its own
/// notices; the other rows are read as usual.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    /// The row (for an unreadable row: its id and name, the rest zero).
    pub row: notify_def::Model,
    /// Why the row could not be read, naming the column.
    pub unreadable: Option<DefinitionError>,
}

impl std::ops::Deref for StoredRow {
    type Target = notify_def::Model;

    fn deref(&self) -> &notify_def::Model {
        &self.row
    }
}

impl StoredRow {
    /// The definition, or why the row is invalid or unreadable.
    pub fn validate(&self) -> Result<Def, DefinitionError> {
        match &self.unreadable {
            Some(problem) => Err(problem.clone()),
            None => validate_row(&self.row),
        }
    }

    fn decode(result: &sea_orm::QueryResult) -> StoredRow {
        use sea_orm::{FromQueryResult, Iterable};
        let error = match notify_def::Model::from_query_result(result, "") {
            Ok(row) => {
                return StoredRow {
                    row,
                    unreadable: None,
                };
            }
            Err(e) => e.to_string(),
        };
        let id = result.try_get::<i64>("", "id").unwrap_or_default();
        let name = result
            .try_get::<String>("", "name")
            .unwrap_or_else(|_| format!("#{id}"));
        // The database's message names the column (sqlx: `column "x"`, or
        // the column's own name); the first column it names is the field.
        let field = notify_def::Column::iter()
            .map(|c| sea_orm::IdenStatic::as_str(&c))
            .find(|c| error.contains(&format!("\"{c}\"")) || error.contains(&format!("`{c}`")))
            .unwrap_or("row");
        let zero = chrono::NaiveDateTime::default();
        StoredRow {
            unreadable: Some(DefinitionError {
                origin: format!("notify_def#{id}"),
                def: name.clone(),
                field: field.to_string(),
                problem: format!(
                    "the stored value does not decode: {}",
                    error.chars().take(300).collect::<String>()
                ),
            }),
            row: notify_def::Model {
                id,
                name,
                channel: String::new(),
                target: String::new(),
                retry_interval: String::new(),
                max_retry_times: 0,
                max_retry_interval: 0,
                alert_trigger_type: 0,
                alert_trigger_fail_times: 0,
                email: String::new(),
                need_confirm: false,
                max_confirm_delay: 0,
                description: String::new(),
                create_time: zero,
                update_time: zero,
                paused_until: None,
                pause_reason: None,
                circuit_failures: 0,
                circuit_window: 0,
                circuit_cool_down: 0,
                on_error: String::new(),
                immediate_retries: 0,
                immediate_retry_delay: 0,
                retry_jitter: 0,
                rate_limit: String::new(),
                ordering: String::new(),
                stop_on_failure: false,
                steps: String::new(),
                events_to: String::new(),
                encrypt: false,
            },
        }
    }
}

/// The rows `select` finds, each decoded on its own (see [`StoredRow`]).
pub async fn read<C: ConnectionTrait>(
    db: &C,
    select: sea_orm::Select<notify_def::Entity>,
) -> Result<Vec<StoredRow>> {
    use sea_orm::QueryTrait;
    let results = db
        .query_all_raw(select.build(db.get_database_backend()))
        .await?;
    Ok(results.iter().map(StoredRow::decode).collect())
}

/// Every row of `notify_def`, as stored, by name.
pub async fn rows<C: ConnectionTrait>(db: &C) -> Result<Vec<StoredRow>> {
    read(
        db,
        notify_def::Entity::find().order_by_asc(notify_def::Column::Name),
    )
    .await
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
) -> Result<Vec<StoredRow>> {
    use sea_orm::{
        QueryFilter, QuerySelect,
        sea_query::{Expr, ExprTrait},
    };
    if !(1..=MAX_DEFS_PAGE).contains(&limit) {
        return Err(crate::error::Error::Config(format!(
            "limit: {limit} is not between 1 and {MAX_DEFS_PAGE}"
        )));
    }
    for (field, text) in [("search", search), ("after", after)] {
        if let Some(text) = text {
            crate::error::check_text(field, text)?;
        }
    }
    let mut select = notify_def::Entity::find().order_by_asc(notify_def::Column::Name);
    if let Some(search) = search.filter(|s| !s.is_empty()) {
        select =
            select.filter(Expr::col(notify_def::Column::Name).like(crate::db::containing(search)));
    }
    if let Some(after) = after.filter(|s| !s.is_empty()) {
        select = select.filter(Expr::col(notify_def::Column::Name).gt(after));
    }
    read(db, select.limit(limit)).await
}

/// Every row of `notify_def` by name, each with its validation result.
pub async fn list<C: ConnectionTrait>(
    db: &C,
) -> Result<Vec<(StoredRow, Result<Def, DefinitionError>)>> {
    Ok(rows(db)
        .await?
        .into_iter()
        .map(|row| {
            let def = row.validate();
            (row, def)
        })
        .collect())
}
