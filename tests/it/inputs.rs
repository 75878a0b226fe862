//! Bad input: a typed error, the caller's transaction intact, nothing written.

use std::{collections::HashMap, sync::Arc};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    Error, NewNotice, Outcome,
    def::{Channel, DefSpec, store},
};

use crate::{
    db_test, pg_test,
    support::{Recorder, TestDb},
};

db_test!(bad_notices_are_typed_errors_and_write_nothing, |db: Arc<
    TestDb,
>| async move {
    let (notifier, rec) = db.shipping().await;

    let tx = notifier.begin().await.unwrap();
    db.insert_order(&tx, 1).await;
    let unknown = tx
        .add_notice("no_such_def", &json!({}), "")
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, Error::UnknownDef(ref name) if name == "no_such_def"),
        "{unknown}"
    );

    let mut not_json: HashMap<(i32, i32), i32> = HashMap::new();
    not_json.insert((1, 2), 3);
    let param = tx.add_notice("ship", &not_json, "").await.unwrap_err();
    assert!(
        matches!(param, Error::Param { ref def, .. } if def == "ship"),
        "{param}"
    );

    let negative = tx
        .add(NewNotice::new("ship", &json!({})).load_balance_num(-1))
        .await
        .unwrap_err();
    assert!(
        matches!(negative, Error::InvalidNotice { .. }),
        "{negative}"
    );

    let long_key = tx
        .add(NewNotice::new("ship", &json!({})).idempotency_key("k".repeat(256)))
        .await
        .unwrap_err();
    assert!(
        matches!(long_key, Error::InvalidNotice { .. }),
        "{long_key}"
    );

    let bad_target = tx
        .add(NewNotice::new("ship", &json!({})).target_override(json!({"handler": 5})))
        .await
        .unwrap_err();
    assert!(
        matches!(bad_target, Error::InvalidNotice { .. }),
        "{bad_target}"
    );

    // The transaction is still usable and commits the business data alone.
    db.insert_order(&tx, 2).await;
    assert!(tx.commit_and_wait().await.unwrap().is_empty());
    assert_eq!(db.count_orders().await, 2);
    assert_eq!(db.counts().await, (0, 0));
    assert_eq!(rec.count(), 0);
});

db_test!(
    invalid_definitions_are_rejected_whole,
    |db: Arc<TestDb>| async move {
        db.def("keep", "h", |_| {}).await;
        let before = store::list(&db.db).await.unwrap();
        let good = DefSpec::new("new_one", Channel::Handler, json!({"handler": "h"}));
        let mut bad = DefSpec::new("broken", Channel::Handler, json!({"handler": "h"}));
        bad.retry_interval = "every 5 minutes".into();
        let err = store::sync(&db.db, &[good, bad]).await.unwrap_err();
        let Error::InvalidDef(e) = err else {
            panic!("expected InvalidDef, got {err}")
        };
        assert_eq!(
            (e.def.as_str(), e.field.as_str()),
            ("broken", "retry_interval")
        );
        assert_eq!(
            store::list(&db.db).await.unwrap(),
            before,
            "nothing written"
        );
    }
);

