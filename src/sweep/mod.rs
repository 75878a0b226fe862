//! Sweep: claim due notices in bounded batches and run each claimed attempt
//! on its own task, through the same path as the after-commit attempt.
//!
//! A sweep claims the next batch only while it holds at most two batches of
//! claimed rows (waiting, delivering or being recorded), so it never holds
//! more than three; what does not fit stays in the database. It runs
//! at most `concurrency`
//! deliveries at once, each with its own timeout, hands plain successes to a
//! batch that moves them to history in one statement, and claims again as
//! soon as the waiting rows run low, for as long as claims come back full.
//! A claim runs beside the deliveries: rows keep starting while the next
//! batch is claimed. On PostgreSQL, while some definition is ordered, the
//! batch of successes also claims the next notice of each key it records,
//! with a run of notices behind it, and hands it back here
//! (`attempt::batch`); the run waits, leased, until the notice before
//! each is recorded, and is released when that notice ends any other way
//! (`Runs`). Such a sweep stays until its last successes are written, and
//! claims due rows again as those next notices come, at most every 100 ms.
//!
//! Shutdown: no more claims and no more starts; unstarted rows (and the
//! runs behind them) are released at once; running deliveries may finish for `shutdown_timeout`, then are
//! abandoned and their rows released. A database error ends the claiming,
//! not the work already claimed: outcomes are retried until they are written
//! (or shutdown gives up on them), and the worker sweeps again soon
//! (`worker::SWEEP_RETRY_FIRST`, doubling).

mod park;

use std::{collections::VecDeque, sync::Arc, time::Duration};

