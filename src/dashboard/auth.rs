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
/// Failed logins allowed from all addresses together within
/// [`LOGIN_WINDOW`] (guessing from many addresses); past it every address
/// that has not logged in within the last hour is refused with 429 until
/// the window ends: 100.
pub const MAX_FAILED_LOGINS_TOTAL: u32 = 100;

/// Who made a request: the basic-auth user name, or `dashboard`.
#[derive(Debug, Clone)]
pub(super) struct Actor(pub String);

/// Most client addresses the limiter remembers; past that, the oldest
/// windows are forgotten first.
const MAX_TRACKED: usize = 10_000;

/// Failed logins per client address (IPv6 by its /64): when the window
/// started, how many.
#[derive(Debug, Default)]
pub(super) struct Limiter {
    failed: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    /// All addresses' failures: when the window started, how many.
    total: Mutex<Option<(Instant, u32)>>,
    /// Addresses that logged in within [`TRUSTED_FOR`]: the global cap does
    /// not lock them out.
    trusted: Mutex<HashMap<IpAddr, Instant>>,
}

/// How long a good login exempts its address from the global cap: an hour.
const TRUSTED_FOR: Duration = Duration::from_secs(3600);

/// The key of a client address: IPv4 as is, IPv6 by its /64 (one host
/// usually holds a whole /64).
fn client(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

impl Limiter {
    fn blocked(&self, ip: IpAddr) -> bool {
        let ip = client(ip);
        let total = *self.total.lock().unwrap_or_else(|p| p.into_inner());
        let flooded = total.is_some_and(|(since, n)| {
            since.elapsed() < LOGIN_WINDOW && n >= MAX_FAILED_LOGINS_TOTAL
        });
        if flooded {
            let trusted = self.trusted.lock().unwrap_or_else(|p| p.into_inner());
            if trusted
                .get(&ip)
                .is_none_or(|at| at.elapsed() >= TRUSTED_FOR)
            {
                return true;
            }
        }
        let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed
            .get(&ip)
            .is_some_and(|(since, n)| since.elapsed() < LOGIN_WINDOW && *n >= MAX_FAILED_LOGINS)
    }

    /// A good login: its address starts again from no failure.
    fn succeed(&self, ip: IpAddr) {
        let ip = client(ip);
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ip);
        let mut trusted = self.trusted.lock().unwrap_or_else(|p| p.into_inner());
        if trusted.len() >= MAX_TRACKED {
            trusted.retain(|_, at| at.elapsed() < TRUSTED_FOR);
            if trusted.len() >= MAX_TRACKED {
                trusted.clear();
            }
        }
        trusted.insert(ip, Instant::now());
    }

    fn fail(&self, ip: IpAddr) {
        {
            let mut total = self.total.lock().unwrap_or_else(|p| p.into_inner());
            match total.as_mut() {
                Some((since, n)) if since.elapsed() < LOGIN_WINDOW => *n += 1,
                _ => *total = Some((Instant::now(), 1)),
            }
        }
        let ip = client(ip);
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.len() >= MAX_TRACKED {
            failed.retain(|_, (since, _)| since.elapsed() < LOGIN_WINDOW);
            if failed.len() >= MAX_TRACKED {
                let oldest = failed
                    .iter()
                    .min_by_key(|(_, (since, _))| *since)
                    .map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    failed.remove(&oldest);
                }
            }
        }
        let entry = failed.entry(ip).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= LOGIN_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

/// Whether the request's `Host` is a loopback name (any port).
fn loopback_host(request: &Request) -> bool {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().host())
        .unwrap_or("");
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(
        name.to_ascii_lowercase().as_str(),
        "localhost" | "127.0.0.1" | "[::1]"
    )
}

/// Constant-time comparison, also of the length: the SHA-256 digests.
fn same_secret(given: &str, token: &str) -> bool {
    use sha2::{Digest, Sha256};
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(token.as_bytes());
    bool::from(a[..].ct_eq(&b[..]))
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
        // Without a token only a loopback name may be asked for: a page of
        // another site whose name was re-pointed at 127.0.0.1 (DNS
        // rebinding) is refused.
        if !loopback_host(&request) {
            return (
                StatusCode::MISDIRECTED_REQUEST,
                "without a token the dashboard answers only to localhost, 127.0.0.1 or [::1]\n",
            )
                .into_response();
        }
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
        Some((user, secret)) if same_secret(&secret, token) => {
            state.logins.succeed(ip);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_flood_locks_out_strangers_but_not_who_logged_in() {
        let limiter = Limiter::default();
        let operator: IpAddr = "10.0.0.1".parse().unwrap();
        limiter.succeed(operator);
        for i in 0..MAX_FAILED_LOGINS_TOTAL {
            let guesser = IpAddr::V4(Ipv4Addr::new(192, 0, 2, (i % 200) as u8));
            assert!(!limiter.blocked("198.51.100.7".parse().unwrap()), "{i}");
            limiter.fail(guesser);
        }
        assert!(limiter.blocked("198.51.100.7".parse().unwrap()));
        assert!(!limiter.blocked(operator));
    }

    #[test]
    fn a_good_login_clears_its_address() {
        let limiter = Limiter::default();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 1..MAX_FAILED_LOGINS {
            limiter.fail(ip);
        }
        assert!(!limiter.blocked(ip));
        limiter.succeed(ip);
        for _ in 1..MAX_FAILED_LOGINS {
            limiter.fail(ip);
        }
        assert!(!limiter.blocked(ip), "counted from the good login");
        limiter.fail(ip);
        assert!(limiter.blocked(ip));
    }
}
