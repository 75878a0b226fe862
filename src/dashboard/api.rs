//! The JSON API under `/api/`: the pages' data, and their actions.
//! Writes take a JSON body and answer the result or `{"error": "…"}`.

use axum::{
    Extension, Json,
    extract::{Path, Query, State},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::json;

use super::{
    AppState,
    auth::Actor,
    pages::pause_end,
    view::{self, Failure, NoticeQuery, READ_ONLY},
};
use crate::ops::{
    Audit, BulkAction, BulkReport, Interrupted, NoticeFilter, Place,
    bulk::{DEFAULT_BATCH_SIZE, DEFAULT_MAX_PINNED},
};

fn allowed(state: &AppState) -> Result<(), Failure> {
    if state.config.allow_actions {
        Ok(())
    } else {
        Err(Failure::Forbidden(READ_ONLY))
    }
}

/// `GET /api/overview` (`?q=` searches definitions by name).
pub(super) async fn overview(
    State(state): State<AppState>,
    Query(query): Query<super::pages::DefQuery>,
) -> Response {
    let of = crate::ops::overview::OverviewQuery {
        search: query.q,
        ..Default::default()
    };
    match crate::ops::overview::overview_of(state.notifier.db(), &of).await {
        Ok(o) => Json(o).into_response(),
        Err(e) => Failure::from(e).json(),
    }
}

/// `GET /api/notices`: the listing's query string; answers
/// `{"notices": […], "next_before_id": ID or null}`.
pub(super) async fn notices(
    State(state): State<AppState>,
    Query(query): Query<NoticeQuery>,
) -> Response {
    match view::find_bounded(&state, &query).await {
        Ok((_, page, found)) => {
            let next = (found.len() as u64 == page.limit)
                .then(|| found.last().map(|v| v.id))
                .flatten();
            Json(json!({ "notices": found, "next_before_id": next })).into_response()
        }
        Err(failure) => failure.json(),
    }
}

/// `GET /api/notices/{id}`.
pub(super) async fn notice(State(state): State<AppState>, Path(id): Path<i64>) -> Response {
    match crate::ops::find::show(state.notifier.db(), id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => Failure::from(e).json(),
    }
}

/// `GET /api/keys/blocked`: the ordering keys held back by a failure,
/// oldest head first.
pub(super) async fn keys_blocked(
    State(state): State<AppState>,
    Query(query): Query<super::view::KeysQuery>,
) -> Response {
    match super::view::blocked_keys(&state, &query).await {
        Ok(page) => Json(page).into_response(),
        Err(e) => Failure::from(e).json(),
    }
}

/// Most definitions `GET /api/defs` answers at once: 1,000.
const DEFS_LIMIT: u64 = 1_000;

/// `GET /api/defs`: the stored definitions by name, a page at a time
/// (`?q=` part of a name, `?after=` the last name of the previous page,
/// at most [`DEFS_LIMIT`]); the response's header `X-Next-After` names
/// where the next page starts when there may be one (percent-encoded).
pub(super) async fn defs(
    State(state): State<AppState>,
    Query(query): Query<super::pages::DefQuery>,
) -> Response {
    match crate::def::store::page(
        state.notifier.db(),
        query.q.as_deref(),
        query.after.as_deref(),
        DEFS_LIMIT,
    )
    .await
    {
        Ok(defs) => {
            let next = (defs.len() as u64 == DEFS_LIMIT)
                .then(|| defs.last().map(|d| d.name.clone()))
                .flatten();
            // Header values and URL keys are secrets: never shown.
            let defs: Vec<_> = defs
                .into_iter()
                .map(|stored| crate::redact::def_row(stored.row))
                .collect();
            let mut response = Json(defs).into_response();
            let encoded = next
                .map(|n| url::form_urlencoded::byte_serialize(n.as_bytes()).collect::<String>());
            if let Some(next) = encoded.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
                response.headers_mut().insert("x-next-after", next);
            }
            response
        }
        Err(e) => Failure::from(e).json(),
    }
}

/// The body of an action: why (required). Who is the authenticated user
/// (the basic-auth name, or `dashboard`): never a field of the body.
#[derive(Debug, Deserialize)]
pub(super) struct ActionBody {
    reason: String,
}

impl ActionBody {
    /// The fields it takes.
    const FIELDS: &[&str] = &["reason"];

