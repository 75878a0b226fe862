//! Dashboard: the operator's web pages and a JSON API, a face on the same
//! library calls as the CLI ([`crate::ops`]). Served by `solid-notify serve`,
//! or mounted by an application from [`router`].
//!
//! - Pages (server-rendered HTML, no script needed): overview, notices in
//!   flight and in history with the CLI's filters, a notice's detail,
//!   definitions, and bulk requeue/cancel with a confirmation step that
//!   acts on exactly the notices it counted ([`PIN_TTL`]).
//! - JSON under `/api/` from the same handlers' data.
//! - **Read-only** unless [`DashboardConfig::allow_actions`].
//! - **Auth**: with [`DashboardConfig::token`] every request needs
//!   `Authorization: Bearer TOKEN` or HTTP basic auth with the token as
//!   password (any user name, which becomes the audit actor). Failed
//!   attempts are limited per client address ([`MAX_FAILED_LOGINS`] per
//!   [`LOGIN_WINDOW`]). [`serve`] refuses a non-loopback address without a
//!   token.
//! - **CSRF**: every form carries a token that must match the `sn_csrf`
//!   cookie (SameSite=Strict); API writes must be `application/json`.
//! - Everything shown is escaped (maud escapes every interpolation).

mod api;
mod auth;
mod chart;
mod csrf;
mod pages;
mod pins;
mod search;
mod view;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    routing::{get, post},
};
use tokio_util::sync::CancellationToken;

// Limits, for the tests (docs/operating.md states them).
#[doc(hidden)]
pub use auth::{LOGIN_WINDOW, MAX_FAILED_LOGINS, MAX_FAILED_LOGINS_TOTAL};
#[doc(hidden)]
pub use pins::{MAX_PINNED_TOTAL, MAX_PINS, PIN_TTL};
#[doc(hidden)]
pub use view::{MAX_SEARCH_CHARS, MAX_SEARCHES, PARAM_EXCERPT, SEARCH_TIMEOUT};

use crate::{
    error::{Error, Result},
    notifier::Notifier,
};

/// Default address of `solid-notify serve`: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// Notices per page of a listing, unless the request says otherwise.
pub const DEFAULT_PAGE: u64 = 50;

/// How the dashboard behaves. `Debug` hides the token.
#[derive(Clone, Default)]
pub struct DashboardConfig {
    /// Allow requeue, cancel, bulk actions, pause and resume. Default:
    /// `false` (read-only: the action buttons are not shown and the routes
    /// answer 403).
    pub allow_actions: bool,
    /// The bearer token / basic-auth password required on every request.
    /// Default: none (only allowed on a loopback address).
    pub token: Option<String>,
    /// The path the router is mounted under (e.g. `/ops`), for links.
    /// Default: empty (the root).
    pub base_path: String,
    /// Longest a listing may take: answered 503 then, its statements
    /// stopped by the database. Default: `None`, [`SEARCH_TIMEOUT`] (10 s);
    /// at most 24 days (longer is taken as 24 days).
    pub search_timeout: Option<std::time::Duration>,
}

impl DashboardConfig {
    /// [`search_timeout`](Self::search_timeout), or its default.
    /// At most 24 days: PostgreSQL's `statement_timeout` takes no more,
    /// and a deadline that far is "no limit" all the same.
    fn listing_timeout(&self) -> std::time::Duration {
        const LONGEST: std::time::Duration = std::time::Duration::from_secs(24 * 24 * 3600);
        self.search_timeout.unwrap_or(SEARCH_TIMEOUT).min(LONGEST)
    }
}

impl std::fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("allow_actions", &self.allow_actions)
            .field("token", &self.token.as_ref().map(|_| crate::redact::HIDDEN))
            .field("base_path", &self.base_path)
            .field("search_timeout", &self.search_timeout)
            .finish()
    }
}

