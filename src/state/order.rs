//! Order: which notices of an ordered definition may be claimed now.
//!
//! A definition with `ordering = "per_key"` sends the notices that share an
//! `ordering_key` one at a time, oldest first. "Older" is `(create_time,
//! id)`: the database's time of the insert, then the id (ids alone are not
//! ordered across producers on PostgreSQL, which take them in blocks). A
//! notice is in turn when, among the notices of its definition and key:
//!
//! - no older one is in `notify_msg`, whatever its status (due, retrying,
//!   being sent, awaiting confirmation);
//! - no other one holds a live claim, older or not: a notice requeued, or
//!   committed late by a slow producer, waits for the one being sent;
//! - none was cancelled while an attempt still held it (its lease is kept in
//!   history until it ends);
//! - with `stop_on_failure`, no older one is in history as a final failure
//!   or parked.
//!
//! Keys never wait for each other: the rule is per row, inside the claim's
//! own statement, so a stuck key only excludes its own rows. It reads
//! `notify_def` in the statement, so an edit of `ordering` or
//! `stop_on_failure` counts at the next claim, in every process. Each probe
//! is one index lookup (migration 12).
//!
//! What it cannot see: a notice whose transaction has not committed. Two
//! claims racing with an operator's requeue of an older notice could, for
//! the length of one claim statement, each see the other's row unclaimed.
//!
//! **Waiting rows stay out of the due scan.** A sweep's claim that meets a
//! due notice not in its turn (while some definition is ordered, as the
//! sweeping process last read them) sets it aside: its `next_call_time` moves
//! [`TURN_RECHECK`] ahead (status, version and lease unchanged), so later
//! claims do not read it again and again. When a notice with a key leaves
//! `notify_msg` (delivered, failed for good, parked, cancelled, confirmed),
//! or a final failure that held its key back is cancelled or purged, the
//! oldest notice of that key is made due at once if it is in its turn now
//! (`promote`). A claim that set rows aside promotes their keys too, once
//! it has committed: a notice that finished between the claim's snapshot
//! and its write is then seen, so no wake-up is lost. Setting aside only
//! ever delays a notice (the turn rule above decides who may be sent), and
//! by at most [`TURN_RECHECK`] when no transition promotes it: a crash
//! between a notice's move to history and its promotion, an edit of
//! `ordering` or `stop_on_failure`, or the end of a lease kept in history by
//! a cancel. Only notices never attempted since they were queued (status 0,
//! not leased) are set aside and promoted; a waiting retry keeps its own
//! schedule.
//!
//! **On PostgreSQL** a notice inserted due with two or more older notices
//! of its key in flight is written set aside at once (a trigger, migration
//! 14), so no claim ever reads it; and a sweep's batch of successes
//! promotes the next notice of each key in the statement that moves them
//! (`next_of_moved_pg`), then checks again after its commit. That
//! statement claims the next notice with up to `RUN` - 1 behind it (a
//! run), which its sweep sends one by one: a key's turn is then found and
//! checked once per run. The first and the last notice of a run hold the
//! key; a live lease of either keeps every other claim of the key out. A notice set
//! aside at its insert whose older ones all finished before its producer
//! committed is claimed by the producer's after-commit attempt; when that
//! attempt does not take it (or its commit's outcome is unknown), its key
//! is checked again once the attempt has ended, never while its claim runs
//! (the check's row lock would make that claim skip it). It can still wait
//! up to [`TURN_RECHECK`] when nothing runs after its commit: a plain-SQL
//! insert, an operator's requeue, a notice added in a nested transaction
//! (`wrap`).

use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, Statement, Value,
    sea_query::{Condition, Expr, ExprTrait},
};

use super::{clock, version::P_VERSION_BUMPED};
use crate::entity::notify_msg::{Column, due_at};
use crate::status::Status;

/// How long a claim sets aside a due notice that is not in its key's turn:
/// 60 seconds. The longest a waiting notice can be late when no transition
/// promotes it (see the module docs); it is read again once per this long
/// while it waits.
pub const TURN_RECHECK: Duration = Duration::from_secs(60);

