//! Auth: a bearer token or basic auth (the token as password), checked in
//! constant time, with failed attempts limited per client address.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;
use subtle::ConstantTimeEq;

use super::AppState;

/// Failed logins allowed per client address within [`LOGIN_WINDOW`]; more
/// are refused with 429 until the window ends: 5.
pub const MAX_FAILED_LOGINS: u32 = 5;
/// The window of [`MAX_FAILED_LOGINS`]: one minute.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// Who made a request: the basic-auth user name, or `dashboard`.
#[derive(Debug, Clone)]
pub(super) struct Actor(pub String);

/// Failed logins per client address: when the window started, how many.
#[derive(Debug, Default)]
pub(super) struct Limiter {
    failed: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Limiter {
    fn blocked(&self, ip: IpAddr) -> bool {
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed
            .get(&ip)
            .is_some_and(|(since, n)| since.elapsed() < LOGIN_WINDOW && *n >= MAX_FAILED_LOGINS)
    }

    fn fail(&self, ip: IpAddr) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.retain(|_, (since, _)| since.elapsed() < LOGIN_WINDOW);
        let entry = failed.entry(ip).or_insert((Instant::now(), 0));
        entry.1 += 1;
    }
}

/// The credentials of a request: `(user, secret)`.
fn credentials(request: &Request) -> Option<(String, String)> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(("dashboard".into(), rest.trim().to_string()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, pass) = text.split_once(':')?;
        let user = if user.is_empty() { "dashboard" } else { user };
        return Some((user.to_string(), pass.to_string()));
    }
    None
}

/// Checks the request's credentials when a token is configured, and puts
/// the [`Actor`] in its extensions.
pub(super) async fn layer(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(token) = state.config.token.as_deref().filter(|t| !t.is_empty()) else {
        request.extensions_mut().insert(Actor("dashboard".into()));
        return next.run(request).await;
    };
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
    if state.logins.blocked(ip) {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, LOGIN_WINDOW.as_secs().to_string())],
            "too many failed logins; try again later\n",
        )
            .into_response();
    }
    match credentials(&request) {
        Some((user, secret)) if bool::from(secret.as_bytes().ct_eq(token.as_bytes())) => {
            request.extensions_mut().insert(Actor(user));
            next.run(request).await
        }
        given => {
            if given.is_some() {
                state.logins.fail(ip);
            }
            let mut response =
                (StatusCode::UNAUTHORIZED, "authentication required\n").into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"solid-notify\", charset=\"UTF-8\""),
            );
            response
        }
    }
}
