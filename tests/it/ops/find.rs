//! Status and find: one notice by id or key, in flight and in history;
//! listings by filter and page.

use std::sync::Arc;

use serde_json::json;
use solid_notify::{
    NewNotice, Status,
    ops::{NoticeFilter, Page, Place, find},
};

use super::filter_def;
use crate::{db_test, faults::quiet, support::TestDb};

db_test!(status_by_id_and_key_in_flight_and_history, |db: Arc<
    TestDb,
>| async move {
    let (notifier, _rec) = db.shipping().await;
    let held = db.notifier().config(quiet()).build().unwrap();
    let tx = held.begin().await.unwrap();
    let waiting = tx
        .add(NewNotice::new("ship", &json!({"order": 1})).idempotency_key("order-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let tx = notifier.begin().await.unwrap();
    let sent = tx
        .add(NewNotice::new("ship", &json!({"order": 2})).idempotency_key("order-2"))
        .await
        .unwrap();
    tx.commit_and_wait().await.unwrap();

    let view = notifier.status(waiting).await.unwrap();
    assert_eq!(
        (view.place, view.status, view.def.as_deref()),
        (Place::InFlight, Status::NotSent, Some("ship"))
    );
    assert_eq!(view.param, json!({"order": 1}));
    assert!(!view.claim_live);
    let view = notifier.status(sent).await.unwrap();
    assert_eq!(
        (view.place, view.status),
        (Place::History, Status::Succeeded)
    );

    let by_key = notifier.status_by_key("ship", "order-2").await.unwrap();
    assert_eq!(
        by_key.map(|v| (v.id, v.place)),
        Some((sent, Place::History))
    );
    let by_key = notifier.status_by_key("ship", "order-1").await.unwrap();
    assert_eq!(by_key.map(|v| v.id), Some(waiting));
    assert!(
        notifier
            .status_by_key("ship", "nope")
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        notifier.status(9_999_999).await,
        Err(solid_notify::Error::NoticeNotFound(9_999_999))
    ));
    assert!(matches!(
        notifier.status_by_key("no_such_def", "order-1").await,
        Err(solid_notify::Error::UnknownDef(_))
    ));

    // Listing: filters and keyset pages, newest first.
    db.insert_due("ship", 5, |i| i as i32 % 2).await;
    let all = find::list(
        &db.db,
        Place::InFlight,
        &filter_def("ship"),
        Page::default(),
    )
    .await
    .unwrap();
    assert_eq!(all.len(), 6);
    assert!(all.windows(2).all(|w| w[0].id > w[1].id));
    let page = Page {
        before_id: Some(all[2].id),
        limit: 2,
    };
    let next = find::list(&db.db, Place::InFlight, &filter_def("ship"), page)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|v| v.id).collect::<Vec<_>>(),
        [all[3].id, all[4].id]
    );
    let odd = NoticeFilter {
        partition: Some(1),
        ..filter_def("ship")
    };
    assert_eq!(
        find::list(&db.db, Place::InFlight, &odd, Page::default())
            .await
            .unwrap()
            .len(),
        2
    );
    let text = NoticeFilter {
        param_contains: Some("\"order\":1".into()),
        ..NoticeFilter::default()
    };
    let found = find::list(&db.db, Place::InFlight, &text, Page::default())
        .await
        .unwrap();
    assert_eq!(found.iter().map(|v| v.id).collect::<Vec<_>>(), [waiting]);
    let wildcard = NoticeFilter {
        param_contains: Some("%".into()),
        ..NoticeFilter::default()
    };
    assert!(
        find::list(&db.db, Place::InFlight, &wildcard, Page::default())
            .await
            .unwrap()
            .is_empty(),
        "% is matched literally"
    );
    let done = NoticeFilter {
        since: Some(chrono::Utc::now().naive_utc() - chrono::Duration::hours(1)),
        ..NoticeFilter::default()
    };
    let finished = find::list(&db.db, Place::History, &done, Page::default())
        .await
        .unwrap();
    assert_eq!(finished.iter().map(|v| v.id).collect::<Vec<_>>(), [sent]);
});
