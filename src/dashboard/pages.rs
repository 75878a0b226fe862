//! The HTML pages: server-rendered with maud (every interpolation escaped),
//! forms for every action, no script.

use axum::{
    Extension, Form,
    extract::{Path, Query, State},
    http::header,
    response::{IntoResponse, Redirect, Response},
};
use chrono::NaiveDateTime;
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;

use super::{
    AppState,
    auth::Actor,
    chart,
    csrf::Token,
    view::{self, Failure, NoticeQuery, READ_ONLY},
};
use crate::{
    entity::notify_def,
    ops::{
        Audit, NoticeView, PauseEnd, Place, When,
        bulk::{DEFAULT_BATCH_SIZE, DEFAULT_MAX_PINNED, Pinned, PinnedAction},
        overview::{DefSummary, Overview, OverviewQuery},
    },
    status::Status,
};

const STYLE: &str = include_str!("style.css");

/// The stylesheet, embedded in the binary.
pub(super) async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLE,
    )
        .into_response()
}

/// A page: the layout around `body`.
fn page(state: &AppState, title: &str, current: &str, body: Markup) -> Markup {
    let nav = [
        ("overview", "/", "Overview"),
        ("in_flight", "/notices?place=in_flight", "In flight"),
        ("history", "/notices?place=history", "History"),
        ("defs", "/defs", "Definitions"),
        ("keys", "/keys/blocked", "Blocked keys"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · solid-notify" }
                link rel="stylesheet" href=(state.link("/assets/style.css"));
            }
            body {
                header {
                    a.brand href=(state.link("/")) { "solid-notify" }
                    nav {
                        @for (key, path, label) in nav {
                            a href=(state.link(path)) class=[(key == current).then_some("current")] { (label) }
                        }
                    }
                    @if !state.config.allow_actions {
                        span.badge title=(READ_ONLY) { "read-only" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

fn failure_page(state: &AppState, failure: Failure) -> Response {
    let status = failure.status();
    let body = html! { p.error { (failure.message()) } };
    (
        status,
        page(
            state,
            status.canonical_reason().unwrap_or("Error"),
            "",
            body,
        ),
    )
        .into_response()
}

fn time(t: Option<NaiveDateTime>) -> Markup {
    match t {
        Some(t) => {
            html! { time datetime=(t.format("%Y-%m-%dT%H:%M:%SZ")) { (t.format("%Y-%m-%d %H:%M:%S")) } }
        }
        None => html! { span.muted { "—" } },
    }
}

fn age(secs: f64) -> String {
    if secs <= 0.0 {
        return "—".into();
    }
    let d = std::time::Duration::from_secs(secs.round() as u64);
    humantime::format_duration(d).to_string()
}

fn status_tag(status: Status) -> Markup {
    html! { span class={"status s-" (status)} { (status) } }
}

/// A notice's status tag, and `scheduled` or `unreadable` beside it.
fn notice_state(v: &NoticeView) -> Markup {
    html! {
        @if v.unreadable.is_some() {
            span class="status s-unreadable" title=(v.unreadable.as_deref().unwrap_or_default()) { "unreadable" }
        } @else {
            (status_tag(v.status))
            @if v.scheduled { " " span.scheduled { "scheduled" } }
        }
    }
}

fn csrf_field(token: &Token) -> Markup {
    html! { input type="hidden" name="csrf" value=(token.0); }
}

fn notices_link(state: &AppState, query: &NoticeQuery) -> String {
    state.link(&format!("/notices?{}", view::query_string(query)))
}

/// `GET /keys/blocked`: the ordering keys held back by a final failure or
/// parked notice (`?def=` one definition's), each with its head's requeue
/// and cancel.
pub(super) async fn keys_blocked(
    State(state): State<AppState>,
    Extension(token): Extension<Token>,
    Query(query): Query<super::view::KeysQuery>,
) -> Response {
    let (keys, more) = match super::view::blocked_keys(&state, &query).await {
        Ok(page) => (page.keys, page.more),
        Err(e) => return failure_page(&state, e.into()),
    };
    let now = chrono::Utc::now().naive_utc();
    let def = query.def.clone().unwrap_or_default();
    let body = html! {
        p.muted {
            "Keys of ordered definitions with stop_on_failure whose oldest final failure or parked notice holds back the younger notices of the key. "
            "Requeue the head to send it again first, or cancel it to let the key go on."
        }
        form.filters method="get" action=(state.link("/keys/blocked")) {
            label { "Definition " input type="search" name="def" value=(def); }
            button type="submit" { "Find" }
        }
        p.muted data-count="blocked" {
            (keys.len()) " blocked"
            @if more { " (the oldest shown; more are blocked: the gauge solid_notify_blocked_keys counts them all)" }
        }
        @if !keys.is_empty() {
            table.keys {
                thead { tr { th { "Definition" } th { "Key" } th { "Head" } th { "Status" } th { "Blocked for" } th { "Waiting" } @if state.config.allow_actions { th { "Actions on the head" } } } }
                tbody {
                    @for k in &keys {
                        // Keys are the producers': control characters escaped.
                        @let key = crate::ops::keys::printable(&k.ordering_key);
                        tr data-key=(key) data-def=(k.def) data-waiting=(k.waiting) {
                            td { (k.def) }
                            td { code { (key) } }
                            td { a href=(state.link(&format!("/notices/{}", k.head_id))) { (k.head_id) } }
                            td { (status_tag(k.head_status)) }
                            td { (age((now - k.blocked_since).num_seconds() as f64)) }
                            td { (k.waiting) }
                            @if state.config.allow_actions {
                                td {
                                    (action_form(&state, &token, &format!("/notices/{}/requeue", k.head_id), "Requeue", "Sent again first."))
                                    (action_form(&state, &token, &format!("/notices/{}/cancel", k.head_id), "Cancel", "Given up; the key goes on."))
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page(&state, "Blocked keys", "keys", body).into_response()
}

/// A search among definitions, and where a page of them starts.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct DefQuery {
    /// Part of a name.
    pub q: Option<String>,
    /// The last name of the previous page.
    pub after: Option<String>,
}

/// `GET /`: the overview (`?q=` searches definitions by name).
pub(super) async fn overview(
    State(state): State<AppState>,
    Query(query): Query<DefQuery>,
) -> Response {
    let of = OverviewQuery {
        search: query.q.clone(),
        ..OverviewQuery::default()
    };
    match crate::ops::overview::overview_of(state.notifier.db(), &of).await {
        Ok(o) => page(
            &state,
            "Overview",
            "overview",
            overview_body(&state, &o, &query),
        )
        .into_response(),
        Err(e) => failure_page(&state, e.into()),
    }
}

fn overview_body(state: &AppState, o: &Overview, query: &DefQuery) -> Markup {
    html! {
        (overview_defs(state, o, query))
        (overview_workers(o))
        p.muted { "Read at " (o.at.format("%Y-%m-%d %H:%M:%S")) " UTC." }
    }
}

/// The overview's section of definitions: the search, the table, the
/// others summed and the orphans.
fn overview_defs(state: &AppState, o: &Overview, query: &DefQuery) -> Markup {
    html! {
        section {
            h2 { "Definitions" }
            @if o.def_count > o.defs.len() as u64 || query.q.is_some() {
                form.filters method="get" action=(state.link("/")) {
                    label { "Definition " input type="search" name="q" value=(query.q.clone().unwrap_or_default()) placeholder="part of a name"; }
                    button type="submit" { "Find" }
                }
                p.muted data-count="shown" {
                    "Showing " (o.defs.len()) " of " (o.def_count) " definitions"
                    @if query.q.as_deref().is_some_and(|q| !q.is_empty()) { " whose name matches" }
                    @else { ": those failing, paused, busy or active in the last 24 hours first" }
                    ". "
                    a href=(state.link("/defs")) { "All definitions" }
                }
            }
            table.defs {
                thead { tr {
                    th { "Definition" } th { "State" } th.num { "In flight" } th.num { "Failing" }
                    th.num { "Awaiting confirmation" } th.num { "Oldest due" } th { "Last 24 h" }
                    th.num { "Succeeded 24 h" } th.num { "Failed 24 h" }
                } }
                tbody {
                    @for d in &o.defs {
                        (overview_def_row(state, d))
                    }
                }
            }
            @if o.others.defs > 0 {
                p.muted data-count="others" {
                    (o.others.defs) " other definitions: " (o.others.total) " in flight, "
                    (o.others.failing) " failing, " (o.others.awaiting) " awaiting confirmation; "
                    (o.others.succeeded_24h) " succeeded and " (o.others.failed_24h) " failed in the last 24 h."
                }
            }
            @if o.orphans > 0 {
                p.error { (o.orphans) " notices in flight belong to a definition that no longer exists." }
            }
        }
    }
}

/// One definition's row of the overview: its state, counts linked to
/// their listings, and its last 24 hours.
fn overview_def_row(state: &AppState, d: &DefSummary) -> Markup {
    let link = |def: &str, place: &str, status: Option<Status>, failing: bool| {
        notices_link(
            state,
            &NoticeQuery {
                place: Some(place.into()),
                def: Some(def.into()),
                status: status.map(|s| s.to_string()),
                failing: failing.then(|| "1".into()),
                ..NoticeQuery::default()
            },
        )
    };
    let ok: i64 = d.last_24h.iter().map(|h| h.succeeded).sum();
    let failed: i64 = d.last_24h.iter().map(|h| h.failed).sum();
    html! {
        tr data-def=(d.name) {
            td { a href=(link(&d.name, "in_flight", None, false)) { (d.name) } span.muted { " " (d.channel) } }
            td {
                @if d.circuit_open { span.state.open title=[d.pause_reason.as_deref()] { "circuit open" } }
                @else if d.paused_until.is_some() { span.state.paused title=[d.pause_reason.as_deref()] { "paused" } }
                @else { span.state.active { "active" } }
            }
            td.num data-count="in_flight" { a href=(link(&d.name, "in_flight", None, false)) { (d.total) } }
            td.num.warn[d.failing > 0] data-count="failing" {
                a href=(link(&d.name, "in_flight", Some(Status::Failed), false)) { (d.failing) }
            }
            td.num data-count="awaiting" { a href=(link(&d.name, "in_flight", Some(Status::AwaitingConfirm), false)) { (d.awaiting) } }
            td.num.warn[d.oldest_due_secs > 60.0] { (age(d.oldest_due_secs)) }
            td { (chart::hours(&d.last_24h)) }
            td.num data-count="succeeded_24h" { a href=(link(&d.name, "history", Some(Status::Succeeded), false)) { (ok) } }
            td.num.bad[failed > 0] data-count="failed_24h" {
                a href=(link(&d.name, "history", Some(Status::FinalFailure), false)) { (failed) }
            }
        }
    }
}

/// The overview's section of workers: each with its heartbeat's counts.
fn overview_workers(o: &Overview) -> Markup {
    html! {
        section {
            h2 { "Workers" }
            @if o.workers.is_empty() {
                p.muted { "No worker has written a heartbeat in the last day." }
            } @else {
                table.workers {
                    thead { tr {
                        th { "Worker" } th { "State" } th { "Started" } th { "Last seen" }
                        th.num { "Sweeps" } th.num { "Claimed" } th.num { "Succeeded" } th.num { "Failed" }
                    } }
                    tbody {
                        @for w in &o.workers {
                            tr class=[(!w.alive).then_some("gone")] {
                                td { (w.row.id) }
                                td { @if w.alive { span.state.active { "alive" } } @else { span.state.gone { "gone" } } }
                                td { (time(Some(w.row.started_at))) }
                                td { (time(Some(w.row.seen_at))) }
                                td.num { (w.row.sweeps) } td.num { (w.row.claimed) }
                                td.num { (w.row.succeeded) } td.num { (w.row.failed) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /notices`: in flight or history, filtered, newest first, keyset pages.
pub(super) async fn notices(
    State(state): State<AppState>,
    Query(query): Query<NoticeQuery>,
) -> Response {
    // A choice of names up to SELECT_DEFS definitions, a text field past it.
    let defs = match crate::def::store::page(state.notifier.db(), None, None, SELECT_DEFS + 1).await
    {
        Ok(defs) => defs
            .into_iter()
            .map(|stored| stored.row)
            .collect::<Vec<_>>(),
        Err(e) => return failure_page(&state, e.into()),
    };
    let (place, page_, found) = match view::find_bounded(&state, &query).await {
        Ok(found) => found,
        Err(failure) => return failure_page(&state, failure),
    };
    let (title, current) = match place {
        Place::InFlight => ("Notices in flight", "in_flight"),
        Place::History => ("History", "history"),
    };
    let body = html! {
        (filter_form(&state, &query, place, &defs))
        (notice_table(&state, &found))
        nav.pages {
            @if page_.before_id.is_some() {
                a href=(state.link(&format!("/notices?{}", query.with_before(None)))) { "« Newest" }
            }
            @if found.len() as u64 == page_.limit {
                @if let Some(last) = found.last() {
                    a.next href=(state.link(&format!("/notices?{}", query.with_before(Some(last.id))))) { "Older »" }
                }
            }
        }
        @if state.config.allow_actions && !found.is_empty() {
            @let action = match place { Place::History => "Requeue", Place::InFlight => "Cancel" };
            p {
                a.button.bulk href=(state.link(&format!("/bulk?{}", query.with_before(None)))) {
                    (action) " every notice matching these filters…"
                }
            }
        }
    };
    page(&state, title, current, body).into_response()
}

/// Most definitions the notices' filter offers as a list: 200 (past it, a
/// text field takes the name).
const SELECT_DEFS: u64 = 200;

/// Definitions shown per page of `/defs`: 50.
const DEFS_PAGE: u64 = 50;

fn filter_form(
    state: &AppState,
    q: &NoticeQuery,
    place: Place,
    defs: &[notify_def::Model],
) -> Markup {
    let value = |f: &Option<String>| f.clone().unwrap_or_default();
    let statuses: &[Status] = match place {
        Place::InFlight => &[Status::NotSent, Status::Failed, Status::AwaitingConfirm],
        Place::History => &[
            Status::Succeeded,
            Status::FinalFailure,
            Status::Cancelled,
            Status::Parked,
        ],
    };
    let chosen_status = q.status.clone().unwrap_or_default();
    let chosen_def = q.def.clone().unwrap_or_default();
    html! {
        form.filters method="get" action=(state.link("/notices")) {
            input type="hidden" name="place" value=(match place { Place::InFlight => "in_flight", Place::History => "history" });
            @if defs.len() as u64 > SELECT_DEFS {
                label { "Definition " input type="text" name="def" value=(chosen_def) placeholder="name" size="20"; }
            } @else {
                label { "Definition " select name="def" {
                    option value="" { "any" }
                    @for d in defs { option value=(d.name) selected[d.name == chosen_def] { (d.name) } }
                } }
            }
            label { "Status " select name="status" {
                option value="" { "any" }
                @for s in statuses { option value=(s) selected[s.to_string() == chosen_status] { (s) } }
            } }
            label { input type="checkbox" name="failing" value="1" checked[q.failing.as_deref().is_some_and(|f| !f.is_empty())]; " failing" }
            label { "Search " input type="search" name="q" value=(value(&q.q)) placeholder="id, key or param text"; }
            label { "Since " input type="text" name="since" value=(value(&q.since)) placeholder="2026-11-23 or 2h" size="12"; }
            label { "Until " input type="text" name="until" value=(value(&q.until)) placeholder="2026-11-24 or 1h" size="12"; }
            label { "Older than " input type="text" name="older_than" value=(value(&q.older_than)) placeholder="1h" size="6"; }
            label { "Partition " input type="number" name="partition" value=(value(&q.partition)) min="0" class="narrow"; }
            button type="submit" { "Filter" }
        }
    }
}

fn excerpt(v: &NoticeView) -> String {
    let text = v.param.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

fn notice_table(state: &AppState, found: &[NoticeView]) -> Markup {
    html! {
        @if found.is_empty() {
            p.muted.empty { "No notice matches." }
        } @else {
            table.notices {
                thead { tr {
                    th.num { "Id" } th { "Definition" } th { "Status" } th.num { "Failures" }
                    th { "Created" } th { "Last call" } th { "Next call" } th { "Key" } th { "Param" }
                } }
                tbody {
                    @for v in found {
                        tr data-id=(v.id) {
                            td.num { a href=(state.link(&format!("/notices/{}", v.id))) { (v.id) } }
                            td { (v.def.as_deref().unwrap_or("?")) }
                            td { (notice_state(v)) @if v.claim_live { " " span.muted { "(running)" } } }
                            td.num { (v.retry_times) }
                            td { (time(Some(v.create_time))) }
                            td { (time(v.last_call_time)) }
                            td { @if v.place == Place::InFlight { (time(Some(v.next_call_time))) } @else { span.muted { "—" } } }
                            td { (v.idempotency_key.as_deref().unwrap_or("")) }
                            td.param { code { (excerpt(v)) } }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /notices/{id}`: one notice, in flight or in history.
pub(super) async fn notice(
    State(state): State<AppState>,
    Extension(token): Extension<Token>,
    Path(id): Path<i64>,
) -> Response {
    let v = match crate::ops::find::show(state.notifier.db(), id).await {
        Ok(v) => v,
        Err(e) => return failure_page(&state, e.into()),
    };
    let param = serde_json::to_string_pretty(&v.param).unwrap_or_default();
    let body = html! {
        dl.detail {
            dt { "Definition" } dd { (v.def.as_deref().unwrap_or("?")) " (id " (v.def_id) ")" }
            dt { "Where" } dd { (match v.place { Place::InFlight => "in flight", Place::History => "history" }) }
            @if v.origin != crate::status::Origin::Producer {
                dt { "Written by" } dd { "the library: " (match v.origin { crate::status::Origin::Alert => "an alert e-mail", _ => "an operational event" }) }
            }
            dt { "Status" } dd { (notice_state(&v)) }
            @if let Some(why) = &v.unreadable {
                dt { "Cannot be read" } dd.unreadable { (why) }
            }
            @if let Some(t) = v.not_before {
                dt { "Not before" } dd { (time(Some(t))) @if v.scheduled { " (no attempt before then)" } }
            }
            dt { "Failed attempts" } dd { (v.retry_times) }
            dt { "Created" } dd { (time(Some(v.create_time))) " UTC" }
            dt { "Last call" } dd { (time(v.last_call_time)) }
            @if v.place == Place::InFlight {
                dt { "Next call" } dd { (time(Some(v.next_call_time))) @if v.claim_live { " (an attempt holds it until then)" } }
            }
            dt { "Partition" } dd { (v.partition) }
            dt { "Idempotency key" } dd { (v.idempotency_key.as_deref().unwrap_or("—")) }
            @if let Some(key) = &v.ordering_key { dt { "Ordering key" } dd { (key) " (sent after the older notices of this key finish)" } }
            @if v.step > 0 || v.step_result.is_some() {
                dt { "Steps done" } dd { (v.steps_done) " (on step " (v.step + 1) ")" }
                @if let Some(result) = &v.step_result { dt { "Step result" } dd { code { (result) } } }
            }
            dt { "Trace id" } dd { code { (v.trace_id.as_deref().unwrap_or("—")) } }
            dt { "Version" } dd { (v.version) }
            @if let Some(over) = &v.target_override { dt { "Target override" } dd { code { (over) } } }
        }
        h2 { "Param" }
        pre.param { (param) }
        h2 { "Description" }
        pre.description { (v.description) }
        h2 { "Log" }
        @if v.errors.is_empty() {
            p.muted { "No failure and no operator action so far." }
        } @else {
            ol.timeline { @for line in &v.errors { li { (line) } } }
        }
        @if state.config.allow_actions {
            @if v.place == Place::History && v.status.is_requeueable() {
                (action_form(&state, &token, &format!("/notices/{id}/requeue"), "Requeue", "Back in flight, due now, with a fresh retry budget."))
            }
            @if v.scheduled {
                (action_form(&state, &token, &format!("/notices/{id}/requeue"), "Send now", "Due at once instead of at its time (its key's order still applies)."))
            }
            @if v.place == Place::InFlight {
                (action_form(&state, &token, &format!("/notices/{id}/cancel"), "Cancel", "Moves it to history as cancelled; a running attempt loses its claim."))
            }
            @if v.place == Place::History && v.ordering_key.is_some() && matches!(v.status, Status::FinalFailure | Status::Parked) {
                (action_form(&state, &token, &format!("/notices/{id}/cancel"), "Cancel", "Gives it up for good (cancelled): the later notices of its ordering key go on."))
            }
        }
    };
    page(&state, &format!("Notice {id}"), "", body).into_response()
}

fn action_form(state: &AppState, token: &Token, path: &str, label: &str, what: &str) -> Markup {
    html! {
        form.action method="post" action=(state.link(path)) {
            (csrf_field(token))
            p.muted { (what) }
            label { "Reason " input type="text" name="reason" required size="40"; }
            button type="submit" { (label) }
        }
    }
}

/// A form with a reason (and its CSRF token, checked before the handler).
#[derive(Debug, Deserialize)]
pub(super) struct ReasonForm {
    #[serde(default)]
    reason: String,
}

fn allowed(state: &AppState) -> Result<(), Failure> {
    if state.config.allow_actions {
        Ok(())
    } else {
        Err(Failure::Forbidden(READ_ONLY))
    }
}

/// An action may run (actions allowed, a reason given): the reason.
fn permitted(state: &AppState, reason: &str) -> Result<String, Failure> {
    allowed(state)?;
    // Checked as it will be written: control characters count as none.
    let reason = Audit::new("", reason).reason;
    if reason.is_empty() {
        return Err(Failure::BadRequest("a reason is required".into()));
    }
    Ok(reason)
}

/// `POST /notices/{id}/requeue`.
pub(super) async fn requeue(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<i64>,
    Form(form): Form<ReasonForm>,
) -> Response {
    one(state, actor, id, form, true).await
}

/// `POST /notices/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<i64>,
    Form(form): Form<ReasonForm>,
) -> Response {
    one(state, actor, id, form, false).await
}

async fn one(state: AppState, actor: Actor, id: i64, form: ReasonForm, requeue: bool) -> Response {
    let reason = match permitted(&state, &form.reason) {
        Ok(r) => r,
        Err(f) => return failure_page(&state, f),
    };
    let audit = Audit::new(actor.0, reason);
    let done = if requeue {
        state.notifier.requeue(id, &audit).await
    } else {
        state.notifier.cancel(id, &audit).await
    };
    match done {
        Ok(()) => Redirect::to(&state.link(&format!("/notices/{id}"))).into_response(),
        Err(e) => failure_page(&state, e.into()),
    }
}

/// `GET /bulk`: what a bulk action on a listing's filters would change,
/// pinned ([`pins`](super::pins)), and the form that does exactly that.
pub(super) async fn bulk_confirm(
    State(state): State<AppState>,
    Extension(token): Extension<Token>,
    Extension(actor): Extension<Actor>,
    Query(query): Query<NoticeQuery>,
) -> Response {
    if let Err(f) = allowed(&state) {
        return failure_page(&state, f);
    }
    let pinned = match pin(&state, &query).await {
        Ok(pinned) => pinned,
        Err(failure) => return failure_page(&state, failure),
    };
    let verb = match pinned.action {
        PinnedAction::Requeue => "Requeue",
        PinnedAction::Cancel => "Cancel",
    };
    let matched = pinned.len();
    let first = pinned.first_ids();
    let pin = if pinned.is_empty() {
        None
    } else {
        match state.pins.put(pinned, &actor.0) {
            Some(pin) => Some(pin),
            None => {
                return failure_page(
                    &state,
                    Failure::Internal("no randomness for a confirmation token".into()),
                );
            }
        }
    };
    let body = html! {
        p.count { strong data-matched=(matched) { (matched) } " notices match." }
        @if !first.is_empty() {
            p.muted { "First: " @for id in &first { a href=(state.link(&format!("/notices/{id}"))) { (id) } " " } }
        }
        @if let Some(pin) = pin {
            form.action method="post" action=(state.link("/bulk")) {
                (csrf_field(&token))
                input type="hidden" name="pin" value=(pin);
                p.muted { "Acts on exactly these " (matched) " notices, each only if it has not changed since this count; the confirmation lasts " (super::PIN_TTL.as_secs() / 60) " minutes." }
                label { "Reason (goes into each notice's log) " input type="text" name="reason" required size="50"; }
                button type="submit" { (verb) " " (matched) " notices" }
            }
        }
        p { a href=(notices_link(&state, &query)) { "Back to the list" } }
    };
    page(&state, &format!("{verb} in bulk"), "", body).into_response()
}

/// The notices a listing's query matches, pinned for its bulk action.
async fn pin(state: &AppState, query: &NoticeQuery) -> Result<Pinned, Failure> {
    let place = query.place().map_err(Failure::BadRequest)?;
    let filter = view::resolved_filter(state.notifier.db(), query).await?;
    state
        .notifier
        .pin(place, &filter, DEFAULT_MAX_PINNED)
        .await
        .map_err(Failure::from)
}

/// The bulk form: the confirmation's pin, a reason.
#[derive(Debug, Deserialize)]
pub(super) struct BulkForm {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    pin: String,
}

/// `POST /bulk`: runs the confirmed bulk action on what it pinned, then
/// shows its report.
pub(super) async fn bulk_run(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Form(form): Form<BulkForm>,
) -> Response {
    let reason = match permitted(&state, &form.reason) {
        Ok(r) => r,
        Err(f) => return failure_page(&state, f),
    };
    let Some(pinned) = state.pins.take(&form.pin, &actor.0) else {
        return failure_page(&state, Failure::Conflict(PIN_GONE.into()));
    };
    let audit = Audit::new(actor.0.clone(), reason.clone());
    let place = pinned.action.place();
    let report = match state
        .notifier
        .apply_pinned(&pinned, &audit, DEFAULT_BATCH_SIZE, false)
        .await
    {
        Ok(report) => report,
        Err(interrupted) => {
            return failure_page(
                &state,
                Failure::Internal(format!(
                    "stopped after {}: {}",
                    interrupted.done, interrupted.error
                )),
            );
        }
    };
    let list = NoticeQuery {
        place: Some(match place {
            Place::History => "history".into(),
            Place::InFlight => "in_flight".into(),
        }),
        ..NoticeQuery::default()
    };
    let body = html! {
        p.report data-changed=(report.changed) data-skipped=(report.skipped) {
            strong { (report.changed) } " changed, " (report.skipped) " skipped (changed since the count), of " (report.matched) " counted."
        }
        @if !report.skipped_ids.is_empty() {
            p.muted data-skipped-ids { "Skipped: " @for id in &report.skipped_ids { a href=(state.link(&format!("/notices/{id}"))) { (id) } " " } }
        }
        p.muted { "Each changed notice's log has the line “by " (actor.0) ": " (reason) "”." }
        p { a href=(notices_link(&state, &list)) { "Back to the list" } }
    };
    page(&state, "Bulk action done", "", body).into_response()
}

/// A confirmation whose pin is gone.
pub(super) const PIN_GONE: &str =
    "this confirmation was used already or has expired (or the dashboard restarted): count again";

/// `GET /defs`: every definition's policy as stored, its pause and circuit.
pub(super) async fn defs(
    State(state): State<AppState>,
    Extension(token): Extension<Token>,
    Query(query): Query<DefQuery>,
) -> Response {
    let now = chrono::Utc::now().naive_utc();
    let defs = match defs_page(&state, &query).await {
        Ok(defs) => defs,
        Err(e) => return failure_page(&state, e.into()),
    };
    let q = query.q.clone().unwrap_or_default();
    let next = (defs.len() as u64 == DEFS_PAGE)
        .then(|| defs.last().map(|(_, d)| d.name.clone()))
        .flatten();
    let body = html! {
        form.filters method="get" action=(state.link("/defs")) {
            label { "Definition " input type="search" name="q" value=(q) placeholder="part of a name"; }
            button type="submit" { "Find" }
        }
        @for (problem, d) in &defs {
            (def_section(&state, &token, now, problem.as_deref(), d))
        }
    };
    let body = html! {
        (body)
        nav.pages {
            @if query.after.is_some() { a href=(state.link(&format!("/defs?q={}", urlencoding(&q)))) { "« First" } }
            @if let Some(after) = next {
                a href=(state.link(&format!("/defs?q={}&after={}", urlencoding(&q), urlencoding(&after)))) { "Next »" }
            }
        }
    };
    page(&state, "Definitions", "defs", body).into_response()
}

/// One page of `/defs`: the stored definitions `query` asks for, each
/// redacted, with why it is invalid when it is.
async fn defs_page(
    state: &AppState,
    query: &DefQuery,
) -> crate::error::Result<Vec<(Option<String>, notify_def::Model)>> {
    let defs = crate::def::store::page(
        state.notifier.db(),
        query.q.as_deref(),
        query.after.as_deref(),
        DEFS_PAGE,
    )
    .await?;
    // Header values and URL keys are secrets: never shown. A row that
    // is invalid or unreadable says why.
    Ok(defs
        .into_iter()
        .map(|stored| {
            let problem = stored.validate().err().map(|e| e.to_string());
            (problem, crate::redact::def_row(stored.row))
        })
        .collect::<Vec<_>>())
}

/// One definition's section of `/defs`: its state, its policy, and its
/// pause or resume form.
fn def_section(
    state: &AppState,
    token: &Token,
    now: NaiveDateTime,
    problem: Option<&str>,
    d: &notify_def::Model,
) -> Markup {
    let paused = d.paused_until.filter(|u| *u > now);
    let circuit = paused.is_some()
        && d.pause_reason
            .as_deref()
            .is_some_and(|r| r.starts_with(crate::circuit::CIRCUIT_REASON));
    html! {
        section.def data-def=(d.name) {
            h2 {
                (d.name) " "
                @if circuit { span.state.open { "circuit open" } }
                @else if paused.is_some() { span.state.paused { "paused" } }
                @else { span.state.active { "active" } }
            }
            @if let Some(problem) = problem { p.error { "Invalid: its notices are parked. " (problem) } }
            @if !d.description.is_empty() { p { (d.description) } }
            (def_policy(d, paused))
            @if state.config.allow_actions {
                @if paused.is_some() {
                    form.action method="post" action=(state.def_link(&d.name, "resume")) {
                        (csrf_field(token))
                        button type="submit" { "Resume" }
                    }
                } @else {
                    form.action method="post" action=(state.def_link(&d.name, "pause")) {
                        (csrf_field(token))
                        label { "Reason " input type="text" name="reason" required size="30"; }
                        label { "Until " input type="text" name="until" placeholder="1h or 2026-11-24 08:00 (empty: until resumed)" size="30"; }
                        button type="submit" { "Pause" }
                    }
                }
            }
        }
    }
}

/// A definition's policy as a list of details, with its pause (`paused`:
/// until then, when paused now).
fn def_policy(d: &notify_def::Model, paused: Option<NaiveDateTime>) -> Markup {
    html! {
        dl.detail {
            dt { "Channel" } dd { (d.channel) }
            dt { "Target" } dd { code { (d.target) } }
            dt { "Retry intervals" } dd { (d.retry_interval) }
            dt { "Max retries" } dd { @if d.max_retry_times < 0 { "unlimited" } @else { (d.max_retry_times) } }
            dt { "Longest wait" } dd { @if d.max_retry_interval <= 0 { "no cap" } @else { (d.max_retry_interval) " min" } }
            @if d.retry_jitter > 0 { dt { "Jitter" } dd { "±" (d.retry_jitter) "% of each wait" } }
            @if !d.rate_limit.is_empty() { dt { "Rate limit" } dd { (d.rate_limit) ", across all workers" } }
            @if !d.steps.is_empty() { dt { "Steps" } dd { code { (d.steps) } " (run in order; a failure resumes at its step)" } }
            @if d.ordering == "per_key" { dt { "Ordering" } dd { "one at a time per ordering key, oldest first; " @if d.stop_on_failure { "a final failure holds its key until requeued or cancelled" } @else { "a final failure does not hold its key" } } }
            @if d.immediate_retries > 0 { dt { "Immediate retries" } dd { (d.immediate_retries) ", " (d.immediate_retry_delay) " ms apart, within the claim" } }
            dt { "Alert" } dd {
                (match d.alert_trigger_type {
                    0 => "on final failure".to_string(),
                    1 => "on every failure".to_string(),
                    2 => "never".to_string(),
                    _ => format!("after {} failures", d.alert_trigger_fail_times),
                })
                ", to " (if d.email.is_empty() { "nobody" } else { d.email.as_str() })
            }
            @if !d.events_to.is_empty() { dt { "Events to" } dd { (d.events_to) " (operational events, see docs/events.md)" } }
            dt { "Confirmation" } dd { @if !d.need_confirm { "not required" } @else if d.max_confirm_delay <= 0 { "required, no deadline" } @else { "required, within " (d.max_confirm_delay) " s" } }
            @if d.channel == "handler" {
                dt { "Handler errors" } dd { @if d.on_error == "fail" { "fail for good" } @else { "retried" } }
            }
            dt { "Circuit" } dd {
                @if d.circuit_failures > 0 { "opens after " (d.circuit_failures) " failures within " (d.circuit_window) " s, cool-down " (d.circuit_cool_down) " s" }
                @else { "off" }
            }
            @if let Some(until) = paused {
                dt { "Paused until" } dd { (time(Some(until))) " UTC" @if until >= crate::state::clock::far_future() { " (until resumed)" } }
                dt { "Reason" } dd { (d.pause_reason.as_deref().unwrap_or("")) }
            }
            dt { "Updated" } dd { (time(Some(d.update_time))) }
        }
    }
}

/// `text` for a query string.
fn urlencoding(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The pause form.
#[derive(Debug, Deserialize)]
pub(super) struct PauseForm {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    until: String,
}

/// How long a pause lasts, from the form's `until`.
pub(super) fn pause_end(until: &str) -> Result<PauseEnd, Failure> {
    if until.trim().is_empty() {
        return Ok(PauseEnd::OnResume);
    }
    match When::parse(until).map_err(|e| Failure::BadRequest(format!("until: {e}")))? {
        When::At(t) => Ok(PauseEnd::At(t)),
        When::Offset(d) => Ok(PauseEnd::After(d)),
    }
}

/// `POST /defs/{name}/pause`.
pub(super) async fn pause(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(name): Path<String>,
    Form(form): Form<PauseForm>,
) -> Response {
    let reason = match permitted(&state, &form.reason) {
        Ok(r) => r,
        Err(f) => return failure_page(&state, f),
    };
    let end = match pause_end(&form.until) {
        Ok(end) => end,
        Err(failure) => return failure_page(&state, failure),
    };
    match state
        .notifier
        .pause(&name, end, &Audit::new(actor.0, reason))
        .await
    {
        Ok(()) => Redirect::to(&state.link("/defs")).into_response(),
        Err(e) => failure_page(&state, e.into()),
    }
}

/// `POST /defs/{name}/resume`.
pub(super) async fn resume(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(name): Path<String>,
) -> Response {
    if let Err(f) = allowed(&state) {
        return failure_page(&state, f);
    }
    match state.notifier.resume(&name, &Audit::new(actor.0, "")).await {
        Ok(()) => Redirect::to(&state.link("/defs")).into_response(),
        Err(e) => failure_page(&state, e.into()),
    }
}
