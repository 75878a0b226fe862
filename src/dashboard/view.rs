//! What pages and API share: the listing query (the CLI's filters) and how
//! errors answer.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};

use super::DEFAULT_PAGE;
use crate::{
    error::Error,
    ops::{NoticeFilter, Page, Place, When},
    status::Status,
};

/// Largest page a listing serves.
pub(super) const MAX_PAGE: u64 = 500;
/// Longest search text (`q`, `key`, `param`, `def`) a listing takes: 256
/// characters (a longer one is refused with 400).
pub const MAX_SEARCH_CHARS: usize = 256;
/// Characters of each notice's param a listing shows: 1,024 (read so by
/// the database; a notice's own page shows the whole).
pub const PARAM_EXCERPT: u32 = 1024;
/// Listings run at once by one dashboard; more are answered 503 at once:
/// 4.
pub const MAX_SEARCHES: usize = 4;
/// Longest a listing may take before it is answered 503, by default
/// ([`DashboardConfig::search_timeout`](super::DashboardConfig::search_timeout)):
/// 10 seconds. Its statements are stopped then by the database itself, and
/// its place among [`MAX_SEARCHES`] is free again (on an in-memory SQLite
/// database a statement runs to its end).
pub const SEARCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A listing's query string, as forms send it (empty fields are absent).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub(super) struct NoticeQuery {
    /// `in_flight` (default) or `history`.
    pub place: Option<String>,
    pub def: Option<String>,
    pub status: Option<String>,
    /// Any non-empty value: only failing notices.
    pub failing: Option<String>,
    /// A notice id, an idempotency key, or text the param contains.
    pub q: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub older_than: Option<String>,
    pub partition: Option<String>,
    /// An exact idempotency key (what a search resolved to).
    pub key: Option<String>,
    /// Text the param contains (what a search resolved to).
    pub param: Option<String>,
    pub before_id: Option<String>,
    pub limit: Option<String>,
}

/// How the search box was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Search {
    None,
    Id(i64),
    /// An idempotency key or param text: both are tried.
    Text(String),
}

