//! Metrics: the Prometheus endpoint serves the outcomes of a known run.

use std::sync::Arc;

use serde_json::json;
use solid_notify::ops::{Audit, PauseEnd};

use crate::{db_test, support::TestDb};

db_test!(
    metrics_are_served_with_the_outcomes_of_a_known_run,
    |db: Arc<TestDb>| async move {
        use crate::mock::{
            Mock, MockServer, ResponseTemplate,
            matchers::{method, path},
        };
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/ok"))
            .respond_with(ResponseTemplate::new(200))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/bad"))
            .respond_with(ResponseTemplate::new(500))
            .mount(&server)
            .await;
        let http = |name: &str, url: String, retries: i64| {
            let mut spec = solid_notify::def::DefSpec::new(
                name,
                solid_notify::def::Channel::Http,
                json!({ "url": url }),
            );
            spec.max_retry_times = retries;
            spec.alert_trigger_type = 2;
            spec
        };
        solid_notify::def::store::sync(
            &db.db,
            &[
                http("m_ok", format!("{}/ok", server.uri()), 3),
                http("m_bad", format!("{}/bad", server.uri()), 0),
                http("m_held", format!("{}/ok", server.uri()), 3),
            ],
        )
        .await
        .unwrap();
        db.insert_due("m_ok", 3, |_| 0).await;
        db.insert_due("m_bad", 2, |_| 0).await;
        db.insert_due("m_held", 4, |_| 0).await;
        let ops = db.notifier().build().unwrap();
        ops.pause(
            "m_held",
            PauseEnd::OnResume,
            &Audit::new("t", "metrics test"),
        )
        .await
        .unwrap();
        let (mut child, addr) = crate::support::metrics_worker(&db, &[]).await;
        let series = |text: &str, name: &str, labels: &str| -> Option<f64> {
            let prefix = format!("{name}{{{labels}}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
        };
        // The last page read is kept, so a run that times out shows what
        // the worker served (the run itself takes well under a second; in
        // CI beside a 100,000-definition drain on the same server, longer).
        let mut last = String::new();
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        let text = loop {
            if let Ok(page) = client.get(&addr).send().await
                && let Ok(text) = page.text().await
            {
                let ok = series(
                    &text,
                    "solid_notify_attempts_total",
                    r#"def="m_ok",outcome="succeeded""#,
                );
                let bad = series(
                    &text,
                    "solid_notify_attempts_total",
                    r#"def="m_bad",outcome="final_failure""#,
                );
                let held = series(
                    &text,
                    "solid_notify_notices",
                    r#"def="m_held",status="not_sent""#,
                );
                let gone = series(
                    &text,
                    "solid_notify_notices",
                    r#"def="m_ok",status="not_sent""#,
                );
                // m_ok's not_sent series is 0 once seen, absent if never
                // seen. A sweep's duration is recorded when it ends, and an
                // attempt's after its outcome is counted.
                // The paused and oldest-due gauges are set by the same
                // refresh as the counts, just after them.
                let paused = series(&text, "solid_notify_paused", r#"def="m_held""#);
                let waited = series(&text, "solid_notify_oldest_due_seconds", r#"def="m_held""#);
                if ok == Some(3.0)
                    && bad == Some(2.0)
                    && held == Some(4.0)
                    && gone.unwrap_or(0.0) == 0.0
                    && paused == Some(1.0)
                    && waited.is_some_and(|w| w > 0.0)
                    && text.contains("solid_notify_sweep_duration_seconds_count")
                    && text.contains("solid_notify_attempt_duration_seconds_bucket{def=\"m_ok\"")
                {
                    break text;
                }
                last = text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after 90s waiting for the run's series; the last page served:\n{}",
                ours(&last)
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let shown = ours(&text);
        // Only paused definitions have a series at 1; the others none, or 0.
        assert_eq!(
            series(&text, "solid_notify_paused", r#"def="m_ok""#).unwrap_or(0.0),
            0.0,
            "{shown}"
        );
        assert_eq!(
            series(&text, "solid_notify_awaiting_confirmation", r#"def="m_ok""#).unwrap_or(0.0),
            0.0,
            "{shown}"
        );
        let claims: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("solid_notify_claims_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no claims counted:\n{shown}"));
        assert!(claims >= 5.0, "{shown}");
        assert_eq!(
            series(
                &text,
                "solid_notify_attempts_total",
                r#"def="m_ok",outcome="lost_claim""#
            ),
            Some(0.0),
            "no lost claims in a one-worker run:\n{shown}"
        );
        // A page of another site whose name points here (DNS rebinding)
        // is refused; an IP address or localhost is answered.
        let http = reqwest::Client::new();
        for (host, answered) in [
            ("evil.example:9464", false),
            ("localhost.evil.example", false),
            ("127.0.0.1:9464", true),
            ("localhost:9464", true),
            ("[::1]:9464", true),
        ] {
            let status = http
                .get(&addr)
                .header(reqwest::header::HOST, host)
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status.is_success(), answered, "{host}: {status}");
        }
        let _ = child.0.kill();
    }
);

/// The series of the test's definitions, the claim and the sweep series
/// of a metrics page: what a failure shows.
fn ours(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.contains("\"m_") || l.contains("claims") || l.contains("sweep"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
