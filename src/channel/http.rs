//! HTTP: a notice is a request to the target URL with the param as its body.
//!
//! Headers tell the receiver what it got, so it can stay idempotent:
//! `X-Notice-Id`, `X-Notice-Def`, `X-Notice-Attempt`, `Idempotency-Key`
//! (a key holding `%`, control characters, spaces at either end or
//! non-ASCII is sent percent-encoded: one header per key)
//! (and `X-Notice-Step`, 1-based, for a definition of several steps),
//! and the W3C `traceparent` / `tracestate` of the producer's trace when it
//! had one ([`crate::trace`]).
//! With `signing_secret` set, `X-Notice-Timestamp` (Unix seconds) and
//! `X-Notice-Signature: sha256=<hex>` carry an HMAC-SHA256 of
//! `"<timestamp>.<body>"` keyed with the secret of that name, taken from
//! [`Config::secrets`](crate::Config) or else the environment variable
//! `SOLID_NOTIFY_SECRET_<NAME>` ([`SECRET_ENV_PREFIX`]; never another
//! variable, so a name is no oracle for the process's environment): the
//! secret never lives in `notify_def`. An empty secret counts as missing.
//! Redirects are not followed: a 3xx is a failure, retried, so a receiver
//! cannot send the request, its headers and signature elsewhere.
//!
//! Header values may name a secret (`{ secret = "NAME" }`), looked up the
//! same way when sending.
//!
//! The network guard: a request goes only to public addresses. A host
//! name is resolved and its private, loopback, link-local, shared
//! (100.64/10), reserved, multicast and documentation addresses are
//! dropped ([`is_public`]); an IP literal is checked as given. With no
//! address left the notice fails for good, naming the host and the
//! setting. [`Config::allow_private_network`](crate::Config) lifts the
//! guard for every definition, a target's `allow_private_network` for its
//! own URL. The addresses checked are the ones connected to (no second
//! lookup for a rebinding DNS to answer). The guarded client ignores the
//! environment's proxy (`HTTP_PROXY`, …), which would resolve names where
//! the guard cannot see them; a worker that must go out through a proxy
//! lifts the guard and leaves egress to the proxy. A refusal is retried
//! like any failure an operator can fix (the notice fails for good once
//! its retries are spent), as is a request that cannot be built.
//!
//! Outcomes: 2xx is success (when `expected_body` is set, the trimmed body
//! must equal it); connection errors, timeouts, 408, 429 and 5xx are retried;
//! other 4xx fail for good unless the target sets `retry_4xx`.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use sha2::Sha256;

use crate::{
    def::{HeaderValue, HttpTarget, TargetUrl},
    error::{Error, Result},
    handler::{Notice, Outcome},
};

/// Default request timeout when the target sets none: 10 seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The prefix of the environment variables a signing secret may come
/// from: `SOLID_NOTIFY_SECRET_` (secret `hook` in
/// `SOLID_NOTIFY_SECRET_hook`).
pub const SECRET_ENV_PREFIX: &str = "SOLID_NOTIFY_SECRET_";
/// Bytes of the response body quoted in a failure reason.
pub const BODY_EXCERPT: usize = 200;
/// Most bytes of a response body read: 64 KiB. The rest is not read (the
/// connection is closed), so a receiver's endless or huge answer costs
/// neither memory nor the attempt's time; such a body never equals a
/// target's `expected_body`.
const RESPONSE_BODY_LIMIT: usize = 64 * 1024;

/// The shared HTTP clients (one connection pool for every notice).
pub(crate) struct HttpChannel {
    /// Guarded by [`Guard`] unless the config lifts the guard.
    client: reqwest::Client,
    /// Unguarded, for targets that allow private addresses; `None` when
    /// `client` is unguarded already.
    open: Option<reqwest::Client>,
    secrets: HashMap<String, String>,
}

