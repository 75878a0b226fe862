//! Batch: a sweep's recorder of plain successes.
//!
//! An attempt hands its lease over and is done; one task takes whatever has
//! arrived (up to [`MAX_BATCH`]) and moves it to history in one statement,
//! then takes the next lot, and reports each result. Under load batches grow
//! by themselves; alone, a success is written at once. A batch the database
//! refuses is retried with backoff like any outcome, and one it cannot take
//! whole is settled row by row. The rows waiting here count toward what a
//! sweep may hold, so memory stays bounded however fast deliveries are.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{AttemptReport, AttemptResult, record};
use crate::{
    db::{self, Backoff},
    state::{
        Lease, Store,
        batch::{HeldMany, succeed_many},
    },
    stats::WorkerStats,
};

/// Most successes moved to history by one statement.
pub const MAX_BATCH: usize = 500;

/// Where a sweep's attempts hand their plain successes.
#[derive(Clone)]
pub(crate) struct BatchHandle {
    sender: mpsc::UnboundedSender<Lease>,
    pending: Arc<AtomicUsize>,
}

impl BatchHandle {
    /// Hands `lease` over; gives it back if the batch has stopped.
    pub fn hand_over(&self, lease: Lease) -> Option<Lease> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let refused = self.sender.send(lease).err()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Some(refused.0)
    }
}

/// The running batch of one sweep.
pub(crate) struct SuccessBatch {
    handle: BatchHandle,
    task: JoinHandle<()>,
    flushed: Arc<tokio::sync::Notify>,
}

impl SuccessBatch {
    /// Starts the batch task; `give_up` ends its retries. Results are
    /// counted in `stats` and, when given, sent to `reports`.
    pub fn start(
        store: Store,
        give_up: CancellationToken,
        stats: Arc<WorkerStats>,
        reports: Option<mpsc::UnboundedSender<AttemptReport>>,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let flushed = Arc::new(tokio::sync::Notify::new());
        let out = Out {
            stats,
            reports,
            pending: pending.clone(),
            flushed: flushed.clone(),
        };
        let task = tokio::spawn(run(store, receiver, give_up, out));
        SuccessBatch {
            handle: BatchHandle { sender, pending },
            task,
            flushed,
        }
    }

    /// Resolves after the next lot is written.
    pub async fn flushed(&self) {
        self.flushed.notified().await;
    }

    /// The handle attempts use.
    pub fn handle(&self) -> BatchHandle {
        self.handle.clone()
    }

    /// Successes handed over and not written yet.
    pub fn pending(&self) -> usize {
        self.handle.pending.load(Ordering::Relaxed)
    }

    /// Writes what is left and stops.
    pub async fn finish(self) {
        drop(self.handle);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "success batch task failed");
        }
    }
}

struct Out {
    stats: Arc<WorkerStats>,
    reports: Option<mpsc::UnboundedSender<AttemptReport>>,
    pending: Arc<AtomicUsize>,
    flushed: Arc<tokio::sync::Notify>,
}

impl Out {
    fn report(&self, notice_id: i64, result: AttemptResult) {
        self.stats.count(&result);
        self.pending.fetch_sub(1, Ordering::Relaxed);
        if let Some(reports) = &self.reports {
            let _ = reports.send(AttemptReport { notice_id, result });
        }
    }
}

/// Whatever ends the batch task (a panic included): nothing is pending any
/// more, and a sweep waiting for a flush is woken. Rows it still held stay
/// leased and are due again when their leases end.
struct OnExit {
    pending: Arc<AtomicUsize>,
    flushed: Arc<tokio::sync::Notify>,
}

impl Drop for OnExit {
    fn drop(&mut self) {
        self.pending.store(0, Ordering::Relaxed);
        self.flushed.notify_one();
    }
}

async fn run(
    store: Store,
    mut receiver: mpsc::UnboundedReceiver<Lease>,
    give_up: CancellationToken,
    out: Out,
) {
    let _exit = OnExit {
        pending: out.pending.clone(),
        flushed: out.flushed.clone(),
    };
    while let Some(first) = receiver.recv().await {
        let mut leases = vec![first];
        while leases.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(lease) => leases.push(lease),
                Err(_) => break,
            }
        }
        let (n, started) = (leases.len() as u64, std::time::Instant::now());
        out.stats.add_flush(n);
        flush(&store, leases, &give_up, &out).await;
        tracing::trace!(
            n,
            ms = started.elapsed().as_millis() as u64,
            "successes recorded"
        );
        out.flushed.notify_one();
    }
}

async fn flush(store: &Store, mut leases: Vec<Lease>, give_up: &CancellationToken, out: &Out) {
    let mut backoff = Backoff::default();
    loop {
        match succeed_many(store, leases).await {
            Ok(moved) => {
                crate::telemetry::lost_claims(moved.iter().filter(|(_, m)| !*m).count() as u64);
                for (id, moved) in moved {
                    let result = if moved {
                        AttemptResult::Succeeded
                    } else {
                        AttemptResult::LostClaim
                    };
                    out.report(id, result);
                }
                return;
            }
            Err(HeldMany {
                leases: held,
                error,
            }) if db::is_transient(&error) => {
                tracing::warn!(error = %error, n = held.len(), "cannot record successes yet; retrying");
                if !backoff.wait(give_up).await {
                    let error = format!("{error}; left to its lease");
                    for lease in held {
                        let id = lease.id();
                        lease.forget();
                        out.report(
                            id,
                            AttemptResult::Error {
                                error: error.clone(),
                            },
                        );
                    }
                    return;
                }
                leases = held;
            }
            Err(HeldMany {
                leases: held,
                error,
            }) => {
                tracing::warn!(error = %error, "a success batch was refused; recording one by one");
                for lease in held {
                    let id = lease.id();
                    out.report(id, record::succeed_inline(lease, None, give_up).await);
                }
                return;
            }
        }
    }
}