    fn audit(self, actor: Actor) -> Result<Audit, Failure> {
        let audit = Audit::new(actor.0, self.reason);
        if audit.reason.is_empty() {
            return Err(Failure::BadRequest("a reason is required".into()));
        }
        Ok(audit)
    }
}

/// Longest unknown field name an error repeats, in characters.
const FIELD_ECHO: usize = 64;

/// `body` as a `T`, refusing (400, naming it) any field that is not one of
/// `fields`: a typo (`dryRun`, `definition`) never changes or widens an
/// action by being ignored.
fn strict<T: serde::de::DeserializeOwned>(
    body: serde_json::Value,
    fields: &[&str],
) -> Result<T, Failure> {
    let Some(object) = body.as_object() else {
        return Err(Failure::BadRequest("the body must be a JSON object".into()));
    };
    if let Some(unknown) = object.keys().find(|k| !fields.contains(&k.as_str())) {
        let shown: String = unknown.chars().take(FIELD_ECHO).collect();
        return Err(Failure::BadRequest(format!(
            "unknown field `{shown}`; the fields are: {}",
            fields.join(", ")
        )));
    }
    serde_json::from_value(body.clone()).map_err(|e| {
        // serde quotes the value it refused: at most an excerpt of it. A
        // field refused on its own is named (a flattened body's error
        // names none).
        let field = object.iter().find_map(|(k, v)| {
            let alone = serde_json::Value::Object([(k.clone(), v.clone())].into_iter().collect());
            serde_json::from_value::<T>(alone)
                .err()
                .filter(|e| !e.to_string().starts_with("missing field"))
                .map(|e| (k, e))
        });
        let (name, e) = match field {
            Some((k, e)) => (format!("field `{k}`"), e),
            None => ("body".to_string(), e),
        };
        let said: String = e.to_string().chars().take(200).collect();
        Failure::BadRequest(format!("{name}: {said}"))
    })
}

/// `POST /api/notices/{id}/requeue` with `{"reason": …}`.
pub(super) async fn requeue(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<i64>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    one(state, actor, id, body, true).await
}

/// `POST /api/notices/{id}/cancel` with `{"reason": …}`.
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<i64>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    one(state, actor, id, body, false).await
}

async fn one(
    state: AppState,
    actor: Actor,
    id: i64,
    body: serde_json::Value,
    requeue: bool,
) -> Response {
    if let Err(f) = allowed(&state) {
        return f.json();
    }
    let audit = match strict::<ActionBody>(body, ActionBody::FIELDS).and_then(|b| b.audit(actor)) {
        Ok(audit) => audit,
        Err(f) => return f.json(),
    };
    let done = if requeue {
        state.notifier.requeue(id, &audit).await
    } else {
        state.notifier.cancel(id, &audit).await
    };
    match done {
        Ok(()) => Json(json!({ "id": id, "done": if requeue { "requeued" } else { "cancelled" } }))
            .into_response(),
        Err(e) => Failure::from(e).json(),
    }
}

/// The body of `POST /api/bulk`: either the listing's query fields
/// (`place`, required, decides the action: `history` requeues, `in_flight`
/// cancels; at least one filter, or `"all": true`), or the `pin` a dry run
/// answered; a reason (not needed for a dry run), and `dry_run`.
///
/// A dry run counts and pins what the action would change and answers its
/// report with a `pin` (kept [`PIN_TTL`](super::PIN_TTL)); the call that
/// gives the pin back changes exactly those notices, each only if it has
/// not changed since. A call with filters and no dry run acts at once, in
/// batches, each changed as it was read (its report counts what it read).
#[derive(Debug, Deserialize)]
pub(super) struct BulkBody {
    #[serde(flatten)]
    query: NoticeQuery,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    pin: Option<String>,
}

impl BulkBody {
    /// The fields it takes: the listing's filters (not its paging), and
    /// its own.
    const FIELDS: &[&str] = &[
        "place",
        "def",
        "status",
        "failing",
        "q",
        "since",
        "until",
        "older_than",
        "partition",
        "key",
        "param",
        "reason",
        "dry_run",
        "all",
        "pin",
    ];
}

