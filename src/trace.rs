//! Trace context: a notice carries the W3C trace context of the span that
//! added it, so its deliveries, however late and from whichever worker,
//! join the producer's trace.
//!
//! - **Stored.** `add_notice` takes the current `tracing` span's
//!   OpenTelemetry context (through `tracing-opentelemetry`'s layer) and
//!   stores its `traceparent` and `tracestate` headers, as a JSON object, in
//!   the notice's `trace_context` column. Without that layer, or outside any
//!   sampled-or-not valid span, nothing is stored (NULL).
//! - **Linked.** Each attempt's `attempt` span is made a child of the stored
//!   context (when the process running it has the layer).
//! - **Sent.** HTTP deliveries carry `traceparent` (and `tracestate`) as
//!   request headers, AMQP deliveries as message headers; handlers see them
//!   in [`Notice::trace_headers`](crate::Notice::trace_headers). The headers
//!   name the attempt span when the process has the layer, the producer's
//!   span otherwise: the trace id is the producer's either way.
//!
//! This needs the `otel` feature (on by default); without it nothing is
//! captured or linked, and a stored valid `traceparent` is still sent on.
//! The layer must be `tracing-opentelemetry` 0.34 (the version this crate
//! links), otherwise the spans are not recognised and nothing is stored. A
//! stored context that is not a JSON object of valid W3C headers (written
//! by hand, say) is ignored: the notice is delivered without trace headers.

#[cfg(feature = "otel")]
use std::collections::{BTreeMap, HashMap};

#[cfg(feature = "otel")]
use opentelemetry::{Context, propagation::TextMapPropagator, trace::TraceContextExt};
#[cfg(feature = "otel")]
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "otel")]
use tracing_opentelemetry::OpenTelemetrySpanExt;

#[cfg(feature = "otel")]
/// The current span's trace context as stored in `trace_context`, or `None`
/// without an OpenTelemetry span.
pub(crate) fn capture() -> Option<String> {
    headers_of(&tracing::Span::current().context())
        .and_then(|headers| serde_json::to_string(&headers).ok())
}

#[cfg(feature = "otel")]
/// Makes `span` a child of the stored context, when there is one and the
/// span is recorded by an OpenTelemetry layer (otherwise nothing happens).
pub(crate) fn link(span: &tracing::Span, stored: Option<&str>) {
    if let Some(parent) = stored.and_then(parse) {
        // Fails only without the layer or for a disabled span: nothing to link.
        let _ = span.set_parent(parent);
    }
}

#[cfg(feature = "otel")]
/// The trace headers to send with a delivery made inside the current span:
/// that span's context when it is in the stored trace (the attempt span,
/// linked to it) or nothing is stored, the stored context otherwise; empty
/// without either.
pub(crate) fn headers(stored: Option<&str>) -> BTreeMap<String, String> {
    let stored = stored.and_then(parse);
    let current = tracing::Span::current().context();
    let same_trace = match &stored {
        Some(s) => s.span().span_context().trace_id() == current.span().span_context().trace_id(),
        None => true,
    };
    let headers = if same_trace {
        headers_of(&current)
    } else {
        None
    };
    headers
        .or_else(|| stored.and_then(|cx| headers_of(&cx)))
        .unwrap_or_default()
        .into_iter()
        .collect()
}

#[cfg(feature = "otel")]
/// The trace id (32 hex digits) of a stored context, if it is valid.
pub fn trace_id(stored: &str) -> Option<String> {
    let cx = parse(stored)?;
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| context.trace_id().to_string())
}

#[cfg(feature = "otel")]
/// The headers of `cx` (`traceparent`, and `tracestate` when not empty), or
/// `None` when it holds no valid span context.
fn headers_of(cx: &Context) -> Option<HashMap<String, String>> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut headers);
    headers.retain(|_, v| !v.is_empty());
    (!headers.is_empty()).then_some(headers)
}

