//! Trace context: a notice added inside an OpenTelemetry span carries that
//! trace to its HTTP delivery, whichever process sweeps it and whether or
//! not that process traces too.

use std::sync::Arc;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use sea_orm::EntityTrait;
use serde_json::json;
use solid_notify::{
    AttemptResult, Config, NewNotice, Notifier,
    def::{Channel, DefSpec, store},
    entity::notify_msg_history,
};
use tracing::Level;
use tracing::{Instrument, instrument::WithSubscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{Layer, filter::Targets, layer::SubscriberExt};

use crate::{
    amqp::{Rabbit, broker_shared},
    db_test,
    receiver::{Receiver, Reply},
    support::{TestDb, eventually, test_config},
};

/// A subscriber exporting nowhere but recording OpenTelemetry spans (always
/// sampled), as an application with tracing set up has. The provider must
/// outlive the spans.
fn traced(service: &'static str) -> (SdkTracerProvider, impl tracing::Subscriber + Send + Sync) {
    traced_targets(service, true)
}

/// [`traced`], recording solid-notify's spans too only with `library`.
/// Without, each recorded span is a root (the test's own): a span whose
/// parent is recorded, dropped last on a sqlx SQLite worker thread, closes
/// that parent through the thread's global subscriber, which panics and
/// kills the connection's worker (its queries then wait for ever).
fn traced_targets(
    service: &'static str,
    library: bool,
) -> (SdkTracerProvider, impl tracing::Subscriber + Send + Sync) {
    let provider = SdkTracerProvider::builder().build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer(service));
    // Only this test's and solid-notify's spans: sqlx's SQLite threads drop
    // the spans current at each query, and closing one whose parent is
    // recorded too goes through that thread's (global) subscriber, which
    // does not know it.
    let mut only = Targets::new().with_target("it", Level::INFO);
    if library {
        only = only.with_target("solid_notify", Level::INFO);
    }
    (
        provider,
        tracing_subscriber::registry().with(layer.with_filter(only)),
    )
}

/// Adds one notice inside a `checkout` span (under `subscriber`, if any) and
/// returns its id and the span's `(trace id, span id)` as the producer saw it.
async fn add(
    notifier: &Notifier,
    param: serde_json::Value,
    subscriber: Option<tracing::Dispatch>,
) -> (i64, Option<(String, String)>) {
    // The span is made inside the outer block, hence under `subscriber`.
    let produce = async {
        let checkout = async {
            let tx = notifier.begin().await.unwrap();
            let id = tx.add(NewNotice::new("traced", &param)).await.unwrap();
            tx.commit().await.unwrap();
            let cx = tracing::Span::current().context();
            let span = cx.span();
            let sc = span.span_context();
            let ids = sc
                .is_valid()
                .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()));
            (id, ids)
        };
        checkout.instrument(tracing::info_span!("checkout")).await
    };
    match subscriber {
        Some(dispatch) => produce.with_subscriber(dispatch).await,
        None => produce.await,
    }
}

async fn add_traced(
    notifier: &Notifier,
    def: &str,
    subscriber: tracing::Dispatch,
) -> (Vec<solid_notify::AttemptReport>, String) {
    let checkout = async {
        let tx = notifier.begin().await.unwrap();
        tx.add(NewNotice::new(def, &json!({}))).await.unwrap();
        let reports = tx.commit_and_wait().await.unwrap();
        let cx = tracing::Span::current().context();
        (reports, cx.span().span_context().trace_id().to_string())
    };
    async { checkout.instrument(tracing::info_span!("checkout")).await }
        .with_subscriber(subscriber)
        .await
}

/// `(trace id, parent span id)` of a `traceparent` header.
fn parts(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    (fields[1].to_string(), fields[2].to_string())
}

