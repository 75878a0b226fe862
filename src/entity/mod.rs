//! Entity: sea-orm models of the tables (`notify_def`, `notify_msg`,
//! `notify_msg_history`, `notify_worker`). Times are UTC, stored without a zone.

pub mod notify_def;
pub mod notify_msg;
pub mod notify_msg_history;
pub mod notify_worker;
pub(crate) mod read;
