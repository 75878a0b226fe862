//! Pause: the `paused_until` and `pause_reason` columns of `notify_def`.
//! While `paused_until` lies ahead by the database's clock, no claim takes
//! the definition's notices ([`claim`](super::claim) checks it in the
//! claiming statement itself), so every worker sees a pause at once.

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, QueryFilter,
    sea_query::{Condition, Expr, Query, SelectStatement},
};

use super::clock;
use crate::entity::notify_def;

/// The start of `pause_reason` while a circuit holds the pause
/// ([`crate::circuit`]).
pub const CIRCUIT_REASON: &str = "circuit open";

/// When a pause ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseEnd {
    /// Only on [`resume`](crate::Notifier::resume) (stored as
    /// [`clock::far_future`]).
    OnResume,
    /// At this UTC time.
    At(chrono::NaiveDateTime),
    /// This long after now, by the database's clock.
    After(std::time::Duration),
}

/// Sets or clears the pause of definition `def_id`. Returns whether the
/// row exists.
pub(crate) async fn set<C: ConnectionTrait>(
    conn: &C,
    def_id: i64,
    end: Option<PauseEnd>,
    reason: Option<String>,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let until = match end {
        None => Expr::val(None::<chrono::NaiveDateTime>),
        Some(PauseEnd::OnResume) => Expr::val(clock::far_future()),
        Some(PauseEnd::At(at)) => Expr::val(at),
        Some(PauseEnd::After(d)) => clock::after(backend, d),
    };
    let updated = notify_def::Entity::update_many()
        .col_expr(notify_def::Column::PausedUntil, until)
        .col_expr(notify_def::Column::PauseReason, Expr::val(reason))
        .filter(Expr::col(notify_def::Column::Id).eq(def_id))
        .exec(conn)
        .await?;
    Ok(updated.rows_affected == 1)
}

/// Ends the pause of `def_id` if it holds now (by the database's clock),
/// and clears one that has ended. Returns whether one held.
pub(crate) async fn lift_if_paused<C: ConnectionTrait>(
    conn: &C,
    def_id: i64,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let lifted = notify_def::Entity::update_many()
        .col_expr(
            notify_def::Column::PausedUntil,
            Expr::val(None::<chrono::NaiveDateTime>),
        )
        .col_expr(notify_def::Column::PauseReason, Expr::val(None::<String>))
        .filter(Expr::col(notify_def::Column::Id).eq(def_id))
        .filter(Expr::col(notify_def::Column::PausedUntil).gt(clock::now(backend)))
        .exec(conn)
        .await?;
    set(conn, def_id, None, None).await?;
    Ok(lifted.rows_affected == 1)
}

/// `SELECT id FROM notify_def WHERE paused_until > now`: the definitions
/// paused right now, by the database's clock.
pub(crate) fn paused_now(backend: DbBackend) -> SelectStatement {
    Query::select()
        .column(notify_def::Column::Id)
        .from(notify_def::Entity)
        .and_where(Expr::col(notify_def::Column::PausedUntil).gt(clock::now(backend)))
        .to_owned()
}

/// Pauses `def_id` for `hold` (by the database's clock) with `reason`, only
/// if it is not paused now. Returns whether it did.
pub(crate) async fn open_if_unpaused<C: ConnectionTrait>(
    conn: &C,
    def_id: i64,
    hold: std::time::Duration,
    reason: &str,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let unpaused = Condition::any()
        .add(Expr::col(notify_def::Column::PausedUntil).is_null())
        .add(Expr::col(notify_def::Column::PausedUntil).lte(clock::now(backend)));
    let updated = notify_def::Entity::update_many()
        .col_expr(notify_def::Column::PausedUntil, clock::after(backend, hold))
        .col_expr(notify_def::Column::PauseReason, Expr::val(reason))
        .filter(Expr::col(notify_def::Column::Id).eq(def_id))
        .filter(unpaused)
        .exec(conn)
        .await?;
    Ok(updated.rows_affected == 1)
}

/// The pause of `def_id` whose reason starts with `prefix` (the circuit's
/// own, not an operator's).
fn held_by(def_id: i64, prefix: &str) -> Condition {
    Condition::all()
        .add(Expr::col(notify_def::Column::Id).eq(def_id))
        .add(Expr::col(notify_def::Column::PauseReason).like(format!("{prefix}%")))
}

/// Extends the pause of `def_id` to `hold` from now, with `reason`, if its
/// reason starts with `prefix`. Returns whether it did.
pub(crate) async fn extend_if<C: ConnectionTrait>(
    conn: &C,
    def_id: i64,
    hold: std::time::Duration,
    prefix: &str,
    reason: &str,
) -> Result<bool, DbErr> {
    let backend = conn.get_database_backend();
    let updated = notify_def::Entity::update_many()
        .col_expr(notify_def::Column::PausedUntil, clock::after(backend, hold))
        .col_expr(notify_def::Column::PauseReason, Expr::val(reason))
        .filter(held_by(def_id, prefix))
        .exec(conn)
        .await?;
    Ok(updated.rows_affected == 1)
}

/// Lifts the pause of `def_id` if its reason starts with `prefix`. Returns
/// whether it did.
pub(crate) async fn lift_if<C: ConnectionTrait>(
    conn: &C,
    def_id: i64,
    prefix: &str,
) -> Result<bool, DbErr> {
    let updated = notify_def::Entity::update_many()
        .col_expr(
            notify_def::Column::PausedUntil,
            Expr::val(None::<chrono::NaiveDateTime>),
        )
        .col_expr(notify_def::Column::PauseReason, Expr::val(None::<String>))
        .filter(held_by(def_id, prefix))
        .exec(conn)
        .await?;
    Ok(updated.rows_affected == 1)
}
