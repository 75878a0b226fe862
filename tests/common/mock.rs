//! A scripted HTTP server on 127.0.0.1 (axum) for the tests that check
//! what a request carried: routes matched by method and path answer with a
//! chosen status, body, header and delay (at most N times, when said), and
//! every request is kept. Its calls read as wiremock's, which it replaces
//! (one HTTP stack in the build: the library's own).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
};

/// What a request must be to match a route.
#[derive(Clone)]
pub enum Matcher {
    Method(Method),
    Path(String),
}

pub mod matchers {
    use super::Matcher;

    /// Requests with this method.
    pub fn method(name: &str) -> Matcher {
        Matcher::Method(name.parse().unwrap())
    }

    /// Requests to this path.
    pub fn path(path: &str) -> Matcher {
        Matcher::Path(path.to_string())
    }
}

/// An answer.
#[derive(Clone)]
pub struct ResponseTemplate {
    status: u16,
    body: String,
    headers: Vec<(String, String)>,
    delay: Duration,
}

impl ResponseTemplate {
    pub fn new(status: u16) -> Self {
        ResponseTemplate {
            status,
            body: String::new(),
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn set_body_string(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }

    pub fn set_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn insert_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// A route: what it matches, how it answers, how often.
pub struct Mock {
    matchers: Vec<Matcher>,
    answer: Option<ResponseTemplate>,
    times: Option<usize>,
}

impl Mock {
    pub fn given(matcher: Matcher) -> Self {
        Mock {
            matchers: vec![matcher],
            answer: None,
            times: None,
        }
    }

    pub fn and(mut self, matcher: Matcher) -> Self {
        self.matchers.push(matcher);
        self
    }

    pub fn respond_with(mut self, answer: ResponseTemplate) -> Self {
        self.answer = Some(answer);
        self
    }

    /// Answers at most `n` requests; the next routes take the rest.
    pub fn up_to_n_times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    pub async fn mount(self, server: &MockServer) {
        server.routes.lock().unwrap().push(self);
    }

    fn matches(&self, method: &Method, uri: &Uri) -> bool {
        self.times != Some(0)
            && self.matchers.iter().all(|m| match m {
                Matcher::Method(want) => want == method,
                Matcher::Path(want) => uri.path() == want,
            })
    }
}

/// A request the server got.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub url: url::Url,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// The server.
pub struct MockServer {
    address: std::net::SocketAddr,
    routes: Arc<Mutex<Vec<Mock>>>,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockServer {
    pub async fn start() -> MockServer {
        let routes: Arc<Mutex<Vec<Mock>>> = Arc::default();
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (r, k) = (routes.clone(), received.clone());
        let app =
            Router::new()
                .fallback(
                    move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                        let (routes, received) = (r.clone(), k.clone());
                        async move {
                            answer(&routes, &received, address, method, uri, headers, body).await
                        }
                    },
                )
                .layer(axum::extract::DefaultBodyLimit::disable());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        MockServer {
            address,
            routes,
            received,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn address(&self) -> &std::net::SocketAddr {
        &self.address
    }

    /// Every request so far, in order.
    pub async fn received_requests(&self) -> Option<Vec<Received>> {
        Some(self.received.lock().unwrap().clone())
    }
}

async fn answer(
    routes: &Mutex<Vec<Mock>>,
    received: &Mutex<Vec<Received>>,
    address: std::net::SocketAddr,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let url = url::Url::parse(&format!("http://{address}{uri}")).unwrap();
    received.lock().unwrap().push(Received {
        method: method.clone(),
        url,
        headers,
        body: body.to_vec(),
    });
    let template = {
        let mut routes = routes.lock().unwrap();
        routes
            .iter_mut()
            .find(|m| m.matches(&method, &uri))
            .map(|m| {
                if let Some(n) = m.times.as_mut() {
                    *n -= 1;
                }
                m.answer
                    .clone()
                    .unwrap_or_else(|| ResponseTemplate::new(200))
            })
    };
    let Some(template) = template else {
        return StatusCode::NOT_FOUND.into_response();
    };
    tokio::time::sleep(template.delay).await;
    let mut response = (
        StatusCode::from_u16(template.status).unwrap(),
        template.body,
    )
        .into_response();
    for (name, value) in template.headers {
        response.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}
