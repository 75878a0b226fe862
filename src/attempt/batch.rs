//! Batch: a sweep's recorder of plain successes.
//!
//! An attempt hands its lease over and is done; one task takes whatever has
//! arrived (up to [`MAX_BATCH`]) and moves it to history in one statement,
//! then takes the next lot, and reports each result. Under load batches grow
//! by themselves; alone, a success is written at once. A batch the database
//! refuses is retried with backoff like any outcome, and one it cannot take
//! whole is settled row by row. The rows waiting here count toward what a
//! sweep may hold, so memory stays bounded however fast deliveries are.
//!
//! On PostgreSQL, a sweep of ordered definitions has the batch claim the
//! next notice of each ordering key it moves, in the same statement
//! ([`NextClaims`]), with the run of notices right behind it: a key then
//! moves one notice per write instead of per claim, promotion and write,
//! and finds and checks its turn once per run. The batch hands the sweep
//! each run's first notice and queues the rest ([`Runs`]); each success it
//! records hands on the next notice queued behind it, so each notice is
//! sent only once the one before it is recorded. A notice that ends any
//! other way has its queue released by the sweep; one whose success is not
//! recorded (a lost claim, a write given up), or recorded while its sweep
//! shuts down, has it released here. If the reply to such a write is lost
//! after it committed, its retry finds the successes gone (reported as
//! lost claims) and the next notices it claimed are due again when their
//! lease ends, as after any claim whose reply is lost.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::StreamExt;
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{AttemptReport, AttemptResult, record, runs::Runs};
use crate::{
    db::{self, Backoff},
    def::{Confirm, DefRef},
    handler::Outcome,
    state::{
        Lease, Store,
        batch::{ClaimNext, Claims, HeldMany, release_many, succeed_many},
    },
    stats::WorkerStats,
};

/// How outcomes are written: one at a time, or plain successes batched.
#[derive(Clone)]
pub(crate) enum Recorder {
    /// Every outcome written by the attempt itself.
    Inline,
    /// Plain successes handed to a sweep's batch; everything else inline.
    Batched(BatchHandle),
}

/// Whether `outcome` goes to a success batch: a plain success (no note, no
/// confirmation to wait for) under a batched recorder. Gives the outcome
/// back otherwise.
pub(crate) fn batchable<'r>(
    def: &DefRef,
    outcome: Outcome,
    recorder: &'r Recorder,
) -> Result<&'r BatchHandle, Outcome> {
    match (recorder, &outcome, def.confirm) {
        (Recorder::Batched(batch), Outcome::Success { note: None, .. }, Confirm::NotNeeded) => {
            Ok(batch)
        }
        _ => Err(outcome),
    }
}

/// Most successes moved to history by one statement.
pub const MAX_BATCH: usize = 500;

/// Where a sweep's attempts hand their plain successes.
#[derive(Clone)]
pub(crate) struct BatchHandle {
    sender: mpsc::UnboundedSender<Lease>,
    pending: Arc<AtomicUsize>,
    stats: Arc<WorkerStats>,
}

impl BatchHandle {
    /// Hands `lease` over; gives it back if the batch has stopped.
    pub fn hand_over(&self, lease: Lease) -> Option<Lease> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.stats.success_handed();
        let refused = self.sender.send(lease).err()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        self.stats.success_settled();
        Some(refused.0)
    }
}

/// Where a batch hands the next notices it claimed (see the module docs):
/// to the sweep whose successes it writes, while that sweep has not begun
/// to shut down.
pub(crate) struct NextClaims {
    /// Which next notices the sweep may take.
    pub claim: ClaimNext,
    /// The sweep's queue of claimed rows.
    pub sender: mpsc::UnboundedSender<Vec<Lease>>,
    /// The sweep's runs: where the rows claimed behind them wait.
    pub runs: Runs,
    /// The sweep's shutdown: from then on next notices are made due, not
    /// claimed.
    pub shutdown: CancellationToken,
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
        next: Option<NextClaims>,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let flushed = Arc::new(tokio::sync::Notify::new());
        let out = Out {
            stats: stats.clone(),
            reports,
            pending: pending.clone(),
            flushed: flushed.clone(),
            next,
        };
        let task = tokio::spawn(run(store, receiver, give_up, out));
        SuccessBatch {
            handle: BatchHandle {
                sender,
                pending,
                stats,
            },
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
        self.handle.pending.load(Ordering::Acquire)
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
    next: Option<NextClaims>,
}

impl Out {
    /// What the batch may claim next, while its sweep takes it: within
    /// what is left of the sweep's bound in bytes (`claim.bytes`), at
    /// least one notice.
    fn claim_next(&self) -> Option<ClaimNext> {
        self.next
            .as_ref()
            .filter(|n| !n.shutdown.is_cancelled() && !n.sender.is_closed())
            .map(|n| ClaimNext {
                bytes: n
                    .claim
                    .bytes
                    .saturating_sub(self.stats.payload_bytes())
                    .max(1),
                ..n.claim.clone()
            })
    }

