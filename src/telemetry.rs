//! Telemetry: Prometheus metrics through the [`metrics`] facade.
//!
//! solid-notify always records its counters and histograms through
//! `metrics`; with no recorder installed they cost a few atomic loads. To
//! export them, either install your own recorder, or call `serve_metrics`
//! (feature `metrics`; what `solid-notify worker --metrics-addr` does). The gauges read from
//! the database are refreshed by [`spawn_gauges`].
//!
//! | name | type | labels |
//! |---|---|---|
//! | `solid_notify_notices` | gauge: notices in flight | `def`, `status` |
//! | `solid_notify_oldest_due_seconds` | gauge: how long the oldest due notice has waited (0: none) | `def` |
//! | `solid_notify_awaiting_confirmation` | gauge: notices sent, waiting for confirmation | `def` |
//! | `solid_notify_paused` | gauge: 1 while the definition is paused | `def` |
//! | `solid_notify_blocked_keys` | gauge: ordering keys held back by a final failure or parked notice ([`Notifier::blocked_keys`](crate::Notifier::blocked_keys)) | `def` |
//! | `solid_notify_attempts_total` | counter: attempts by how they ended | `def`, `outcome` |
//! | `solid_notify_attempt_duration_seconds` | histogram: claim to recorded outcome | `def` |
//! | `solid_notify_claims_total` | counter: rows claimed | |
//! | `solid_notify_lost_claims_total` | counter: attempts whose claim another sender or an operator took | |
//! | `solid_notify_sweep_duration_seconds` | histogram: one sweep | |
//! | `solid_notify_in_flight_payload_bytes` | gauge: bytes of params this process's workers hold (waiting, or being delivered, counted three times then) | |
//! | `solid_notify_outcomes_given_up_total` | counter: outcomes (a delivered success among them) not recorded because the process stopped while the database could not take them; each notice is due again when its lease ends | |
//! | `solid_notify_events_total` | counter: operational events written (`events_to`) | |
//! | `solid_notify_events_dropped_total` | counter: operational events not written because `events_to` names no valid definition (each logged at `error`) | |
//! | `solid_notify_notices_unreadable_total` | counter: notice rows parked because a cell cannot be read as its column (a plain-SQL producer's odd row; each logged at `error`, the reason in its failure log) | |
//!
//! `def` labels are definition names from `notify_def` (rows of a deleted
//! definition count under `_unknown`), never notice data; `outcome` is one
//! of `succeeded`, `awaiting_confirm`, `will_retry`, `final_failure`,
//! `lost_claim`, `skipped`, `released`, `parked`, `error`.

#[cfg(feature = "metrics")]
use std::net::SocketAddr;
#[cfg(feature = "metrics")]
use std::sync::Arc;
use std::{collections::HashMap, time::Duration};

use metrics::gauge;
#[cfg(feature = "metrics")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sea_orm::EntityTrait;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "metrics")]
use crate::error::Error;
use crate::{
    entity::notify_def, error::Result, notifier::Notifier, ops::overview::Group, status::Status,
};

/// How often [`spawn_gauges`] refreshes the database gauges by default:
/// every 5 seconds (one grouped query over `notify_msg` and one read of
/// `notify_def` each time).
pub const DEFAULT_GAUGE_EVERY: Duration = Duration::from_secs(5);

#[doc(hidden)]
/// Histogram buckets (seconds) of the duration histograms.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

use crate::counters::label;
pub use crate::counters::{METRICS_MAX_DEFS, OTHER_DEFS, UNKNOWN_DEF};

#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("solid_notify_notices", "Notices in flight");
    describe_gauge!(
        "solid_notify_in_flight_payload_bytes",
        Unit::Bytes,
        "Bytes of params held by this process's workers"
    );
    describe_counter!(
        "solid_notify_outcomes_given_up_total",
        "Outcomes not recorded because the process stopped while the database could not take them"
    );
    describe_counter!(
        "solid_notify_events_total",
        "Operational events written to events_to definitions"
    );
    describe_counter!(
        "solid_notify_events_dropped_total",
        "Operational events not written: events_to names no valid definition"
    );
    describe_gauge!(
        "solid_notify_oldest_due_seconds",
        Unit::Seconds,
        "How long the oldest due notice has waited"
    );
    describe_gauge!(
        "solid_notify_awaiting_confirmation",
        "Notices sent and waiting for confirmation"
    );
    describe_gauge!("solid_notify_paused", "1 while the definition is paused");
    describe_gauge!(
        "solid_notify_wake_listening",
        "1 while the wake-up listener hears NOTIFY; 0 when it cannot (a pooler in transaction mode) and workers poll"
    );
    describe_counter!("solid_notify_attempts_total", "Attempts by outcome");
    describe_histogram!(
        "solid_notify_attempt_duration_seconds",
        Unit::Seconds,
        "Attempt duration, claim to recorded outcome"
    );
    describe_counter!("solid_notify_claims_total", "Rows claimed");
    describe_counter!(
        "solid_notify_notices_unreadable_total",
        "Notice rows parked because a cell cannot be read"
    );
    describe_counter!(
        "solid_notify_lost_claims_total",
        "Attempts whose claim was taken by another sender or an operator"
    );
    describe_histogram!(
        "solid_notify_sweep_duration_seconds",
        Unit::Seconds,
        "Sweep duration"
    );
}

