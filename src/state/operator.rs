//! Operator: transitions an operator makes by hand, one notice or a batch
//! at a time, each row guarded by the version the operator's tool read, each
//! leaving an audit line in the notice's failure log. A row that changed
//! since it was read is skipped, never overwritten.

use chrono::NaiveDateTime;
use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, QueryFilter, QueryOrder,
    QuerySelect,
    sea_query::{CaseStatement, Condition, Expr},
};

use super::{
    Store, clock,
    columns::{self, Column, Set, Table},
    errors_log,
    insert::{NewRow, insert_plain},
};
use crate::{
    db,
    entity::notify_msg_history::{self, Column as History},
    status::Status,
};

/// Builds the notice that reports the release of ordering key `key` of
/// definition `def_id` (its `key.released` event), or `None` when that
/// definition sends none. Given by the layer that knows the events.
pub(crate) type OnRelease<'a> = &'a (dyn Fn(i64, &str) -> Option<NewRow> + Sync);

/// Statuses in history that hold a key (with `stop_on_failure`).
const HOLDING: [Status; 2] = [Status::FinalFailure, Status::Parked];

/// Locks what a change of the guarded rows of history may release, in
/// one order for every change: first every row that holds a key one of
/// them holds (final failures and parked notices with a key), by
/// definition, key and id; then the guarded rows. Two changes that release
/// the same key one row each so wait for each other, and the second finds
/// the key free and writes its event; they cannot deadlock on each other's
/// rows. Returns the guarded rows' ids and the `(def_id, ordering_key)`
/// pairs they hold.
async fn lock_for_release<C: ConnectionTrait>(
    conn: &C,
    guard: Condition,
) -> Result<(Vec<i64>, Vec<(i64, String)>), DbErr> {
    let holding = || Expr::col(History::Status).is_in(HOLDING.map(|s| s as i16));
    let keys_of = |cond: Condition| {
        notify_msg_history::Entity::find()
            .select_only()
            .column(History::DefId)
            .column(History::OrderingKey)
            .distinct()
            .filter(cond)
            .filter(holding())
            .filter(Expr::col(History::OrderingKey).is_not_null())
            .order_by_asc(History::DefId)
            .order_by_asc(History::OrderingKey)
    };
    // SQLite's write transactions run one at a time already.
    if conn.get_database_backend() != DbBackend::Sqlite {
        let keys = readable_keys(conn, keys_of(guard.clone())).await?;
        if !keys.is_empty() {
            let _: Vec<i64> = notify_msg_history::Entity::find()
                .select_only()
                .column(History::Id)
                // Pairs as equalities: MariaDB range-scans these, not a
                // tuple IN.
                .filter(keys.iter().fold(Condition::any(), |any, (def_id, key)| {
                    any.add(
                        Condition::all()
                            .add(Expr::col(History::DefId).eq(*def_id))
                            .add(Expr::col(History::OrderingKey).eq(key.as_str())),
                    )
                }))
                .filter(holding())
                .order_by_asc(History::DefId)
                .order_by_asc(History::OrderingKey)
                .order_by_asc(History::Id)
                .lock_exclusive()
                .into_tuple()
                .all(conn)
                .await?;
        }
    }
    let ids = columns::history_ids(conn, guard).await?;
    if ids.is_empty() {
        return Ok((ids, Vec::new()));
    }
    let keys = readable_keys(
        conn,
        keys_of(Condition::all().add(Expr::col(History::Id).is_in(ids.iter().copied()))),
    )
    .await?;
    Ok((ids, keys))
}

/// The `(def_id, ordering_key)` pairs `select` reads, those that read as an
/// integer and text: a key a plain-SQL producer wrote as a BLOB (SQLite)
/// holds nothing back, as no text key equals it.
pub(crate) async fn readable_keys<C: ConnectionTrait>(
    conn: &C,
    select: sea_orm::Select<notify_msg_history::Entity>,
) -> Result<Vec<(i64, String)>, DbErr> {
    let rows = conn
        .query_all(&sea_orm::QueryTrait::into_query(select))
        .await?;
    Ok(rows
        .iter()
        .filter_map(|row| Some((row.try_get_by_index(0).ok()?, row.try_get_by_index(1).ok()?)))
        .collect())
}

