//! Ids: notice ids handed out before their row is written (PostgreSQL's
//! buffered inserts), taken from the table's own sequence in blocks, so that
//! `add_notice` can answer with the id at once and the row can still be
//! written together with the commit. Ids of a block a process never uses are
//! simply skipped; ids are unique, not ordered by time across processes.
//! Used only with the `postgres` feature.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::{collections::VecDeque, sync::Mutex};

/// Ids fetched from the sequence at a time: 100.
pub const ID_BLOCK: u32 = 100;

/// The statement that takes a block of ids from `notify_msg`'s sequence.
pub(crate) fn block_sql() -> String {
    format!(
        "SELECT nextval(pg_get_serial_sequence('notify_msg', 'id')) FROM generate_series(1, {ID_BLOCK})"
    )
}

/// Ids taken from the sequence and not handed out yet.
#[derive(Debug, Default)]
pub(crate) struct IdBlocks {
    free: Mutex<VecDeque<i64>>,
}

impl IdBlocks {
    /// The next free id, if any is left.
    pub fn take(&self) -> Option<i64> {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Adds a fetched block.
    pub fn put(&self, ids: impl IntoIterator<Item = i64>) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(ids);
    }
}
