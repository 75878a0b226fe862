//! Operator actions: find, requeue and cancel notices.

use solid_notify::ops::Audit;
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use serde_json::json;
use solid_notify::{
    AttemptResult, Config, Error, Outcome, Status,
    ops::{NoticeFilter, Page, Place, find},
};

use crate::{
    db_test,
    support::{Recorder, TestDb, test_config},
};

db_test!(
    requeue_replays_a_final_failure_and_cancel_stops_one,
    |db: Arc<TestDb>| async move {
        db.def("crm", "crm", |s| s.max_retry_times = 0).await;
        let fixed = Arc::new(AtomicBool::new(false));
        let rec = Recorder::default();
        let flag = fixed.clone();
        let notifier = db
            .notifier()
            .config(test_config())
            .handler(
                "crm",
                rec.handler(move |_| {
                    if flag.load(Ordering::SeqCst) {
                        Outcome::success()
                    } else {
                        Outcome::retry("CRM down")
                    }
                }),
            )
            .build()
            .unwrap();
        let tx = notifier.begin().await.unwrap();
        let id = tx
            .add_notice("crm", &json!({"customer": 9}), "")
            .await
            .unwrap();
        let first = tx.commit_and_wait().await.unwrap();
        assert!(matches!(
            first[0].result,
            AttemptResult::FinalFailure { .. }
        ));

        // Find it, as an operator would.
        let filter = NoticeFilter {
            def: Some("crm".into()),
            status: Some(Status::FinalFailure),
            ..NoticeFilter::default()
        };
        let failed = find::list(&db.db, Place::History, &filter, Page::default())
            .await
            .unwrap();
        assert_eq!(failed.iter().map(|h| h.id).collect::<Vec<_>>(), [id]);
        assert_eq!(find::show(&db.db, id).await.unwrap().retry_times, 1);

        // The receiver is fixed; requeue replays the same notice id.
        fixed.store(true, Ordering::SeqCst);
        notifier.requeue(id, &Audit::operator()).await.unwrap();
        assert!(db.history_of(id).await.is_none());
        let reports = notifier.sweep_once(10).await.unwrap();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].result, AttemptResult::Succeeded);
        let done = db.history_of(id).await.unwrap();
        assert_eq!((done.status, done.retry_times), (Status::Succeeded, 0));
        assert!(
            done.errors.contains("attempt 1: CRM down")
                && done.errors.contains("requeued by an operator"),
            "{}",
            done.errors
        );
        assert_eq!(rec.count_for(id), 2);
        assert!(matches!(
            notifier.requeue(424242, &Audit::operator()).await,
            Err(Error::NoticeNotFound(424242))
        ));

        // Cancel a notice in flight: it is never attempted again.
        let quiet = db
            .notifier()
            .config(Config {
                immediate_attempt: false,
                ..test_config()
            })
            .build()
            .unwrap();
        let tx = quiet.begin().await.unwrap();
        let doomed = tx.add_notice("crm", &json!({}), "").await.unwrap();
        tx.commit().await.unwrap();
        notifier.cancel(doomed, &Audit::operator()).await.unwrap();
        assert_eq!(
            db.history_of(doomed).await.unwrap().status,
            Status::Cancelled
        );
        assert!(notifier.sweep_once(10).await.unwrap().is_empty());
        assert_eq!(rec.count_for(doomed), 0);
        assert!(matches!(
            notifier.cancel(doomed, &Audit::operator()).await,
            Err(Error::WrongState {
                status: Status::Cancelled,
                ..
            })
        ));
        assert!(matches!(
            notifier.cancel(777_777, &Audit::operator()).await,
            Err(Error::NoticeNotFound(777_777))
        ));
    }
);