/// After a change, writes on `conn` (its transaction) the `key.released`
/// event of each of `keys` that no final failure or parked notice in
/// history holds any more. Returns how many it wrote.
async fn write_released<C: ConnectionTrait>(
    conn: &C,
    keys: &[(i64, String)],
    on_release: OnRelease<'_>,
) -> Result<usize, DbErr> {
    let mut written = 0;
    for (def_id, key) in keys {
        let Some(row) = on_release(*def_id, key) else {
            continue;
        };
        let still: Option<i64> = notify_msg_history::Entity::find()
            .select_only()
            .column(History::Id)
            .filter(Expr::col(History::DefId).eq(*def_id))
            .filter(Expr::col(History::OrderingKey).eq(key.as_str()))
            .filter(Expr::col(History::Status).is_in(HOLDING.map(|s| s as i16)))
            .limit(1)
            .into_tuple()
            .one(conn)
            .await?;
        if still.is_none() {
            insert_plain(conn, &row).await?;
            written += 1;
        }
    }
    Ok(written)
}

/// A notice as an operator's tool read it: what a guarded write needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub id: i64,
    pub version: i32,
    /// Its failure log as read; the audit line is appended to it.
    pub errors: String,
}

async fn move_guarded(
    store: &Store,
    from: Table,
    to: Table,
    guard: Condition,
    sets: Vec<Set>,
) -> Result<Vec<i64>, DbErr> {
    db::on_conflict_retry(|| async {
        if store.backend() == DbBackend::Postgres {
            return columns::move_rows(&store.db, from, to, guard.clone(), sets.clone()).await;
        }
        let txn = db::begin(&store.db).await?;
        let moved = columns::move_rows(&txn, from, to, guard.clone(), sets.clone()).await?;
        txn.commit().await?;
        Ok(moved)
    })
    .await
}

/// Each row's log with `note` (dated `at`) appended: one value for one row,
/// a `CASE id WHEN …` for a batch.
fn audited(rows: &[Seen], note: &str, at: NaiveDateTime) -> Expr {
    let line = |row: &Seen| errors_log::append_note(&row.errors, at, note);
    match rows {
        [row] => Expr::val(line(row)),
        _ => {
            let mut case = CaseStatement::new();
            for row in rows {
                case = case.case(
                    Condition::all().add(Expr::col(Column::Id).eq(row.id)),
                    Expr::val(line(row)),
                );
            }
            case.finally(Expr::col(Column::Errors)).into()
        }
    }
}

fn guard(rows: &[Seen]) -> Condition {
    let pairs: Vec<(i64, i32)> = rows.iter().map(|r| (r.id, r.version)).collect();
    columns::at_versions(&pairs)
}

/// Cancels `rows`, notices in flight as read: they move to history with
/// status 5, `last_call_time` now (the database's clock) and `note` (dated
/// `at`) in their log. An attempt running
/// meanwhile loses its claim: its outcome is not recorded. Its lease
/// (`leased`, `next_call_time`) is kept in history, so that a requeue cannot
/// make the notice due while that attempt may still be sending. Returns the
/// ids cancelled; the others changed since they were read.
pub(crate) async fn cancel(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
) -> Result<Vec<i64>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let now = clock::now(store.backend());
    let sets = vec![
        (Column::Status, Expr::val(Status::Cancelled as i16)),
        (Column::Errors, audited(rows, note, at)),
        // When it finished, for retention and `--since`: a cancelled
        // notice's last call is its cancel.
        (Column::LastCallTime, now),
    ];
    let moved = move_guarded(store, Table::Live, Table::History, guard(rows), sets).await?;
    // The next notice of a cancelled one's ordering key may be in turn.
    store.finished_ids(&moved).await;
    Ok(moved)
}

