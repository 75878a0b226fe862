//! Listener: the HTTP server of the dashboard and of the metrics endpoint,
//! bounded before any request is read (before authentication too).
//!
//! - A connection has [`HEADER_READ_TIMEOUT`] to send each request head; a
//!   half-sent one is closed then.
//! - At most [`MAX_CONNECTIONS`] are open at once. A new one past that
//!   closes the oldest connection with no request being answered (idle,
//!   or still sending its head); when every one is answering a request,
//!   the new one is closed instead. So half-open connections can hold no
//!   more than the cap's file descriptors, and never starve a request
//!   that sends its head at once.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::ConnectInfo};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a connection may take to send a request head: 10 s.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections open at once: 512 (each a file descriptor).
pub const MAX_CONNECTIONS: usize = 512;

/// How long a shutdown waits for the requests being answered: 10 s.
const DRAIN: Duration = Duration::from_secs(10);

/// An open connection, as the accept loop tracks it.
struct Open {
    /// Requests being answered on it now.
    busy: Arc<AtomicUsize>,
    /// Closes it at once (it answers no request).
    evict: CancellationToken,
}

/// The open connections by arrival, oldest first.
type Registry = Arc<Mutex<BTreeMap<u64, Open>>>;

/// Serves `app` on `listener` until `shutdown`, each connection's address
/// given to handlers as [`ConnectInfo`]. On shutdown it stops accepting,
/// lets the requests being answered finish (for at most 10 s) and closes
/// the rest.
pub(crate) async fn serve(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let open: Registry = Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let mut seq: u64 = 0;
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: a moment, then on.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        if !make_room(&open) {
            // Every connection is answering a request: this one waits for
            // none of them.
            drop(stream);
            continue;
        }
        seq += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        if let Ok(mut open) = open.lock() {
            open.insert(
                seq,
                Open {
                    busy: busy.clone(),
                    evict: evict.clone(),
                },
            );
        }
        let (app, open, id, stop) = (app.clone(), open.clone(), seq, shutdown.clone());
        connections.spawn(async move {
            connection(stream, peer, app, busy, (evict, stop)).await;
            if let Ok(mut open) = open.lock() {
                open.remove(&id);
            }
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

/// Below the cap, or made so by closing the oldest connection with no
/// request being answered; `false` when every one is answering one.
fn make_room(open: &Registry) -> bool {
    let Ok(mut open) = open.lock() else {
        return false;
    };
    if open.len() < MAX_CONNECTIONS {
        return true;
    }
    let idle = open
        .iter()
        .find(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
        .map(|(id, _)| *id);
    match idle.and_then(|id| open.remove(&id)) {
        Some(oldest) => {
            oldest.evict.cancel();
            true
        }
        None => false,
    }
}

/// One connection: HTTP/1.1 with the header timeout, until it ends, is
/// evicted (room for a newer one: dropped at once, as it answers no
/// request), or the server shuts down (the request being answered
/// finishes first, for at most 10 s).
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: Router,
    busy: Arc<AtomicUsize>,
    (evict, shutdown): (CancellationToken, CancellationToken),
) {
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let answering = Answering::new(busy.clone());
            let app = app.clone();
            async move {
                let _answering = answering;
                app.oneshot(request.map(axum::body::Body::new)).await
            }
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
        }
        _ = evict.cancelled() => {}
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn).await;
        }
    }
}

/// A request being answered on a connection, counted while it lives.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn new(busy: Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::AcqRel);
        Answering(busy)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
