//! Columns: the one column list of a notice, the one version bump, and the
//! guarded statements every transition is made of.
//!
//! `notify_msg` and `notify_msg_history` have the same columns (the order of
//! [`notify_msg::Column`]); a move between them copies every column
//! server-side, replacing only those a transition changes.

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, IdenStatic, Iterable, QueryFilter,
    QuerySelect,
    sea_query::{
        Alias, CommonTableExpression, Condition, DeleteStatement, Expr, IntoCondition, Query,
        SelectStatement, WithClause,
    },
};

use crate::entity::{
    notify_msg, notify_msg_history,
    read::{self, Unreadable},
};

pub(crate) use notify_msg::Column;

/// A column a transition sets, and the value (an expression over the row as
/// it was before the statement).
pub(crate) type Set = (Column, Expr);

pub(crate) use notify_msg::due_at;

/// The one way `version` changes: up by one, in the statement that makes the
/// transition ([`bumped`](super::version::bumped)).
pub(crate) fn bump() -> Set {
    (Column::Version, Expr::cust(bumped("version")))
}

pub(crate) use super::version::bumped;

/// Guard of one row: still at the version the caller holds.
pub(crate) fn at_version(id: i64, version: i32) -> Condition {
    Condition::all()
        .add(Expr::col(Column::Id).eq(id))
        .add(Expr::col(Column::Version).eq(version))
}

/// Guard of many rows, each at the version its holder holds.
pub(crate) fn at_versions(pairs: &[(i64, i32)]) -> Condition {
    Condition::all().add(
        Expr::tuple([Expr::col(Column::Id), Expr::col(Column::Version)])
            .in_tuples(pairs.iter().copied()),
    )
}

/// The two tables of a notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    /// `notify_msg`: in flight.
    Live,
    /// `notify_msg_history`: finished.
    History,
}

impl Table {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Table::Live => "notify_msg",
            Table::History => "notify_msg_history",
        }
    }

    fn alias(self) -> Alias {
        Alias::new(self.name())
    }
}

fn col(c: Column) -> Alias {
    Alias::new(c.as_str())
}

/// Updates the guarded rows of `notify_msg` in place: `sets`, plus the
/// version bump. Returns how many rows changed.
pub(crate) async fn update<C: ConnectionTrait>(
    conn: &C,
    guard: impl IntoCondition,
    sets: Vec<Set>,
) -> Result<u64, DbErr> {
    let mut update = notify_msg::Entity::update_many().filter(guard);
    for (c, value) in sets.into_iter().chain([bump()]) {
        update = update.col_expr(c, value);
    }
    Ok(update.exec(conn).await?.rows_affected)
}

/// Updates the guarded rows of `notify_msg_history` in place: `sets`, plus
/// the version bump. Returns how many rows changed.
pub(crate) async fn update_history<C: ConnectionTrait>(
    conn: &C,
    guard: impl IntoCondition,
    sets: Vec<Set>,
) -> Result<u64, DbErr> {
    let mut update = notify_msg_history::Entity::update_many().filter(guard);
    for (c, value) in sets.into_iter().chain([bump()]) {
        update = update.col_expr(c, value);
    }
    Ok(update.exec(conn).await?.rows_affected)
}

/// Ids of the guarded rows of `notify_msg_history`, locked for update where
/// the backend can (SQLite: the caller's write transaction).
pub(crate) async fn history_ids<C: ConnectionTrait>(
    conn: &C,
    guard: Condition,
) -> Result<Vec<i64>, DbErr> {
    let mut select = notify_msg_history::Entity::find()
        .select_only()
        .column(notify_msg_history::Column::Id)
        .filter(guard);
    if conn.get_database_backend() != DbBackend::Sqlite {
        select = select.lock_exclusive();
    }
    select.into_tuple().all(conn).await
}