/// Makes `row`, a delayed notice in flight as read (never attempted, not
/// held), due at once, whether or not its time has come by the database's
/// clock: `not_before` cleared, `next_call_time` now, `note` (dated `at`)
/// in its log. Its key's turn still applies. Whether it changed (`false`:
/// it changed since it was read).
pub(crate) async fn send_now(
    store: &Store,
    row: &Seen,
    note: &str,
    at: NaiveDateTime,
) -> Result<bool, DbErr> {
    let now = clock::now(store.backend());
    let guard = guard(std::slice::from_ref(row))
        .add(Expr::col(Column::Status).eq(Status::NotSent as i16))
        .add(Expr::col(Column::Leased).eq(false))
        .add(Expr::col(Column::NotBefore).is_not_null());
    let sets = vec![
        (Column::NextCallTime, now),
        (Column::NotBefore, Expr::val(Option::<NaiveDateTime>::None)),
        (Column::Errors, audited(std::slice::from_ref(row), note, at)),
    ];
    let changed =
        db::on_conflict_retry(|| columns::update(&store.db, guard.clone(), sets.clone())).await?;
    Ok(changed == 1)
}

/// Cancels `rows`, final failures or parked notices in history as read: they
/// stay in history with status 5 and `note` (dated `at`) in their log. With
/// `stop_on_failure` this lets the later notices of their ordering key go
/// on ([`order`](super::order)), and each key it releases gets its event
/// (`on_release`) in the same transaction. Returns the ids cancelled (the
/// others changed since they were read) and the events written.
pub(crate) async fn cancel_finished(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
    on_release: Option<OnRelease<'_>>,
) -> Result<(Vec<i64>, usize), DbErr> {
    if rows.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let guard = guard(rows).add(
        Expr::col(Column::Status).is_in([Status::FinalFailure, Status::Parked].map(|s| s as i16)),
    );
    let sets = vec![
        (Column::Status, Expr::val(Status::Cancelled as i16)),
        (Column::Errors, audited(rows, note, at)),
    ];
    let (changed, events) = db::on_conflict_retry(|| async {
        let txn = db::begin(&store.db).await?;
        let (ids, keys) = match on_release {
            Some(_) => lock_for_release(&txn, guard.clone()).await?,
            None => (columns::history_ids(&txn, guard.clone()).await?, Vec::new()),
        };
        let mut events = 0;
        if !ids.is_empty() {
            let mine = Condition::all().add(Expr::col(Column::Id).is_in(ids.iter().copied()));
            columns::update_history(&txn, mine, sets.clone()).await?;
            if let Some(on_release) = on_release {
                events = write_released(&txn, &keys, on_release).await?;
            }
        }
        txn.commit().await?;
        Ok((ids, events))
    })
    .await?;
    store.finished_ids(&changed).await;
    Ok((changed, events))
}

/// What a requeue writes: in flight, due now (or when a live lease of a
/// cancelled notice ends), a fresh retry budget, `note` in the log.
fn requeue_sets(now: Expr, rows: &[Seen], note: &str, at: NaiveDateTime) -> Vec<Set> {
    let live_lease = || {
        Condition::all()
            .add(Expr::col(Column::Leased).eq(true))
            .add(Expr::col(Column::NextCallTime).gt(now.clone()))
    };
    vec![
        (
            Column::Leased,
            Expr::case(live_lease(), true).finally(false).into(),
        ),
        (Column::Status, Expr::val(Status::NotSent as i16)),
        (Column::RetryTimes, Expr::val(0)),
        (
            Column::NextCallTime,
            Expr::case(live_lease(), Expr::col(Column::NextCallTime))
                .finally(now.clone())
                .into(),
        ),
        (Column::Errors, audited(rows, note, at)),
        // A requeue makes a delayed notice due at once too.
        (Column::NotBefore, Expr::val(Option::<NaiveDateTime>::None)),
    ]
}

