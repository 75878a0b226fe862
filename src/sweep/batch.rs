//! Batch: claim many due rows in one statement, release them, and move many
//! successes to history in one transaction.
//!
//! Claims keep the guarantee of the single-row claim: every claimed row has
//! its `version` bumped and its lease set by the claiming statement itself, and
//! rows another sender holds are skipped (`FOR UPDATE SKIP LOCKED` on
//! PostgreSQL and MariaDB; SQLite has a single writer).

use chrono::Utc;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, QueryFilter,
    QueryOrder, QuerySelect, QueryTrait, Select, SqlErr,
    sea_query::{Expr, LockBehavior, LockType, Query},
};

use crate::{
    Status, db,
    dispatch::Claimed,
    entity::{
        notify_msg::{self, Column},
        notify_msg_history,
    },
    notifier::Inner,
};

/// Which due rows a sweep may take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueFilter {
    /// Only rows of these definitions (`None`: any definition).
    pub def_ids: Option<Vec<i64>>,
    /// Only rows of these partitions (empty: any partition).
    pub partitions: Vec<i32>,
}

fn due_rows(filter: &DueFilter, limit: u64) -> Select<notify_msg::Entity> {
    let now = Utc::now().naive_utc();
    let mut due = notify_msg::Entity::find()
        .filter(Column::NextCallTime.lte(now))
        .filter(Column::Status.is_in(Status::DUE))
        .order_by_asc(Column::NextCallTime)
        .limit(limit);
    if let Some(ids) = &filter.def_ids {
        due = due.filter(Column::DefId.is_in(ids.iter().copied()));
    }
    if !filter.partitions.is_empty() {
        due = due.filter(Column::LoadBalanceNum.is_in(filter.partitions.iter().copied()));
    }
    due
}

/// Claims up to `limit` due rows, oldest first.
pub(crate) async fn claim(
    inner: &Inner,
    filter: &DueFilter,
    limit: u64,
) -> Result<Vec<Claimed>, DbErr> {
    if filter.def_ids.as_ref().is_some_and(Vec::is_empty) || limit == 0 {
        return Ok(Vec::new());
    }
    let now = Utc::now().naive_utc();
    let lease_end = now + inner.config.lease;
    let bump = |update: sea_orm::UpdateMany<notify_msg::Entity>| {
        update
            .col_expr(Column::Version, Expr::col(Column::Version).add(1))
            .col_expr(Column::LastCallTime, Expr::value(now))
            .col_expr(Column::NextCallTime, Expr::value(lease_end))
    };
    let due = due_rows(filter, limit);
    let mut rows = match inner.db.get_database_backend() {
        DbBackend::MySql => {
            // MariaDB has no UPDATE … RETURNING: lock, then bump, in one transaction.
            let txn = db::begin(&inner.db).await?;
            let mut rows = due
                .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
                .all(&txn)
                .await?;
            if !rows.is_empty() {
                bump(notify_msg::Entity::update_many())
                    .filter(Column::Id.is_in(rows.iter().map(|r| r.id)))
                    .exec(&txn)
                    .await?;
            }
            txn.commit().await?;
            for row in &mut rows {
                row.version += 1;
                row.last_call_time = Some(now);
                row.next_call_time = lease_end;
            }
            rows
        }
        backend => {
            let mut ids = due.select_only().column(Column::Id);
            if backend == DbBackend::Postgres {
                ids = ids.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
            }
            let mut rows = bump(notify_msg::Entity::update_many())
                .filter(Column::Id.in_subquery(ids.into_query()))
                .exec_with_returning(&inner.db)
                .await?;
            rows.sort_by_key(|r| r.id);
            rows
        }
    };
    Ok(rows.drain(..).map(Claimed::new).collect())
}

fn claimed_pairs(pairs: &[(i64, i32)]) -> sea_orm::sea_query::SimpleExpr {
    Expr::tuple([Expr::col(Column::Id), Expr::col(Column::Version)])
        .in_tuples(pairs.iter().copied())
}

/// Makes claimed rows due again at once (releasing their leases); rows whose
/// claim was lost meanwhile are left alone. Returns how many were released.
pub(crate) async fn release(inner: &Inner, pairs: &[(i64, i32)]) -> Result<u64, DbErr> {
    if pairs.is_empty() {
        return Ok(0);
    }
    let now = Utc::now().naive_utc();
    let release = || {
        notify_msg::Entity::update_many()
            .col_expr(Column::Version, Expr::col(Column::Version).add(1))
            .col_expr(Column::NextCallTime, Expr::value(now))
            .filter(claimed_pairs(pairs))
            .exec(&inner.db)
    };
    Ok(db::on_conflict_retry(release).await?.rows_affected)
}

/// Moves claimed rows to history as succeeded, in one transaction, copying
/// them server-side. Returns `false` (and writes nothing) unless every pair
/// still held its claim; the caller then records them one by one.
pub(crate) async fn succeed_all(inner: &Inner, pairs: &[(i64, i32)]) -> Result<bool, DbErr> {
    if pairs.is_empty() {
        return Ok(true);
    }
    db::on_conflict_retry(|| succeed_all_once(inner, pairs)).await
}

async fn succeed_all_once(inner: &Inner, pairs: &[(i64, i32)]) -> Result<bool, DbErr> {
    use notify_msg::Column as C;
    let copy = Query::select()
        .columns([C::Id, C::DefId, C::Param, C::Description, C::Errors])
        .expr(Expr::val(Status::Succeeded as i16))
        .columns([
            C::RetryTimes,
            C::LastCallTime,
            C::NextCallTime,
            C::CreateTime,
        ])
        .expr(Expr::col(C::Version).add(1))
        .columns([C::LoadBalanceNum, C::IdempotencyKey, C::TargetOverride])
        .from(notify_msg::Entity)
        .and_where(claimed_pairs(pairs))
        .to_owned();
    use notify_msg_history::Column as H;
    let insert = Query::insert()
        .into_table(notify_msg_history::Entity)
        .columns([
            H::Id,
            H::DefId,
            H::Param,
            H::Description,
            H::Errors,
            H::Status,
            H::RetryTimes,
            H::LastCallTime,
            H::NextCallTime,
            H::CreateTime,
            H::Version,
            H::LoadBalanceNum,
            H::IdempotencyKey,
            H::TargetOverride,
        ])
        .select_from(copy)
        .map_err(|e| DbErr::Custom(e.to_string()))?
        .to_owned();
    let txn = db::begin(&inner.db).await?;
    // Lock the claimed rows first (SQLite: the transaction holds the write
    // lock already), so that nothing can change or remove them between the
    // copy and the delete.
    if txn.get_database_backend() != DbBackend::Sqlite {
        let locked = notify_msg::Entity::find()
            .select_only()
            .column(Column::Id)
            .filter(claimed_pairs(pairs))
            .lock(LockType::Update)
            .into_tuple::<i64>()
            .all(&txn)
            .await?;
        if locked.len() != pairs.len() {
            txn.rollback().await?;
            return Ok(false);
        }
    }
    let copied = match txn.execute(&insert).await {
        Ok(done) => done.rows_affected(),
        // Already in history (e.g. cancelled meanwhile): settle row by row.
        Err(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            txn.rollback().await?;
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let deleted = notify_msg::Entity::delete_many()
        .filter(claimed_pairs(pairs))
        .exec(&txn)
        .await?
        .rows_affected;
    if copied != pairs.len() as u64 || deleted != copied {
        txn.rollback().await?;
        return Ok(false);
    }
    txn.commit().await?;
    Ok(true)
}
