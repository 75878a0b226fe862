//! A TCP proxy in front of a database server, to take the database away
//! from a worker and give it back: `cut` drops every open connection and
//! refuses new ones (as a server that went down), `restore` lets them in.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{net::TcpListener, task::JoinHandle};

pub struct Proxy {
    pub port: u16,
    open: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let task = tokio::spawn({
            let (open, links) = (open.clone(), links.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: connection refused, in effect
                    }
                    let link = tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            port,
            open,
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