/// Like [`update`], returning the rows as written where the backend can
/// (PostgreSQL and SQLite: `RETURNING`; MySQL: read back by the new version).
pub(crate) async fn update_returning<C: ConnectionTrait>(
    conn: &C,
    id: i64,
    version: i32,
    sets: Vec<Set>,
) -> Result<Option<notify_msg::Model>, DbErr> {
    if conn.get_database_backend() == DbBackend::MySql {
        if update(conn, at_version(id, version), sets).await? != 1 {
            return Ok(None);
        }
        return notify_msg::Entity::find()
            .filter(at_version(id, version.wrapping_add(1)))
            .one(conn)
            .await;
    }
    let mut update = notify_msg::Entity::update_many().filter(at_version(id, version));
    for (c, value) in sets.into_iter().chain([bump()]) {
        update = update.col_expr(c, value);
    }
    Ok(update.exec_with_returning(conn).await?.pop())
}

/// The select list that copies every column, with `sets` replacing some.
fn copy_list(select: &mut SelectStatement, sets: &[Set]) {
    for c in Column::iter() {
        match sets.iter().find(|(s, _)| s.as_str() == c.as_str()) {
            Some((_, value)) => select.expr_as(value.clone(), col(c)),
            None => select.column(col(c)),
        };
    }
}

/// Moves the guarded rows from one table to the other, copying every column
/// server-side with `sets` (and the version bump) applied. Returns the ids
/// moved.
///
/// On PostgreSQL this is one statement (`WITH moved AS (DELETE … RETURNING
/// *) INSERT … SELECT … FROM moved`). Elsewhere `conn` must be a
/// transaction: the rows are locked (MySQL `FOR UPDATE`; SQLite holds the
/// write lock), copied, then deleted.
pub(crate) async fn move_rows<C: ConnectionTrait>(
    conn: &C,
    from: Table,
    to: Table,
    guard: Condition,
    sets: Vec<Set>,
) -> Result<Vec<i64>, DbErr> {
    let sets: Vec<Set> = sets.into_iter().chain([bump()]).collect();
    let mut insert = Query::insert();
    insert
        .into_table(to.alias())
        .columns(Column::iter().map(col));
    let backend = conn.get_database_backend();
    if backend == DbBackend::Postgres {
        let moved = Alias::new("moved");
        let mut delete: DeleteStatement = Query::delete();
        delete
            .from_table(from.alias())
            .cond_where(guard)
            .returning_all();
        let cte = CommonTableExpression::new()
            .table_name(moved.clone())
            .query(delete)
            .to_owned();
        let mut select = Query::select();
        copy_list(&mut select, &sets);
        select.from(moved);
        insert
            .select_from(select)
            .map_err(|e| DbErr::Custom(e.to_string()))?
            .returning_col(col(Column::Id));
        let stmt = insert.with(WithClause::new().cte(cte).to_owned());
        let rows = conn.query_all(&stmt).await?;
        return rows
            .iter()
            .map(|r| r.try_get_by_index::<i64>(0))
            .collect::<Result<_, _>>();
    }
    let mut lock = Query::select();
    lock.column(col(Column::Id))
        .from(from.alias())
        .cond_where(guard.clone());
    if backend == DbBackend::MySql {
        lock.lock(sea_orm::sea_query::LockType::Update);
    }
    let ids: Vec<i64> = conn
        .query_all(&lock)
        .await?
        .iter()
        .map(|r| r.try_get_by_index::<i64>(0))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(ids);
    }
    let held = Condition::all()
        .add(guard)
        .add(Expr::col(col(Column::Id)).is_in(ids.iter().copied()));
    let mut select = Query::select();
    copy_list(&mut select, &sets);
    select.from(from.alias()).cond_where(held.clone());
    insert
        .select_from(select)
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    let copied = conn.execute(&insert).await?.rows_affected();
    let mut delete = Query::delete();
    delete.from_table(from.alias()).cond_where(held);
    let deleted = conn.execute(&delete).await?.rows_affected();
    if copied != ids.len() as u64 || deleted != copied {
        return Err(DbErr::Custom(format!(
            "moving {} locked notices from {} copied {copied} and deleted {deleted}",
            ids.len(),
            from.name()
        )));
    }
    Ok(ids)
}