/// At most 64 characters of what a client sent, for an error message.
fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl NoticeQuery {
    pub fn place(&self) -> Result<Place, String> {
        match given(&self.place) {
            None | Some("in_flight") => Ok(Place::InFlight),
            Some("history") => Ok(Place::History),
            Some(other) => Err(format!("place `{other}` is not in_flight or history")),
        }
    }

    pub fn search(&self) -> Search {
        match given(&self.q) {
            None => Search::None,
            Some(q) => match q.parse::<i64>() {
                Ok(id) => Search::Id(id),
                Err(_) => Search::Text(q.to_string()),
            },
        }
    }

    /// The filter, without the search box's text (see [`Search`]).
    pub fn filter(&self) -> Result<NoticeFilter, String> {
        for (name, field) in [
            ("q", &self.q),
            ("key", &self.key),
            ("param", &self.param),
            ("def", &self.def),
        ] {
            if field
                .as_deref()
                .is_some_and(|f| f.chars().count() > MAX_SEARCH_CHARS)
            {
                return Err(format!("{name}: at most {MAX_SEARCH_CHARS} characters"));
            }
            if let Some(text) = field {
                crate::error::check_text(name, text).map_err(|e| e.to_string())?;
            }
        }
        let time = |name: &str, field: &Option<String>| {
            given(field)
                .map(|s| When::parse(s).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        Ok(NoticeFilter {
            def: given(&self.def).map(str::to_string),
            status: given(&self.status)
                .map(|s| Status::parse(s).ok_or_else(|| format!("unknown status `{s}`")))
                .transpose()?,
            failing: given(&self.failing).is_some(),
            older_than: given(&self.older_than)
                .map(|s| {
                    humantime::parse_duration(s)
                        .map_err(|e| format!("older_than `{}`: {e}", cut(s)))
                })
                .transpose()?,
            partition: given(&self.partition)
                .map(|s| {
                    s.parse()
                        .map_err(|_| format!("partition `{s}` is not a number"))
                })
                .transpose()?,
            since: time("since", &self.since)?.map(When::ago),
            until: time("until", &self.until)?.map(When::ago),
            key: given(&self.key).map(str::to_string),
            param_contains: given(&self.param).map(str::to_string),
            ..NoticeFilter::default()
        })
    }

    /// Whether any filter is set (a bulk API call needs one, or `all`).
    pub fn narrows(&self) -> bool {
        [
            &self.def,
            &self.status,
            &self.failing,
            &self.q,
            &self.since,
            &self.until,
            &self.older_than,
            &self.partition,
            &self.key,
            &self.param,
        ]
        .into_iter()
        .any(|f| given(f).is_some())
    }

    pub fn page(&self) -> Result<Page, String> {
        let number = |field: &Option<String>, what: &str| {
            given(field)
                .map(|s| {
                    s.parse::<i64>()
                        .map_err(|_| format!("{what} `{s}` is not a number"))
                })
                .transpose()
        };
        // Past the largest page, the largest page; below one, an error.
        let limit = match number(&self.limit, "limit")? {
            None => DEFAULT_PAGE,
            Some(n) if n < 1 => return Err(format!("limit `{n}` is less than 1")),
            Some(n) => n.min(MAX_PAGE as i64) as u64,
        };
        Ok(Page {
            before_id: number(&self.before_id, "before_id")?,
            limit,
        })
    }

    /// The same query, for a link: this page's filters with `before_id`.
    pub fn with_before(&self, before_id: Option<i64>) -> String {
        let mut next = self.clone();
        next.before_id = before_id.map(|id| id.to_string());
        query_string(&next)
    }
}

/// `query` as a URL query string (empty fields left out).
pub(super) fn query_string(query: &NoticeQuery) -> String {
    let value = serde_json::to_value(query).unwrap_or_default();
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    if let Some(fields) = value.as_object() {
        for (k, v) in fields {
            if let Some(v) = v.as_str().filter(|v| !v.trim().is_empty()) {
                out.append_pair(k, v);
            }
        }
    }
    out.finish()
}

/// An error as the dashboard answers it.
pub(super) enum Failure {
    BadRequest(String),
    NotFound(String),
    Forbidden(&'static str),
    Conflict(String),
    /// Too busy or too slow: 503.
    Unavailable(String),
    Internal(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::NoticeNotFound(_) | Error::UnknownDef(_) => Failure::NotFound(e.to_string()),
            Error::WrongState { .. } | Error::Conflict(_) => Failure::Conflict(e.to_string()),
            Error::Config(_) | Error::InvalidNotice { .. } | Error::InvalidInput { .. } => {
                Failure::BadRequest(e.to_string())
            }
            other => {
                tracing::warn!(error = %other, "dashboard request failed");
                Failure::Internal(other.to_string())
            }
        }
    }
}

impl Failure {
    pub fn status(&self) -> StatusCode {
        match self {
            Failure::BadRequest(_) => StatusCode::BAD_REQUEST,
            Failure::NotFound(_) => StatusCode::NOT_FOUND,
            Failure::Forbidden(_) => StatusCode::FORBIDDEN,
            Failure::Conflict(_) => StatusCode::CONFLICT,
            Failure::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Failure::BadRequest(m)
            | Failure::NotFound(m)
            | Failure::Conflict(m)
            | Failure::Unavailable(m)
            | Failure::Internal(m) => m.clone(),
            Failure::Forbidden(m) => (*m).to_string(),
        }
    }

    /// As JSON: `{"error": "…"}` with the status.
    pub fn json(self) -> Response {
        (
            self.status(),
            Json(serde_json::json!({ "error": self.message() })),
        )
            .into_response()
    }
}

/// The read-only refusal.
pub(super) const READ_ONLY: &str =
    "this dashboard is read-only: start it with --allow-actions to change notices";

/// The filter a listing query means: its filters, and the search box read
/// as an id (when a notice of `place` has it), else as an idempotency key
/// (when one has it), else as param text.
pub(super) async fn resolved_filter<C: sea_orm::ConnectionTrait>(
    db: &C,
    query: &NoticeQuery,
) -> Result<NoticeFilter, Failure> {
    let place = query.place().map_err(Failure::BadRequest)?;
    let filter = query.filter().map_err(Failure::BadRequest)?;
    let one = Page {
        before_id: None,
        limit: 1,
    };
    let any = async |f: &NoticeFilter| crate::ops::find::list(db, place, f, one).await;
    let text = match query.search() {
        Search::None => return Ok(filter),
        Search::Id(id) => {
            let by_id = NoticeFilter {
                ids: Some(vec![id]),
                ..filter.clone()
            };
            if !any(&by_id).await?.is_empty() {
                return Ok(by_id);
            }
            id.to_string()
        }
        Search::Text(text) => text,
    };
    let by_key = NoticeFilter {
        key: Some(text.clone()),
        ..filter.clone()
    };
    if !any(&by_key).await?.is_empty() {
        return Ok(by_key);
    }
    Ok(NoticeFilter {
        param_contains: Some(text),
        ..filter
    })
}

/// The notices a listing query finds, newest first, one page, each
/// param cut to [`PARAM_EXCERPT`].
async fn find<C: sea_orm::ConnectionTrait>(
    db: &C,
    query: &NoticeQuery,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    let place = query.place().map_err(Failure::BadRequest)?;
    let page = query.page().map_err(Failure::BadRequest)?;
    let filter = resolved_filter(db, query).await?;
    Ok((
        place,
        page,
        crate::ops::find::list_excerpts(db, place, &filter, page, PARAM_EXCERPT).await?,
    ))
}

/// What a listing that found no place among [`MAX_SEARCHES`], or whose
/// server stopped answering, is answered (503).
const BUSY: &str = "too many searches at once; try again in a moment";

/// [`find`], bounded: at most [`MAX_SEARCHES`] at once (503 past that),
/// answered within [`SEARCH_TIMEOUT`] (503), and on PostgreSQL cancelled
/// by the server then.
pub(super) async fn find_bounded(
    state: &super::AppState,
    query: &NoticeQuery,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    let Ok(permit) = state.searches.clone().try_acquire_owned() else {
        return Err(Failure::Unavailable(BUSY.into()));
    };
    let db = state.notifier.db().clone();
    let query = query.clone();
    let started = std::time::Instant::now();
    let (search_pool, mariadb) = (state.search_pool.clone(), state.mariadb.clone());
    let timeout = state.config.listing_timeout();
    // The permit is held until the database is done (stopped at
    // SEARCH_TIMEOUT by the database; at most twice that if it stops
    // answering), even after the answer gave up waiting: never more than
    // MAX_SEARCHES statements.
    let search = find_limited(db, query, search_pool, mariadb, timeout);
    let task = tokio::spawn(async move {
        let _permit = permit;
        search.await
    });
    let slow = || {
        Failure::Unavailable(format!(
            "the search took more than {:?}: narrow it (a definition, a status, a time)",
            timeout
        ))
    };
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(Err(Failure::Internal(_)))) if started.elapsed() >= timeout => Err(slow()),
        Ok(Ok(found)) => found,
        Ok(Err(_)) => Err(Failure::Internal("the search stopped".into())),
        Err(_) => Err(slow()),
    }
}

