//! Integration tests: every database test runs on SQLite, PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[path = "../common/receiver.rs"]
mod receiver;

#[path = "../common/proxy.rs"]
mod proxy;

#[path = "../common/mock.rs"]
mod mock;

mod amqp;
mod axum_orders;
mod baseline;
mod browser;
mod census;
mod committed;
mod dashboard;
mod defs;
mod delayed;
mod docs;
mod due_index;
mod encrypt;
mod events;
mod exposure;
mod faults;
mod hardening;
mod health;
mod history;
mod http;
mod idempotent;
mod inputs;
mod keys;
mod legacy;
mod mail;
mod many_defs;
mod migrations;
mod ops;
mod ordered;
mod partitions;
mod pins;
mod poison;
mod pooler;
mod producer;
mod rate;
mod retry;
mod schema;
mod smtp;
mod steps;
mod trace;
mod untrusted;
mod wake;
mod worker;