/// Keys promoted per statement: 500.
pub(crate) const PROMOTE_CHUNK: usize = 500;

/// Rows a claim may set aside when they are not in turn, and a promotion
/// may make due: keyed, never attempted since queued, not leased, and not
/// delayed past now (a delayed notice waits for its `not_before` whatever
/// its turn: only time makes it due).
pub(crate) fn may_wait(backend: DbBackend) -> Condition {
    Condition::all()
        .add(Expr::col(Column::OrderingKey).is_not_null())
        .add(Expr::col(Column::Status).eq(Status::NotSent as i16))
        .add(Expr::col(Column::Leased).eq(false))
        .add(
            Condition::any()
                .add(Expr::col(Column::NotBefore).is_null())
                .add(Expr::col(Column::NotBefore).lte(clock::now(backend))),
        )
}

/// The condition on a `notify_msg` row (the statement's own `notify_msg`)
/// that it is in turn: no key, an unordered definition, or nothing of its
/// key holding it back.
pub(crate) fn in_turn(backend: DbBackend) -> Expr {
    Expr::cust(in_turn_sql(backend))
}

/// `column > time`, written so that no index on `column` serves it. The
/// rows set aside are all due later: a condition on `next_call_time` that
/// the planner reads by the due index (whose statistics may not know them
/// yet) reads every one of them, where a probe of the key or the primary
/// key finds the few rows meant.
fn not_indexed_after(column: &str, time: &str) -> String {
    format!("(CASE WHEN {column} > {time} THEN 1 ELSE 0 END) = 1")
}

/// sea-query's placeholder for an expression in a custom one: numbered on
/// PostgreSQL only.
fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_string(),
    }
}

/// `in_turn` as SQL text (for `EXPLAIN`ing a claim by hand).
pub fn in_turn_sql(backend: DbBackend) -> String {
    format!(
        "(notify_msg.ordering_key IS NULL \
         OR notify_msg.def_id NOT IN (SELECT d.id FROM notify_def d WHERE d.ordering = 'per_key') \
         OR (NOT EXISTS (SELECT 1 FROM notify_msg o \
                 WHERE o.def_id = notify_msg.def_id AND o.ordering_key = notify_msg.ordering_key \
                 AND (o.create_time, o.id) < (notify_msg.create_time, notify_msg.id)) \
             AND {}))",
        not_held_back_sql(backend, "notify_msg", "")
    )
}

/// The rest of the turn of the row `row` (one with a key, of an ordered
/// definition, with no older notice of its key in `notify_msg`): no other
/// notice of its key holds a live lease (besides those `also_not`, an SQL
/// condition on `l`, excludes), none cancelled while claimed holds one in
/// history, and, for a definition with `stop_on_failure`, no older final
/// failure or parked notice of its key is in history.
fn not_held_back_sql(backend: DbBackend, row: &str, also_not: &str) -> String {
    let now = clock::now_sql(backend);
    // "Its lease has not ended": each probe goes by the key's index.
    let live_l = not_indexed_after("l.next_call_time", now);
    let live_c = not_indexed_after("c.next_call_time", now);
    // A leased notice of the key: on PostgreSQL by `held_key` (migration
    // 16), whose index a claim of a notice without a key leaves alone.
    let held = match backend {
        DbBackend::Postgres => format!("l.held_key = {row}.ordering_key"),
        _ => format!("l.ordering_key = {row}.ordering_key AND l.leased"),
    };
    format!(
        "NOT EXISTS (SELECT 1 FROM notify_msg l \
             WHERE l.def_id = {row}.def_id AND {held} \
             AND l.id <> {row}.id {also_not} AND {live_l}) \
         AND NOT EXISTS (SELECT 1 FROM notify_msg_history c \
             WHERE c.def_id = {row}.def_id AND c.ordering_key = {row}.ordering_key \
             AND c.status = 5 AND c.leased AND {live_c}) \
         AND ({row}.def_id IN (SELECT d.id FROM notify_def d WHERE NOT d.stop_on_failure) \
             OR NOT EXISTS (SELECT 1 FROM notify_msg_history h \
                 WHERE h.def_id = {row}.def_id AND h.ordering_key = {row}.ordering_key \
                 AND h.status IN (3, 6) \
                 AND (h.create_time, h.id) < ({row}.create_time, {row}.id)))"
    )
}

