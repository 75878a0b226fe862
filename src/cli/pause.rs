//! `solid-notify pause` and `resume`: a definition's notices held back, then
//! let go.

use sea_orm::DatabaseConnection;
use solid_notify::{
    Notifier,
    ops::{Audit, PauseEnd, When},
};

use super::common::default_actor;

/// `pause`: until a time, for a while, or until `resume`.
pub(crate) async fn pause(
    db: DatabaseConnection,
    def: String,
    until: Option<When>,
    reason: String,
    actor: Option<String>,
) -> solid_notify::Result<()> {
    let end = match until {
        None => PauseEnd::OnResume,
        Some(When::At(t)) => PauseEnd::At(t),
        Some(When::Offset(d)) => PauseEnd::After(d),
    };
    let audit = Audit::new(actor.unwrap_or_else(default_actor), reason);
    Notifier::builder(db)
        .build()?
        .pause(&def, end, &audit)
        .await?;
    println!("{def} paused");
    Ok(())
}

/// `resume`: the pause ends now.
pub(crate) async fn resume(db: DatabaseConnection, def: String) -> solid_notify::Result<()> {
    Notifier::builder(db)
        .build()?
        .resume(&def, &Audit::operator())
        .await?;
    println!("{def} resumed");
    Ok(())
}