db_test!(
    traceparent_reaches_the_receiver_with_the_producers_trace_id,
    |db: Arc<TestDb>| async move {
        let receiver = Receiver::start(|_| Reply::ok()).await;
        let spec = DefSpec::new("traced", Channel::Http, json!({ "url": receiver.url }));
        store::sync(&db.db, &[spec]).await.unwrap();
        // Every notice waits for a sweep, as one from another process would.
        let config = Config {
            immediate_attempt: false,
            ..test_config()
        };
        let notifier = Notifier::builder(db.db.clone())
            .config(config)
            .build()
            .unwrap();
        let (_producer_otel, producer) = traced("shop");
        let producer = tracing::Dispatch::new(producer);
        let (_worker_otel, worker) = traced("worker");
        let worker = tracing::Dispatch::new(worker);

        // 1. Traced producer, traced worker: the request names the attempt
        //    span, a child in the producer's trace.
        let (a, a_ids) = add(&notifier, json!({ "n": 1 }), Some(producer.clone())).await;
        let (a_trace, a_span) = a_ids.expect("the producer's span is traced");
        let swept = notifier
            .sweep_once(10)
            .with_subscriber(worker)
            .await
            .unwrap();
        assert_eq!(swept.len(), 1, "{swept:?}");
        // 2. Traced producer, worker without OpenTelemetry: the stored
        //    context is sent as it was captured.
        let (b, b_ids) = add(&notifier, json!({ "n": 2 }), Some(producer)).await;
        let (b_trace, b_span) = b_ids.expect("the producer's span is traced");
        assert_eq!(notifier.sweep_once(10).await.unwrap().len(), 1);
        // 3. No OpenTelemetry anywhere: nothing stored, nothing sent.
        let (c, c_ids) = add(&notifier, json!({ "n": 3 }), None).await;
        assert_eq!(c_ids, None);
        assert_eq!(notifier.sweep_once(10).await.unwrap().len(), 1);

        let seen = eventually(10, "three deliveries", || {
            let seen = receiver.seen();
            async move { (seen.len() == 3).then_some(seen) }
        })
        .await;
        let header = |id: i64| {
            let hits: Vec<_> = seen.iter().filter(|s| s.id == id).collect();
            assert_eq!(hits.len(), 1, "notice {id}: {seen:?}");
            hits[0].traceparent.clone()
        };
        let (trace, parent) = parts(&header(a).expect("traceparent sent for a"));
        assert_eq!(trace, a_trace, "the producer's trace id");
        assert_ne!(parent, a_span, "the worker's attempt span is the parent");
        let (trace, parent) = parts(&header(b).expect("traceparent sent for b"));
        assert_eq!((trace, parent), (b_trace.clone(), b_span));
        assert_eq!(header(c), None);
        assert_ne!(a_trace, b_trace, "each checkout is its own trace");

        // The context moved to history with the notice, and status shows it.
        for (id, trace) in [(a, Some(a_trace)), (b, Some(b_trace)), (c, None)] {
            let row = notify_msg_history::Entity::find_by_id(id)
                .one(&db.db)
                .await
                .unwrap()
                .expect("in history");
            assert_eq!(row.trace_context.is_some(), trace.is_some(), "{row:?}");
            let view = notifier.status(id).await.unwrap();
            assert_eq!(view.trace_id, trace);
        }
    }
);

db_test!(amqp_messages_carry_the_producers_traceparent, |db: Arc<
    TestDb,
>| async move {
    let _shared = broker_shared().await;
    let rabbit = Rabbit::new(&db).await;
    rabbit.def(&db, "orders", "rk", |_| {}).await;
    let notifier = db.notifier().config(rabbit.config()).build().unwrap();
    let (_otel, subscriber) = traced_targets("shop", false);
    let (reports, trace) = add_traced(&notifier, "orders", subscriber.into()).await;
    assert_eq!(reports[0].result, AttemptResult::Succeeded);
    let message = rabbit.take(1).await.pop().unwrap();
    let header = message.traceparent.expect("traceparent header");
    assert_eq!(parts(&header).0, trace);
});