/// The `next_call_time` of a notice set aside: [`TURN_RECHECK`] from now,
/// or sooner, when a notice of its key cancelled while being sent holds its
/// lease in history until then (the one hold on a key that ends by time,
/// not by a transition that promotes).
pub(crate) fn aside_until(backend: DbBackend) -> Expr {
    let later = clock::after(backend, TURN_RECHECK);
    let now = clock::now_sql(backend);
    let (p1, p2) = (placeholder(backend, 1), placeholder(backend, 2));
    Expr::cust_with_exprs(
        format!(
            "COALESCE((SELECT MIN(c.next_call_time) FROM notify_msg_history c \
             WHERE c.def_id = notify_msg.def_id AND c.ordering_key = notify_msg.ordering_key \
             AND c.status = {cancelled} AND c.leased AND c.next_call_time > {now} \
             AND c.next_call_time < {p1}), {p2})",
            cancelled = Status::Cancelled as i16,
        ),
        [later.clone(), later],
    )
}

/// Notices of one key the batch of successes claims at once: the next one
/// in turn and up to 15 behind it ([`next_of_moved_pg`]): 16.
pub(crate) const RUN: usize = 16;

/// Largest param of a notice claimed behind the next one, in a run: 1 KiB.
/// A run stops before a larger one (claimed in its turn, counted in a
/// sweep's bound in bytes like any claim): a run's queue holds up to 15 KiB.
pub(crate) const RUN_MEMBER_BYTES: usize = 1024;

/// The oldest notice left of each ordering key moved by the statement's
/// CTE `moved` (but those of moved ids in `$5`, when `skip`), as a subquery
/// of ids (PostgreSQL). The statement's snapshot still holds the rows it
/// deletes, so they are left out by id.
fn next_of_moved(skip: bool) -> String {
    let skip = if skip {
        " AND NOT (id = ANY($5::bigint[]))"
    } else {
        ""
    };
    format!(
        "SELECT (SELECT o.id FROM notify_msg o \
         WHERE o.def_id = k.def_id AND o.ordering_key = k.ordering_key \
         AND o.id NOT IN (SELECT id FROM moved) ORDER BY o.create_time, o.id LIMIT 1) \
         FROM (SELECT DISTINCT def_id, ordering_key FROM moved \
         WHERE ordering_key IS NOT NULL{skip}) k"
    )
}

