//! Order: which notices of an ordered definition may be claimed now.
//!
//! A definition with `ordering = "per_key"` sends the notices that share an
//! `ordering_key` one at a time, oldest first. "Older" is `(create_time,
//! id)`: the database's time of the insert, then the id (ids alone are not
//! ordered across producers on PostgreSQL, which take them in blocks). A
//! notice is in turn when no older notice of its definition and key is in
//! `notify_msg` (whatever its status, leased or not) and, with
//! `stop_on_failure`, none is in history as a final failure or parked. Keys
//! never wait for each other: the rule is per row, inside the claim's own
//! statement, so a stuck key only excludes its own rows.
//!
//! The rule reads `notify_def` in the statement, so an edit of `ordering`
//! or `stop_on_failure` counts at the next claim, in every process.
//! Each probe is one index lookup: `idx_notify_msg_def_order` in flight and
//! `idx_notify_msg_history_def_order` in history (migration 12).

use sea_orm::sea_query::Expr;

/// The condition on a `notify_msg` row (the statement's own `notify_msg`)
/// that it is in turn: no key, an unordered definition, or no older notice
/// of its key holding it back.
pub(crate) fn in_turn() -> Expr {
    Expr::cust(
        "(notify_msg.ordering_key IS NULL \
         OR notify_msg.def_id NOT IN (SELECT d.id FROM notify_def d WHERE d.ordering = 'per_key') \
         OR (NOT EXISTS (SELECT 1 FROM notify_msg o \
                 WHERE o.def_id = notify_msg.def_id AND o.ordering_key = notify_msg.ordering_key \
                 AND (o.create_time, o.id) < (notify_msg.create_time, notify_msg.id)) \
             AND (notify_msg.def_id IN (SELECT d.id FROM notify_def d WHERE NOT d.stop_on_failure) \
                 OR NOT EXISTS (SELECT 1 FROM notify_msg_history h \
                     WHERE h.def_id = notify_msg.def_id AND h.ordering_key = notify_msg.ordering_key \
                     AND h.status IN (3, 6) \
                     AND (h.create_time, h.id) < (notify_msg.create_time, notify_msg.id)))))",
    )
}