impl HttpChannel {
    pub fn new(secrets: HashMap<String, String>, allow_private_network: bool) -> Result<Self> {
        let builder = || {
            reqwest::Client::builder()
                .user_agent(concat!("solid-notify/", env!("CARGO_PKG_VERSION")))
                .redirect(reqwest::redirect::Policy::none())
        };
        let build = |b: reqwest::ClientBuilder| {
            b.build()
                .map_err(|e| Error::Config(format!("HTTP client: {e}")))
        };
        let (client, open) = match allow_private_network {
            true => (build(builder())?, None),
            false => (
                build(builder().no_proxy().dns_resolver(Arc::new(Guard)))?,
                Some(build(builder())?),
            ),
        };
        Ok(HttpChannel {
            client,
            open,
            secrets,
        })
    }

    /// The secret `name`: from the config, else `SOLID_NOTIFY_SECRET_<NAME>`;
    /// an empty one counts as missing.
    fn secret(&self, name: &str) -> Option<String> {
        self.secrets
            .get(name)
            .cloned()
            .or_else(|| std::env::var(format!("{SECRET_ENV_PREFIX}{name}")).ok())
            .filter(|secret| !secret.is_empty())
    }

    /// The URL `target` calls: a URL kept as a secret is read now, and never
    /// said (a failure names the secret).
    fn url<'t>(&self, target: &'t HttpTarget) -> Result<std::borrow::Cow<'t, str>, Outcome> {
        let r = match &target.url {
            TargetUrl::Text(url) => return Ok(std::borrow::Cow::Borrowed(url.as_str())),
            TargetUrl::Secret(r) => r,
        };
        let Some(url) = self.secret(&r.secret) else {
            return Err(Outcome::retry(format!(
                "url: secret `{}` is not configured",
                r.secret
            )));
        };
        match crate::def::check_url(&url) {
            Ok(()) => Ok(std::borrow::Cow::Owned(url)),
            Err(_) => Err(Outcome::retry(format!(
                "url: secret `{}` is not an http(s) URL with a host",
                r.secret
            ))),
        }
    }

    /// Sends one request, bounded by the target's timeout and the attempt's.
    pub async fn send(
        &self,
        target: &HttpTarget,
        notice: &Notice,
        body: &str,
        attempt_timeout: Duration,
    ) -> Outcome {
        let method = Method::from_bytes(target.method.as_bytes()).unwrap_or(Method::POST);
        let timeout = request_timeout(target, attempt_timeout);
        let url = match self.url(target) {
            Ok(url) => url,
            Err(outcome) => return outcome,
        };
        // A URL kept as a secret is never said, its host included.
        let secret = match &target.url {
            TargetUrl::Secret(r) => Some(r.secret.as_str()),
            TargetUrl::Text(_) => None,
        };
        let client = match self.client_for(target, &url, secret) {
            Ok(client) => client,
            Err(outcome) => return outcome,
        };
        let request = client.request(method, url.as_ref()).timeout(timeout);
        let request = with_notice_headers(request, target, notice);
        let request = match self.with_target_headers(request, target) {
            Ok(request) => request,
            Err(outcome) => return outcome,
        };
        let request = match self.signed(request, target, body) {
            Ok(request) => request,
            Err(outcome) => return outcome,
        };
        let response = match request.body(body.to_string()).send().await {
            Ok(response) => response,
            Err(e) => return send_failure(e, timeout, secret),
        };
        let status = response.status();
        let text = match read_body(response).await {
            Ok(text) => text,
            Err(e) => {
                return Outcome::retry(match secret {
                    Some(_) => format!("HTTP {status}: reading body failed"),
                    None => format!(
                        "HTTP {status}: reading body failed: {}",
                        error_chain(&e.without_url())
                    ),
                });
            }
        };
        // A receiver's body may echo the URL (a redirect's, an error
        // page's path): not quoted for a URL kept as a secret.
        classify(target, status, &text, secret)
    }

    /// The client for `target`: the unguarded one when the target may reach
    /// private addresses, else the guarded one, refusing a non-public IP
    /// literal (not named when the URL is the `secret`'s).
    fn client_for(
        &self,
        target: &HttpTarget,
        url: &str,
        secret: Option<&str>,
    ) -> Result<&reqwest::Client, Outcome> {
        match (&self.open, target.allow_private_network) {
            (Some(open), true) => Ok(open),
            (None, _) => Ok(&self.client),
            (Some(_), false) => {
                if let Some(refused) = reqwest::Url::parse(url)
                    .ok()
                    .and_then(|url| refused_literal(&url))
                {
                    return Err(Outcome::retry(match secret {
                        Some(name) => secret_refused(name),
                        None => format!("HTTP request refused: {refused}"),
                    }));
                }
                Ok(&self.client)
            }
        }
    }

    /// `request` with the target's own headers, a secret's value read now;
    /// a retry naming the header and the secret when one is not configured.
    fn with_target_headers(
        &self,
        mut request: reqwest::RequestBuilder,
        target: &HttpTarget,
    ) -> Result<reqwest::RequestBuilder, Outcome> {
        for (name, value) in &target.headers {
            let value = match value {
                HeaderValue::Text(text) => text.clone(),
                HeaderValue::Secret(r) => match self.secret(&r.secret) {
                    Some(secret) => secret,
                    None => {
                        return Err(Outcome::retry(format!(
                            "header `{name}`: secret `{}` is not configured",
                            r.secret
                        )));
                    }
                },
            };
            request = request.header(name, value);
        }
        Ok(request)
    }

    /// `request` with the timestamp and signature headers when the target
    /// names a signing secret; a retry when that secret is not configured.
    fn signed(
        &self,
        mut request: reqwest::RequestBuilder,
        target: &HttpTarget,
        body: &str,
    ) -> Result<reqwest::RequestBuilder, Outcome> {
        if let Some(name) = &target.signing_secret {
            let Some(secret) = self.secret(name) else {
                return Err(Outcome::retry(format!(
                    "signing secret `{name}` is not configured"
                )));
            };
            let timestamp = chrono::Utc::now().timestamp().to_string();
            request = request
                .header("x-notice-timestamp", &timestamp)
                .header("x-notice-signature", sign(&secret, &timestamp, body));
        }
        Ok(request)
    }
}

