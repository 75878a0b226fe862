//! Entity: sea-orm models of the three tables (`notify_def`, `notify_msg`,
//! `notify_msg_history`). Times are UTC, stored without a zone.

pub mod notify_def;
pub mod notify_msg;
pub mod notify_msg_history;
