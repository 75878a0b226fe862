//! Operational events: what happened to a definition's notices, keys, pause
//! and circuit, told through any definition.
//!
//! A definition names the one that receives its events with `events_to`
//! (TOML `events_to = "ops_webhook"`). That definition may use any channel:
//! an HTTP webhook (Slack, PagerDuty, your own), AMQP, e-mail, a handler.
//! Each event is a notice of it, written in the same transaction as the
//! change it reports, so an event is never lost and never reports a change
//! that did not commit; it is attempted right after that commit (or by a
//! sweeper) and retried on the receiving definition's schedule.
//!
//! The alert e-mails by alert type 0–3 ([`crate::alert`]) stay as they are,
//! beside the events.
//!
//! | kind | when |
//! |---|---|
//! | `notice.failing` | a failure that is not final alerts by the definition's alert type 1 or 3 |
//! | `notice.failed` | a notice fails for good (every final failure) |
//! | `notice.recovered` | a notice reported failing (`notice.failing`) is delivered |
//! | `key.blocked` | a final failure holds its ordering key (`per_key`, `stop_on_failure`) |
//! | `key.released` | a requeue or cancel leaves its key with no final failure or parked notice |
//! | `definition.paused` | an operator or the circuit pauses the definition |
//! | `definition.resumed` | an operator resumes a paused definition, or the circuit closes |
//! | `circuit.opened` | the circuit opens (the definition is paused too) |
//! | `circuit.closed` | a probe succeeds and the circuit closes |
//!
//! **No loop.** A notice that is itself an event (its `origin` is
//! [`Origin::Event`](crate::Origin::Event)) and the alert e-mails raise no
//! events: an
//! event definition's own failures fall back to its alert e-mails (to its
//! `email`, else to the alert definition's) and a log line.
//!
//! The document (`"version": 1`, [`EVENT_VERSION`]) is described field by
//! field in `docs/events.md`. It carries ids, names, counts, times and the
//! failure reason, never the notice's param or target.

use chrono::{NaiveDateTime, SecondsFormat};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value, json};

use crate::{
    def::Def,
    state::{
        errors_log::{clean, truncate},
        insert::NewRow,
    },
};

/// The version of the event document: a field is added within a version,
/// never renamed, removed or given another meaning.
pub const EVENT_VERSION: u32 = 1;

/// The description of every event notice starts with this, followed by a
/// space and the kind (`solid-notify event notice.failed`), for people:
/// the notice's `origin` tells it apart.
pub const EVENT_DESCRIPTION: &str = "solid-notify event";

/// Bytes of the failure reason quoted in an event.
pub const EVENT_REASON_BYTES: usize = 1000;

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A failure that is not final and alerts (alert types 1 and 3).
    NoticeFailing,
    /// A final failure.
    NoticeFailed,
    /// A notice reported failing was delivered.
    NoticeRecovered,
    /// A final failure holds its ordering key.
    KeyBlocked,
    /// A key is no longer held.
    KeyReleased,
    /// The definition was paused (by an operator or its circuit).
    DefinitionPaused,
    /// The definition was resumed (by an operator or its circuit).
    DefinitionResumed,
    /// The circuit opened.
    CircuitOpened,
    /// The circuit closed.
    CircuitClosed,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 9] = [
        EventKind::NoticeFailing,
        EventKind::NoticeFailed,
        EventKind::NoticeRecovered,
        EventKind::KeyBlocked,
        EventKind::KeyReleased,
        EventKind::DefinitionPaused,
        EventKind::DefinitionResumed,
        EventKind::CircuitOpened,
        EventKind::CircuitClosed,
    ];

    /// The `type` of the document: `notice.failed`, …
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::NoticeFailing => "notice.failing",
            EventKind::NoticeFailed => "notice.failed",
            EventKind::NoticeRecovered => "notice.recovered",
            EventKind::KeyBlocked => "key.blocked",
            EventKind::KeyReleased => "key.released",
            EventKind::DefinitionPaused => "definition.paused",
            EventKind::DefinitionResumed => "definition.resumed",
            EventKind::CircuitOpened => "circuit.opened",
            EventKind::CircuitClosed => "circuit.closed",
        }
    }
}

/// The notice an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticeRef {
    /// Its id.
    pub id: i64,
    /// The attempt that ended (1 = the first).
    pub attempt: u32,
    /// Failures so far.
    pub failures: u32,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// When it is due again, if it will be retried.
    pub next_attempt_at: Option<NaiveDateTime>,
}

/// One event, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What it reports.
    pub kind: EventKind,
    /// The definition it is about: id and name.
    pub def_id: i64,
    /// The definition's name.
    pub def_name: String,
    /// The notice it is about (notice events, `key.blocked`).
    pub notice: Option<NoticeRef>,
    /// The ordering key (key events).
    pub key: Option<String>,
    /// Why: the failure, the operator's audit line, the circuit's count.
    pub reason: String,
    /// Until when a pause holds, if it ends by itself.
    pub paused_until: Option<NaiveDateTime>,
}