use tokio::{sync::Semaphore, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use crate::{
    attempt::{
        self, Ran, Recorder, Stop,
        batch::{NextClaims, SuccessBatch},
        runs::Runs,
    },
    def::{DefRef, Target},
    error::Result,
    notifier::Notifier,
    notifier::RELEASE_GRACE,
    report::AttemptReport,
    report::AttemptResult,
    state::{
        DefSelect, DueFilter, Lease,
        batch::{ClaimNext, HeldMany, release_many},
        claim,
    },
    stats::WorkerStats,
};

/// How often a sweep kept going by the next notices its batch claims
/// ([`attempt::batch`]) claims due rows again: at the first next notice
/// that arrives 100 ms or more after its last claim ended.
const RECLAIM_WHILE_CHAINING: Duration = Duration::from_millis(100);

/// Default [`SweepLimits::max_in_flight_bytes`]: 64 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 64 * 1024 * 1024;

/// Largest batch a sweep claims at once (and largest
/// [`WorkerConfig::batch_size`](crate::WorkerConfig::batch_size) a worker
/// accepts): 100,000 rows.
pub const MAX_BATCH_SIZE: u64 = 100_000;

/// Limits of one sweep.
#[derive(Debug, Clone)]
pub struct SweepLimits {
    /// Rows claimed per batch.
    pub batch_size: u64,
    /// Deliveries running at once.
    pub concurrency: usize,
    /// How long running deliveries may finish after shutdown is requested.
    pub shutdown_timeout: Duration,
    /// Params held at once, in bytes (see
    /// [`WorkerConfig::max_in_flight_bytes`](crate::WorkerConfig)).
    pub max_in_flight_bytes: u64,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Rows claimed.
    pub claimed: u64,
    /// Every attempt's report (only kept when asked for).
    pub reports: Vec<AttemptReport>,
}

impl Notifier {
    #[doc(hidden)]
    /// One sweep over the due rows matching `filter`; see the module docs.
    /// Returns an error only when not a single row could be claimed; an
    /// error later in the sweep ends its claiming and is logged.
    pub async fn sweep(
        &self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        stats: &Arc<WorkerStats>,
    ) -> Result<SweepSummary> {
        Sweep::new(self, stats.clone(), false)
            .run(filter, limits, shutdown, true, None)
            .await
    }

    /// [`sweep`](Self::sweep) that also claims again whenever `wakes`
    /// changes while it runs (notices made due meanwhile).
    pub(crate) async fn sweep_woken(
        &self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        stats: &Arc<WorkerStats>,
        wakes: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<SweepSummary> {
        Sweep::new(self, stats.clone(), false)
            .run(filter, limits, shutdown, true, Some(wakes))
            .await
    }

    /// Attempts up to `limit` due rows (any definition this process can
    /// deliver; at most [`MAX_BATCH_SIZE`]),
    /// one at a time, and returns each attempt's report.
    pub async fn sweep_once(&self, limit: u64) -> Result<Vec<AttemptReport>> {
        let filter = DueFilter {
            defs: self.deliverable_defs(&[], &[]).await?,
            ..DueFilter::default()
        };
        let limits = SweepLimits {
            batch_size: limit.min(MAX_BATCH_SIZE),
            concurrency: 1,
            shutdown_timeout: Duration::ZERO,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
        };
        let summary = Sweep::new(self, Arc::default(), true)
            .run(&filter, &limits, &CancellationToken::new(), false, None)
            .await?;
        Ok(summary.reports)
    }

    /// The definitions this process can deliver (valid, with their
    /// channel available), narrowed to `defs` and `handlers` when those are
    /// not empty (a definition matches by its name, or by the name of its
    /// handler), as the smaller of the two forms: the ids taken, or every
    /// known id but those not taken ([`DefSelect::Except`]). Either way the
    /// claim binds one parameter past [`claim::IDS_INLINE`] ids, whatever
    /// the number of definitions.
    pub(crate) async fn deliverable_defs(
        &self,
        defs: &[String],
        handlers: &[String],
    ) -> Result<DefSelect> {
        let inner = &self.engine;
        let known = inner.defs.known(&inner.store.db).await?;
        Ok(self.deliverable_among(&known, defs, handlers))
    }

    /// [`deliverable_defs`](Self::deliverable_defs) among the rows `known`.
    pub(crate) fn deliverable_among(
        &self,
        known: &std::collections::HashMap<i64, crate::def::cache::Entry>,
        defs: &[String],
        handlers: &[String],
    ) -> DefSelect {
        let inner = &self.engine;
        let mut taken = Vec::new();
        let mut not_taken = Vec::new();
        for (id, def) in known.iter() {
            let take = def.as_ref().is_ok_and(|def| {
                attempt::available(inner, def).is_ok() && {
                    let handler = |h: &str| handlers.iter().any(|x| x == h);
                    (defs.is_empty() && handlers.is_empty())
                        || defs.contains(&def.name)
                        || def.steps.iter().any(
                            |step| matches!(&step.target, Target::Handler(t) if handler(&t.handler)),
                        )
                }
            });
            if take {
                taken.push(*id);
            } else {
                not_taken.push(*id);
            }
        }
        let (Some(&from), Some(&through)) = (known.keys().min(), known.keys().max()) else {
            return DefSelect::Only(taken);
        };
        // Ids in the range the cache does not hold (deleted, or committed
        // after it was read) are not taken either: their notices are the
        // park check's, after it reads `notify_def` again.
        let span = u64::try_from(through.saturating_sub(from)).unwrap_or(u64::MAX);
        let gaps = span.saturating_add(1).saturating_sub(known.len() as u64);
        if taken.len() as u64 <= (not_taken.len() as u64).saturating_add(gaps) {
            return DefSelect::Only(taken);
        }
        if gaps > 0 {
            let mut ids: Vec<i64> = known.keys().copied().collect();
            ids.sort_unstable();
            for pair in ids.windows(2) {
                not_taken.extend(pair[0] + 1..pair[1]);
            }
        }
        DefSelect::Except {
            ids: not_taken,
            from,
            through,
        }
    }
}

/// A claim of due rows in flight, and when it was asked for.
type ClaimInFlight<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    std::result::Result<claim::Claimed, sea_orm::DbErr>,
                    std::time::Instant,
                ),
            > + Send
            + 'a,
    >,
>;

/// What a sweep writes with, from its start to its end ([`Sweep::start`]).
struct Setup {
    /// The stop its attempts share.
    stop: Stop,
    /// Ends the attempts `shutdown_timeout` after shutdown.
    watcher: tokio::task::JoinHandle<()>,
    /// The batch that moves plain successes to history.
    batch: SuccessBatch,
    /// The attempts' way to the batch.
    recorder: Recorder,
    /// The batch's reports (when reports are kept).
    batch_reports: tokio::sync::mpsc::UnboundedReceiver<AttemptReport>,
    /// Next notices the batch claimed ([`attempt::batch`]).
    next_claimed: tokio::sync::mpsc::UnboundedReceiver<Vec<Lease>>,
    /// Whether the batch claims next notices (PostgreSQL, some definition
    /// ordered, a sweep that goes on).
    chain: bool,
    /// One per delivery that may run at once.
    slots: Arc<Semaphore>,
}

/// What a sweep's turns share ([`Sweep::turn`]).
struct Turns<'f> {
    /// Claimed rows waiting for a slot, with their definitions.
    waiting: VecDeque<(Lease, DefRef)>,
    /// The attempts being run.
    running: JoinSet<Option<AttemptReport>>,
    /// The notice each attempt task runs, to release what waits behind it
    /// should the task fail.
    attempting: std::collections::HashMap<tokio::task::Id, i64>,
    /// Rows claimed so far.
    claimed_total: u64,
    /// Whether to claim again.
    more: bool,
    /// Whether the sweep holds little enough to claim more (rows and bytes).
    room: bool,
    /// The first claim's error, when it failed before any row was claimed.
    first_error: Option<sea_orm::DbErr>,
    /// The claim in flight: deliveries keep starting while it runs.
    claiming: Option<ClaimInFlight<'f>>,
    /// When the last claim ended.
    last_claim: std::time::Instant,
}