/// How long `/readyz` waits for the database before it answers 503: 2
/// seconds (Kubernetes' default probe timeout is 1 second; set the probe's
/// `timeoutSeconds` to 3 or more).
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Installs a Prometheus recorder as the process's global `metrics`
/// recorder and serves, until `shutdown` (feature `metrics`):
/// - `/metrics`: the Prometheus text;
/// - `/healthz`: 200 `ok` while the process serves (a liveness probe);
/// - `/readyz`: 200 `ready` when `db` answers within [`READY_TIMEOUT`] and
///   every migration this build knows has run, 503 with the reason
///   otherwise (a readiness probe; see [`readiness`]). The answer is
///   reused for [`READY_REUSE`]. It waits for a connection of `db`'s pool
///   like any statement: a pool busy for the whole timeout is not ready.
///
/// Once `shutdown` is cancelled the listener stops: probes then fail to
/// connect, which a probe counts as a failure.
///
/// Returns the bound address (pass port 0 for any free port). Fails if
/// another recorder is installed already or the address cannot be bound.
#[cfg(feature = "metrics")]
pub async fn serve_metrics(
    addr: SocketAddr,
    db: sea_orm::DatabaseConnection,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("metrics address {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("metrics address {addr}: {e}")))?;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("duration_seconds".into()),
            &DURATION_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| Error::Config(format!("metrics recorder: {e}")))?;
    describe();
    let upkeep = handle.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tick.tick() => upkeep.run_upkeep(),
                _ = stop.cancelled() => return,
            }
        }
    });
    let stopping = shutdown.clone();
    let last = Arc::new(tokio::sync::Mutex::new(None));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || render(handle.clone())),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || ready(db.clone(), stopping.clone(), last.clone())),
        )
        .layer(axum::middleware::from_fn(host_checked));
    tokio::spawn(crate::listener::serve(listener, app, shutdown));
    Ok(bound)
}

/// To a client on this host, answers only a `Host` that is an IP address
/// or `localhost` (any port): a page of another site whose name was
/// re-pointed at 127.0.0.1 (DNS rebinding) is refused with 421, as the
/// dashboard does without a token. Other clients (scrapers, which use
/// service names) are answered whatever the name.
#[cfg(feature = "metrics")]
async fn host_checked(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let local = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .is_none_or(|peer| peer.0.ip().to_canonical().is_loopback());
    if !local {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().host())
        .unwrap_or("")
        .to_string();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host.as_str(),
    };
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if name.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok() {
        next.run(request).await
    } else {
        (
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            "to a client on this host the metrics answer only to an IP address or localhost\n",
        )
            .into_response()
    }
}

/// How long a `/readyz` answer is reused: 1 second. However many probes
/// ask, the check takes at most one of the pool's connections, at most
/// once a second.
pub const READY_REUSE: Duration = Duration::from_secs(1);

/// The last `/readyz` answer and when it was made.
#[cfg(feature = "metrics")]
type LastReady = Arc<tokio::sync::Mutex<Option<(std::time::Instant, Ready)>>>;

#[cfg(feature = "metrics")]
type Ready = (axum::http::StatusCode, String);

#[cfg(feature = "metrics")]
async fn ready(
    db: sea_orm::DatabaseConnection,
    stopping: CancellationToken,
    last: LastReady,
) -> Ready {
    use axum::http::StatusCode;
    if stopping.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "stopping\n".into());
    }
    // One check at a time: the others wait for its answer.
    let mut last = last.lock().await;
    if let Some((at, answer)) = last.as_ref()
        && at.elapsed() < READY_REUSE
    {
        return answer.clone();
    }
    let answer = match tokio::time::timeout(READY_TIMEOUT, readiness(&db)).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the database did not answer within {}\n",
                humantime::format_duration(READY_TIMEOUT)
            ),
        ),
    };
    *last = Some((std::time::Instant::now(), answer.clone()));
    answer
}

