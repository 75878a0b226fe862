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

use sea_orm::{DbBackend, sea_query::Expr};

use super::clock;

/// The condition on a `notify_msg` row (the statement's own `notify_msg`)
/// that it is in turn: no key, an unordered definition, or nothing of its
/// key holding it back.
pub(crate) fn in_turn(backend: DbBackend) -> Expr {
    Expr::cust(in_turn_sql(backend))
}

/// [`in_turn`] as SQL text (for `EXPLAIN`ing a claim by hand).
pub fn in_turn_sql(backend: DbBackend) -> String {
    let now = clock::now_sql(backend);
    format!(
        "(notify_msg.ordering_key IS NULL \
         OR notify_msg.def_id NOT IN (SELECT d.id FROM notify_def d WHERE d.ordering = 'per_key') \
         OR (NOT EXISTS (SELECT 1 FROM notify_msg o \
                 WHERE o.def_id = notify_msg.def_id AND o.ordering_key = notify_msg.ordering_key \
                 AND (o.create_time, o.id) < (notify_msg.create_time, notify_msg.id)) \
             AND NOT EXISTS (SELECT 1 FROM notify_msg l \
                 WHERE l.def_id = notify_msg.def_id AND l.ordering_key = notify_msg.ordering_key \
                 AND l.leased AND l.id <> notify_msg.id AND l.next_call_time > {now}) \
             AND NOT EXISTS (SELECT 1 FROM notify_msg_history c \
                 WHERE c.def_id = notify_msg.def_id AND c.ordering_key = notify_msg.ordering_key \
                 AND c.status = 5 AND c.leased AND c.next_call_time > {now}) \
             AND (notify_msg.def_id IN (SELECT d.id FROM notify_def d WHERE NOT d.stop_on_failure) \
                 OR NOT EXISTS (SELECT 1 FROM notify_msg_history h \
                     WHERE h.def_id = notify_msg.def_id AND h.ordering_key = notify_msg.ordering_key \
                     AND h.status IN (3, 6) \
                     AND (h.create_time, h.id) < (notify_msg.create_time, notify_msg.id)))))"
    )
}