impl Turns<'_> {
    fn new() -> Self {
        Turns {
            waiting: VecDeque::new(),
            running: JoinSet::new(),
            attempting: std::collections::HashMap::new(),
            claimed_total: 0,
            more: true,
            room: true,
            first_error: None,
            claiming: None,
            last_claim: std::time::Instant::now(),
        }
    }
}

struct Sweep<'a> {
    notifier: &'a Notifier,
    stats: Arc<WorkerStats>,
    keep_reports: bool,
    reports: Vec<AttemptReport>,
    /// Notices claimed behind those being sent ([`attempt::runs`]).
    runs: Runs,
    /// The sweep's bound in bytes ([`SweepLimits::max_in_flight_bytes`]).
    max_bytes: u64,
}

impl<'a> Sweep<'a> {
    fn new(notifier: &'a Notifier, stats: Arc<WorkerStats>, keep_reports: bool) -> Self {
        Sweep {
            notifier,
            stats,
            keep_reports,
            reports: Vec::new(),
            runs: Runs::default(),
            max_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
        }
    }

    fn report(&mut self, report: AttemptReport) {
        self.stats.count(&report.result);
        if self.keep_reports {
            self.reports.push(report);
        }
    }

    /// Claims and runs attempts until no due row is left (or, without
    /// `again`, after one claim): [`start`](Self::start)s what the sweep
    /// writes with, then turns until it is done ([`claim_if_low`](Self::claim_if_low),
    /// [`release_waiting`](Self::release_waiting), [`turn`](Self::turn)),
    /// then [`finish`](Self::finish)es.
    async fn run(
        mut self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        again: bool,
        mut wakes: Option<&mut tokio::sync::watch::Receiver<u64>>,
    ) -> Result<SweepSummary> {
        self.max_bytes = limits.max_in_flight_bytes.max(1);
        let sweep_started = std::time::Instant::now();
        let mut setup = self.start(filter, limits, shutdown, again);
        let mut turns = Turns::new();
        loop {
            self.claim_if_low(&mut turns, &setup, filter, limits, shutdown);
            // (Not while a claim is in flight: on SQLite, or on a pool of
            // one, the release would wait for the claim it does not poll.)
            if shutdown.is_cancelled() && !turns.waiting.is_empty() && turns.claiming.is_none() {
                self.release_waiting(&mut turns, &setup.stop).await;
            }
            // Done once nothing is held or being claimed; a woken sweep
            // also stays while its last successes are written, so a wake-up
            // meanwhile claims at once instead of after that write, and so
            // does one whose batch claims next notices (they come with it).
            let writing = (wakes.is_some() || setup.chain) && setup.batch.pending() > 0;
            let idle = turns.waiting.is_empty()
                && turns.running.is_empty()
                && turns.claiming.is_none()
                && setup.next_claimed.is_empty();
            if idle
                && (!turns.more || shutdown.is_cancelled())
                && (!writing || shutdown.is_cancelled())
            {
                break;
            }
            let waiting_for_writes = !turns.room || (idle && writing);
            self.turn(
                &mut turns,
                &mut setup,
                limits,
                shutdown,
                again,
                wakes.as_deref_mut(),
                waiting_for_writes,
            )
            .await;
        }
        let summary = self.finish(turns, setup).await?;
        crate::counters::sweep_finished(sweep_started.elapsed());
        Ok(summary)
    }