/// [`find`] with the database told to stop it after `timeout`, as each
/// backend can be told.
async fn find_limited(
    db: sea_orm::DatabaseConnection,
    query: NoticeQuery,
    search_pool: Option<sea_orm::DatabaseConnection>,
    mariadb: std::sync::Arc<tokio::sync::OnceCell<bool>>,
    timeout: std::time::Duration,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    match (db.get_database_backend(), search_pool) {
        (sea_orm::DbBackend::MySql, _) => find_on_mysql(&db, &query, &mariadb, timeout).await,
        (sea_orm::DbBackend::Sqlite, Some(pool)) => find_on_sqlite_pool(&pool, &query).await,
        (sea_orm::DbBackend::Sqlite, None) => find(&db, &query).await,
        _ => find_with_statement_timeout(&db, &query, timeout).await,
    }
}

/// [`find`] on MySQL or MariaDB, each statement limited to `timeout` in
/// the server's own form; a server that stops answering (to the version
/// probe too) gives the place back after twice that (a search only reads:
/// a statement dropped mid-way writes nothing).
async fn find_on_mysql(
    db: &sea_orm::DatabaseConnection,
    query: &NoticeQuery,
    mariadb: &tokio::sync::OnceCell<bool>,
    timeout: std::time::Duration,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    let search = async {
        // Asked once, remembered once known; while it cannot be
        // told, MariaDB's form (this project's server).
        let known = mariadb
            .get_or_try_init(|| async { super::search::is_mariadb(db).await.ok_or(()) })
            .await;
        let mariadb = known.copied().unwrap_or(true);
        let limited = super::search::Limited {
            inner: db,
            mariadb,
            timeout,
        };
        find(&limited, query).await
    };
    tokio::time::timeout(timeout.saturating_mul(2), search)
        .await
        .unwrap_or_else(|_| Err(Failure::Unavailable(BUSY.into())))
}

