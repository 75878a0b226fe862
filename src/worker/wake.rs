//! Wake: what ends a worker's wait before its next tick.
//!
//! - **In-process**: a producer, operator or attempt of the same
//!   [`Notifier`] (or a clone) that makes notices due wakes its workers at
//!   once, on every backend.
//! - **PostgreSQL**: a `LISTEN solid_notify` connection; the trigger of the
//!   migrations sends one notification per statement that makes notices due,
//!   whoever runs it (another process, plain SQL from another language). The
//!   listener reconnects by itself, and a lost connection wakes the worker
//!   too, since notifications may have been missed meanwhile.
//! - **A notice added due later** (a delayed notice), in this process (the
//!   producer hands its time over at commit) or, on PostgreSQL, in any
//!   (`NOTIFY solid_notify, 'later'`, migration 20): the worker asks the
//!   database when its next notice is due, without sweeping. On MySQL and
//!   SQLite it also asks every
//!   [`due_check_every`](crate::WorkerConfig::due_check_every).
//! - **The earliest due time** the worker knows of (a retry scheduled for
//!   later, a lease that may run out, a confirmation deadline): the worker
//!   sleeps until then, not blindly until its next tick.
//!
//! Wake-ups coalesce: however many arrive during a sweep, one more sweep
//! follows. Polling on the worker's schedule stays as the fallback, so a lost
//! notification delays a notice by one poll at most.

#[cfg(feature = "postgres")]
use std::ops::ControlFlow;
use std::time::Duration;

use std::sync::{Arc, atomic::AtomicBool};

use tokio_util::sync::CancellationToken;

use crate::{
    error::{Error, Result},
    notifier::Notifier,
    worker::config::ListenUrl,
};

/// The channel PostgreSQL workers listen on (see the migrations).
pub const WAKE_CHANNEL: &str = migration::WAKE_CHANNEL;

/// The payload of the notification sent for a notice added due later
/// (migration 20): workers ask when it is due instead of sweeping.
#[cfg(feature = "postgres")]
const LATER_PAYLOAD: &str = "later";

/// Pause before listening again after the listener failed to connect.
#[cfg(feature = "postgres")]
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// How long the listener may hear nothing before it checks that its
/// connection still answers (within [`Config::db_timeout`](crate::Config::db_timeout)):
/// 30 seconds. A connection cut off by a network partition stays open and
/// silent; one that does not answer is dropped and listening starts again.
pub const LISTEN_CHECK_EVERY: Duration = Duration::from_secs(30);

/// Checks [`WorkerConfig::listen_url`](crate::WorkerConfig::listen_url):
/// PostgreSQL only, a URL sqlx reads.
pub(crate) fn check_listen_url(notifier: &Notifier, url: Option<&ListenUrl>) -> Result<()> {
    let Some(url) = url else {
        return Ok(());
    };
    if notifier.store().backend() != sea_orm::DbBackend::Postgres {
        return Err(Error::Config(
            "listen_url: only PostgreSQL workers listen for wake-ups".into(),
        ));
    }
    listen_options(url).map(drop)
}

/// `url` read as PostgreSQL's connection options.
#[cfg(feature = "postgres")]
fn listen_options(url: &ListenUrl) -> Result<sea_orm::sqlx::postgres::PgConnectOptions> {
    use std::str::FromStr;
    if url::Url::parse(&url.0).is_err() {
        return Err(Error::Config(
            "listen_url: not a URL (postgres://user:password@host:port/database)".into(),
        ));
    }
    sea_orm::sqlx::postgres::PgConnectOptions::from_str(&url.0).map_err(|e| {
        Error::Config(format!(
            "listen_url {}: {}",
            url.shown(),
            crate::redact::scrub(&e.to_string(), &url.0)
        ))
    })
}

/// Without PostgreSQL there is nothing to listen to.
#[cfg(not(feature = "postgres"))]
fn listen_options(_: &ListenUrl) -> Result<()> {
    Ok(())
}

/// Listens for `NOTIFY solid_notify` until `stop` and wakes the notifier's
/// workers on each notification and after each reconnection. Does nothing on
/// other backends.
#[cfg(not(feature = "postgres"))]
pub(crate) async fn listen(
    _: Notifier,
    _: Option<ListenUrl>,
    _: bool,
    _: Arc<AtomicBool>,
    _: CancellationToken,
) {
}