#[derive(Clone)]
struct AppState {
    notifier: Notifier,
    config: Arc<DashboardConfig>,
    logins: Arc<auth::Limiter>,
    /// What bulk confirmations counted, until confirmed.
    pins: Arc<pins::Pins>,
    /// Listings running now ([`MAX_SEARCHES`]).
    searches: Arc<tokio::sync::Semaphore>,
    /// SQLite: the listings' own pool, whose statements stop at their
    /// time ([`search::sqlite_pool`]).
    search_pool: Option<sea_orm::DatabaseConnection>,
    /// MySQL protocol: whether the server is MariaDB (asked once).
    mariadb: Arc<tokio::sync::OnceCell<bool>>,
}

impl AppState {
    /// A link to `path` (starting with `/`) under the mount point; the
    /// root of a nested router is the mount point itself.
    fn link(&self, path: &str) -> String {
        let base = self.config.base_path.trim_end_matches('/');
        match (base, path) {
            ("", _) => path.to_string(),
            (base, "/") => base.to_string(),
            (base, path) => format!("{base}{path}"),
        }
    }

    /// A link to a definition's `action` (its name percent-encoded as one
    /// path segment).
    fn def_link(&self, name: &str, action: &str) -> String {
        let name = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
        self.link(&format!("/defs/{name}/{action}"))
    }
}

/// The dashboard's routes, with its auth and CSRF layers, to serve or to
/// nest under [`DashboardConfig::base_path`] in an application's router.
/// Serve it with connect info (`into_make_service_with_connect_info`) so
/// failed logins are limited per client address.
pub fn router(notifier: Notifier, config: DashboardConfig) -> Router {
    let search_pool = search::sqlite_pool(notifier.db(), MAX_SEARCHES, config.listing_timeout());
    let state = AppState {
        notifier,
        config: Arc::new(config),
        logins: Arc::new(auth::Limiter::default()),
        pins: Arc::default(),
        searches: Arc::new(tokio::sync::Semaphore::new(MAX_SEARCHES)),
        search_pool,
        mariadb: Arc::default(),
    };
    Router::new()
        .route("/", get(pages::overview))
        .route("/notices", get(pages::notices))
        .route("/notices/{id}", get(pages::notice))
        .route("/notices/{id}/requeue", post(pages::requeue))
        .route("/notices/{id}/cancel", post(pages::cancel))
        .route("/bulk", get(pages::bulk_confirm).post(pages::bulk_run))
        .route("/defs", get(pages::defs))
        .route("/keys/blocked", get(pages::keys_blocked))
        .route("/defs/{name}/pause", post(pages::pause))
        .route("/defs/{name}/resume", post(pages::resume))
        .route("/assets/style.css", get(pages::style))
        .route("/api/overview", get(api::overview))
        .route("/api/notices", get(api::notices))
        .route("/api/notices/{id}", get(api::notice))
        .route("/api/notices/{id}/requeue", post(api::requeue))
        .route("/api/notices/{id}/cancel", post(api::cancel))
        .route("/api/bulk", post(api::bulk))
        .route("/api/defs", get(api::defs))
        .route("/api/keys/blocked", get(api::keys_blocked))
        .route("/api/defs/{name}/pause", post(api::pause))
        .route("/api/defs/{name}/resume", post(api::resume))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            csrf::layer,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::layer,
        ))
        .layer(axum::middleware::map_response(csrf::secure))
        .with_state(state)
}

/// Serves the dashboard on `addr` until `shutdown`; returns the bound
/// address (port 0: any free port). Refuses an address that is not
/// loopback unless a token is configured.
pub async fn serve(
    notifier: Notifier,
    addr: SocketAddr,
    config: DashboardConfig,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    if !addr.ip().is_loopback() && config.token.as_deref().is_none_or(str::is_empty) {
        return Err(Error::Config(format!(
            "refusing to serve the dashboard on {addr} without a token: set --token or \
             SOLID_NOTIFY_DASHBOARD_TOKEN, or bind a loopback address"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("dashboard address {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("dashboard address {addr}: {e}")))?;
    let app = router(notifier, config);
    let task = tokio::spawn(crate::listener::serve(listener, app, shutdown));
    Ok((bound, task))
}
