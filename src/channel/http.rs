//! HTTP: a notice is a request to the target URL with the param as its body.
//!
//! Headers tell the receiver what it got, so it can stay idempotent:
//! `X-Notice-Id`, `X-Notice-Def`, `X-Notice-Attempt`, `Idempotency-Key`
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
//! Outcomes: 2xx is success (when `expected_body` is set, the trimmed body
//! must equal it); connection errors, timeouts, 408, 429 and 5xx are retried;
//! other 4xx fail for good unless the target sets `retry_4xx`.

use std::{collections::HashMap, time::Duration};

use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use sha2::Sha256;

use crate::{
    def::HttpTarget,
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

/// The shared HTTP client (one connection pool for every notice).
pub(crate) struct HttpChannel {
    client: reqwest::Client,
    secrets: HashMap<String, String>,
}

impl HttpChannel {
    pub fn new(secrets: HashMap<String, String>) -> Result<Self> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("solid-notify/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(HttpChannel { client, secrets })
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
        let timeout = target
            .timeout
            .as_deref()
            .and_then(|t| crate::schedule::parse_interval(t).ok())
            .unwrap_or(DEFAULT_TIMEOUT)
            .min(attempt_timeout);
        let mut request = self
            .client
            .request(method, &target.url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header("x-notice-id", notice.id)
            .header("x-notice-def", &notice.def)
            .header("x-notice-attempt", notice.attempt)
            .header("idempotency-key", &notice.idempotency_key);
        if notice.steps > 1 {
            request = request.header("x-notice-step", notice.step.saturating_add(1));
        }
        // The target's own headers win over the trace's (no duplicates).
        let trace = notice
            .trace_headers
            .iter()
            .filter(|(name, _)| !target.headers.keys().any(|k| k.eq_ignore_ascii_case(name)));
        for (name, value) in trace.chain(&target.headers) {
            request = request.header(name, value);
        }
        if let Some(name) = &target.signing_secret {
            let Some(secret) = self
                .secrets
                .get(name)
                .cloned()
                .or_else(|| std::env::var(format!("{SECRET_ENV_PREFIX}{name}")).ok())
                .filter(|secret| !secret.is_empty())
            else {
                return Outcome::retry(format!("signing secret `{name}` is not configured"));
            };
            let timestamp = chrono::Utc::now().timestamp().to_string();
            request = request
                .header("x-notice-timestamp", &timestamp)
                .header("x-notice-signature", sign(&secret, &timestamp, body));
        }
        let response = match request.body(body.to_string()).send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => {
                return Outcome::retry(format!("HTTP timeout after {timeout:?}"));
            }
            // Without the URL: its query may hold a key.
            Err(e) => {
                return Outcome::retry(format!(
                    "HTTP request failed: {}",
                    error_chain(&e.without_url())
                ));
            }
        };
        let status = response.status();
        let text = match response.text().await {
            Ok(text) => text,
            Err(e) => return Outcome::retry(format!("HTTP {status}: reading body failed: {e}")),
        };
        classify(target, status, &text)
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

fn classify(target: &HttpTarget, status: StatusCode, body: &str) -> Outcome {
    let excerpt = || {
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
        let kind = |code: u16| match classify(&t, StatusCode::from_u16(code).unwrap(), "nope") {
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
            classify(&lenient, StatusCode::BAD_REQUEST, ""),
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
            classify(&t, StatusCode::OK, " success\n"),
            Outcome::success()
        );
        let Outcome::Retry { reason } = classify(&t, StatusCode::OK, "fail") else {
            panic!()
        };
        assert!(reason.contains("`fail`"), "{reason}");
        let long = "x".repeat(1000);
        let Outcome::Retry { reason } = classify(&target(), StatusCode::BAD_GATEWAY, &long) else {
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
}