/// `LISTEN` cannot hear (a pooler in transaction mode, or no connection
/// now): the gauge goes to 0 and `hears_notify` to false, and, the first
/// time, the workers are told to ask what is due, so that each plans its
/// due checks at once without sweeping (a worker waiting for its next
/// tick, an hour away on a slow schedule, would otherwise learn of it only
/// then; a sweep would fail while the database is down).
#[cfg(feature = "postgres")]
fn deaf(notifier: &Notifier, hears_notify: &AtomicBool) {
    crate::counters::wake_listening(false);
    if hears_notify.swap(false, std::sync::atomic::Ordering::Relaxed) {
        notifier.signals().ask_due();
    }
}

/// Listens for `NOTIFY solid_notify` until `stop`, on `listen_url` or else
/// the pool's connection options, and wakes the notifier's workers on each
/// notification and after each reconnection. Does nothing on other
/// backends. Behind a pooler in transaction mode, where `LISTEN` hears
/// nothing (`pooled`: the pool's, found by the worker's check; a
/// `listen_url`'s, checked before each connection), it warns once, sets
/// `solid_notify_wake_listening` to 0 and `hears_notify` to false (the
/// worker polls), and waits for `stop`. While it cannot connect,
/// `hears_notify` is false too, and true again once it listens.
#[cfg(feature = "postgres")]
pub(crate) async fn listen(
    notifier: Notifier,
    listen_url: Option<ListenUrl>,
    pooled: bool,
    hears_notify: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let db = notifier.db().clone();
    if db.get_database_backend() != sea_orm::DbBackend::Postgres {
        return;
    }
    let options = match listen_url.as_ref().map(listen_options) {
        Some(Ok(options)) => options,
        // Checked by `Worker::new`.
        Some(Err(_)) => return,
        None => db
            .get_postgres_connection_pool()
            .connect_options()
            .as_ref()
            .clone(),
    };
    let bound = notifier.config().db_timeout;
    while !stop.is_cancelled() {
        let can = match listen_url.is_some() {
            true => can_listen(&options, bound, &stop).await,
            false => !pooled,
        };
        if !can {
            warn_pooled(listen_url.is_some());
            deaf(&notifier, &hears_notify);
            stop.cancelled().await;
            return;
        }
        let own = own_pool(&options, bound);
        let mut listener = tokio::select! {
            connected = connect(&own, bound) => match connected {
                Ok(listener) => listener,
                Err(e) => {
                    deaf(&notifier, &hears_notify);
                    tracing::warn!(error = %e, "cannot listen for wake-ups; polling meanwhile");
                    tokio::select! {
                        _ = tokio::time::sleep(RECONNECT_PAUSE) => continue,
                        _ = stop.cancelled() => return,
                    }
                }
            },
            _ = stop.cancelled() => return,
        };
        crate::counters::wake_listening(true);
        hears_notify.store(true, std::sync::atomic::Ordering::Relaxed);
        // Anything that became due while we were not listening.
        notifier.wake_workers();
        if hear(&notifier, &mut listener, bound, &stop)
            .await
            .is_break()
        {
            return;
        }
    }
}

/// Whether `LISTEN` can hear anything on `options`' connections: `false`
/// behind a pooler in transaction mode. A check that fails (the server
/// does not answer) says `true`: connecting will fail and be tried again.
#[cfg(feature = "postgres")]
async fn can_listen(
    options: &sea_orm::sqlx::postgres::PgConnectOptions,
    bound: Duration,
    stop: &CancellationToken,
) -> bool {
    use crate::schema::pooling::{Pooled, pooled};
    let probed = tokio::select! {
        probed = tokio::time::timeout(bound, pooled(options)) => probed,
        () = stop.cancelled() => return true,
    };
    !matches!(probed, Ok(Ok(Pooled::KeepsPrepared | Pooled::Refused(_))))
}

/// The one warning of a listener that cannot listen (`own_url`: through
/// `listen_url`).
#[cfg(feature = "postgres")]
fn warn_pooled(own_url: bool) {
    let fix = match own_url {
        true => {
            "point listen_url (SOLID_NOTIFY_LISTEN_URL) at PostgreSQL itself or at a pooler in session mode"
        }
        false => {
            "set listen_url (SOLID_NOTIFY_LISTEN_URL) to PostgreSQL itself or to a pooler in session mode"
        }
    };
    tracing::warn!(
        "wake-ups cannot LISTEN through a pooler in transaction mode: {fix}; until then this worker polls (each tick, and asks what is due every due_check_every)"
    );
}

