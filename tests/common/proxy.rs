//! A TCP proxy in front of a database server, to take the database away
//! from a worker and give it back:
//!
//! - `cut` drops every open connection and refuses new ones (a server that
//!   went down), `restore` lets them in again;
//! - `freeze` stops forwarding in both directions but keeps every socket
//!   open, holding the bytes sent meanwhile (a network partition: nothing
//!   arrives, nothing fails), and new connections hang before they reach the
//!   server; `thaw` forwards what was held and goes on;
//! - `strand` freezes the connections open now for good, while new ones go
//!   through: peers that vanished without a word (the server restarted
//!   during a partition), which only a bound on each call notices.

// Shared by the tests and the chaos example, each using part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
    task::JoinHandle,
};

pub struct Proxy {
    pub port: u16,
    open: Arc<AtomicBool>,
    /// Whether everything is frozen, and which links (numbered from 0 as
    /// they were accepted) are stranded: those below it.
    frozen: watch::Sender<(bool, u64)>,
    /// Links accepted so far.
    accepted: Arc<std::sync::atomic::AtomicU64>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    task: JoinHandle<()>,
}

/// Whether link `n` is frozen now.
fn is_frozen(state: &(bool, u64), n: u64) -> bool {
    state.0 || n < state.1
}

/// Waits while link `n` is frozen; `false` when the proxy is gone.
async fn while_frozen(frozen: &mut watch::Receiver<(bool, u64)>, n: u64) -> bool {
    frozen.wait_for(|s| !is_frozen(s, n)).await.is_ok()
}

/// Copies `from` to `to` for link `n`, holding bytes while it is frozen
/// (reads stop, so what the peer sends stays in the socket's buffers).
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut frozen: watch::Receiver<(bool, u64)>,
    n: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !while_frozen(&mut frozen, n).await {
            return;
        }
        let n_read = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            },
            // Frozen while waiting: stop reading (the read is cancel-safe).
            _ = frozen.wait_for(|s| is_frozen(s, n)) => continue,
        };
        if !while_frozen(&mut frozen, n).await {
            return;
        }
        if to.write_all(&buf[..n_read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (frozen, _) = watch::channel((false, 0));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn({
            let (open, links, frozen) = (open.clone(), links.clone(), frozen.clone());
            let accepted = accepted.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: connection refused, in effect
                    }
                    let n = accepted.fetch_add(1, Ordering::SeqCst);
                    let mut thawed = frozen.subscribe();
                    let link = tokio::spawn(async move {
                        // A connection made while frozen waits, silent.
                        if !while_frozen(&mut thawed, n).await {
                            return;
                        }
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::join!(
                            pipe(client_read, server_write, thawed.clone(), n),
                            pipe(server_read, client_write, thawed, n),
                        );
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            port,
            open,
            frozen,
            accepted,
            links,
            task,
        }
    }

    /// The database goes away: open connections die, new ones are dropped.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    /// The database is back.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// A partition: nothing is forwarded, every socket stays open.
    pub fn freeze(&self) {
        self.frozen.send_modify(|s| s.0 = true);
    }

    /// The partition heals: what was held is forwarded (but on stranded
    /// connections).
    pub fn thaw(&self) {
        self.frozen.send_modify(|s| s.0 = false);
    }

    /// Every connection open now is frozen for good; new ones go through.
    pub fn strand(&self) {
        let now = self.accepted.load(Ordering::SeqCst);
        self.frozen.send_modify(|s| s.1 = now);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
