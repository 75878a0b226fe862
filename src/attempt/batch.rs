//! Batch: a sweep's recorder of plain successes.
//!
//! Attempts hand their lease over and wait for the result; one task takes
//! whatever has arrived (up to [`MAX_BATCH`]) and moves it to history in one
//! statement, then takes the next lot. Under load batches grow by
//! themselves; alone, a success is written at once. A batch the database
//! refuses is retried with backoff like any outcome, and one it cannot take
//! whole is settled row by row.

use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

use super::{AttemptResult, Recorder, record};
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

/// One success waiting to be written, and where its result goes.
pub(crate) struct Item {
    pub lease: Lease,
    pub reply: oneshot::Sender<AttemptResult>,
}

/// The running batch of one sweep.
pub(crate) struct SuccessBatch {
    sender: mpsc::UnboundedSender<Item>,
    task: JoinHandle<()>,
}

impl SuccessBatch {
    /// Starts the batch task; `give_up` ends its retries.
    pub fn start(
        store: Store,
        give_up: CancellationToken,
        stats: std::sync::Arc<WorkerStats>,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, receiver, give_up, stats));
        SuccessBatch { sender, task }
    }

    /// The recorder that hands plain successes to this batch.
    pub fn recorder(&self) -> Recorder {
        Recorder::Batched(self.sender.clone())
    }

    /// Writes what is left and stops.
    pub async fn finish(self) {
        drop(self.sender);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "success batch task failed");
        }
    }
}

async fn run(
    store: Store,
    mut receiver: mpsc::UnboundedReceiver<Item>,
    give_up: CancellationToken,
    stats: std::sync::Arc<WorkerStats>,
) {
    while let Some(first) = receiver.recv().await {
        let mut items = vec![first];
        while items.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(item) => items.push(item),
                Err(_) => break,
            }
        }
        stats.add_flush(items.len() as u64);
        flush(&store, items, &give_up).await;
    }
}

async fn flush(store: &Store, items: Vec<Item>, give_up: &CancellationToken) {
    let (mut leases, replies): (Vec<Lease>, Vec<_>) =
        items.into_iter().map(|i| (i.lease, (i.reply))).unzip();
    let mut backoff = Backoff::default();
    loop {
        match succeed_many(store, leases).await {
            Ok(moved) => {
                for ((_, moved), reply) in moved.into_iter().zip(replies) {
                    let result = if moved {
                        AttemptResult::Succeeded
                    } else {
                        AttemptResult::LostClaim
                    };
                    let _ = reply.send(result);
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
                    for (lease, reply) in held.into_iter().zip(replies) {
                        lease.forget();
                        let _ = reply.send(AttemptResult::Error {
                            error: error.clone(),
                        });
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
                for (lease, reply) in held.into_iter().zip(replies) {
                    let _ = reply.send(record::succeed_inline(lease, None, give_up).await);
                }
                return;
            }
        }
    }
}
