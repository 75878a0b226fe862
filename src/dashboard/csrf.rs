//! CSRF: a double-submit token. Every response makes sure the browser holds
//! a random `sn_csrf` cookie (SameSite=Strict, HttpOnly); every form carries
//! the same value in a hidden `csrf` field. A state-changing form whose field
//! does not match its cookie is refused (403) before any handler runs. API
//! writes must be `application/json` (a cross-site form cannot send that
//! without the browser asking first), or they are refused (415). Every
//! write is also refused (403) when the browser says it comes from another
//! site or origin (`Sec-Fetch-Site`, `Origin`), which also stops a sibling
//! subdomain that planted its own cookie.
//!
//! Reads are refused (403) when the browser says another site sent them,
//! unless they are a top-level navigation to a page (following a link):
//! an `<img>` or `fetch` on another site's page cannot make the
//! dashboard search. Every response carries [`SECURITY_HEADERS`]: no
//! framing, no content sniffing, nothing loaded from elsewhere.

use axum::{
    body::{Body, to_bytes},
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq;

use super::AppState;

/// The cookie's name.
const COOKIE: &str = "sn_csrf";
/// Largest form body read: 64 KiB.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// The request's CSRF token, for the forms of the page.
#[derive(Debug, Clone)]
pub(super) struct Token(pub String);

fn from_cookie(request: &Request) -> Option<String> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == COOKIE && value.len() == 32)
        .map(|(_, value)| value.to_string())
}

/// Whether a write comes from the dashboard's own pages (or a tool that
/// sends neither header): `Sec-Fetch-Site`, when sent, must be
/// `same-origin` or `none`; `Origin`, when sent, must name the `Host`.
fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site")
        && site != "same-origin"
        && site != "none"
    {
        return false;
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Whether a read may be answered: `Sec-Fetch-Site`, when sent, is
/// `same-origin` or `none`, or the request is a top-level navigation
/// (`Sec-Fetch-Mode: navigate`, `Sec-Fetch-Dest: document`) to a page,
/// not to the API nor to the bulk confirmation (which counts and pins).
fn readable(headers: &axum::http::HeaderMap, api: bool) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match get("sec-fetch-site") {
        None | Some("same-origin" | "none") => true,
        Some(_) => {
            !api && get("sec-fetch-mode") == Some("navigate")
                && get("sec-fetch-dest") == Some("document")
        }
    }
}

/// Headers on every response: the pages are never framed (clickjacking),
/// never sniffed as another type, load nothing from elsewhere and run no
/// script, and send no referrer to another site (a listing's URL holds its
/// search).
pub(super) const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("x-content-type-options", "nosniff"),
    (
        "content-security-policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    // `no-referrer` would make the browser send `Origin: null` with the
    // dashboard's own forms (refused as cross-origin).
    ("referrer-policy", "same-origin"),
];

/// Sets [`SECURITY_HEADERS`] (the outermost layer: on refusals too).
pub(super) async fn secure(mut response: Response) -> Response {
    for (name, value) in SECURITY_HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    response
}

/// 128 random bits as hex; `None` when the system has no randomness to give.
pub(super) fn fresh() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(hex::encode(bytes))
}

fn refuse(status: StatusCode, why: &'static str) -> Response {
    (status, why).into_response()
}

/// Checks state-changing requests, refuses cross-site reads and hands the
/// page its token.
pub(super) async fn layer(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let cookie = from_cookie(&request);
    let (mut parts, body) = request.into_parts();
    // A nested router sees its own paths (the mount point is stripped).
    let api = parts.uri.path().starts_with("/api/");
    let mut body = body;
    let counts = api || parts.uri.path() == "/bulk";
    if parts.method != Method::POST && !readable(&parts.headers, counts) {
        return refuse(
            StatusCode::FORBIDDEN,
            "cross-site reads are refused (Sec-Fetch-Site); open the dashboard directly\n",
        );
    }
    if parts.method == Method::POST {
        if !same_origin(&parts.headers) {
            return refuse(
                StatusCode::FORBIDDEN,
                "cross-origin writes are refused (Origin / Sec-Fetch-Site)\n",
            );
        }
        if api {
            let json = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if !json {
                return refuse(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "API writes must be application/json\n",
                );
            }
        } else {
            let Ok(bytes) = to_bytes(body, MAX_FORM_BYTES).await else {
                return refuse(StatusCode::PAYLOAD_TOO_LARGE, "form too large\n");
            };
            let sent = url::form_urlencoded::parse(&bytes)
                .find(|(k, _)| k == "csrf")
                .map(|(_, v)| v.into_owned());
            let matches = match (&cookie, &sent) {
                (Some(cookie), Some(sent)) => bool::from(cookie.as_bytes().ct_eq(sent.as_bytes())),
                _ => false,
            };
            if !matches {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "CSRF check failed: reload the page and submit the form again\n",
                );
            }
            body = Body::from(bytes);
        }
    }
    let (token, set) = match cookie {
        Some(token) => (token, false),
        None => match fresh() {
            Some(token) => (token, true),
            None => return refuse(StatusCode::INTERNAL_SERVER_ERROR, "no randomness\n"),
        },
    };
    parts.extensions.insert(Token(token.clone()));
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if set {
        let path = match state.config.base_path.trim_end_matches('/') {
            "" => "/",
            base => base,
        };
        let cookie = format!("{COOKIE}={token}; Path={path}; HttpOnly; SameSite=Strict");
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}