/// Where a PostgreSQL batch of successes claims the next notice of each
/// ordering key it moves ([`order::next_of_moved_pg`](super::order)).
#[derive(Debug, Clone)]
pub(crate) struct ClaimNext {
    /// Only rows of these `load_balance_num` partitions (empty: any).
    pub partitions: Vec<i32>,
    /// At most this many bytes of params, over the next notices claimed
    /// (always at least one); the others are made due.
    pub bytes: u64,
}

impl Default for ClaimNext {
    /// Any partition, no bound in bytes.
    fn default() -> Self {
        ClaimNext {
            partitions: Vec::new(),
            bytes: u64::MAX,
        }
    }
}

/// A row a batch of successes claimed: the next notice of its key, or one
/// of the run behind it (`behind`: the next notice's id and the place
/// behind it, from 1; see [`order::next_of_moved_pg`](super::order)).
pub(crate) struct ClaimedNext {
    /// The row, at its claimed version.
    pub row: notify_msg::Model,
    /// Which next notice it follows, and where.
    pub behind: Option<(i64, i64)>,
    /// Whether its lease holds its key (`held_key`): the first and the
    /// last of a run do.
    pub holds: bool,
}

/// PostgreSQL: moves the rows held at `pairs` (id, version) to history as
/// succeeded, in one prepared statement whatever their number (the pairs
/// travel as two arrays and are joined on the primary key), and deals with
/// the next notice of each ordering key moved: claims it (and the run
/// behind it) for the caller when `next` is given and it is in turn, else
/// makes it due. `next`'s ids are moved ids whose keys are left alone (the
/// caller holds their next notices already). Returns the ids moved, the
/// rows claimed, and those claimed that cannot be read (to park).
pub(crate) async fn succeed_pairs_pg(
    db: &crate::db::Db,
    pairs: &[(i64, i32)],
    next: Option<(&ClaimNext, std::time::Duration, &[i64])>,
) -> Result<(Vec<i64>, Vec<ClaimedNext>, Vec<Unreadable>), DbErr> {
    use sea_orm::{Iterable as _, Statement};
    // `next`'s position: after every column of the row.
    let next_at = Column::iter().count();
    use std::sync::OnceLock;
    static SQL: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    let claim = next.is_some();
    let sql = SQL[usize::from(claim)].get_or_init(|| succeed_pairs_sql(claim));
    let ids: Vec<i64> = pairs.iter().map(|p| p.0).collect();
    let versions: Vec<i32> = pairs.iter().map(|p| p.1).collect();
    let Some((next, lease, continuing)) = next else {
        let moved = moved_ids_pg(db, sql, ids, versions).await?;
        return Ok((moved, Vec::new(), Vec::new()));
    };
    let values = [
        ids.into(),
        versions.into(),
        next.partitions.clone().into(),
        lease.as_secs_f64().into(),
        continuing.to_vec().into(),
        i64::try_from(next.bytes).unwrap_or(i64::MAX).into(),
    ];
    let (mut moved, mut claimed, mut unreadable) = (Vec::new(), Vec::new(), Vec::new());
    for row in db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql.as_str(),
            values,
        ))
        .await?
    {
        if row.try_get_by_index::<bool>(next_at)? {
            let head = row.try_get_by_index::<Option<i64>>(next_at + 1)?;
            let pos = row.try_get_by_index::<Option<i64>>(next_at + 2)?;
            let holds = row.try_get_by_index::<Option<bool>>(next_at + 3)?;
            match claimed_row(DbBackend::Postgres, &row) {
                Ok(model) => claimed.push(ClaimedNext {
                    row: model,
                    behind: head.zip(pos),
                    holds: holds.unwrap_or(false),
                }),
                // Not sent: the rows of its run behind it stray.
                Err(u) => unreadable.push(u),
            }
        } else {
            moved.push(row.try_get_by_index::<i64>(0)?);
        }
    }
    Ok((moved, claimed, unreadable))
}

