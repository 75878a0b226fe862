//! The schema a process starts on: older than the build is refused, naming
//! the migration to run, before anything is claimed or added; newer than
//! the build (a later release migrated it) is reported and used.

use std::{sync::Arc, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{Error, NewNotice, Worker, WorkerConfig, worker::Mode};
use tokio_util::sync::CancellationToken;

use crate::{
    db_test,
    faults::start,
    support::{Recorder, TestDb, eventually, test_config},
};

/// The migration this build starts from.
const BASELINE: &str = "m20261215_000001_baseline";

fn fast() -> WorkerConfig {
    WorkerConfig {
        mode: Mode::FixedDelay,
        delay: Duration::from_millis(50),
        confirm_listener: false,
        ..WorkerConfig::default()
    }
}

db_test!(
    an_older_schema_is_refused_by_workers_and_producers_naming_its_migration,
    |db: Arc<TestDb>| async move {
        db.def("ship", "ship", |_| {}).await;
        let rec = Recorder::default();
        let config = solid_notify::Config {
            immediate_attempt: false,
            ..test_config()
        };
        // One notice due, added while the schema was whole.
        let notifier = db.notifier().config(config.clone()).build().unwrap();
        let tx = notifier.begin().await.unwrap();
        tx.add(NewNotice::new("ship", &json!({"n": 1})))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // The baseline's record gone: this build's migration has not run.
        db.db
            .execute_unprepared(&format!(
                "DELETE FROM solid_notify_migrations WHERE version = '{BASELINE}'"
            ))
            .await
            .unwrap();

        let fresh = db
            .notifier()
            .config(config.clone())
            .handler("ship", rec.handler(|_| solid_notify::Outcome::success()))
            .build()
            .unwrap();
        let worker = Worker::new(fresh.clone(), fast()).unwrap();
        let ran = tokio::time::timeout(
            Duration::from_secs(30),
            worker.run(CancellationToken::new()),
        )
        .await
        .expect("a worker on an older schema returns at once");
        match ran {
            Err(Error::SchemaBehind { first, count }) => {
                assert_eq!((first.as_str(), count), (BASELINE, 1));
            }
            other => panic!("expected SchemaBehind, got {other:?}"),
        }
        match fresh.begin().await {
            Err(e @ Error::SchemaBehind { .. }) => {
                assert!(e.to_string().contains(BASELINE), "{e}");
                assert!(e.to_string().contains("solid-notify migrate"), "{e}");
            }
            Err(e) => panic!("expected SchemaBehind, got {e}"),
            Ok(_) => panic!("a transaction began on an older schema"),
        }
        let (status, stderr) = crate::support::worker_until_exit(&db.url).await;
        assert!(!status.success(), "the CLI worker ran: {stderr}");
        assert!(stderr.contains(BASELINE), "{stderr}");
        // Nothing was claimed or sent: the notice is as it was added.
        assert_eq!(rec.count(), 0);
        let live = db.live().await;
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].version, 0);

        // Migrated again, the same notifier's worker starts and sends it.
        db.db
            .execute_unprepared(&format!(
                "INSERT INTO solid_notify_migrations (version, applied_at) VALUES ('{BASELINE}', 0)"
            ))
            .await
            .unwrap();
        // A refusal is answered again for a second, then checked anew.
        eventually(10, "the check passes once migrated", || async {
            fresh.check_database().await.ok()
        })
        .await;
        let running = start(fresh.clone(), fast());
        eventually(30, "the notice sent once migrated", || async {
            (rec.count() == 1).then_some(())
        })
        .await;
        running.stop().await;
    }
);

db_test!(
    a_newer_schema_is_reported_and_used,
    |db: Arc<TestDb>| async move {
        let (notifier, rec) = db.shipping().await;
        db.db.execute_unprepared(
            "INSERT INTO solid_notify_migrations (version, applied_at) VALUES ('m20991231_000001_later', 0)",
        )
        .await
        .unwrap();
        let check = notifier.check_database().await.unwrap();
        assert_eq!(check.newer, vec!["m20991231_000001_later".to_string()]);
        assert!(!check.transaction_pooled);
        let running = start(notifier.clone(), fast());
        let tx = notifier.begin().await.unwrap();
        tx.add(NewNotice::new("ship", &json!({"n": 1})))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        eventually(30, "the notice sent on the newer schema", || async {
            (rec.count() == 1).then_some(())
        })
        .await;
        running.stop().await;
    }
);

/// A `listen_url`'s password never shows in a worker's settings, whether
/// it is a URL or a `key=value` string.
#[test]
fn a_listen_url_is_never_shown_with_its_password() {
    for url in [
        "postgres://app:hunter2@db:5432/x",
        "host=db user=app password=hunter2",
    ] {
        let config = WorkerConfig {
            listen_url: Some(solid_notify::ListenUrl(url.into())),
            ..WorkerConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