/// Data-modifying CTEs for a PostgreSQL statement whose CTE `moved`
/// deletes notices from `notify_msg`: they deal, in the same statement,
/// with the oldest notice left of each ordering key moved, when it was
/// never attempted, is not leased and its definition is ordered.
///
/// Without `claim`, one CTE (`promoted`) makes each such notice due. With
/// `claim`, a CTE `claimed` claims those in turn for the sweep whose
/// successes these are (as a claim would: leased, version bumped, one
/// lease of `$4` seconds ahead; `RETURNING` the whole row), when their
/// definition is not paused, their partition is in `$3` (an empty array:
/// any) and their params fit in `$6` bytes (in id order, at least one);
/// the others are made due (`promoted`). Their turn is the
/// claim's ([`in_turn_sql`]) with the moved rows left out: they are older
/// than the next notice by construction, and succeeded. Keys of the moved
/// ids in `$5` are left alone: their next notices are claimed already (a
/// run, below).
///
/// **Runs.** With each next notice claimed, `claimed` also claims the
/// notices of its key right behind it, up to [`RUN`] in all: those that
/// follow it without a gap among the rows it can see and that, like it,
/// have status 0, are not leased, are in `$3`'s partitions, have a param
/// of at most [`RUN_MEMBER_BYTES`] and, for a
/// definition with `stop_on_failure`, have no final failure or parked
/// notice of their key in history between them and the next notice. They
/// need no turn of their own: while the first is unfinished none of them
/// is in turn for anyone, and the caller sends each only once the one
/// before it is recorded ([`attempt::batch`](crate::attempt)). The CTE
/// `run` tells them apart: its `head` is the next notice they follow and
/// its `pos` their place behind it (1, 2, …). Only the first and the last
/// of a run hold the key (`held_key`); those between are claimed with
/// `in_run_at` at their new version and `due_at` left alone, so their
/// claim is a heap-only update (migration 17). The last one's lease keeps
/// every other claim of the key out until the run ends, so a caller must
/// send a run's notices only while each place before them was claimed and
/// the last one it keeps holds the key.
///
/// It runs before its own commit, so it also writes a next notice that
/// looked due already: a claim that is setting it aside right now holds its
/// row lock, this update waits for it, then re-checks the row and claims
/// or promotes what was set aside. (Were it to skip notices due in its
/// snapshot, the claim's own recheck, run before this commit, would still
/// see the finished notice, and the next one would wait a whole
/// [`TURN_RECHECK`].) A notice promoted that is still held back (a final
/// failure in history) is only set aside again by the next claim. What it
/// cannot see (a notice committed while it ran, a head cancelled
/// meanwhile) the batch's [`promote`] after its commit catches. A notice
/// of a key committed after its run was claimed, but dated before the
/// run's last (a producer's transaction slower than those after it), is
/// sent after the run.
pub(crate) fn next_of_moved_pg(claim: bool) -> String {
    const MAY_WAIT: &str = "p.status = 0 AND NOT p.leased \
         AND (p.not_before IS NULL OR p.not_before <= (statement_timestamp() AT TIME ZONE 'UTC')) \
         AND p.def_id IN (SELECT d.id FROM notify_def d WHERE d.ordering = 'per_key')";
    const NOW: &str = "(statement_timestamp() AT TIME ZONE 'UTC')";
    const PARTITION: &str = "(cardinality($3::int[]) = 0 OR {t}.load_balance_num = ANY($3::int[]))";
    if !claim {
        return format!(
            "promoted AS (UPDATE notify_msg p SET next_call_time = {NOW}, due_at = {NOW} \
             WHERE p.id = ANY(ARRAY({})) AND {MAY_WAIT})",
            next_of_moved(false)
        );
    }
    let take = format!(
        "p.def_id NOT IN (SELECT d.id FROM notify_def d WHERE d.paused_until > {NOW}) \
         AND {} AND {}",
        PARTITION.replace("{t}", "p"),
        not_held_back_sql(
            DbBackend::Postgres,
            "p",
            "AND l.id NOT IN (SELECT id FROM moved)"
        )
    );
    // Behind each next notice taken, by the key's index: the next RUN - 1
    // rows, cut at the first that may not follow it. With `stop_on_failure`
    // that includes every row behind a final failure or parked notice of
    // the key in history that is younger than the next notice (`f`, one
    // probe of the history's key index per run): the head's own turn only
    // sees those older than itself.
    let run = format!(
        "SELECT r.id, h.id AS head, r.pos, r.pos = max(r.pos) OVER (PARTITION BY h.id) AS last \
         FROM following h LEFT JOIN LATERAL ( \
             SELECT x.create_time, x.id FROM notify_msg_history x \
             WHERE x.def_id = h.def_id AND x.ordering_key = h.ordering_key \
             AND x.status IN (3, 6) AND (x.create_time, x.id) > (h.create_time, h.id) \
             AND h.def_id IN (SELECT d.id FROM notify_def d WHERE d.stop_on_failure) \
             ORDER BY x.create_time, x.id LIMIT 1) f ON true \
         CROSS JOIN LATERAL ( \
             SELECT c.id, c.pos FROM ( \
                 SELECT b.id, row_number() OVER w AS pos, bool_and(b.free) OVER w AS free \
                 FROM (SELECT n.id, n.create_time, \
                         n.status = 0 AND NOT n.leased AND {partition} \
                         AND (n.not_before IS NULL OR n.not_before <= {NOW}) \
                         AND n.id NOT IN (SELECT id FROM moved) \
                         AND octet_length(n.param) + COALESCE(octet_length(n.step_result), 0) <= {RUN_MEMBER_BYTES} \
                         AND (f.id IS NULL OR (n.create_time, n.id) < (f.create_time, f.id)) AS free \
                     FROM notify_msg n \
                     WHERE n.def_id = h.def_id AND n.ordering_key = h.ordering_key \
                     AND (n.create_time, n.id) > (h.create_time, h.id) \
                     ORDER BY n.create_time, n.id LIMIT {behind}) b \
                 WINDOW w AS (ORDER BY b.create_time, b.id)) c \
             WHERE c.free) r \
         WHERE h.take",
        partition = PARTITION.replace("{t}", "n"),
        behind = RUN - 1,
    );
    // The next notices in turn are taken while their params, in id
    // order, fit in `$6` bytes (at least one); the rest are made due.
    format!(
        "nexts AS MATERIALIZED (SELECT p.id, p.def_id, p.ordering_key, p.create_time, \
             octet_length(p.param) + COALESCE(octet_length(p.step_result), 0) AS sz, ({take}) AS fits FROM notify_msg p \
             WHERE p.id = ANY(ARRAY({next})) AND {MAY_WAIT}), \
         following AS MATERIALIZED (SELECT id, def_id, ordering_key, create_time, \
             fits AND SUM(CASE WHEN fits THEN sz ELSE 0 END) OVER (ORDER BY id) \
                 - CASE WHEN fits THEN sz ELSE 0 END < GREATEST($6::bigint, 1) AS take FROM nexts), \
         run AS MATERIALIZED ({run}), \
         inside AS MATERIALIZED (SELECT id FROM run WHERE NOT last), \
         claimed AS (UPDATE notify_msg p SET leased = true, last_call_time = {NOW}, \
             next_call_time = {NOW} + make_interval(secs => $4::double precision), \
             due_at = CASE WHEN p.id IN (SELECT id FROM inside) THEN p.due_at \
                 ELSE {NOW} + make_interval(secs => $4::double precision) END, \
             in_run_at = CASE WHEN p.id IN (SELECT id FROM inside) THEN {P_VERSION_BUMPED} END, \
             version = {P_VERSION_BUMPED} \
             WHERE p.id = ANY(ARRAY(SELECT id FROM following WHERE take UNION ALL SELECT id FROM run)) \
             AND {MAY_WAIT} RETURNING p.*), \
         promoted AS (UPDATE notify_msg p SET next_call_time = {NOW}, due_at = {NOW} \
             WHERE p.id = ANY(ARRAY(SELECT id FROM following WHERE NOT take)) AND {MAY_WAIT})",
        next = next_of_moved(true),
    )
}