#[cfg(feature = "otel")]
/// A stored context: a JSON object of header strings, extracted by the W3C
/// propagator; `None` unless it yields a valid remote span context.
fn parse(stored: &str) -> Option<Context> {
    let headers: HashMap<String, String> = serde_json::from_str(stored).ok()?;
    let cx = TraceContextPropagator::new().extract(&headers);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Without the `otel` feature: nothing is captured or linked; a stored
/// context's valid `traceparent` (and a `tracestate` that is a header
/// value) is still sent on. Compiled either way, so that its tests run.
#[cfg_attr(feature = "otel", allow(dead_code))]
mod plain {
    use std::collections::{BTreeMap, HashMap};

    /// Nothing to capture without OpenTelemetry.
    pub(crate) fn capture() -> Option<String> {
        None
    }

    /// Nothing to link without OpenTelemetry.
    pub(crate) fn link(_span: &tracing::Span, _stored: Option<&str>) {}

    /// The stored headers, when their `traceparent` is valid.
    pub(crate) fn headers(stored: Option<&str>) -> BTreeMap<String, String> {
        stored
            .and_then(parse)
            .map(|h| h.into_iter().collect())
            .unwrap_or_default()
    }

    /// The trace id (32 hex digits) of a stored context, if it is valid.
    pub fn trace_id(stored: &str) -> Option<String> {
        let headers = parse(stored)?;
        headers
            .get("traceparent")
            .and_then(|tp| tp.split('-').nth(1))
            .map(str::to_string)
    }

    /// A stored context whose `traceparent` is `00-<32 hex>-<16 hex>-<2 hex>`
    /// with non-zero ids; only `traceparent` and `tracestate` are kept.
    fn parse(stored: &str) -> Option<HashMap<String, String>> {
        let mut headers: HashMap<String, String> = serde_json::from_str(stored).ok()?;
        // A `tracestate` is at most 512 characters of visible ASCII (W3C);
        // another is left out, as the OpenTelemetry propagator does.
        let state_ok = |v: &str| {
            v.len() <= 512 && v.bytes().all(|b| (b' '..=b'~').contains(&b)) && !v.trim().is_empty()
        };
        headers.retain(|k, v| match k.as_str() {
            "traceparent" => !v.is_empty(),
            "tracestate" => state_ok(v),
            _ => false,
        });
        let parts: Vec<&str> = headers.get("traceparent")?.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let valid = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && parts[1].bytes().any(|b| b != b'0')
            && hex(parts[2], 16)
            && parts[2].bytes().any(|b| b != b'0')
            && hex(parts[3], 2);
        valid.then_some(headers)
    }

    #[cfg(test)]
    mod tests {
        const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

        #[test]
        fn a_valid_stored_context_is_passed_on_and_nothing_else() {
            let stored = format!(r#"{{"traceparent":"{PARENT}","tracestate":"k=v","x":"y"}}"#);
            let headers = super::headers(Some(&stored));
            assert_eq!(headers.len(), 2, "{headers:?}");
            assert_eq!(headers["traceparent"], PARENT);
            assert_eq!(
                super::trace_id(&stored).as_deref(),
                Some("4bf92f3577b34da6a3ce929d0e0e4736")
            );
            let bad_state = format!(r#"{{"traceparent":"{PARENT}","tracestate":"a\nb"}}"#);
            let headers = super::headers(Some(&bad_state));
            assert_eq!(headers.keys().collect::<Vec<_>>(), ["traceparent"]);
            for bad in [
                r#"{"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}"#,
                r#"{"traceparent":"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
                r#"{"traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}"#,
                r#"{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}"#,
                r#"["traceparent"]"#,
                "not json",
            ] {
                assert!(super::headers(Some(bad)).is_empty(), "{bad}");
                assert!(super::trace_id(bad).is_none(), "{bad}");
            }
            assert!(super::capture().is_none());
        }
    }
}
#[cfg(not(feature = "otel"))]
pub use plain::trace_id;
#[cfg(not(feature = "otel"))]
pub(crate) use plain::{capture, headers, link};

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn stored_contexts_round_trip_and_garbage_is_ignored() {
        let stored = serde_json::json!({ "traceparent": PARENT, "tracestate": "vendor=1" });
        let stored = stored.to_string();
        assert_eq!(
            trace_id(&stored).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        // Outside any OpenTelemetry span the stored headers are sent as they are.
        assert_eq!(
            headers(Some(&stored)),
            BTreeMap::from([
                ("traceparent".to_string(), PARENT.to_string()),
                ("tracestate".to_string(), "vendor=1".to_string()),
            ])
        );
        for bad in [
            "",
            "null",
            "[1]",
            r#"{"traceparent": 7}"#,
            r#"{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}"#,
            r#"{"traceparent": "not a traceparent"}"#,
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
            assert!(headers(Some(bad)).is_empty(), "{bad}");
        }
        assert!(headers(None).is_empty());
        assert_eq!(capture(), None, "no OpenTelemetry layer, nothing stored");
    }
}
