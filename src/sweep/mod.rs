//! Sweep: claim due notices in bounded batches and attempt them with bounded
//! concurrency, through the same deliver and record steps as the after-commit
//! attempt.
//!
//! A sweep claims at most `batch_size` rows (that batch is the only in-memory
//! queue: what does not fit stays in the database), runs at most
//! `concurrency` deliveries at once, records plain successes in bulk and
//! everything else row by row, and claims again at once when it found a full
//! batch. On shutdown it stops claiming, lets running deliveries finish up to
//! a timeout, and releases every claimed row it did not finish.

pub mod batch;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use chrono::Utc;
use futures::{StreamExt, stream::FuturesUnordered};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use batch::DueFilter;

use crate::{
    AttemptReport, AttemptResult, Notifier,
    def::{Confirm, DefRef},
    dispatch::{self, Claimed, Delivery},
    error::Result,
    handler::Outcome,
    worker::WorkerStats,
};

/// Bulk-recorded successes are flushed once this many are waiting ...
const FLUSH_AT: usize = 256;
/// ... or once the oldest has waited this long, so a crash re-sends little.
const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// Limits of one sweep.
#[derive(Debug, Clone)]
pub struct SweepLimits {
    /// Rows claimed per batch.
    pub batch_size: u64,
    /// Deliveries running at once.
    pub concurrency: usize,
    /// How long running deliveries may finish after shutdown is requested.
    pub shutdown_timeout: Duration,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Rows claimed.
    pub claimed: u64,
    /// Every attempt's report (only kept when asked for).
    pub reports: Vec<AttemptReport>,
}

struct Run<'a> {
    notifier: &'a Notifier,
    stats: &'a WorkerStats,
    keep_reports: bool,
    reports: Vec<AttemptReport>,
    successes: Vec<(i64, i32)>,
    /// When the oldest unflushed success must be written.
    flush_by: Option<Instant>,
}

impl Notifier {
    /// One sweep over the due rows matching `filter`; see the module docs.
    pub async fn sweep(
        &self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
        stats: &WorkerStats,
    ) -> Result<SweepSummary> {
        Run::new(self, stats, false)
            .sweep(filter, limits, shutdown)
            .await
    }

    /// Attempts up to `limit` due rows (any definition this process can
    /// deliver) and returns each attempt's report.
    pub async fn sweep_once(&self, limit: u64) -> Result<Vec<AttemptReport>> {
        let filter = DueFilter {
            def_ids: Some(self.deliverable_defs(&[], &[]).await?),
            partitions: Vec::new(),
        };
        let limits = SweepLimits {
            batch_size: limit,
            concurrency: 1,
            shutdown_timeout: Duration::ZERO,
        };
        let stats = WorkerStats::default();
        let mut run = Run::new(self, &stats, true);
        let claimed = batch::claim(&self.inner, &filter, limit).await?;
        run.process(claimed, &limits, &CancellationToken::new())
            .await?;
        Ok(run.reports)
    }

    /// Ids of the valid definitions this process can deliver, narrowed to
    /// `defs` and `handlers` when those are not empty (a definition matches by
    /// its name, or by the name of its handler).
    pub async fn deliverable_defs(&self, defs: &[String], handlers: &[String]) -> Result<Vec<i64>> {
        let all = self.inner.defs.all(&self.inner.db).await?;
        Ok(all
            .iter()
            .filter(|def| dispatch::available(&self.inner, def).is_ok())
            .filter(|def| {
                let handler = match &def.target {
                    crate::def::Target::Handler(t) => Some(t.handler.as_str()),
                    _ => None,
                };
                (defs.is_empty() && handlers.is_empty())
                    || defs.contains(&def.name)
                    || handler.is_some_and(|h| handlers.iter().any(|x| x == h))
            })
            .map(|def| def.id)
            .collect())
    }
}

impl<'a> Run<'a> {
    fn new(notifier: &'a Notifier, stats: &'a WorkerStats, keep_reports: bool) -> Self {
        Run {
            notifier,
            stats,
            keep_reports,
            reports: Vec::new(),
            successes: Vec::new(),
            flush_by: None,
        }
    }

    async fn sweep(
        &mut self,
        filter: &DueFilter,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
    ) -> Result<SweepSummary> {
        let mut claimed_total = 0;
        while !shutdown.is_cancelled() {
            let claimed = batch::claim(&self.notifier.inner, filter, limits.batch_size).await?;
            let n = claimed.len() as u64;
            claimed_total += n;
            self.stats.add_claimed(n);
            self.process(claimed, limits, shutdown).await?;
            if n < limits.batch_size {
                break;
            }
        }
        Ok(SweepSummary {
            claimed: claimed_total,
            reports: std::mem::take(&mut self.reports),
        })
    }