/// The request's timeout: the target's (the default when it sets none or
/// one that does not parse), at most the attempt's.
fn request_timeout(target: &HttpTarget, attempt_timeout: Duration) -> Duration {
    target
        .timeout
        .as_deref()
        .and_then(|t| crate::schedule::parse_interval(t).ok())
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(attempt_timeout)
}

/// `request` with the headers that tell the receiver what it got: the
/// content type, the notice's id, definition, attempt, key and step, and
/// the trace's headers the target does not set itself.
fn with_notice_headers(
    request: reqwest::RequestBuilder,
    target: &HttpTarget,
    notice: &Notice,
) -> reqwest::RequestBuilder {
    let mut request = request
        .header("content-type", "application/json")
        .header("x-notice-id", notice.id)
        .header("x-notice-def", &notice.def)
        .header("x-notice-attempt", notice.attempt)
        .header(
            "idempotency-key",
            header_safe(&notice.idempotency_key).as_ref(),
        );
    if notice.steps > 1 {
        request = request.header("x-notice-step", notice.step.saturating_add(1));
    }
    // The target's own headers win over the trace's (no duplicates).
    let trace = notice
        .trace_headers
        .iter()
        .filter(|(name, _)| !target.headers.keys().any(|k| k.eq_ignore_ascii_case(name)));
    for (name, value) in trace {
        request = request.header(name, value);
    }
    request
}

/// The refusal of a URL kept as secret `name`: neither its host nor its
/// address is said.
fn secret_refused(name: &str) -> String {
    format!(
        "HTTP request refused: the URL of secret `{name}` is not a public address (allow it with the target's allow_private_network or Config::allow_private_network)"
    )
}