    /// Hands the sweep what follows the successes written (`moved`, each
    /// with whether it moved): for each moved notice with a run queued
    /// behind it, its next notice; and the first notice of each run
    /// claimed, queuing the rest. Before the successes are reported, so a
    /// sweep that sees nothing pending sees them. A sweep gone or shutting
    /// down meanwhile has them released, and so are the runs behind
    /// notices not moved.
    async fn hand_next(&self, store: &Store, moved: &[(i64, bool)], claimed: Claims) {
        let Some(next) = &self.next else {
            let all = claimed.runs.into_iter().flatten().chain(claimed.stray);
            return release(store, all.collect()).await;
        };
        let taking = !next.shutdown.is_cancelled() && !next.sender.is_closed();
        let mut to_release = claimed.stray;
        let mut hand = Vec::new();
        for &(id, moved) in moved {
            if moved && taking {
                hand.extend(next.runs.advance(id));
            } else {
                to_release.extend(next.runs.take(id));
            }
        }
        for mut run in claimed.runs {
            let mut rest = run.split_off(1);
            if taking {
                // Queued, their payloads count in the sweep's bytes.
                for lease in &mut rest {
                    lease.count_payload(&self.stats, 1);
                }
                if let Some(first) = run.first() {
                    next.runs.queue(first.id(), rest);
                }
                hand.extend(run);
            } else {
                to_release.extend(run.into_iter().chain(rest));
            }
        }
        if !hand.is_empty()
            && let Err(refused) = next.sender.send(hand)
        {
            let ids: Vec<i64> = refused.0.iter().map(Lease::id).collect();
            to_release.extend(refused.0);
            to_release.extend(next.runs.take_behind(ids.into_iter()));
        }
        release(store, to_release).await;
    }

    /// Releases what is queued behind `ids`: their successes were not
    /// recorded here.
    async fn release_behind(&self, store: &Store, ids: &[i64]) {
        if let Some(next) = &self.next {
            release(store, next.runs.take_behind(ids.iter().copied())).await;
        }
    }

    fn report(&self, notice_id: i64, result: AttemptResult) {
        self.stats.count(&result);
        self.stats.success_settled();
        // Release: a sweep that reads nothing pending (Acquire) also sees
        // the next notices handed over before.
        self.pending.fetch_sub(1, Ordering::Release);
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
    // A batch that claims next notices writes twice at once: its writes
    // are its sweep's claims, and a key's next notice waits for them.
    let at_once = if out.next.is_some() { 2 } else { 1 };
    let mut writing = futures::stream::FuturesUnordered::new();
    loop {
        let lease = tokio::select! {
            lease = receiver.recv(), if writing.len() < at_once => match lease {
                Some(lease) => lease,
                None => break,
            },
            Some(()) = writing.next(), if !writing.is_empty() => continue,
        };
        let mut leases = vec![lease];
        while leases.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(lease) => leases.push(lease),
                Err(_) => break,
            }
        }
        let (store, give_up, out) = (&store, &give_up, &out);
        writing.push(async move {
            let (n, started) = (leases.len() as u64, std::time::Instant::now());
            out.stats.add_flush(n);
            flush(store, leases, give_up, out).await;
            tracing::trace!(
                n,
                ms = started.elapsed().as_millis() as u64,
                "successes recorded"
            );
            out.flushed.notify_one();
        });
    }
    while writing.next().await.is_some() {}
}

async fn flush(store: &Store, mut leases: Vec<Lease>, give_up: &CancellationToken, out: &Out) {
    let mut backoff = Backoff::default();
    loop {
        // Keys with a run queued: their next notices are held already.
        let continuing = match &out.next {
            Some(next) => next.runs.continuing(leases.iter().map(Lease::id)),
            None => Vec::new(),
        };
        let claim_next = out.claim_next();
        let claim_next = claim_next.as_ref().map(|c| (c, continuing.as_slice()));
        match succeed_many(store, leases, claim_next).await {
            Ok((written, claimed)) => {
                let moved: Vec<(i64, bool)> = written
                    .iter()
                    .map(|w| match w {
                        Ok(id) => (*id, true),
                        Err(lost) => (lost.id, false),
                    })
                    .collect();
                out.hand_next(store, &moved, claimed).await;
                crate::counters::lost_claims(moved.iter().filter(|(_, m)| !*m).count() as u64);
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
                    out.stats.add_given_up(held.len() as u64);
                    let ids: Vec<i64> = held.iter().map(Lease::id).collect();
                    out.release_behind(store, &ids).await;
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
                let ids: Vec<i64> = held.iter().map(Lease::id).collect();
                out.release_behind(store, &ids).await;
                for lease in held {
                    let id = lease.id();
                    out.report(id, record::succeed_inline(lease, None, give_up).await);
                }
                return;
            }
        }
    }
}

/// Releases rows claimed for a sweep that no longer takes them, or queued
/// behind a notice that was not recorded here: due again at once (or, if
/// that cannot be written, when their leases end).
async fn release(store: &Store, claimed: Vec<Lease>) {
    if claimed.is_empty() {
        return;
    }
    match release_many(store, claimed).await {
        Ok(n) => tracing::debug!(n, "next notices released: their sweep has ended"),
        Err(HeldMany { leases, error }) => {
            tracing::warn!(error = %error, n = leases.len(), "cannot release next notices claimed for an ended sweep; due when their leases end");
            leases.into_iter().for_each(Lease::forget);
        }
    }
}