/// What `/readyz` checks: the database answers, and every migration this
/// build knows is recorded in `solid_notify_migrations`. A schema newer
/// than the build (a rolling upgrade whose migration job ran first) is
/// ready: migrations only add what older builds ignore. The error says
/// what is missing, never a connection string.
pub async fn readiness(db: &sea_orm::DatabaseConnection) -> Result<()> {
    db.ping().await?;
    crate::schema::check_schema(db).await.map(drop)
}

#[cfg(feature = "metrics")]
async fn render(handle: PrometheusHandle) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
}

/// Refreshes the database gauges every `every` until `shutdown`: one
/// grouped query over `notify_msg` (count and earliest `next_call_time` per
/// definition and status), two small reads of `notify_def` (the paused
/// definitions and the names of the busiest, [`METRICS_MAX_DEFS`] at most),
/// and the count of blocked keys per definition
/// (as [`Notifier::blocked_keys`](crate::Notifier::blocked_keys) counts them).
pub fn spawn_gauges(
    notifier: Notifier,
    every: Duration,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = Seen::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            match refresh_gauges(&notifier, &seen).await {
                Ok(now_seen) => seen = now_seen,
                Err(e) => tracing::warn!(error = %e, "cannot refresh the metrics gauges"),
            }
        }
    })
}

/// The series a refresh set above 0.
#[derive(Default)]
struct Seen {
    counts: Vec<(String, Status)>,
    paused: Vec<String>,
    blocked: Vec<String>,
}

/// One refresh. Series seen last time and absent now are set to 0.
async fn refresh_gauges(notifier: &Notifier, seen_before: &Seen) -> Result<Seen> {
    use sea_orm::{ColumnTrait, QueryFilter, QueryOrder, QuerySelect};
    let db = &notifier.store().db;
    let groups = crate::ops::overview::in_flight_groups(db).await?;
    let now = chrono::Utc::now().naive_utc();
    // The definitions with series of their own: the paused ones, then the
    // busiest, up to METRICS_MAX_DEFS.
    let paused = notify_def::Entity::find()
        .filter(notify_def::Column::PausedUntil.gt(now))
        .order_by_asc(notify_def::Column::Name)
        .limit(METRICS_MAX_DEFS as u64)
        .all(db)
        .await?;
    let own = own_defs(&paused, &groups);
    let named = notify_def::Entity::find()
        .filter(notify_def::Column::Id.is_in(own.iter().copied()))
        .all(db)
        .await?;
    let InFlight {
        counts,
        oldest,
        awaiting,
    } = in_flight(groups, &named, &own, now, seen_before);
    set_in_flight_gauges(&counts, oldest, awaiting);
    let paused_now = paused_gauges(paused, &seen_before.paused);
    let blocked = blocked_gauges(db, &seen_before.blocked).await?;
    Ok(Seen {
        counts: counts
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, _)| k)
            .collect(),
        paused: paused_now,
        blocked,
    })
}

/// The definitions with series of their own: the `paused` ones, then the
/// busiest of `groups`, up to [`METRICS_MAX_DEFS`].
fn own_defs(paused: &[notify_def::Model], groups: &[Group]) -> Vec<i64> {
    let mut busy: HashMap<i64, i64> = HashMap::new();
    for g in groups {
        *busy.entry(g.def_id).or_default() += g.n;
    }
    let mut busiest: Vec<(i64, i64)> = busy.into_iter().collect();
    busiest.sort_by_key(|(id, n)| (std::cmp::Reverse(*n), *id));
    let mut own: Vec<i64> = paused.iter().map(|d| d.id).collect();
    for (id, _) in busiest {
        if own.len() >= METRICS_MAX_DEFS {
            break;
        }
        if !own.contains(&id) {
            own.push(id);
        }
    }
    own
}

/// The in-flight gauges of one refresh, by definition label.
struct InFlight {
    /// Notices per definition and status.
    counts: HashMap<(String, Status), i64>,
    /// Seconds the oldest due notice of each definition has waited.
    oldest: HashMap<String, f64>,
    /// Notices awaiting confirmation per definition.
    awaiting: HashMap<String, i64>,
}

