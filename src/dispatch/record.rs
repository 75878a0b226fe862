//! Record: write an attempt's outcome against the claimed version.
//!
//! A terminal outcome moves the row to history (delete + insert in one
//! transaction); any other rewrites it in place. When the definition's alert
//! policy fires and it has recipients, the alert e-mail is queued as a notice
//! of [`ALERT_DEF`](crate::alert::ALERT_DEF) in that same transaction: it is
//! sent and retried like any notice, and can neither block nor undo the
//! bookkeeping it reports on.

use chrono::{NaiveDate, NaiveDateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait,
    QueryFilter,
};

use super::{AttemptResult, Delivery, append_error, claim::Claimed};
use crate::{
    Error, Notifier, PendingNotice, Status,
    alert::{self, AlertMail, FailureEvent},
    channel::amqp::BrokerConfirm,
    db,
    def::{Confirm, DefRef},
    entity::{notify_msg, notify_msg_history},
    handler::Outcome,
    notifier::Inner,
};

/// Longest time an in-process [`AlertHook`](crate::AlertHook) may take per
/// alert before it is abandoned (the alert e-mail does not depend on it).
pub const ALERT_HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `next_call_time` of a notice that waits for confirmation forever.
pub(crate) fn far_future() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(9999, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or(NaiveDateTime::MAX)
}

/// Records the outcome of the attempt held in `claimed`.
pub(crate) async fn record(
    notifier: &Notifier,
    def: &DefRef,
    claimed: Claimed,
    delivery: Delivery,
) -> AttemptResult {
    let result = match delivery.outcome {
        Outcome::Success { note } => succeed(notifier, def, claimed, note, delivery.broker).await,
        Outcome::Retry { reason } => fail(notifier, def, claimed, reason, false).await,
        Outcome::Permanent { reason } => fail(notifier, def, claimed, reason, true).await,
    };
    result.unwrap_or_else(|e| AttemptResult::Error {
        error: e.to_string(),
    })
}

async fn succeed(
    notifier: &Notifier,
    def: &DefRef,
    claimed: Claimed,
    note: Option<String>,
    broker: Option<BrokerConfirm>,
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
    // Awaiting the broker and/or the consumer: status 4 until the deadline.
    let deadline = match (def.confirm, &broker) {
        (Confirm::NotNeeded, None) => None,
        (Confirm::NotNeeded, Some(_)) => Some(now + notifier.inner.config.lease),
        (Confirm::Within(delay), _) => Some(now + delay),
        (Confirm::Forever, _) => Some(far_future()),
    };
    let (terminal, result) = match deadline {
        None => {
            row.status = Status::Succeeded;
            (true, AttemptResult::Succeeded)
        }
        Some(deadline) => {
            row.status = Status::AwaitingConfirm;
            row.next_call_time = deadline;
            (false, AttemptResult::AwaitingConfirm)
        }
    };
    let (id, version) = (row.id, row.version);
    if write(notifier, row, claimed_version, terminal, None)
        .await?
        .is_none()
    {
        return Ok(AttemptResult::LostClaim);
    }
    if let Some(broker) = broker {
        let needs_consumer = def.confirm != Confirm::NotNeeded;
        tokio::spawn(await_broker(
            notifier.clone(),
            broker,
            id,
            version,
            needs_consumer,
        ));
    }
    Ok(result)
}

/// Waits for the broker's verdict on a publish and applies it: an ack
/// finishes the notice (unless the consumer must confirm too), a nack or a
/// return fails the attempt. Boxed, hence `Send` by its type: applying a
/// verdict records an attempt, which may publish again.
fn await_broker(
    notifier: Notifier,
    broker: BrokerConfirm,
    id: i64,
    version: i32,
    needs_consumer: bool,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        let verdict = broker.verdict().await;
        if verdict.is_ok() && needs_consumer {
            return; // still waiting for the consumer's confirmation
        }
        if let Err(e) = notifier
            .apply_confirmation(id, Some(version), verdict)
            .await
        {
            tracing::warn!(notice_id = id, error = %e, "cannot record the broker's verdict");
        }
    })
}

/// Moves a row awaiting confirmation to history as succeeded; `false` when
/// its version moved on meanwhile.
pub(crate) async fn confirmed(
    notifier: &Notifier,
    mut row: notify_msg::Model,
) -> Result<bool, DbErr> {
    let version = row.version;
    row.status = Status::Succeeded;
    row.version = version.wrapping_add(1);
    Ok(write(notifier, row, version, true, None).await?.is_some())
}