db_test!(definitions_edited_in_the_table_take_effect, |db: Arc<
    TestDb,
>| async move {
    db.def("editable", "h", |s| s.max_retry_times = 0).await;
    let rec = Recorder::default();
    let notifier = db
        .notifier()
        .handler("h", rec.handler(|_| Outcome::retry("down")))
        .build()
        .unwrap();

    let tx = notifier.begin().await.unwrap();
    tx.add_notice("editable", &json!({}), "").await.unwrap();
    let first = tx.commit_and_wait().await.unwrap();
    assert!(matches!(
        first[0].result,
        solid_notify::AttemptResult::FinalFailure { .. }
    ));

    // An operator allows retries directly in the table; no restart.
    db.db
        .execute_unprepared("UPDATE notify_def SET max_retry_times = 3, retry_interval = '2h' WHERE name = 'editable'")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await; // the test TTL is 100 ms
    let tx = notifier.begin().await.unwrap();
    tx.add_notice("editable", &json!({}), "").await.unwrap();
    let second = tx.commit_and_wait().await.unwrap();
    assert!(
        matches!(
            second[0].result,
            solid_notify::AttemptResult::WillRetry { .. }
        ),
        "{second:?}"
    );

    // A row broken in place is reported as such, not as a missing def.
    db.db
        .execute_unprepared("UPDATE notify_def SET retry_interval = 'soon' WHERE name = 'editable'")
        .await
        .unwrap();
    notifier.reload_defs();
    let tx = notifier.begin().await.unwrap();
    let err = tx.add_notice("editable", &json!({}), "").await.unwrap_err();
    let Error::InvalidDef(e) = err else {
        panic!("expected InvalidDef, got {err}")
    };
    assert_eq!(e.field, "retry_interval");
    assert!(e.origin.starts_with("notify_def#"), "{}", e.origin);
    tx.rollback().await.unwrap();
    assert_eq!(db.counts().await, (1, 1));

    // Each delivery-policy column broken in place is named.
    let valid = [
        ("retry_interval", "'2h'"),
        ("immediate_retries", "0"),
        ("immediate_retry_delay", "100"),
        ("retry_jitter", "0"),
        ("on_error", "'retry'"),
        ("rate_limit", "''"),
        ("ordering", "''"),
        ("steps", "''"),
    ];
    for (field, bad) in [
        ("immediate_retries", "11"),
        ("immediate_retries", "-1"),
        ("immediate_retry_delay", "600000"),
        ("retry_jitter", "101"),
        ("on_error", "'ignore'"),
        ("rate_limit", "'fast'"),
        ("rate_limit", "'0/s'"),
        ("ordering", "'per_customer'"),
        ("steps", "'not json'"),
        ("steps", "'[]'"),
        (
            "steps[1].channel",
            r#"'[{"channel": "handler", "target": {"handler": "h"}}, {"channel": "fax", "target": {}}]'"#,
        ),
    ] {
        let set: Vec<String> = valid
            .iter()
            .map(|(col, ok)| {
                let broken = field.split('[').next() == Some(*col);
                format!("{col} = {}", if broken { bad } else { ok })
            })
            .collect();
        let set = set.join(", ");
        db.db
            .execute_unprepared(&format!(
                "UPDATE notify_def SET {set} WHERE name = 'editable'"
            ))
            .await
            .unwrap();
        notifier.reload_defs();
        let tx = notifier.begin().await.unwrap();
        let err = tx.add_notice("editable", &json!({}), "").await.unwrap_err();
        let Error::InvalidDef(e) = err else {
            panic!("expected InvalidDef for {set}, got {err}")
        };
        assert_eq!(e.field, field, "{set}: {e}");
        tx.rollback().await.unwrap();
    }
    assert_eq!(db.counts().await, (1, 1));
});

db_test!(
    every_string_arrives_as_written,
    |db: Arc<TestDb>| async move {
        let notifier = db.notifier();
        strings_round_trip(&db, notifier).await;
    }
);

pg_test!(
    every_string_arrives_as_written_whatever_the_string_settings,
    |db: Arc<TestDb>| async move {
        // Settings a hardened or legacy server may have, for every new
        // session of this database.
        for setting in ["backslash_quote = off", "standard_conforming_strings = off"] {
            db.db
                .execute_unprepared(&format!(
                    "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET {setting}', current_database()); END $$"
                ))
                .await
                .unwrap();
        }
        let pool = TestDb::connect_to(&db.url).await;
        let off = pool
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT current_setting('backslash_quote') || current_setting('standard_conforming_strings')",
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(off.try_get_by_index::<String>(0).unwrap(), "offoff");
        let notifier = solid_notify::Notifier::builder(pool).config(crate::support::test_config());
        strings_round_trip(&db, notifier).await;
    }
);

/// Awkward strings in small and large batches of one transaction each, on
/// `notifier`: each is delivered and kept exactly as written.
async fn strings_round_trip(db: &TestDb, notifier: solid_notify::NotifierBuilder) {
    db.def("ship", "ship", |_| {}).await;
    let rec = Recorder::default();
    let notifier = notifier
        .handler("ship", rec.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let awkward = [
        "it's",
        r"back\slash \' \\'",
        "line\nbreak\ttab\r",
        "$$ $tag$ E'x' ''",
        "'; DELETE FROM notify_msg; --",
        "ünïcødé 通知 🚀",
        "",
    ];
    // One transaction whose notices are small (on PostgreSQL: sent as SQL
    // literals with the COMMIT), one whose notices are large in all (sent
    // as a prepared statement before it).
    let big = "x".repeat(600 * 1024);
    let mut sent = Vec::new();
    for pad in ["", big.as_str()] {
        let tx = notifier.begin().await.unwrap();
        for (i, s) in awkward.iter().enumerate() {
            let param = json!({ "s": s, "pad": pad });
            let id = tx
                .add(
                    NewNotice::new("ship", &param)
                        .description(*s)
                        .idempotency_key(format!("{pad_len}-{i}-{s}", pad_len = pad.len())),
                )
                .await
                .unwrap();
            sent.push((id, param, s.to_string()));
        }
        let reports = tx.commit_and_wait().await.unwrap();
        assert_eq!(reports.len(), awkward.len());
    }
    let calls = rec.calls();
    assert_eq!(calls.len(), sent.len());
    for (id, param, s) in &sent {
        let call = calls.iter().find(|c| c.id == *id).expect("delivered");
        assert_eq!(&call.param, param, "param of {id}");
        assert_eq!(&call.description, s, "description of {id}");
        assert!(call.idempotency_key.ends_with(s.as_str()), "key of {id}");
        let kept = db.history_of(*id).await.expect("in history");
        assert_eq!(&kept.description, s);
    }
    assert_eq!(db.counts().await, (0, sent.len() as u64));
}
