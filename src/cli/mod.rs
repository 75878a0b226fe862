//! The commands of the `solid-notify` binary, one module each (`main.rs`
//! parses the arguments and dispatches); [`common`] holds what several share.
//! A command module imports only `common`, never another command nor
//! `main.rs`.

pub(crate) mod bulk;
pub(crate) mod common;
pub(crate) mod defs;
pub(crate) mod find;
pub(crate) mod keys;
pub(crate) mod pause;
pub(crate) mod purge;
#[cfg(feature = "dashboard")]
pub(crate) mod serve;
pub(crate) mod worker;