/// Tallies `groups` under the labels of the `named` definitions (`own`
/// but unnamed: unknown; the rest: other), with the series seen before
/// and absent now at 0.
fn in_flight(
    groups: Vec<Group>,
    named: &[notify_def::Model],
    own: &[i64],
    now: chrono::NaiveDateTime,
    seen_before: &Seen,
) -> InFlight {
    let names: HashMap<i64, &str> = named.iter().map(|d| (d.id, d.name.as_str())).collect();
    let any_missing = !groups.is_empty();
    let name = |id: i64| match names.get(&id) {
        Some(name) => label(name),
        // Busy but not among the named: either past the cap or unknown.
        None if own.contains(&id) => UNKNOWN_DEF.to_string(),
        None => OTHER_DEFS.to_string(),
    };
    let mut counts: HashMap<(String, Status), i64> = HashMap::new();
    let mut oldest: HashMap<String, f64> = named.iter().map(|d| (label(&d.name), 0.0)).collect();
    let mut awaiting: HashMap<String, i64> = named.iter().map(|d| (label(&d.name), 0)).collect();
    if any_missing {
        oldest.entry(OTHER_DEFS.to_string()).or_default();
        awaiting.entry(OTHER_DEFS.to_string()).or_default();
    }
    for g in groups {
        let Some(status) = Status::parse(&g.status.to_string()) else {
            continue;
        };
        let def = name(g.def_id);
        *counts.entry((def.clone(), status)).or_default() += g.n;
        if status == Status::AwaitingConfirm {
            *awaiting.entry(def.clone()).or_default() += g.n;
        }
        // Leased rows carry their lease's end: a due row never waits past it.
        if let Some(at) = g.oldest.filter(|at| *at <= now) {
            let waited = (now - at).to_std().unwrap_or_default().as_secs_f64();
            let entry = oldest.entry(def).or_default();
            *entry = entry.max(waited);
        }
    }
    for key in &seen_before.counts {
        counts.entry(key.clone()).or_insert(0);
        // A definition that drops out of the named ones: its gauges to 0.
        oldest.entry(key.0.clone()).or_insert(0.0);
        awaiting.entry(key.0.clone()).or_insert(0);
    }
    InFlight {
        counts,
        oldest,
        awaiting,
    }
}

/// Sets `solid_notify_notices`, `solid_notify_oldest_due_seconds` and
/// `solid_notify_awaiting_confirmation`.
fn set_in_flight_gauges(
    counts: &HashMap<(String, Status), i64>,
    oldest: HashMap<String, f64>,
    awaiting: HashMap<String, i64>,
) {
    for ((def, status), n) in counts {
        gauge!("solid_notify_notices", "def" => def.clone(), "status" => status.to_string())
            .set(*n as f64);
    }
    for (def, secs) in oldest {
        gauge!("solid_notify_oldest_due_seconds", "def" => def).set(secs);
    }
    for (def, n) in awaiting {
        gauge!("solid_notify_awaiting_confirmation", "def" => def).set(n as f64);
    }
}

/// Sets `solid_notify_paused` to 1 for the `paused` definitions and to 0
/// for those paused `before` and not now. Returns the labels set to 1.
fn paused_gauges(paused: Vec<notify_def::Model>, before: &[String]) -> Vec<String> {
    // Paused definitions past the cap are not named (they show in the
    // dashboard); `_other` is never "paused".
    let paused_now: Vec<String> = paused
        .into_iter()
        .map(|d| label(&d.name))
        .filter(|name| name != OTHER_DEFS)
        .collect();
    for def in before {
        if !paused_now.contains(def) {
            gauge!("solid_notify_paused", "def" => def.clone()).set(0.0);
        }
    }
    for def in &paused_now {
        gauge!("solid_notify_paused", "def" => def.clone()).set(1.0);
    }
    paused_now
}

/// Sets `solid_notify_blocked_keys` per definition (the first
/// [`METRICS_MAX_DEFS`] by name, the rest under `_other`), and to 0 for
/// those `before` that have none now. Returns the definitions set above 0.
async fn blocked_gauges(db: &crate::db::Db, before: &[String]) -> Result<Vec<String>> {
    let mut counts: Vec<(String, u64)> = crate::ops::keys::blocked_counts(db)
        .await?
        .into_iter()
        .collect();
    counts.sort();
    let mut by_label: HashMap<String, u64> = HashMap::new();
    for (i, (name, n)) in counts.into_iter().enumerate() {
        let def = match i < METRICS_MAX_DEFS {
            true => label(&name),
            false => OTHER_DEFS.to_string(),
        };
        *by_label.entry(def).or_default() += n;
    }
    for def in before {
        by_label.entry(def.clone()).or_insert(0);
    }
    for (def, n) in &by_label {
        gauge!("solid_notify_blocked_keys", "def" => def.clone()).set(*n as f64);
    }
    Ok(by_label
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(def, _)| def)
        .collect())
}