/// At most [`RESPONSE_BODY_LIMIT`] bytes of `response`'s body, as text
/// (invalid UTF-8 replaced); the rest is left unread.
async fn read_body(mut response: reqwest::Response) -> Result<String, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = RESPONSE_BODY_LIMIT - body.len();
        if chunk.len() >= room {
            body.extend_from_slice(&chunk[..room]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The retry for a request that got no response, `timeout` being its
/// bound. For a URL kept as `secret`, only the kind of failure is said:
/// what the network says (a refused address, a name a certificate does not
/// match, the names it does) may name its host.
fn send_failure(e: reqwest::Error, timeout: Duration, secret: Option<&str>) -> Outcome {
    match (e, secret) {
        (e, _) if e.is_timeout() => Outcome::retry(format!("HTTP timeout after {timeout:?}")),
        (e, Some(name)) if refused_by_guard(&e) => Outcome::retry(secret_refused(name)),
        (e, Some(name)) => Outcome::retry(format!(
            "HTTP request to the URL of secret `{name}` failed ({}); the details are not said, as they may name its host",
            match () {
                () if e.is_builder() => "it could not be built",
                () if e.is_connect() => "no connection",
                _ => "no answer",
            }
        )),
        (e, None) => other_failure(e),
    }
}

/// [`send_failure`] of a URL said in its definition.
fn other_failure(e: reqwest::Error) -> Outcome {
    match e {
        // A request that cannot be built (a header of a hand-edited row
        // or a secret that is no header value) or an address the guard
        // refused: said as such. Without the URL: its query may hold a
        // key; without the header's value: it may be a secret.
        e if e.is_builder() => Outcome::retry(format!(
            "HTTP request could not be built: {}",
            error_chain(&e.without_url())
        )),
        e if refused_by_guard(&e) => Outcome::retry(format!(
            "HTTP request refused: {}",
            error_chain(&e.without_url())
        )),
        e => Outcome::retry(format!(
            "HTTP request failed: {}",
            error_chain(&e.without_url())
        )),
    }
}

/// Whether `ip` is a public address: not private, loopback, link-local,
/// unspecified, shared (100.64/10), benchmarking (198.18/15), reserved
/// (240/4, 0/8, 192.0.0/24, 192.88.99/24), broadcast, multicast or
/// documentation, nor an IPv6 unique-local, link-local, site-local,
/// discard-only, Teredo or local-use NAT64 one, nor one of these embedded
/// in IPv6 (mapped, compatible, SIIT, NAT64 `64:ff9b::/96`, 6to4).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            if v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() {
                return false;
            }
            if let Some(v4) = v6.to_ipv4() {
                return public_v4(v4);
            }
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                return public_v4(embedded(s[6], s[7]));
            }
            // SIIT (::ffff:0:a.b.c.d) carries an IPv4 address too.
            if s[0..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0 {
                return public_v4(embedded(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return public_v4(embedded(s[1], s[2]));
            }
            !((s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                // Teredo: a tunnel to any IPv4 address.
                || (s[0] == 0x2001 && s[1] == 0)
                // Local-use NAT64 (64:ff9b:1::/48): to private IPv4.
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                // Discard-only (100::/64).
                || (s[0] == 0x100 && s[1..4] == [0, 0, 0]))
        }
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || o[0] >= 240
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        || (o[0] == 192 && o[1] == 88 && o[2] == 99)
        || (o[0] == 198 && (o[1] & 0xfe) == 18))
}

/// An address the network guard refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{host}` is {ip}, not a public address (allow it with the target's allow_private_network or Config::allow_private_network)"
)]
struct Refused {
    host: String,
    ip: IpAddr,
}