/// [`succeed_pairs_pg`]'s statement: with `claim`, it claims the next
/// notice of each key moved (and returns the rows claimed), else it only
/// moves.
fn succeed_pairs_sql(claim: bool) -> String {
    use sea_orm::Iterable as _;
    let names: Vec<&str> = Column::iter().map(|c| c.as_str()).collect();
    let values: Vec<String> = Column::iter()
        .map(|c| match c {
            Column::Status => format!("{} AS status", crate::status::Status::Succeeded as i16),
            Column::Version => bumped("version"),
            Column::Leased => "false".to_string(),
            other => format!("\"{}\"", other.as_str()),
        })
        .collect();
    // The rows claimed in full, then the ids moved (the other columns
    // NULL), told apart by `next`, after the columns [`model_at_pg`]
    // reads; then where a claimed row stands in its run.
    let select = if claim {
        let nulls: Vec<&str> = names
            .iter()
            .map(|n| if *n == "id" { "id" } else { "NULL" })
            .collect();
        format!(
            "SELECT {all}, true AS next, r.head, r.pos, claimed.held_key IS NOT NULL \
             FROM claimed LEFT JOIN run r ON r.id = claimed.id \
             UNION ALL SELECT {ids}, false, NULL, NULL, NULL FROM kept",
            all = names
                .iter()
                .map(|n| format!("claimed.\"{n}\""))
                .collect::<Vec<_>>()
                .join(", "),
            ids = nulls.join(", "),
        )
    } else {
        "SELECT id FROM kept".to_string()
    };
    format!(
        "WITH moved AS (DELETE FROM notify_msg m USING UNNEST($1::bigint[], $2::int[]) AS c(id, version) \
         WHERE m.id = c.id AND m.version = c.version RETURNING m.*), \
         kept AS (INSERT INTO notify_msg_history ({}) SELECT {} FROM moved RETURNING id), \
         {} {select}",
        names
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", "),
        values.join(", "),
        super::order::next_of_moved_pg(claim),
    )
}

/// PostgreSQL: runs [`succeed_pairs_pg`]'s statement that only moves rows,
/// straight on the driver: the ids moved.
#[cfg(feature = "postgres")]
async fn moved_ids_pg(
    db: &crate::db::Db,
    sql: &str,
    ids: Vec<i64>,
    versions: Vec<i32>,
) -> Result<Vec<i64>, DbErr> {
    let moved = sea_orm::sqlx::query_scalar(sea_orm::sqlx::AssertSqlSafe(sql))
        .bind(ids)
        .bind(versions)
        .fetch_all(db.pool().get_postgres_connection_pool());
    crate::db::bounded(db.bound(), async {
        moved
            .await
            .map_err(|e| DbErr::Query(sea_orm::RuntimeErr::SqlxError(std::sync::Arc::new(e))))
    })
    .await
}

#[cfg(not(feature = "postgres"))]
async fn moved_ids_pg(
    _: &crate::db::Db,
    _: &str,
    _: Vec<i64>,
    _: Vec<i32>,
) -> Result<Vec<i64>, DbErr> {
    Err(no_postgres())
}

/// What a PostgreSQL-only call answers in a build without `postgres`
/// (never asked: such a build's notifier refuses PostgreSQL connections,
/// `db::check_backend`).
#[cfg(not(feature = "postgres"))]
fn no_postgres() -> DbErr {
    DbErr::Custom("PostgreSQL is not compiled in (the `postgres` feature)".into())
}

#[cfg(not(feature = "postgres"))]
pub(crate) fn model_at_pg(_: &sea_orm::QueryResult) -> Result<notify_msg::Model, DbErr> {
    Err(no_postgres())
}

