//! Integration tests: every database test runs on SQLite, PostgreSQL and MariaDB.

mod support;

mod defs;
mod inputs;
mod producer;
mod retry;