    /// What the sweep writes with: the stop its attempts share (and its
    /// watcher, which ends them `shutdown_timeout` after `shutdown`), the
    /// batch of successes (which, on PostgreSQL with ordered definitions
    /// and `again`, claims each key's next notice as it records a success
    /// and hands it back: `chain`), and the slots of its deliveries.
    fn start(
        &self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        again: bool,
    ) -> Setup {
        let inner = &self.notifier.engine;
        let stop = inner.lifecycle.stop.child();
        let watcher = tokio::spawn(stop_after(
            shutdown.clone(),
            stop.clone(),
            limits.shutdown_timeout,
        ));
        let (reports, batch_reports) = tokio::sync::mpsc::unbounded_channel();
        let (next_sender, next_claimed) = tokio::sync::mpsc::unbounded_channel();
        let chain = again
            && inner.store.backend() == sea_orm::DbBackend::Postgres
            && inner.defs.any_ordered();
        let next = chain.then(|| NextClaims {
            claim: ClaimNext {
                partitions: filter.partitions.clone(),
                bytes: limits.max_in_flight_bytes.max(1),
            },
            sender: next_sender,
            runs: self.runs.clone(),
            shutdown: shutdown.clone(),
        });
        let batch = SuccessBatch::start(
            inner.store.clone(),
            stop.give_up.clone(),
            self.stats.clone(),
            self.keep_reports.then_some(reports),
            next,
        );
        Setup {
            recorder: Recorder::Batched(batch.handle()),
            batch,
            batch_reports,
            next_claimed,
            chain,
            slots: Arc::new(Semaphore::new(limits.concurrency.max(1))),
            stop,
            watcher,
        }
    }