/// `POST /api/bulk`: answers the [`BulkReport`](crate::ops::BulkReport)
/// (and a dry run's `pin`).
pub(super) async fn bulk(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    if let Err(f) = allowed(&state) {
        return f.json();
    }
    let body: BulkBody = match strict(body, BulkBody::FIELDS) {
        Ok(body) => body,
        Err(f) => return f.json(),
    };
    let done = match &body.pin {
        Some(pin) => bulk_on_pin(&state, &actor, &body, pin).await,
        None => bulk_on_filters(&state, &actor, &body).await,
    };
    done.unwrap_or_else(Failure::json)
}

/// The audit of a bulk action: `body`'s reason (required), by `actor`.
fn bulk_audit(body: &BulkBody, actor: &Actor) -> Result<Audit, Failure> {
    ActionBody {
        reason: body.reason.clone(),
    }
    .audit(actor.clone())
}

/// A bulk call with the `pin` a dry run answered: changes exactly the
/// notices it pinned, each only if it has not changed since.
async fn bulk_on_pin(
    state: &AppState,
    actor: &Actor,
    body: &BulkBody,
    pin: &str,
) -> Result<Response, Failure> {
    if body.query.narrows() || body.all || body.dry_run {
        return Err(Failure::BadRequest(
            "a `pin` acts on what its dry run counted: give no filter, `all` or `dry_run` with it"
                .into(),
        ));
    }
    let audit = bulk_audit(body, actor)?;
    let Some(pinned) = state.pins.take(pin, &actor.0) else {
        return Err(Failure::Conflict(super::pages::PIN_GONE.into()));
    };
    Ok(report(
        state
            .notifier
            .apply_pinned(&pinned, &audit, DEFAULT_BATCH_SIZE, false)
            .await,
        None,
    ))
}

/// A bulk call with the listing's filters: acts at once, or for a dry
/// run counts and pins what it would change.
async fn bulk_on_filters(
    state: &AppState,
    actor: &Actor,
    body: &BulkBody,
) -> Result<Response, Failure> {
    require_place_and_filter(body)?;
    // A dry run needs no reason; an action does, before anything is read.
    let audit = match (body.dry_run, bulk_audit(body, actor)) {
        (true, _) => Audit::new(actor.0.clone(), ""),
        (false, Ok(audit)) => audit,
        (false, Err(f)) => return Err(f),
    };
    let query = NoticeQuery {
        before_id: None,
        limit: None,
        ..body.query.clone()
    };
    let place = query.place().map_err(Failure::BadRequest)?;
    let filter = view::resolved_filter(state.notifier.db(), &query).await?;
    refuse_search_as_param(&query, body.dry_run, &filter)?;
    if !body.all {
        narrowing(state, place, &filter).await?;
    }
    if !body.dry_run {
        // Counted as it goes: each batch is changed as it was read.
        let action = BulkAction::new(filter, audit);
        let done = match place {
            Place::History => state.notifier.requeue_where(&action).await,
            Place::InFlight => state.notifier.cancel_where(&action).await,
        };
        return Ok(report(done, None));
    }
    bulk_dry_run(state, actor, place, &filter, &audit).await
}

/// Refuses a bulk body without a `place`, or with neither a filter nor
/// `"all": true`.
fn require_place_and_filter(body: &BulkBody) -> Result<(), Failure> {
    if body
        .query
        .place
        .as_deref()
        .is_none_or(|p| p.trim().is_empty())
    {
        return Err(Failure::BadRequest(
            "`place` is required: history (requeue) or in_flight (cancel)".into(),
        ));
    }
    if !body.all && !body.query.narrows() {
        return Err(Failure::BadRequest(
            "a bulk action needs at least one filter, or \"all\": true".into(),
        ));
    }
    Ok(())
}

/// Refuses a search text given with `key` or `param`, and one an action
/// would read as param text.
fn refuse_search_as_param(
    query: &NoticeQuery,
    dry_run: bool,
    filter: &NoticeFilter,
) -> Result<(), Failure> {
    // A search text that found no notice id or key would act at once on
    // every notice whose param contains it: that needs `param`, said
    // outright (a dry run shows what it would count).
    if query.search() != view::Search::None {
        if query.key.as_deref().is_some_and(|k| !k.trim().is_empty())
            || query.param.as_deref().is_some_and(|p| !p.trim().is_empty())
        {
            return Err(Failure::BadRequest(
                "give `q` alone, or `key` / `param` without `q`".into(),
            ));
        }
        if !dry_run && filter.ids.is_none() && filter.key.is_none() {
            return Err(Failure::BadRequest(
                "`q` matched no notice id or idempotency key here; give `param` to act on the notices whose param contains it".into(),
            ));
        }
    }
    Ok(())
}