/// Brings forward the next check of the oldest notice of each `(def_id,
/// ordering_key)`, when it was set aside (status 0, not leased, due later):
/// due at once if it is in its turn now, else at [`aside_until`] if that
/// is sooner (a cancel that keeps its lease in history). Returns how many
/// were made due. Changes no version: it only moves a waiting notice's
/// next check forward, which never lets anything be sent out of turn.
pub(crate) async fn promote<C: ConnectionTrait>(
    db: &C,
    keys: &[(i64, String)],
) -> Result<u64, DbErr> {
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    let backend = db.get_database_backend();
    let mut promoted = 0;
    for chunk in keys.chunks(PROMOTE_CHUNK) {
        let (heads, values) = heads(backend, chunk);
        let heads: Vec<i64> = db
            .query_all_raw(Statement::from_sql_and_values(backend, heads, values))
            .await?
            .iter()
            .filter_map(|r| r.try_get_by_index::<Option<i64>>(0).transpose())
            .collect::<Result<_, _>>()?;
        if heads.is_empty() {
            continue;
        }
        let (in_turn, held) = set_aside(db, &heads).await?;
        for (ids, at, due) in [
            (in_turn, clock::now(backend), true),
            (held, aside_until(backend), false),
        ] {
            if ids.is_empty() {
                continue;
            }
            let mut update = sea_orm::sea_query::Query::update();
            update
                .table(sea_orm::sea_query::Alias::new("notify_msg"))
                .value(Column::NextCallTime, at.clone())
                .cond_where(
                    Condition::all()
                        .add(Expr::col(Column::Id).is_in(ids))
                        .add(may_wait(backend))
                        .add(Expr::cust_with_exprs(
                            not_indexed_after("next_call_time", &placeholder(backend, 1)),
                            [at.clone()],
                        )),
                );
            if backend == DbBackend::Postgres {
                // `due_at` with it: the trigger that would copy it is not run.
                update.value(due_at(), at);
            }
            let n = db.execute(&update).await?.rows_affected();
            if due {
                promoted += n;
            }
        }
    }
    Ok(promoted)
}

