//! `solid-notify serve`: the operator dashboard and its JSON API until
//! SIGINT or SIGTERM.

use sea_orm::DatabaseConnection;
use solid_notify::Notifier;
use tokio_util::sync::CancellationToken;

use super::common::stop_signal;

/// Serves the dashboard at `addr` until a stop signal.
pub(crate) async fn run(
    db: DatabaseConnection,
    addr: std::net::SocketAddr,
    token: Option<String>,
    allow_actions: bool,
) -> solid_notify::Result<()> {
    let notifier = Notifier::builder(db).build()?;
    let config = solid_notify::dashboard::DashboardConfig {
        allow_actions,
        token,
        ..solid_notify::dashboard::DashboardConfig::default()
    };
    let shutdown = CancellationToken::new();
    let (bound, served) =
        solid_notify::dashboard::serve(notifier, addr, config, shutdown.clone()).await?;
    println!("dashboard: http://{bound}/");
    stop_signal().await;
    shutdown.cancel();
    served.await.ok();
    Ok(())
}