fn time(at: NaiveDateTime) -> String {
    at.and_utc().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn segment(text: &str) -> String {
    utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
}

impl Event {
    /// An event about definition `def`.
    pub fn new(kind: EventKind, def: &Def, reason: impl Into<String>) -> Self {
        Event {
            kind,
            def_id: def.id,
            def_name: def.name.clone(),
            notice: None,
            key: None,
            reason: reason.into(),
            paused_until: None,
        }
    }

    /// The JSON document, written at `at` (UTC, this host's clock), with a
    /// link into the dashboard at `dashboard` when one is configured.
    pub fn document(&self, at: NaiveDateTime, dashboard: Option<&str>) -> Value {
        let mut doc = Map::new();
        doc.insert("type".into(), json!(self.kind.as_str()));
        doc.insert("version".into(), json!(EVENT_VERSION));
        doc.insert("at".into(), json!(time(at)));
        doc.insert(
            "definition".into(),
            json!({"id": self.def_id, "name": self.def_name}),
        );
        if let Some(n) = &self.notice {
            doc.insert(
                "notice".into(),
                json!({
                    "id": n.id,
                    "attempt": n.attempt,
                    "failures": n.failures,
                    "ordering_key": n.ordering_key,
                    "next_attempt_at": n.next_attempt_at.map(time),
                }),
            );
        }
        if let Some(key) = &self.key {
            doc.insert("key".into(), json!(key));
        }
        // As the failure log shows it: one line, control characters blanked.
        doc.insert(
            "reason".into(),
            json!(truncate(&clean(&self.reason), EVENT_REASON_BYTES)),
        );
        if let Some(until) = self.paused_until {
            doc.insert("paused_until".into(), json!(time(until)));
        }
        if let Some(base) = dashboard {
            doc.insert("link".into(), json!(self.link(base)));
        }
        Value::Object(doc)
    }

    /// The dashboard page of what the event is about, under `base`.
    pub fn link(&self, base: &str) -> String {
        let base = base.trim_end_matches('/');
        let def = segment(&self.def_name);
        match (&self.notice, self.kind) {
            (_, EventKind::KeyBlocked | EventKind::KeyReleased) => {
                format!("{base}/keys/blocked?def={def}")
            }
            (Some(n), _) => format!("{base}/notices/{}", n.id),
            (None, _) => format!("{base}/notices?def={def}"),
        }
    }

    /// The notice row that carries this event to definition `to`, due now.
    pub(crate) fn row(&self, to: &Def, at: NaiveDateTime, dashboard: Option<&str>) -> NewRow {
        NewRow::follow_up(
            crate::status::Origin::Event,
            to.id,
            self.document(at, dashboard).to_string(),
            format!("{EVENT_DESCRIPTION} {}", self.kind.as_str()),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::def::{Channel, DefSpec};

    fn def() -> Def {
        DefSpec::new("order paid/x", Channel::Handler, json!({"handler": "h"}))
            .validate(7, "test")
            .unwrap()
    }

    #[test]
    fn the_document_has_its_documented_fields() {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 5_000_000)
            .unwrap()
            .naive_utc();
        let mut e = Event::new(EventKind::NoticeFailed, &def(), "HTTP 500");
        e.notice = Some(NoticeRef {
            id: 42,
            attempt: 6,
            failures: 6,
            ordering_key: Some("k\r\n".into()),
            next_attempt_at: None,
        });
        let doc = e.document(at, Some("https://ops.example.com/notify/"));
        assert_eq!(
            doc,
            json!({
                "type": "notice.failed",
                "version": 1,
                "at": "2023-11-14T22:13:20.005Z",
                "definition": {"id": 7, "name": "order paid/x"},
                "notice": {"id": 42, "attempt": 6, "failures": 6, "ordering_key": "k\r\n", "next_attempt_at": null},
                "reason": "HTTP 500",
                "link": "https://ops.example.com/notify/notices/42",
            })
        );
        let mut k = Event::new(EventKind::KeyReleased, &def(), "requeued");
        k.key = Some("a".into());
        assert_eq!(
            k.link("http://d"),
            "http://d/keys/blocked?def=order%20paid%2Fx"
        );
        assert!(k.document(at, None).get("link").is_none());
    }

    #[test]
    fn an_event_row_is_of_event_origin_and_says_its_kind() {
        let row = Event::new(EventKind::CircuitOpened, &def(), "x").row(
            &def(),
            chrono::Utc::now().naive_utc(),
            None,
        );
        assert_eq!(row.description, "solid-notify event circuit.opened");
        assert_eq!(row.origin, crate::status::Origin::Event);
    }
}
