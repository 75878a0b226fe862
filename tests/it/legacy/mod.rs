//! The 24 migrations solid-notify grew before its first release, kept only
//! to check that the baseline builds the very schema they built (ADR 0013,
//! `baseline.rs`), and that a database they migrated is adopted.

#![allow(dead_code)]

use migration::{MIGRATION_TABLE, MigrationTrait, MigratorTrait};
use sea_orm_migration::prelude::*;

mod m20261122_000001_create_tables;
mod m20261122_000002_alert_def;
mod m20261123_000003_lease_flag;
mod m20261124_000004_wake_trigger;
mod m20261125_000005_pause;
mod m20261126_000006_trace_context;
mod m20261127_000007_worker_heartbeat;
mod m20261128_000008_error_policy;
mod m20261129_000009_retry_shape;
mod m20261130_000010_idempotency_key;
mod m20261201_000011_rate_limit;
mod m20261202_000012_ordering;
mod m20261203_000013_steps;
mod m20261204_000014_set_aside_at_insert;
mod m20261205_000015_history_key_partial;
mod m20261206_000016_hot_claim;
mod m20261207_000017_run_claim;
mod m20261208_000018_def_touched;
mod m20261209_000019_paused_index;
mod m20261210_000020_not_before;
mod m20261211_000021_events_to;
mod m20261212_000022_encrypt;
mod m20261213_000023_untrusted_rows;
mod m20261214_000024_origin;

/// The pre-release chain, recorded in the same table as the baseline.
pub struct Legacy;

#[async_trait::async_trait]
impl MigratorTrait for Legacy {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261122_000001_create_tables::Migration),
            Box::new(m20261122_000002_alert_def::Migration),
            Box::new(m20261123_000003_lease_flag::Migration),
            Box::new(m20261124_000004_wake_trigger::Migration),
            Box::new(m20261125_000005_pause::Migration),
            Box::new(m20261126_000006_trace_context::Migration),
            Box::new(m20261127_000007_worker_heartbeat::Migration),
            Box::new(m20261128_000008_error_policy::Migration),
            Box::new(m20261129_000009_retry_shape::Migration),
            Box::new(m20261130_000010_idempotency_key::Migration),
            Box::new(m20261201_000011_rate_limit::Migration),
            Box::new(m20261202_000012_ordering::Migration),
            Box::new(m20261203_000013_steps::Migration),
            Box::new(m20261204_000014_set_aside_at_insert::Migration),
            Box::new(m20261205_000015_history_key_partial::Migration),
            Box::new(m20261206_000016_hot_claim::Migration),
            Box::new(m20261207_000017_run_claim::Migration),
            Box::new(m20261208_000018_def_touched::Migration),
            Box::new(m20261209_000019_paused_index::Migration),
            Box::new(m20261210_000020_not_before::Migration),
            Box::new(m20261211_000021_events_to::Migration),
            Box::new(m20261212_000022_encrypt::Migration),
            Box::new(m20261213_000023_untrusted_rows::Migration),
            Box::new(m20261214_000024_origin::Migration),
        ]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(MIGRATION_TABLE).into_iden()
    }
}