/// PostgreSQL: a notice row read by position, its columns in the order of
/// [`Column`] (a statement's `RETURNING` list from [`returning_all`]).
///
/// The derived decode looks every column up by name and formats an error
/// for each `NULL` it meets (a fifth of a no-op drain's worker CPU went to
/// decoding claimed rows); this one reads positions and takes `NULL` as
/// `None`.
#[cfg(feature = "postgres")]
pub(crate) fn model_at_pg(row: &sea_orm::QueryResult) -> Result<notify_msg::Model, DbErr> {
    use sea_orm::{ActiveEnum, sqlx::Row};
    let Some(row) = row.try_as_pg_row() else {
        return Err(DbErr::Custom("not a PostgreSQL row".into()));
    };
    let e = |e: sea_orm::sqlx::Error| DbErr::Custom(format!("reading a notice row: {e}"));
    let status: i16 = row.try_get(5).map_err(e)?;
    Ok(notify_msg::Model {
        id: row.try_get(0).map_err(e)?,
        def_id: row.try_get(1).map_err(e)?,
        param: row.try_get(2).map_err(e)?,
        description: row.try_get(3).map_err(e)?,
        errors: row.try_get(4).map_err(e)?,
        status: crate::status::Status::try_from_value(&status)?,
        retry_times: row.try_get(6).map_err(e)?,
        last_call_time: row.try_get(7).map_err(e)?,
        next_call_time: row.try_get(8).map_err(e)?,
        create_time: row.try_get(9).map_err(e)?,
        version: row.try_get(10).map_err(e)?,
        load_balance_num: row.try_get(11).map_err(e)?,
        idempotency_key: row.try_get(12).map_err(e)?,
        target_override: row.try_get(13).map_err(e)?,
        leased: row.try_get(14).map_err(e)?,
        trace_context: row.try_get(15).map_err(e)?,
        ordering_key: row.try_get(16).map_err(e)?,
        step: row.try_get(17).map_err(e)?,
        step_result: row.try_get(18).map_err(e)?,
        not_before: row.try_get(19).map_err(e)?,
        origin: crate::status::Origin::try_from_value(&row.try_get::<i16, _>(20).map_err(e)?)?,
    })
}

/// A claimed row (a statement's `RETURNING` list from [`returning_all`], or
/// a whole row read): read by position on PostgreSQL ([`model_at_pg`]), by
/// name elsewhere; or what cannot be read of it.
pub(crate) fn claimed_row(
    backend: DbBackend,
    row: &sea_orm::QueryResult,
) -> Result<notify_msg::Model, Unreadable> {
    if backend == DbBackend::Postgres
        && read::times_in_range(row)
        && let Ok(model) = model_at_pg(row)
    {
        return Ok(model);
    }
    read::notice(row)
}

/// [`claimed_row`] for each of `rows`: those read, and those that cannot be.
pub(crate) fn claimed_rows(
    backend: DbBackend,
    rows: &[sea_orm::QueryResult],
) -> (Vec<notify_msg::Model>, Vec<Unreadable>) {
    let mut read = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in rows {
        match claimed_row(backend, row) {
            Ok(model) => read.push(model),
            Err(u) => unreadable.push(u),
        }
    }
    (read, unreadable)
}

/// Every column of a notice, in the order [`model_at_pg`] reads them.
pub(crate) fn returning_all() -> sea_orm::sea_query::ReturningClause {
    Query::returning().columns(Column::iter().map(col))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`model_at_pg`] reads the columns by these positions.
    #[test]
    fn the_column_order_is_the_one_model_at_pg_reads() {
        let names: Vec<&str> = Column::iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "id",
                "def_id",
                "param",
                "description",
                "errors",
                "status",
                "retry_times",
                "last_call_time",
                "next_call_time",
                "create_time",
                "version",
                "load_balance_num",
                "idempotency_key",
                "target_override",
                "leased",
                "trace_context",
                "ordering_key",
                "step",
                "step_result",
                "not_before",
                "origin",
            ]
        );
    }
}
