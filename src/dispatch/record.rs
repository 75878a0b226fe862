//! Record: write an attempt's outcome against the claimed version.

use chrono::{NaiveDate, NaiveDateTime, Utc};
use sea_orm::{ActiveModelTrait, ActiveValue::Set, ColumnTrait, DbErr, EntityTrait, QueryFilter};

use super::{AttemptResult, append_error, claim::Claimed};
use crate::{
    Status,
    alert::FailureEvent,
    db,
    def::{Confirm, DefRef},
    entity::{notify_msg, notify_msg_history},
    handler::Outcome,
    notifier::Inner,
};

/// `next_call_time` of a notice that waits for confirmation forever.
pub(crate) fn far_future() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(9999, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or(NaiveDateTime::MAX)
}

/// Records `outcome` for the attempt held in `claimed`.
pub(crate) async fn record(
    inner: &Inner,
    def: &DefRef,
    claimed: Claimed,
    outcome: Outcome,
) -> AttemptResult {
    let result = match outcome {
        Outcome::Success { note } => succeed(inner, def, claimed, note).await,
        Outcome::Retry { reason } => fail(inner, def, claimed, reason, false).await,
        Outcome::Permanent { reason } => fail(inner, def, claimed, reason, true).await,
    };
    result.unwrap_or_else(|e| AttemptResult::Error {
        error: e.to_string(),
    })
}

async fn succeed(
    inner: &Inner,
    def: &DefRef,
    claimed: Claimed,
    note: Option<String>,
) -> Result<AttemptResult, DbErr> {
    let now = Utc::now().naive_utc();
    let claimed_version = claimed.row.version;
    let mut row = claimed.row;
    if let Some(note) = note {
        if !row.description.is_empty() {
            row.description.push('\n');
        }
        row.description.push_str(&note);
    }
    row.version = claimed_version.wrapping_add(1);
    let deadline = match def.confirm {
        Confirm::NotNeeded => {
            row.status = Status::Succeeded;
            return Ok(match move_to_history(inner, row, claimed_version).await? {
                true => AttemptResult::Succeeded,
                false => AttemptResult::LostClaim,
            });
        }
        Confirm::Within(delay) => now + delay,
        Confirm::Forever => far_future(),
    };
    row.status = Status::AwaitingConfirm;
    row.next_call_time = deadline;
    Ok(match update(inner, row, claimed_version).await? {
        true => AttemptResult::AwaitingConfirm,
        false => AttemptResult::LostClaim,
    })
}

async fn fail(
    inner: &Inner,
    def: &DefRef,
    claimed: Claimed,
    reason: String,
    permanent: bool,
) -> Result<AttemptResult, DbErr> {
    let now = Utc::now().naive_utc();
    let attempt = claimed.attempt;
    let claimed_version = claimed.row.version;
    let failures = u32::try_from(claimed.row.retry_times)
        .unwrap_or(0)
        .saturating_add(1);
    let is_final = permanent || def.retry.exhausted(failures);
    let mut row = claimed.row;
    row.errors = append_error(&row.errors, now, attempt, &reason);
    row.retry_times = i32::try_from(failures).unwrap_or(i32::MAX);
    row.version = claimed_version.wrapping_add(1);
    let (recorded, result) = if is_final {
        row.status = Status::FinalFailure;
        let moved = move_to_history(inner, row.clone(), claimed_version).await?;
        let result = AttemptResult::FinalFailure {
            attempt,
            reason: reason.clone(),
        };
        (moved, result)
    } else {
        row.status = Status::Failed;
        row.next_call_time = now + def.retry.delay(failures);
        let at = row.next_call_time;
        let updated = update(inner, row.clone(), claimed_version).await?;
        let result = AttemptResult::WillRetry {
            attempt,
            at,
            reason: reason.clone(),
        };
        (updated, result)
    };
    if !recorded {
        return Ok(AttemptResult::LostClaim);
    }
    if def.alert.fires(failures, is_final) {
        let event = FailureEvent {
            notice_id: row.id,
            def: def.clone(),
            attempt,
            failures,
            is_final,
            reason,
            errors: row.errors,
            param: row.param,
        };
        inner.alerts.alert(event).await;
    }
    Ok(result)
}