/// The guard as a resolver: a name's public addresses only.
struct Guard;

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            match (public.is_empty(), all.first()) {
                (true, Some(first)) => Err(Box::new(Refused {
                    host,
                    ip: first.ip(),
                })
                    as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// The refusal of a URL whose host is a non-public IP literal (literals
/// are not resolved, so the [`Guard`] never sees them).
fn refused_literal(url: &reqwest::Url) -> Option<Refused> {
    let ip = match url.host()? {
        url::Host::Ipv4(ip) => IpAddr::V4(ip),
        url::Host::Ipv6(ip) => IpAddr::V6(ip),
        url::Host::Domain(_) => return None,
    };
    (!is_public(ip)).then(|| Refused {
        host: ip.to_string(),
        ip,
    })
}

/// Whether the guard refused `e`'s address.
fn refused_by_guard(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        if inner.downcast_ref::<Refused>().is_some() {
            return true;
        }
        source = inner.source();
    }
    false
}

/// `key` as a header value, one to one: as it is when that is a header
/// value a receiver reads back unchanged (no `%`, no control character, no
/// space at either end, nothing a header refuses); otherwise with `%`,
/// control characters, spaces and non-ASCII percent-encoded. The first
/// kind never holds `%` and the second always does, so two keys never
/// share a header, and a key's header is the same on every attempt.
fn header_safe(key: &str) -> std::borrow::Cow<'_, str> {
    use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
    const ENCODED: &AsciiSet = &CONTROLS.add(b'%').add(b' ');
    let plain = !key.contains('%')
        && !key.contains(char::is_control)
        && !key.starts_with(' ')
        && !key.ends_with(' ')
        && key.is_ascii()
        && reqwest::header::HeaderValue::from_str(key).is_ok();
    match plain {
        true => std::borrow::Cow::Borrowed(key),
        false => utf8_percent_encode(key, ENCODED).into(),
    }
}