/// [`find`] on SQLite's search pool, in one read-only transaction.
async fn find_on_sqlite_pool(
    pool: &sea_orm::DatabaseConnection,
    query: &NoticeQuery,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    // One connection for the whole search: its time is set
    // when it is taken.
    let txn = sea_orm::TransactionTrait::begin(pool)
        .await
        .map_err(|e| Failure::from(Error::from(e)))?;
    let found = find(&txn, query).await;
    txn.rollback().await.ok();
    found
}

/// [`find`] on PostgreSQL, in a transaction whose `statement_timeout` is
/// `timeout`; 503 if the server does not answer within twice that.
async fn find_with_statement_timeout(
    db: &sea_orm::DatabaseConnection,
    query: &NoticeQuery,
    timeout: std::time::Duration,
) -> Result<(Place, Page, Vec<crate::ops::NoticeView>), Failure> {
    use sea_orm::ConnectionTrait;
    // Never a BEGIN dropped half-way (see `db::begin_bounded`).
    let txn = crate::db::begin_bounded(db, Default::default(), timeout)
        .await
        .map_err(|e| Failure::from(Error::from(e)))?;
    let limit = format!("SET LOCAL statement_timeout = {}", timeout.as_millis());
    // Once begun, a statement dropped mid-way is safe: its transaction
    // is rolled back on the way back to the pool. A server that stops
    // answering gives the place back after twice the answer's time.
    let found = tokio::time::timeout(timeout.saturating_mul(2), async {
        txn.execute_unprepared(&limit)
            .await
            .map_err(|e| Failure::from(Error::from(e)))?;
        find(&txn, query).await
    })
    .await
    .unwrap_or_else(|_| Err(Failure::Unavailable(BUSY.into())));
    // Read only: nothing to keep.
    txn.rollback().await.ok();
    found
}

/// A filter of blocked keys: `?def=` one definition's, `?limit=` at most
/// this many ([`keys::DEFAULT_BLOCKED_LIMIT`](crate::ops::keys::DEFAULT_BLOCKED_LIMIT)
/// by default).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct KeysQuery {
    pub def: Option<String>,
    pub limit: Option<u64>,
}

/// The blocked keys a query asks for.
pub(super) async fn blocked_keys(
    state: &super::AppState,
    query: &KeysQuery,
) -> crate::error::Result<crate::ops::keys::BlockedKeys> {
    let db = state.notifier.db();
    let def_id = match &query.def {
        None => None,
        Some(name) if name.is_empty() => None,
        Some(name) => Some(crate::ops::find::def_id(db, name).await?),
    };
    let limit = query
        .limit
        .unwrap_or(crate::ops::keys::DEFAULT_BLOCKED_LIMIT);
    crate::ops::keys::blocked(db, def_id, limit).await
}

#[cfg(test)]
mod prop {
    use proptest::prelude::*;

    use super::NoticeQuery;

    fn field() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(prop_oneof![
            prop::sample::select(vec![
                "in_flight",
                "history",
                "failed",
                "0",
                "-1",
                "1h",
                "0s",
                "2026-01-01",
                "9000y",
                "18446744073709551616",
                "",
            ])
            .prop_map(String::from),
            "\\PC{0,24}",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any query string reads as a place, a filter and a page, or as a
        /// message: never a panic; a link made from it is one line.
        #[test]
        fn listing_queries_never_panic(
            place in field(), def in field(), status in field(), failing in field(),
            q in field(), since in field(), until in field(), older_than in field(),
            partition in field(), key in field(), param in field(), before_id in field(),
            limit in field(),
        ) {
            let query = NoticeQuery {
                place, def, status, failing, q, since, until, older_than, partition, key,
                param, before_id, limit,
            };
            let _ = query.place();
            let _ = query.search();
            let _ = query.page();
            let _ = query.narrows();
            let _ = query.with_before(Some(1));
            let _ = query.filter();
            prop_assert!(!super::query_string(&query).contains('\n'));
        }
    }
}
