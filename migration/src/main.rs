//! `cargo run -p solid-notify-migration -- up`: the sea-orm-migration CLI for solid-notify's tables.

use sea_orm_migration::prelude::*;

#[tokio::main]
async fn main() {
    cli::run_cli(solid_notify_migration::Migrator).await;
}