    /// Delivers a claimed batch with bounded concurrency and records outcomes.
    async fn process(
        &mut self,
        claimed: Vec<Claimed>,
        limits: &SweepLimits,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let inner = &self.notifier.inner;
        let mut queue = claimed.into_iter();
        let mut running = FuturesUnordered::new();
        let mut in_flight: HashMap<i64, i32> = HashMap::new();
        let mut to_release: Vec<(i64, i32)> = Vec::new();
        let mut stopping = false;
        loop {
            while !stopping && !shutdown.is_cancelled() && running.len() < limits.concurrency.max(1)
            {
                let Some(claimed) = queue.next() else { break };
                // Never start an attempt that could outlive its lease.
                let latest_start = claimed.row.next_call_time - inner.config.attempt_timeout;
                if Utc::now().naive_utc() >= latest_start {
                    to_release.push((claimed.row.id, claimed.row.version));
                    continue;
                }
                let def = match inner.defs.by_id(&inner.db, claimed.row.def_id).await {
                    Ok(def) => def,
                    Err(e) => {
                        let id = claimed.row.id;
                        let result = dispatch::park_claimed(inner, claimed, &e.to_string()).await;
                        self.report(id, result);
                        continue;
                    }
                };
                in_flight.insert(claimed.row.id, claimed.row.version);
                running.push(attempt(self.notifier, def, claimed));
            }
            if running.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    to_release.extend(queue.by_ref().map(|c| (c.row.id, c.row.version)));
                    let deadline = Instant::now() + limits.shutdown_timeout;
                    while let Ok(Some((def, claimed, delivery))) =
                        tokio::time::timeout_at(deadline.into(), running.next()).await
                    {
                        in_flight.remove(&claimed.row.id);
                        self.settle(def, claimed, delivery).await?;
                    }
                    // Whatever is still running is abandoned and released.
                    running.clear();
                    to_release.extend(in_flight.drain());
                }
                Some((def, claimed, delivery)) = running.next() => {
                    in_flight.remove(&claimed.row.id);
                    self.settle(def, claimed, delivery).await?;
                }
                _ = sleep_until(self.flush_by), if self.flush_by.is_some() => {
                    self.flush().await?;
                }
            }
        }
        self.flush().await?;
        if !to_release.is_empty() {
            let released = batch::release(inner, &to_release).await?;
            self.stats.add_released(released);
            tracing::info!(released, "released claimed notices for other workers");
        }
        Ok(())
    }

    /// Records one outcome: plain successes wait for a bulk move, the rest
    /// go through the single-row recorder.
    async fn settle(&mut self, def: DefRef, claimed: Claimed, delivery: Delivery) -> Result<()> {
        let plain_success = matches!(delivery.outcome, Outcome::Success { note: None })
            && delivery.broker.is_none()
            && def.confirm == Confirm::NotNeeded;
        if plain_success {
            self.successes.push((claimed.row.id, claimed.row.version));
            self.flush_by
                .get_or_insert_with(|| Instant::now() + FLUSH_AFTER);
            if self.successes.len() >= FLUSH_AT {
                self.flush().await?;
            }
            return Ok(());
        }
        let id = claimed.row.id;
        let result = dispatch::record(self.notifier, &def, claimed, delivery).await;
        self.report(id, result);
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        self.flush_by = None;
        let pairs = std::mem::take(&mut self.successes);
        if pairs.is_empty() {
            return Ok(());
        }
        let inner = &self.notifier.inner;
        if batch::succeed_all(inner, &pairs).await? {
            for (id, _) in pairs {
                self.report(id, AttemptResult::Succeeded);
            }
            return Ok(());
        }
        // Some claim was lost meanwhile: settle each row on its own.
        for (id, version) in pairs {
            let moved = batch::succeed_all(inner, &[(id, version)]).await?;
            let result = if moved {
                AttemptResult::Succeeded
            } else {
                AttemptResult::LostClaim
            };
            self.report(id, result);
        }
        Ok(())
    }

    fn report(&mut self, notice_id: i64, result: AttemptResult) {
        self.stats.count(&result);
        if self.keep_reports {
            self.reports.push(AttemptReport { notice_id, result });
        }
    }
}

/// Sleeps until `at` (forever when `None`; the caller guards that arm).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Delivers one claimed row inside its tracing span.
async fn attempt(
    notifier: &Notifier,
    def: DefRef,
    claimed: Claimed,
) -> (DefRef, Claimed, Delivery) {
    let span = tracing::info_span!(
        "attempt",
        notice_id = claimed.row.id,
        def = %def.name,
        attempt = claimed.attempt,
    );
    let started = Instant::now();
    let delivery = dispatch::deliver(&notifier.inner, &def, &claimed)
        .instrument(span.clone())
        .await;
    tracing::debug!(parent: &span, outcome = ?delivery.outcome, ms = started.elapsed().as_millis() as u64, "delivered");
    (def, claimed, delivery)
}