    /// Asks for a claim when the waiting rows run low: fewer than the
    /// deliveries that may run at once, or, while at most half of those
    /// run (deliveries end as fast as they start), fewer than half a
    /// batch, so the next claim runs while these start. And only while this
    /// sweep holds at most two batches (waiting, delivering, being
    /// written): claims, deliveries and writes of successes then overlap,
    /// and memory stays bounded. Slow deliveries keep their slots busy, so
    /// no more than the concurrency waits ahead of them when a claim is
    /// asked. Sets `turns.room`.
    fn claim_if_low<'f>(
        &self,
        turns: &mut Turns<'f>,
        setup: &Setup,
        filter: &'f DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
    ) where
        'a: 'f,
    {
        let inner: &'f attempt::engine::Engine = &self.notifier.engine;
        let concurrency = limits.concurrency.max(1);
        let low = if turns.running.len() <= concurrency / 2 {
            concurrency.max(limits.batch_size as usize / 2)
        } else {
            concurrency
        };
        // (Runs queued behind these are not counted: at most RUN - 1
        // each, they bound themselves.)
        let held = (turns.waiting.len() + turns.running.len() + setup.batch.pending()) as u64;
        // And only while its params (waiting, being delivered, queued in
        // runs) are under their bound in bytes: each claim takes at most
        // what is left of it, and an eighth of it (a claim's rows are
        // parsed from the database's answer, so held twice meanwhile),
        // always at least one row.
        let budget = limits.max_in_flight_bytes.max(1);
        let held_bytes = self.stats.payload_bytes();
        turns.room = held <= 2 * limits.batch_size && held_bytes < budget;
        if !turns.more
            || turns.claiming.is_some()
            || shutdown.is_cancelled()
            || turns.waiting.len() >= low
            || !turns.room
        {
            return;
        }
        let set_aside = inner.defs.any_ordered();
        let (store, limit) = (&inner.store, limits.batch_size);
        let bytes = (budget - held_bytes).min(budget / 8).max(1);
        turns.claiming = Some(Box::pin(async move {
            let asked = std::time::Instant::now();
            let claimed = claim::claim_due(store, filter, limit, set_aside, bytes).await;
            (claimed, asked)
        }));
    }

    /// Shutting down: the rows not started, and the runs behind them, go
    /// back at once.
    async fn release_waiting(&mut self, turns: &mut Turns<'_>, stop: &Stop) {
        let leases: Vec<Lease> = turns.waiting.drain(..).map(|(lease, _)| lease).collect();
        let behind = self.runs.take_behind(leases.iter().map(Lease::id));
        let leases = leases.into_iter().chain(behind).collect();
        self.release(leases, "shutting down", &stop.give_up).await;
    }

    /// One turn: waits for the first of an attempt ending, a claim
    /// answering, next notices from the batch, a slot for a waiting row,
    /// shutdown, the batch's writes (when `waiting_for_writes`) or a
    /// wake-up, and deals with it.
    #[allow(clippy::too_many_arguments)]
    async fn turn(
        &mut self,
        turns: &mut Turns<'_>,
        setup: &mut Setup,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        again: bool,
        mut wakes: Option<&mut tokio::sync::watch::Receiver<u64>>,
        waiting_for_writes: bool,
    ) {
        let chain = setup.chain;
        tokio::select! {
            biased;
            Some(done) = turns.running.join_next_with_id() => {
                self.attempt_ended(turns, done, &setup.stop).await;
            }
            // A claim is never dropped while in flight: rows it took would
            // wait out their lease. Its rows are released at the next turn
            // if shutdown came meanwhile.
            (claimed, asked) = async { match turns.claiming.as_mut() {
                Some(claim) => claim.await,
                None => std::future::pending().await,
            } }, if turns.claiming.is_some() => {
                self.claim_answered(turns, claimed, asked, again, limits).await;
            }
            // Next notices the batch claimed as it recorded successes.
            Some(leases) = setup.next_claimed.recv(), if chain => {
                // Chains keep this sweep going with nothing waking it
                // (their writes promote nothing): it claims again now and
                // then, so rows due meanwhile (a retry, a lease run out)
                // are not left until every chain has ended.
                if !turns.more && turns.last_claim.elapsed() >= RECLAIM_WHILE_CHAINING {
                    turns.more = true;
                }
                let n = leases.len() as u64;
                turns.claimed_total += n;
                self.stats.add_claimed(n);
                self.resolve(leases, &mut turns.waiting).await;
            }
            slot = setup.slots.clone().acquire_owned(), if !turns.waiting.is_empty() && !shutdown.is_cancelled()
                && (turns.running.is_empty() || starts_within(&turns.waiting, &self.stats, limits)) => {
                if let Ok(slot) = slot {
                    self.start_attempt(turns, setup, slot);
                }
            }
            _ = shutdown.cancelled(), if !turns.waiting.is_empty() && !shutdown.is_cancelled() => {}
            // Holding a full batch of successes being written, or only the
            // last ones (woken sweep): wait for them.
            _ = setup.batch.flushed(), if waiting_for_writes => {}
            // Notices made due meanwhile: claim again.
            changed = async { match wakes.as_mut() {
                Some(w) => w.changed().await.is_ok(),
                None => std::future::pending().await,
            } }, if wakes.is_some() && !turns.more && !shutdown.is_cancelled() => {
                if changed {
                    turns.more = true;
                    self.stats.add_wakeup();
                }
            }
        }
    }

    /// An attempt's task ended: its report (unless the batch reports it),
    /// and what waited behind it in its run released unless the batch
    /// recorded it as a plain success.
    async fn attempt_ended(
        &mut self,
        turns: &mut Turns<'_>,
        done: std::result::Result<(tokio::task::Id, Option<AttemptReport>), tokio::task::JoinError>,
        stop: &Stop,
    ) {
        match done {
            Ok((task, Some(report))) => {
                turns.attempting.remove(&task);
                // Not recorded by the batch: what waited behind it goes
                // back to the claims' turn rule.
                let behind = self.runs.take(report.notice_id);
                self.report(report);
                self.release(
                    behind,
                    "its run ended: the notice before it was not recorded as a plain success",
                    &stop.give_up,
                )
                .await;
            }
            // Handed to the batch, which reports it.
            Ok((task, None)) => {
                turns.attempting.remove(&task);
            }
            Err(e) => {
                tracing::error!(error = %e, "an attempt task failed");
                // Its lease was dropped (released in the background); so
                // is what waited behind it.
                if let Some(notice_id) = turns.attempting.remove(&e.id()) {
                    let behind = self.runs.take(notice_id);
                    self.release(
                        behind,
                        "its run ended: the attempt before it failed",
                        &stop.give_up,
                    )
                    .await;
                }
            }
        }
    }

    /// A claim answered: its rows wait for a slot, and the sweep claims
    /// again while claims come back full. A claim that fails ends the
    /// claiming; the sweep fails with it only if it claimed nothing.
    async fn claim_answered(
        &mut self,
        turns: &mut Turns<'_>,
        claimed: std::result::Result<claim::Claimed, sea_orm::DbErr>,
        asked: std::time::Instant,
        again: bool,
        limits: &SweepLimits,
    ) {
        turns.claiming = None;
        // Counted from its end: a slow claim is not followed by another at
        // once.
        turns.last_claim = std::time::Instant::now();
        match claimed {
            Ok(claimed) => {
                let n = claimed.leases.len() as u64;
                let aside = claimed.set_aside;
                tracing::trace!(n, aside, ms = asked.elapsed().as_millis() as u64, "claimed");
                turns.claimed_total += n;
                self.stats.add_claimed(n);
                // Rows set aside for their turn count too: a claim that
                // dealt with its whole limit, or filled its bound in bytes,
                // may leave more due.
                turns.more =
                    again && (claimed.looked_at() >= limits.batch_size || claimed.full_in_bytes);
                self.resolve(claimed.leases, &mut turns.waiting).await;
            }
            Err(e) => {
                turns.more = false;
                if turns.claimed_total == 0 {
                    turns.first_error = Some(e);
                } else {
                    self.stats.add_error();
                    tracing::warn!(error = %e, "claiming failed mid-sweep; finishing what is claimed");
                }
            }
        }
    }

    /// Starts the attempt of the first waiting row on its own task, holding
    /// `slot`.
    fn start_attempt(
        &mut self,
        turns: &mut Turns<'_>,
        setup: &Setup,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let Some((mut lease, def)) = turns.waiting.pop_front() else {
            return;
        };
        // Being delivered, its payload is held three times.
        lease.recount_payload(crate::state::DELIVERY_COPIES);
        let notifier = self.notifier.clone();
        let (recorder, stop) = (setup.recorder.clone(), setup.stop.clone());
        // The caller's subscriber follows the attempt onto its task. Boxed:
        // a task's future is moved on spawn, and an attempt's is large (a
        // tenth of a no-op drain's CPU went to copying it).
        let notice_id = lease.id();
        let task = turns.running.spawn(
            Box::pin(async move {
                match attempt::run(&notifier.engine, def, lease, &recorder, &stop, Some(slot)).await
                {
                    Ran::Done(result) => Some(AttemptReport { notice_id, result }),
                    Ran::Batched => None,
                }
            })
            .with_current_subscriber(),
        );
        turns.attempting.insert(task.id(), notice_id);
    }

    /// The sweep's end: the last successes written, next notices claimed
    /// by the last writes (after the sweep stopped taking rows) and the
    /// runs still queued released, the reports gathered.
    async fn finish(mut self, turns: Turns<'_>, setup: Setup) -> Result<SweepSummary> {
        let Setup {
            recorder,
            batch,
            mut batch_reports,
            mut next_claimed,
            stop,
            watcher,
            ..
        } = setup;
        drop(recorder);
        batch.finish().await;
        let mut late = Vec::new();
        while let Ok(leases) = next_claimed.try_recv() {
            late.extend(leases);
        }
        late.extend(self.runs.take_all());
        self.release(late, "shutting down", &stop.give_up).await;
        watcher.abort();
        while let Ok(report) = batch_reports.try_recv() {
            self.reports.push(report);
        }
        if let Some(e) = turns.first_error {
            return Err(e.into());
        }
        Ok(SweepSummary {
            claimed: turns.claimed_total,
            reports: std::mem::take(&mut self.reports),
        })
    }

    /// Finds each lease's definition: rows this process can deliver wait for
    /// a slot; rows of a definition that is unknown or invalid are parked;
    /// rows it cannot deliver (a handler registered elsewhere) are released.
    /// Their payloads count in the sweep's bytes while it holds them.
    async fn resolve(&mut self, leases: Vec<Lease>, waiting: &mut VecDeque<(Lease, DefRef)>) {
        let inner = &self.notifier.engine;
        let mut unusable = Vec::new();
        let mut elsewhere = Vec::new();
        for mut lease in leases {
            lease.count_payload(&self.stats, 1);
            if lease.payload_bytes() > self.max_bytes {
                tracing::info!(
                    notice_id = lease.id(),
                    bytes = lease.payload_bytes(),
                    max_in_flight_bytes = self.max_bytes,
                    "a param larger than the sweep's bound in bytes: it goes alone"
                );
            }
            match inner.defs.by_id(&inner.store.db, lease.row().def_id).await {
                Ok(def) if attempt::available(inner, &def).is_ok() => {
                    waiting.push_back((lease, def))
                }
                Ok(_) => elsewhere.push(lease),
                Err(crate::error::Error::Db(_)) => elsewhere.push(lease),
                Err(_) => unusable.push(lease),
            }
        }
        // What waits behind rows not attempted here goes back too.
        let behind = self
            .runs
            .take_behind(unusable.iter().chain(&elsewhere).map(Lease::id));
        elsewhere.extend(behind);
        for report in attempt::park::park(
            &self.notifier.engine,
            unusable,
            &inner.lifecycle.stop.give_up,
        )
        .await
        {
            self.report(report);
        }
        self.release(
            elsewhere,
            "not deliverable in this process",
            &inner.lifecycle.stop.give_up,
        )
        .await;
    }

    /// Releases leases that will not be attempted here.
    async fn release(&mut self, leases: Vec<Lease>, reason: &str, give_up: &CancellationToken) {
        if leases.is_empty() {
            return;
        }
        let ids: Vec<i64> = leases.iter().map(Lease::id).collect();
        let result = match release_all(self.notifier.store(), leases, give_up).await {
            Ok(n) => {
                self.notifier.engine.count_released(n);
                AttemptResult::Released {
                    reason: reason.to_string(),
                }
            }
            Err(error) => AttemptResult::Error { error },
        };
        for notice_id in ids {
            self.report(AttemptReport {
                notice_id,
                result: result.clone(),
            });
        }
    }
}

