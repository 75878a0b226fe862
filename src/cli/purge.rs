//! `solid-notify purge`: old history deleted in batches, archived first when
//! asked.

use sea_orm::DatabaseConnection;
use solid_notify::ops::Purge;

use super::common::print_json;

/// Runs `purge` and prints its report.
pub(crate) async fn run(
    db: &DatabaseConnection,
    purge: Purge,
    json: bool,
) -> solid_notify::Result<()> {
    let report = solid_notify::ops::purge::purge(db, &purge)
        .await
        .map_err(|e| {
            eprintln!("{}", e.done);
            e.error
        })?;
    if json {
        print_json(&serde_json::to_value(&report));
    } else {
        println!("{report}");
    }
    Ok(())
}