/// Which of `heads` (ids) are set aside (status 0, not leased, due
/// later): those in their turn now, and the others.
async fn set_aside<C: ConnectionTrait>(
    db: &C,
    heads: &[i64],
) -> Result<(Vec<i64>, Vec<i64>), DbErr> {
    let backend = db.get_database_backend();
    let now = clock::now_sql(backend);
    // The heads by their ids, as literals: a probe of the primary key
    // each, never a scan of the rows set aside.
    let ids: Vec<String> = heads.iter().map(i64::to_string).collect();
    let waiting = format!(
        "SELECT id, CASE WHEN {turn} THEN 1 ELSE 0 END FROM notify_msg WHERE id IN ({ids}) \
         AND status = {not_sent} AND NOT leased AND {later}",
        ids = ids.join(", "),
        later = not_indexed_after("next_call_time", now),
        not_sent = Status::NotSent as i16,
        turn = in_turn_sql(backend),
    );
    let mut in_turn = Vec::new();
    let mut held = Vec::new();
    for row in db
        .query_all_raw(Statement::from_string(backend, waiting))
        .await?
    {
        let id = row.try_get_by_index::<i64>(0)?;
        let turn = match row.try_get_by_index::<i32>(1) {
            Ok(n) => n != 0,
            Err(_) => row.try_get_by_index::<i64>(1)? != 0,
        };
        if turn {
            in_turn.push(id);
        } else {
            held.push(id);
        }
    }
    Ok((in_turn, held))
}

/// The query of the oldest notice in flight of each key (one column, the
/// id, NULL for a key with none), and its values.
fn heads(backend: DbBackend, keys: &[(i64, String)]) -> (String, Vec<Value>) {
    const OLDEST: &str = "SELECT o.id FROM notify_msg o WHERE o.def_id = {def} \
         AND o.ordering_key = {key} ORDER BY o.create_time, o.id LIMIT 1";
    if backend == DbBackend::Postgres {
        let defs: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let names: Vec<String> = keys.iter().map(|k| k.1.clone()).collect();
        let oldest = OLDEST
            .replace("{def}", "k.def_id")
            .replace("{key}", "k.okey");
        return (
            format!("SELECT ({oldest}) FROM UNNEST($1::bigint[], $2::text[]) AS k(def_id, okey)"),
            vec![defs.into(), names.into()],
        );
    }
    // One scalar subquery per key: MariaDB loses a derived table's columns
    // in a correlated subquery of a prepared statement.
    let oldest = format!(
        "SELECT ({})",
        OLDEST.replace("{def}", "?").replace("{key}", "?")
    );
    let values = keys
        .iter()
        .flat_map(|(def, key)| [Value::from(*def), Value::from(key.clone())])
        .collect();
    (vec![oldest; keys.len()].join(" UNION ALL "), values)
}