/// Whether the next waiting lease may start now: its payload, held three
/// times while delivered, keeps the sweep's bytes within their bound.
fn starts_within(
    waiting: &VecDeque<(Lease, DefRef)>,
    stats: &WorkerStats,
    limits: &SweepLimits,
) -> bool {
    let extra = waiting.front().map_or(0, |(lease, _)| {
        lease
            .payload_bytes()
            .saturating_mul(crate::state::DELIVERY_COPIES - 1)
    });
    stats.payload_bytes().saturating_add(extra) <= limits.max_in_flight_bytes
}

/// Releases `leases` in one statement, retrying while the database is away;
/// on giving up they are left to run out.
async fn release_all(
    store: &crate::state::Store,
    mut leases: Vec<Lease>,
    give_up: &CancellationToken,
) -> std::result::Result<u64, String> {
    let mut backoff = crate::db::Backoff::default();
    loop {
        match release_many(store, leases).await {
            Ok(n) => return Ok(n),
            Err(HeldMany {
                leases: held,
                error,
            }) => {
                if !crate::db::is_transient(&error) || !backoff.wait(give_up).await {
                    held.into_iter().for_each(Lease::forget);
                    return Err(format!("{error}; left to its lease"));
                }
                leases = held;
            }
        }
    }
}

/// After `shutdown`, lets deliveries run for `timeout`, then aborts them;
/// [`RELEASE_GRACE`] later, stops retrying writes.
async fn stop_after(shutdown: CancellationToken, stop: Stop, timeout: Duration) {
    shutdown.cancelled().await;
    tokio::time::sleep(timeout).await;
    stop.abort.cancel();
    tokio::time::sleep(RELEASE_GRACE).await;
    stop.give_up.cancel();
}