/// A bulk dry run: pins what `filter` matches on `place`, counts it, and
/// answers the report with the pin that confirms it.
async fn bulk_dry_run(
    state: &AppState,
    actor: &Actor,
    place: Place,
    filter: &NoticeFilter,
    audit: &Audit,
) -> Result<Response, Failure> {
    let pinned = state
        .notifier
        .pin(place, filter, DEFAULT_MAX_PINNED)
        .await
        .map_err(Failure::from)?;
    let done = state
        .notifier
        .apply_pinned(&pinned, audit, DEFAULT_BATCH_SIZE, true)
        .await;
    let Some(pin) = state.pins.put(pinned, &actor.0) else {
        return Err(Failure::Internal(
            "no randomness for a confirmation token".into(),
        ));
    };
    Ok(report(done, Some(pin)))
}

/// A bulk action's answer: its report (with a dry run's `pin`), or its
/// error with what it did before.
fn report(
    done: std::result::Result<BulkReport, Interrupted<BulkReport>>,
    pin: Option<String>,
) -> Response {
    match done {
        Ok(report) => {
            let mut answer = serde_json::to_value(&report).unwrap_or_default();
            if let (Some(pin), Some(fields)) = (pin, answer.as_object_mut()) {
                fields.insert("pin".into(), pin.into());
                fields.insert(
                    "pin_expires_in_secs".into(),
                    super::PIN_TTL.as_secs().into(),
                );
            }
            Json(answer).into_response()
        }
        Err(interrupted) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": interrupted.error.to_string(), "done": interrupted.done })),
        )
            .into_response(),
    }
}

/// Refuses a bulk `filter` on `place` that matches every notice:
/// `older_than: "0s"`, `since: "1000000000y"`, `param: "{"`: given, and
/// matching all (text filters counted in the database, not judged from
/// their value).
async fn narrowing(state: &AppState, place: Place, filter: &NoticeFilter) -> Result<(), Failure> {
    let every = match (filter.narrows(), filter.narrows_by_text_only()) {
        (false, _) => true,
        (true, true) => state
            .notifier
            .matches_every_notice(place, filter)
            .await
            .map_err(Failure::from)?,
        (true, false) => false,
    };
    match every {
        false => Ok(()),
        true => Err(Failure::BadRequest(
            "the filters given match every notice: narrow them, or say \"all\": true".into(),
        )),
    }
}

/// The body of `POST /api/defs/{name}/pause`.
#[derive(Debug, Deserialize)]
pub(super) struct PauseBody {
    reason: String,
    /// A UTC time or a duration from now; absent: until resumed.
    #[serde(default)]
    until: String,
}

/// `POST /api/defs/{name}/pause`.
pub(super) async fn pause(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(name): Path<String>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    if let Err(f) = allowed(&state) {
        return f.json();
    }
    let body: PauseBody = match strict(body, &["reason", "until"]) {
        Ok(body) => body,
        Err(f) => return f.json(),
    };
    let end = match pause_end(&body.until) {
        Ok(end) => end,
        Err(failure) => return failure.json(),
    };
    let audit = match (ActionBody {
        reason: body.reason,
    })
    .audit(actor)
    {
        Ok(audit) => audit,
        Err(f) => return f.json(),
    };
    match state.notifier.pause(&name, end, &audit).await {
        Ok(()) => Json(json!({ "def": name, "done": "paused" })).into_response(),
        Err(e) => Failure::from(e).json(),
    }
}

/// The body of `POST /api/defs/{name}/resume`: `{}`, or a reason.
#[derive(Debug, Deserialize)]
pub(super) struct ResumeBody {
    #[serde(default)]
    reason: String,
}

/// `POST /api/defs/{name}/resume` with `{}` or `{"reason": …}` (any other
/// field is refused, as on every write).
pub(super) async fn resume(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(name): Path<String>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    if let Err(f) = allowed(&state) {
        return f.json();
    }
    let body: ResumeBody = match strict(body, &["reason"]) {
        Ok(body) => body,
        Err(f) => return f.json(),
    };
    match state
        .notifier
        .resume(&name, &Audit::new(actor.0, body.reason))
        .await
    {
        Ok(()) => Json(json!({ "def": name, "done": "resumed" })).into_response(),
        Err(e) => Failure::from(e).json(),
    }
}
