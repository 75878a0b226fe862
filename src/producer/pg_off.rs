//! Without the `postgres` feature a notifier refuses a PostgreSQL
//! connection (`db::check_backend`, even when sea-orm has the driver from
//! another crate), so no [`PgTx`] can be made: it has no values, and the
//! PostgreSQL arms of
//! [`NoticeTx`](super::tx::NoticeTx) are never reached. The methods have
//! the real one's shape (`pg.rs`).

use sea_orm::{DbErr, ExecResult, QueryResult, Statement};

use crate::{
    error::Result,
    state::{ids::IdBlocks, insert::NewRow},
};

/// A PostgreSQL transaction, of which there are none in this build.
pub(crate) enum PgTx {}

#[allow(clippy::unused_async)]
impl PgTx {
    pub async fn break_with(&self, _: String) {
        match *self {}
    }

    pub fn undo_later(&self, _: String) {
        match *self {}
    }

    pub async fn open_savepoint(&self, _: &str) -> std::result::Result<(), DbErr> {
        match *self {}
    }

    pub async fn end_savepoint(&self, _: &str, _: bool) -> std::result::Result<(), DbErr> {
        match *self {}
    }

    pub async fn alive(&self) -> std::result::Result<(), String> {
        match *self {}
    }

    pub async fn check_later(&self, _: String) {
        match *self {}
    }

    pub async fn write_now(&self, _: &[(i64, NewRow)]) -> Result<()> {
        match *self {}
    }

    pub async fn execute(&self, _: Statement) -> std::result::Result<ExecResult, DbErr> {
        match *self {}
    }

    pub async fn execute_unprepared(&self, _: &str) -> std::result::Result<ExecResult, DbErr> {
        match *self {}
    }

    pub async fn query_all(&self, _: Statement) -> std::result::Result<Vec<QueryResult>, DbErr> {
        match *self {}
    }

    pub async fn query_one(&self, _: Statement) -> std::result::Result<Option<QueryResult>, DbErr> {
        match *self {}
    }

    pub async fn next_id(&self, _: &IdBlocks) -> std::result::Result<i64, DbErr> {
        match *self {}
    }

    pub async fn commit(&self, _: &[(i64, NewRow)]) -> Result<()> {
        match *self {}
    }

    pub async fn rollback(&self) -> std::result::Result<(), DbErr> {
        match *self {}
    }
}
