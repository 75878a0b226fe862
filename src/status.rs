//! Status: the life-cycle state of a notice, as stored in the `status` column.

use sea_orm::entity::prelude::*;
use serde::Serialize;

/// State of a notice row (`notify_msg.status` / `notify_msg_history.status`).
///
/// Rows in `notify_msg` are always [`NotSent`](Status::NotSent),
/// [`Failed`](Status::Failed) or [`AwaitingConfirm`](Status::AwaitingConfirm);
/// terminal states ([`Succeeded`](Status::Succeeded),
/// [`FinalFailure`](Status::FinalFailure), [`Cancelled`](Status::Cancelled),
/// [`Parked`](Status::Parked)) live in `notify_msg_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize)]
#[sea_orm(rs_type = "i16", db_type = "SmallInteger")]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// 0: not attempted yet.
    #[sea_orm(num_value = 0)]
    NotSent,
    /// 1: delivered (and confirmed, when the definition needs it). Terminal.
    #[sea_orm(num_value = 1)]
    Succeeded,
    /// 2: the last attempt failed; another is scheduled at `next_call_time`.
    #[sea_orm(num_value = 2)]
    Failed,
    /// 3: retries exhausted or a permanent failure. Terminal.
    #[sea_orm(num_value = 3)]
    FinalFailure,
    /// 4: sent, waiting for confirmation until `next_call_time`.
    #[sea_orm(num_value = 4)]
    AwaitingConfirm,
    /// 5: cancelled by an operator. Terminal.
    #[sea_orm(num_value = 5)]
    Cancelled,
    /// 6: set aside because its definition is unknown, deleted or invalid
    /// (the reason is in `errors`); requeue it once the definition is fixed.
    /// Terminal until then.
    #[sea_orm(num_value = 6)]
    Parked,
}

impl Status {
    /// The states a sweeper picks up when they are due.
    pub const DUE: [Status; 3] = [Status::NotSent, Status::Failed, Status::AwaitingConfirm];

    /// Whether this state only appears in `notify_msg_history`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Succeeded | Status::FinalFailure | Status::Cancelled | Status::Parked
        )
    }

    /// Whether an operator may requeue a notice in this state: final
    /// failures, cancelled and parked notices.
    pub fn is_requeueable(self) -> bool {
        matches!(
            self,
            Status::FinalFailure | Status::Cancelled | Status::Parked
        )
    }

    /// Parses the name shown by [`Display`](std::fmt::Display) or the number.
    pub fn parse(text: &str) -> Option<Status> {
        use sea_orm::Iterable;
        Status::iter().find(|s| s.to_string() == text || (*s as i16).to_string() == text)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Status::NotSent => "not_sent",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::FinalFailure => "final_failure",
            Status::AwaitingConfirm => "awaiting_confirm",
            Status::Cancelled => "cancelled",
            Status::Parked => "parked",
        };
        f.write_str(s)
    }
}

/// Who wrote a notice (`notify_msg.origin` / `notify_msg_history.origin`).
///
/// The library writes [`Alert`](Origin::Alert) and [`Event`](Origin::Event)
/// rows itself; every notice a producer adds, through the library or in
/// plain SQL (the column's default), is a [`Producer`](Origin::Producer)
/// notice. The description is free text: it never decides the origin.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize,
)]
#[sea_orm(rs_type = "i16", db_type = "SmallInteger")]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// 0: added by a producer (the default).
    #[default]
    #[sea_orm(num_value = 0)]
    Producer,
    /// 1: an alert e-mail about another notice.
    #[sea_orm(num_value = 1)]
    Alert,
    /// 2: an operational event (`docs/events.md`); its failures raise no
    /// further events.
    #[sea_orm(num_value = 2)]
    Event,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Producer => "producer",
            Origin::Alert => "alert",
            Origin::Event => "event",
        })
    }
}