async fn fail(
    notifier: &Notifier,
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
    let result = if is_final {
        row.status = Status::FinalFailure;
        AttemptResult::FinalFailure {
            attempt,
            reason: reason.clone(),
        }
    } else {
        row.status = Status::Failed;
        row.next_call_time = now + def.retry.delay(failures);
        AttemptResult::WillRetry {
            attempt,
            at: row.next_call_time,
            reason: reason.clone(),
        }
    };
    let alerts = def.alert.fires(failures, is_final);
    let event = FailureEvent {
        notice_id: row.id,
        def: def.clone(),
        attempt,
        failures,
        is_final,
        reason,
        errors: row.errors.clone(),
        param: row.param.clone(),
        next_call_time: (!is_final).then_some(row.next_call_time),
    };
    let mail = (alerts && !def.alert_emails.is_empty()).then(|| AlertMail::compose(&event));
    let Some(alert) = write(notifier, row, claimed_version, is_final, mail.as_ref()).await? else {
        return Ok(AttemptResult::LostClaim);
    };
    if let Some(pending) = alert {
        notifier.spawn_attempts(vec![pending]);
    }
    if alerts {
        let notice_id = event.notice_id;
        let hook = notifier.inner.alerts.alert(event);
        if tokio::time::timeout(ALERT_HOOK_TIMEOUT, hook)
            .await
            .is_err()
        {
            tracing::warn!(
                notice_id,
                "alert hook took longer than {ALERT_HOOK_TIMEOUT:?}; abandoned"
            );
        }
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
    match update(&inner.db, row, version).await {
        Ok(true) => AttemptResult::Skipped {
            reason: why.to_string(),
        },
        Ok(false) => AttemptResult::LostClaim,
        Err(e) => AttemptResult::Error {
            error: e.to_string(),
        },
    }
}

/// Writes `row` over the claimed row (or moves it to history when
/// `terminal`), with the alert notice when there is one, in one transaction.
/// `None` when the claim was lost (nothing written); otherwise the queued
/// alert, if any.
async fn write(
    notifier: &Notifier,
    row: notify_msg::Model,
    claimed_version: i32,
    terminal: bool,
    alert: Option<&AlertMail>,
) -> Result<Option<Option<PendingNotice>>, DbErr> {
    let inner = &notifier.inner;
    if !terminal && alert.is_none() {
        let written =
            db::on_conflict_retry(|| update(&inner.db, row.clone(), claimed_version)).await?;
        return Ok(written.then_some(None));
    }
    db::on_conflict_retry(|| async {
        let txn = db::begin(&inner.db).await?;
        let written = if terminal {
            move_to_history(&txn, row.clone(), claimed_version).await?
        } else {
            update(&txn, row.clone(), claimed_version).await?
        };
        if !written {
            txn.rollback().await?;
            return Ok(None);
        }
        let pending = match alert {
            Some(mail) => match notifier.add(&txn, mail.notice()).await {
                Ok(pending) => Some(pending),
                Err(Error::Db(e)) => return Err(e),
                Err(e) => {
                    tracing::error!(error = %e, def = alert::ALERT_DEF, "cannot queue alert e-mail");
                    None
                }
            },
            None => None,
        };
        txn.commit().await?;
        Ok(Some(pending))
    })
    .await
}

/// Writes `row` over the claimed row; `false` when the claim was lost.
async fn update<C: ConnectionTrait>(
    conn: &C,
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
        .exec(conn)
        .await?;
    Ok(done.rows_affected == 1)
}

/// Deletes the claimed row and inserts its final form into history;
/// `false` (nothing done) when the claim was lost.
async fn move_to_history<C: ConnectionTrait>(
    conn: &C,
    row: notify_msg::Model,
    claimed_version: i32,
) -> Result<bool, DbErr> {
    let deleted = notify_msg::Entity::delete_many()
        .filter(notify_msg::Column::Id.eq(row.id))
        .filter(notify_msg::Column::Version.eq(claimed_version))
        .exec(conn)
        .await?;
    if deleted.rows_affected != 1 {
        return Ok(false);
    }
    notify_msg_history::Entity::insert(history_row(row))
        .exec_without_returning(conn)
        .await?;
    Ok(true)
}

pub(crate) fn history_row(row: notify_msg::Model) -> notify_msg_history::ActiveModel {
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