/// A row whose definition cannot be used: claim it and park it.
pub(crate) async fn park(inner: &Inner, row: notify_msg::Model, why: &str) -> AttemptResult {
    match super::claim::claim(inner, &row).await {
        Ok(Some(claimed)) => park_claimed(inner, claimed, why).await,
        Ok(None) => AttemptResult::LostClaim,
        Err(e) => AttemptResult::Error {
            error: e.to_string(),
        },
    }
}

/// Notes in `errors` why a claimed row cannot be attempted (without counting
/// a failure) and leaves it due again when its lease ends, so that it is
/// neither sent nor lost until its definition is fixed.
pub(crate) async fn park_claimed(inner: &Inner, claimed: Claimed, why: &str) -> AttemptResult {
    let now = Utc::now().naive_utc();
    let version = claimed.row.version;
    let mut row = claimed.row;
    row.errors = append_error(&row.errors, now, claimed.attempt, why);
    row.version = version.wrapping_add(1);
    match update(inner, row, version).await {
        Ok(true) => AttemptResult::Skipped {
            reason: why.to_string(),
        },
        Ok(false) => AttemptResult::LostClaim,
        Err(e) => AttemptResult::Error {
            error: e.to_string(),
        },
    }
}

/// Writes `row` over the claimed row; `false` when the claim was lost.
async fn update(
    inner: &Inner,
    row: notify_msg::Model,
    claimed_version: i32,
) -> Result<bool, DbErr> {
    let id = row.id;
    let mut active = notify_msg::ActiveModel::from(row).reset_all();
    active.id = sea_orm::ActiveValue::NotSet;
    let done = notify_msg::Entity::update_many()
        .set(active)
        .filter(notify_msg::Column::Id.eq(id))
        .filter(notify_msg::Column::Version.eq(claimed_version))
        .exec(&inner.db)
        .await?;
    Ok(done.rows_affected == 1)
}

/// Deletes the claimed row and inserts its final form into history, in one
/// transaction; `false` (and nothing written) when the claim was lost.
async fn move_to_history(
    inner: &Inner,
    row: notify_msg::Model,
    claimed_version: i32,
) -> Result<bool, DbErr> {
    db::on_conflict_retry(|| move_once(inner, row.clone(), claimed_version)).await
}

async fn move_once(
    inner: &Inner,
    row: notify_msg::Model,
    claimed_version: i32,
) -> Result<bool, DbErr> {
    let txn = db::begin(&inner.db).await?;
    let deleted = notify_msg::Entity::delete_many()
        .filter(notify_msg::Column::Id.eq(row.id))
        .filter(notify_msg::Column::Version.eq(claimed_version))
        .exec(&txn)
        .await?;
    if deleted.rows_affected != 1 {
        txn.rollback().await?;
        return Ok(false);
    }
    notify_msg_history::Entity::insert(history_row(row))
        .exec_without_returning(&txn)
        .await?;
    txn.commit().await?;
    Ok(true)
}

fn history_row(row: notify_msg::Model) -> notify_msg_history::ActiveModel {
    notify_msg_history::ActiveModel {
        id: Set(row.id),
        def_id: Set(row.def_id),
        param: Set(row.param),
        description: Set(row.description),
        errors: Set(row.errors),
        status: Set(row.status),
        retry_times: Set(row.retry_times),
        last_call_time: Set(row.last_call_time),
        next_call_time: Set(row.next_call_time),
        create_time: Set(row.create_time),
        version: Set(row.version),
        load_balance_num: Set(row.load_balance_num),
        idempotency_key: Set(row.idempotency_key),
        target_override: Set(row.target_override),
    }
}