/// The listener's pool, made anew for each connection (none is opened
/// until it is used).
#[cfg(feature = "postgres")]
fn own_pool(
    options: &sea_orm::sqlx::postgres::PgConnectOptions,
    bound: Duration,
) -> sea_orm::sqlx::PgPool {
    // A pool of one connection, of its own, each time: a listener
    // dropped on a dead connection leaves a task that says `UNLISTEN`
    // to it, without a bound, holding its connection; not one of the
    // worker's.
    sea_orm::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(bound)
        .connect_lazy_with(options.clone())
}

/// Connects a listener on `own` and listens on [`WAKE_CHANNEL`], within
/// `bound`; the error as text.
#[cfg(feature = "postgres")]
async fn connect(
    own: &sea_orm::sqlx::PgPool,
    bound: Duration,
) -> Result<sea_orm::sqlx::postgres::PgListener, String> {
    let connected = async {
        let mut listener = sea_orm::sqlx::postgres::PgListener::connect_with(own).await?;
        listener.listen(WAKE_CHANNEL).await?;
        Ok::<_, sea_orm::sqlx::Error>(listener)
    };
    match tokio::time::timeout(bound, connected).await {
        Ok(connected) => connected.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}

/// Hears `listener`'s notifications and wakes the workers (or has them ask
/// what is due) until it fails or stops answering: `Continue`, listen
/// again; `Break`: `stop`.
#[cfg(feature = "postgres")]
async fn hear(
    notifier: &Notifier,
    listener: &mut sea_orm::sqlx::postgres::PgListener,
    bound: Duration,
    stop: &CancellationToken,
) -> ControlFlow<()> {
    loop {
        let next = tokio::select! {
            next = listener.try_recv() => next,
            _ = tokio::time::sleep(LISTEN_CHECK_EVERY) => {
                // Quiet for a while: does the connection still answer?
                let check = sea_orm::sqlx::query("SELECT 1").execute(&mut *listener);
                let checked = tokio::select! {
                    checked = tokio::time::timeout(bound, check) => checked,
                    _ = stop.cancelled() => return ControlFlow::Break(()),
                };
                match checked {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => tracing::warn!(error = %e, "wake-up listener failed its check; listening again"),
                    Err(_) => tracing::warn!("wake-up listener's connection did not answer within {bound:?}; listening again"),
                }
                // Notifications may have been missed meanwhile.
                notifier.wake_workers();
                return ControlFlow::Continue(());
            }
            _ = stop.cancelled() => return ControlFlow::Break(()),
        };
        match next {
            // A notice added due later: when is it due?
            Ok(Some(n)) if n.payload() == LATER_PAYLOAD => {
                tracing::trace!("notified of a notice due later");
                notifier.signals().ask_due();
            }
            Ok(Some(_)) => {
                tracing::trace!("notified");
                notifier.wake_workers();
            }
            Ok(None) => {
                // The connection was lost and is back: notifications may
                // have been missed.
                tracing::debug!("wake-up listener reconnected");
                notifier.wake_workers();
            }
            Err(e) => {
                tracing::warn!(error = %e, "wake-up listener failed; reconnecting");
                return ControlFlow::Continue(());
            }
        }
    }
}

#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Finding that `LISTEN` cannot hear tells the workers once to ask
    /// what is due (each then plans its due checks), and no more while it
    /// stays so.
    #[tokio::test]
    async fn a_listener_that_cannot_hear_tells_the_workers_once() {
        let db = sea_orm::Database::connect("sqlite::memory:")
            .await
            .expect("an in-memory SQLite database");
        let notifier = crate::Notifier::builder(db).build().expect("a notifier");
        let mut wakes = notifier.signals().subscribe_due_checks();
        wakes.mark_unchanged();
        let hears = AtomicBool::new(true);
        super::deaf(&notifier, &hears);
        assert!(!hears.load(Ordering::Relaxed));
        assert!(wakes.has_changed().expect("the sender lives"));
        wakes.mark_unchanged();
        super::deaf(&notifier, &hears);
        assert!(!wakes.has_changed().expect("the sender lives"));
    }
}