/// Puts `rows`, finished notices as read (final failures, cancelled or
/// parked), back in flight: due now (or, for a notice cancelled while an
/// attempt held it, when that attempt's lease ends), a fresh retry budget,
/// `note` (dated `at`) in the log, ids unchanged. Each ordering key it
/// releases gets its event (`on_release`) in the same transaction. Returns
/// the ids requeued (the others changed since they were read) and the
/// events written.
pub(crate) async fn requeue(
    store: &Store,
    rows: &[Seen],
    note: &str,
    at: NaiveDateTime,
    on_release: Option<OnRelease<'_>>,
) -> Result<(Vec<i64>, usize), DbErr> {
    if rows.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let sets = requeue_sets(clock::now(store.backend()), rows, note, at);
    let requeueable = |rows: &[Seen]| {
        guard(rows).add(
            Expr::col(Column::Status)
                .is_in([Status::FinalFailure, Status::Cancelled, Status::Parked].map(|s| s as i16)),
        )
    };
    let moved = match on_release {
        None => move_guarded(store, Table::History, Table::Live, requeueable(rows), sets)
            .await
            .map(|ids| (ids, 0)),
        Some(on_release) => {
            db::on_conflict_retry(|| async {
                let txn = db::begin(&store.db).await?;
                // Locked first: only rows this change moves release keys.
                let (locked, keys) = lock_for_release(&txn, requeueable(rows)).await?;
                let mine =
                    requeueable(rows).add(Expr::col(Column::Id).is_in(locked.iter().copied()));
                let ids = columns::move_rows(&txn, Table::History, Table::Live, mine, sets.clone())
                    .await?;
                let events = write_released(&txn, &keys, on_release).await?;
                txn.commit().await?;
                Ok((ids, events))
            })
            .await
        }
    };
    match moved {
        Err(e) if super::keyed::is_key_conflict(&e) && rows.len() > 1 => {
            // A notice of the same key is in flight (or twice in this
            // batch, from before keys were unique): one at a time, leaving
            // in history each one whose key is taken.
            let (mut moved, mut events) = (Vec::new(), 0);
            for row in rows {
                let (ids, n) = Box::pin(requeue(
                    store,
                    std::slice::from_ref(row),
                    note,
                    at,
                    on_release,
                ))
                .await?;
                moved.extend(ids);
                events += n;
            }
            Ok((moved, events))
        }
        Err(e) if super::keyed::is_key_conflict(&e) => {
            tracing::warn!(notice_id = rows[0].id, error = %e, "not requeued: a notice with its idempotency key is in flight");
            Ok((Vec::new(), 0))
        }
        other => other,
    }
}

/// Writes values sealed again (`rekey`) into row `id` of `notify_msg`
/// (`live`) or `notify_msg_history`: each `(column, old, new)` only if the
/// column still holds `old`, and in flight only while no attempt holds the
/// row (`leased` false: claimed, or reserved for its producer's after-commit
/// attempt, which finds its row by its param). The version is not bumped:
/// the text is the same once opened. Whether it wrote (`false`: the row
/// changed, left, or is held).
pub(crate) async fn reseal<C: ConnectionTrait>(
    conn: &C,
    live: bool,
    id: i64,
    sets: &[(&str, String, String)],
) -> Result<bool, DbErr> {
    let table = if live { Table::Live } else { Table::History };
    let mut update = sea_orm::sea_query::Query::update();
    update
        .table(sea_orm::sea_query::Alias::new(table.name()))
        .and_where(Expr::col(Column::Id).eq(id));
    if live {
        update.and_where(Expr::col(Column::Leased).eq(false));
    }
    for (column, old, new) in sets {
        let column = sea_orm::sea_query::Alias::new(*column);
        update.value(column.clone(), new.clone());
        update.and_where(Expr::col(column).eq(old.as_str()));
    }
    Ok(conn.execute(&update).await?.rows_affected() == 1)
}