/// `sha256=<hex of HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub fn sign(secret: &str, timestamp: &str, body: &str) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The outcome of an answer with `status` and `body`; reasons quote the
/// body's start, except for a URL kept as `secret`.
fn classify(target: &HttpTarget, status: StatusCode, body: &str, secret: Option<&str>) -> Outcome {
    let excerpt = || {
        if let Some(name) = secret {
            return format!("(body not said: the URL is secret `{name}`'s)");
        }
        let body = body.trim();
        let cut = body
            .char_indices()
            .nth(BODY_EXCERPT)
            .map_or(body.len(), |(i, _)| i);
        if cut < body.len() {
            format!("{}…", &body[..cut])
        } else {
            body.to_string()
        }
    };
    if status.is_success() {
        return match &target.expected_body {
            Some(expected) if body.trim() != expected.trim() => Outcome::retry(format!(
                "HTTP {status}: body `{}` is not the expected `{expected}`",
                excerpt()
            )),
            _ => Outcome::success(),
        };
    }
    let reason = format!("HTTP {status}: {}", excerpt());
    let retryable = status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || target.retry_4xx
        || !status.is_client_error();
    if retryable {
        Outcome::retry(reason)
    } else {
        Outcome::permanent(reason)
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> HttpTarget {
        serde_json::from_value(serde_json::json!({"url": "http://x"})).unwrap()
    }

    #[test]
    fn statuses_map_to_outcomes() {
        let t = target();
        let kind = |code: u16| match classify(&t, StatusCode::from_u16(code).unwrap(), "nope", None)
        {
            Outcome::Success { .. } => "ok",
            Outcome::Retry { .. } => "retry",
            Outcome::Permanent { .. } => "permanent",
        };
        assert_eq!(
            [200, 204, 400, 404, 408, 429, 500, 503, 302].map(kind),
            [
                "ok",
                "ok",
                "permanent",
                "permanent",
                "retry",
                "retry",
                "retry",
                "retry",
                "retry"
            ]
        );
        let lenient = HttpTarget {
            retry_4xx: true,
            ..target()
        };
        assert!(matches!(
            classify(&lenient, StatusCode::BAD_REQUEST, "", None),
            Outcome::Retry { .. }
        ));
    }

    #[test]
    fn expected_body_and_excerpt() {
        let t = HttpTarget {
            expected_body: Some("success".into()),
            ..target()
        };
        assert_eq!(
            classify(&t, StatusCode::OK, " success\n", None),
            Outcome::success()
        );
        let Outcome::Retry { reason } = classify(&t, StatusCode::OK, "fail", None) else {
            panic!()
        };
        assert!(reason.contains("`fail`"), "{reason}");
        let long = "x".repeat(1000);
        let Outcome::Retry { reason } = classify(&target(), StatusCode::BAD_GATEWAY, &long, None)
        else {
            panic!()
        };
        assert!(
            reason.starts_with("HTTP 502 Bad Gateway: xxx") && reason.len() < 300,
            "{reason}"
        );
    }

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // Expected value from Python: hmac.new(b"Jefe", b'1700000000.{"a":1}', sha256).
        assert_eq!(
            sign("Jefe", "1700000000", r#"{"a":1}"#),
            "sha256=fa5f6481efc59da48b19c9dc10196c9953e5651f8304b3a318b6b87d70272e0a"
        );
    }

    #[test]
    fn any_idempotency_key_makes_a_header_of_its_own() {
        assert_eq!(header_safe("order:42"), "order:42");
        assert_eq!(header_safe("a b"), "a b");
        assert_eq!(header_safe("50%"), "50%25");
        assert_eq!(header_safe("k\r\nX-B: 1"), "k%0D%0AX-B:%201");
        assert_eq!(header_safe("a%\tb"), "a%25%09b");
        assert_eq!(header_safe("k\t"), "k%09");
        assert_eq!(header_safe(" k"), "%20k");
        assert_eq!(header_safe("é"), "%C3%A9");
        // One to one: keys that differ never share a header.
        let keys = [
            "a\n", "a%0A", "a%250A", "k", "k\t", "k%09", " k", "%20k", "é", "%C3%A9", "50%",
            "50%25",
        ];
        let headers: std::collections::HashSet<String> =
            keys.iter().map(|k| header_safe(k).into_owned()).collect();
        assert_eq!(headers.len(), keys.len(), "{headers:?}");
        for key in keys {
            assert!(reqwest::header::HeaderValue::from_str(&header_safe(key)).is_ok());
        }
    }

    #[test]
    fn only_public_addresses_pass_the_guard() {
        for private in [
            "127.0.0.1",
            "127.8.9.10",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "100.127.255.254",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "2001:0:4136:e378::1",
            "64:ff9b:1::a00:1",
            "100::1",
            "::ffff:0:a00:1",
            "192.88.99.1",
        ] {
            let ip: IpAddr = private.parse().unwrap();
            assert!(!is_public(ip), "{private} passed");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::",
        ] {
            let ip: IpAddr = public.parse().unwrap();
            assert!(is_public(ip), "{public} refused");
        }
    }

    #[test]
    fn ip_literals_are_refused_before_any_connection() {
        for url in [
            "http://127.0.0.1:9/x",
            "http://[::1]/x",
            "http://169.254.169.254/latest/meta-data",
            "http://[::ffff:10.0.0.1]/",
            "http://2130706433/",
            "http://0x7f.1/",
        ] {
            let url = reqwest::Url::parse(url).unwrap();
            let refused = refused_literal(&url).unwrap_or_else(|| panic!("{url} passed"));
            assert!(refused.to_string().contains("allow_private_network"));
        }
        for url in ["http://example.com/", "http://8.8.8.8/"] {
            assert!(refused_literal(&reqwest::Url::parse(url).unwrap()).is_none());
        }
    }

    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_refused() {
        let channel = HttpChannel::new(HashMap::new(), false).unwrap();
        let target: HttpTarget =
            serde_json::from_value(serde_json::json!({"url": "http://localhost:9/x"})).unwrap();
        let notice = crate::handler::Notice {
            id: 1,
            def: "d".into(),
            attempt: 1,
            version: 1,
            param: serde_json::json!({}),
            description: String::new(),
            idempotency_key: "1".into(),
            load_balance_num: 0,
            trace_headers: Default::default(),
            ordering_key: None,
            step: 0,
            steps: 1,
            previous_result: None,
        };
        let outcome = channel
            .send(&target, &notice, "{}", Duration::from_secs(5))
            .await;
        let Outcome::Retry { reason } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(
            reason.contains("not a public address") && reason.contains("localhost"),
            "{reason}"
        );
    }
}
