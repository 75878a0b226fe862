//! The poison census: notice rows a plain-SQL producer wrote with a cell the
//! library cannot use (on SQLite any type in any cell; on the servers what
//! their column types accept: text that is not JSON, numbers out of range,
//! a status that is none), each beside good notices of another definition.
//! The good notices are delivered; each odd row is parked with a reason
//! naming its column (or, never due, shown as unreadable); `list`, `show`,
//! the pages and the API answer; nothing else in the tables changes.
//! Also: times in every form SQLite writes, read or refused at the insert.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, Statement};
use serde_json::Value;
use solid_notify::{
    Outcome,
    dashboard::DashboardConfig,
    ops::find::{self, NoticeFilter, Page, Place},
};

use crate::{
    dashboard::{client, serve},
    db_test,
    ops::cli,
    support::{Backend, Recorder, TestDb, eventually},
};

/// What becomes of an odd row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Parked (history, status 6), the reason naming the column.
    Parked,
    /// Delivered like any notice (the claim rewrites the cell, or the
    /// value is odd but usable).
    Delivered,
    /// Never due (a status that is none is never claimed): left in flight
    /// as it is, shown as unreadable.
    Shown,
}

/// One odd cell: the column, its value as SQL, and its fate.
struct Case {
    column: &'static str,
    value: &'static str,
    fate: Fate,
    /// The word the reason names (the column, or what is wrong).
    named: &'static str,
}

const fn case(column: &'static str, value: &'static str, fate: Fate) -> Case {
    Case {
        column,
        value,
        fate,
        named: column,
    }
}

/// The cases of `backend`.
fn cases(backend: Backend) -> Vec<Case> {
    use Fate::*;
    // What every backend accepts in its columns.
    let mut cases = vec![
        case("param", "'not json'", Parked),
        case("target_override", "'[1]'", Parked),
        case("target_override", "'{'", Parked),
        case("step_result", "'not json'", Parked),
        case("step", "7", Parked),
        case("step", "-1", Parked),
        case("version", "2147483647", Delivered),
        case("retry_times", "-5", Delivered),
        case("load_balance_num", "-1", Delivered),
        case("status", "9", Shown),
        case("trace_context", "'not json'", Delivered),
    ];
    match backend {
        Backend::Sqlite => cases.extend([
            Case {
                named: "param",
                ..case("param", "X'7B7D'", Parked)
            },
            case("retry_times", "'abc'", Parked),
            case("retry_times", "99999999999", Parked),
            case("load_balance_num", "'abc'", Parked),
            case("step", "'abc'", Parked),
            case("ordering_key", "X'6B'", Parked),
            case("description", "X'00'", Parked),
            case("target_override", "X'7B7D'", Parked),
            case("trace_context", "X'7B7D'", Parked),
            case("step_result", "X'7B7D'", Parked),
            case("idempotency_key", "X'6B'", Parked),
            case("errors", "X'6B'", Parked),
            case("create_time", "'garbage'", Parked),
            case("create_time", "X'00'", Parked),
            case("not_before", "'garbage'", Parked),
            case("not_before", "'2000-01-01'", Parked),
            case("version", "'abc'", Delivered),
            case("version", "1.5", Parked),
            // Within the CHECK's range, but no origin.
            case("origin", "1.5", Parked),
            case("leased", "'yes'", Delivered),
            case("def_id", "'abc'", Parked),
            case("status", "'abc'", Shown),
        ]),
        Backend::MySql => cases.extend([
            case("create_time", "'0000-00-00 00:00:00'", Parked),
            // Read as no delay at all (the driver reads a zero date as NULL).
            case("not_before", "'0000-00-00 00:00:00'", Delivered),
        ]),
        // Times sqlx cannot read (it would panic on them).
        Backend::Postgres => cases.extend([
            case("create_time", "'infinity'", Parked),
            case("not_before", "'-infinity'", Parked),
            case("create_time", "'270000-01-01'", Parked),
        ]),
    }
    cases
}

/// Runs `sql` on `db`.
async fn exec(db: &TestDb, sql: &str) -> Result<u64, sea_orm::DbErr> {
    db.db
        .execute_raw(Statement::from_string(
            db.db.get_database_backend(),
            sql.to_string(),
        ))
        .await
        .map(|r| r.rows_affected())
}

/// Inserts a due notice of `def` with plain SQL; returns its id.
async fn insert(db: &TestDb, def: &str) -> i64 {
    exec(
        db,
        &format!(
            "INSERT INTO notify_msg (def_id, param, description, errors, status, retry_times, \
             next_call_time, create_time, version, load_balance_num, leased, step) \
             SELECT id, '{{}}', 'census', '', 0, 0, {now}, {now}, 0, 0, false, 0 \
             FROM notify_def WHERE name = '{def}'",
            now = db.now_sql()
        ),
    )
    .await
    .unwrap();
    db.scalar("SELECT MAX(id) FROM notify_msg").await
}

/// Notices of a definition, by id, wherever they are: (place, status).
async fn where_is(db: &TestDb, id: i64) -> (Place, i64, String) {
    for (place, table) in [
        (Place::InFlight, "notify_msg"),
        (Place::History, "notify_msg_history"),
    ] {
        let n = db
            .scalar(&format!("SELECT COUNT(*) FROM {table} WHERE id = {id}"))
            .await;
        if n == 1 {
            let status = match db.backend {
                Backend::Sqlite => "CASE WHEN typeof(status) = 'integer' THEN status ELSE -1 END",
                Backend::MySql => "CAST(status AS SIGNED)",
                Backend::Postgres => "CAST(status AS BIGINT)",
            };
            let status = db
                .scalar(&format!("SELECT {status} FROM {table} WHERE id = {id}"))
                .await;
            let errors = errors_of(db, table, id).await;
            return (place, status, errors);
        }
    }
    panic!("notice {id} is in neither table");
}

/// The failure log of row `id` of `table`, as text.
async fn errors_of(db: &TestDb, table: &str, id: i64) -> String {
    let cast = match db.backend {
        Backend::MySql => "CAST(errors AS CHAR)",
        _ => "CAST(errors AS TEXT)",
    };
    let row = db
        .db
        .query_one_raw(Statement::from_string(
            db.db.get_database_backend(),
            format!("SELECT {cast} FROM {table} WHERE id = {id}"),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<Option<String>>(0)
        .unwrap()
        .unwrap_or_default()
}

db_test!(
    a_plain_sql_notice_is_a_producers_and_no_other_origin_is_stored,
    |db| async move {
        db.def("odd", "odd", |_| {}).await;
        let id = insert(&db, "odd").await;
        let origin = format!("SELECT origin + 0 FROM notify_msg WHERE id = {id}");
        assert_eq!(db.scalar(&origin).await, 0, "the column's default");
        let mut refused = vec!["3", "-1"];
        if db.backend == Backend::Sqlite {
            refused.extend(["'event'", "X'02'"]);
        }
        for value in refused {
            let sql = format!("UPDATE notify_msg SET origin = {value} WHERE id = {id}");
            let err = exec(&db, &sql).await.expect_err(&sql);
            let err = err.to_string().to_lowercase();
            assert!(
                err.contains("check") || err.contains("constraint"),
                "{sql}: {err}"
            );
        }
        assert_eq!(db.scalar(&origin).await, 0, "unchanged");
    }
);

db_test!(odd_rows_are_parked_and_stop_no_one, |db| async move {
    db.def("good", "good", |_| {}).await;
    db.def("odd", "odd", |_| {}).await;
    let (good, odd) = (Recorder::default(), Recorder::default());
    let notifier = db
        .notifier()
        .handler("good", good.handler(|_| Outcome::success()))
        .handler("odd", odd.handler(|_| Outcome::success()))
        .build()
        .unwrap();
    let backend = db.backend;
    let mut placed: Vec<(i64, Case)> = Vec::new();
    for case in cases(backend) {
        let id = insert(&db, "odd").await;
        let sql = format!(
            "UPDATE notify_msg SET {} = {} WHERE id = {id}",
            case.column, case.value
        );
        exec(&db, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        placed.push((id, case));
    }
    let mut good_ids = Vec::new();
    for _ in 0..3 {
        good_ids.push(insert(&db, "good").await);
    }
    let expected_odd: usize = placed
        .iter()
        .filter(|(_, c)| c.fate == Fate::Delivered)
        .count();
    let settled = placed.iter().filter(|(_, c)| c.fate != Fate::Shown).count() as i64;
    eventually(
        60,
        "the good notices delivered, the odd rows settled",
        || async {
            pass(&notifier).await;
            let done = db.scalar("SELECT COUNT(*) FROM notify_msg_history").await;
            (good.count() == 3 && odd.count() == expected_odd && done == settled + 3).then_some(())
        },
    )
    .await;
    let delivered: Vec<i64> = good.calls().iter().map(|n| n.id).collect();
    assert_eq!(delivered.len(), 3, "each good notice once");
    for id in &good_ids {
        assert!(delivered.contains(id));
    }
    for (id, case) in &placed {
        let what = format!("{} = {} (notice {id})", case.column, case.value);
        let (place, status, errors) = where_is(&db, *id).await;
        match case.fate {
            Fate::Parked => {
                assert_eq!((place, status), (Place::History, 6), "{what}: parked");
                assert!(
                    errors.contains("parked") && errors.contains(case.named),
                    "{what}: the reason names the column: {errors}"
                );
                assert_eq!(odd.count_for(*id), 0, "{what}: never sent");
            }
            Fate::Delivered => {
                assert_eq!((place, status), (Place::History, 1), "{what}: delivered");
                assert_eq!(odd.count_for(*id), 1, "{what}: once");
            }
            Fate::Shown => {
                assert_eq!(place, Place::InFlight, "{what}: never claimed");
                assert_eq!(odd.count_for(*id), 0, "{what}: never sent");
            }
        }
    }
    // Every listing and view answers, and shows each odd row.
    let mut seen: HashMap<i64, find::NoticeView> = HashMap::new();
    for place in [Place::InFlight, Place::History] {
        for view in find::list(
            &db.db,
            place,
            &NoticeFilter::default(),
            Page {
                before_id: None,
                limit: 1_000,
            },
        )
        .await
        .expect("a listing stops for no odd row")
        {
            seen.insert(view.id, view);
        }
    }
    for (id, case) in &placed {
        let what = format!("{} = {}", case.column, case.value);
        let view = find::show(&db.db, *id).await.expect("show answers");
        assert_eq!(seen.get(id).map(|v| v.id), Some(*id), "{what}: listed");
        if case.fate == Fate::Shown {
            let why = view.unreadable.clone().unwrap_or_default();
            assert!(
                why.contains(case.named),
                "{what}: shown as unreadable: {why:?}"
            );
            assert_eq!(view.state(), "unreadable");
        }
    }
    // The CLI and the dashboard too.
    let (ok, out, err) = cli(&db, &["list", "--limit", "1000"]);
    assert!(ok, "list: {err}");
    for (id, _) in placed.iter().filter(|(_, c)| c.fate == Fate::Shown) {
        assert!(out.contains(&id.to_string()), "list shows {id}: {out}");
        let (ok, out, err) = cli(&db, &["show", &id.to_string()]);
        assert!(ok && out.contains("unreadable"), "show {id}: {out} {err}");
    }
    let (ok, _, err) = cli(&db, &["history", "list", "--limit", "1000"]);
    assert!(ok, "history list: {err}");
    let (base, stop) = serve(&db, DashboardConfig::default()).await;
    let http = client();
    for path in [
        "/notices",
        "/notices?place=history",
        "/api/notices",
        "/api/notices?place=history",
        "/",
    ] {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    for (id, case) in &placed {
        for path in [format!("/notices/{id}"), format!("/api/notices/{id}")] {
            let r = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path} ({} = {})", case.column, case.value);
            if path.starts_with("/api") && case.fate == Fate::Shown {
                let body: Value = r.json().await.unwrap();
                assert!(body["unreadable"].is_string(), "{path}: {body}");
            }
        }
    }
    stop.cancel();
    // An operator requeues every parked row at once: none is refused. A
    // requeue rewrites some cells (a fresh retry count and log, no delay):
    // those rows are delivered now, once; the others are parked again.
    let parked = placed
        .iter()
        .filter(|(_, c)| c.fate == Fate::Parked)
        .count();
    let shown = placed.iter().filter(|(_, c)| c.fate == Fate::Shown).count();
    let action = solid_notify::ops::BulkAction::new(
        NoticeFilter {
            status: Some(solid_notify::Status::Parked),
            ..NoticeFilter::default()
        },
        solid_notify::ops::Audit::new("census", "requeue them all"),
    );
    let report = notifier
        .requeue_where(&action)
        .await
        .expect("a requeue stops for no odd row");
    assert_eq!(report.changed as usize, parked, "{report}");
    eventually(60, "the requeued rows settled again", || async {
        pass(&notifier).await;
        (db.counts().await.0 as usize == shown).then_some(())
    })
    .await;
    for (id, case) in placed.iter().filter(|(_, c)| c.fate == Fate::Parked) {
        let what = format!("{} = {} (notice {id})", case.column, case.value);
        match where_is(&db, *id).await {
            (Place::History, 1, _) => assert_eq!(odd.count_for(*id), 1, "{what}: once"),
            (Place::History, 6, errors) => {
                assert_eq!(odd.count_for(*id), 0, "{what}: never sent");
                assert!(errors.contains("requeued by census"), "{what}: {errors}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // Nothing else changed: only the odd and good notices exist.
    let (live, done) = db.counts().await;
    assert_eq!(live + done, placed.len() as u64 + 3);
});

/// A time in one of the forms SQLite writes, as SQL, and whether it is in
/// the future (a delayed notice) or the past (due at once). A date alone
/// is its midnight: two days ahead, so that it is still more than an hour
/// ahead late in the day (`+1 day` was 30 minutes ahead at 23:30 UTC).
const TIMES: [(&str, bool); 9] = [
    ("date('now', '+2 days')", true),
    ("date('now', '-1 day')", false),
    ("strftime('%Y-%m-%dT%H:%M:%SZ', 'now', '+1 day')", true),
    (
        "strftime('%Y-%m-%dT%H:%M:%S+02:00', 'now', '-1 hour')",
        false,
    ),
    (
        "strftime('%Y-%m-%dT%H:%M:%S-05:00', 'now', '-1 hour')",
        true,
    ),
    ("CAST(strftime('%s', 'now', '+1 day') AS INTEGER)", true),
    ("CAST(strftime('%s', 'now', '-1 day') AS REAL)", false),
    ("julianday('now', '+1 day')", true),
    ("julianday('now', '-1 day')", false),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_times_in_any_form_are_read_or_refused_at_the_insert() {
    crate::support::run(Backend::Sqlite, |db| async move {
        let (notifier, rec) = db.shipping().await;
        let insert = |time: &str| {
            format!(
                "INSERT INTO notify_msg (def_id, param, next_call_time, create_time) \
                 SELECT id, '{{}}', {time}, {time} FROM notify_def WHERE name = 'ship'"
            )
        };
        let mut ids = Vec::new();
        for (time, later) in TIMES {
            exec(&db, &insert(time))
                .await
                .unwrap_or_else(|e| panic!("{time}: {e}"));
            ids.push((
                db.scalar("SELECT MAX(id) FROM notify_msg").await,
                time,
                later,
            ));
        }
        // Every stored time is in the library's form now.
        assert_eq!(
            db.scalar(
                "SELECT COUNT(*) FROM notify_msg WHERE next_call_time NOT GLOB \
                 '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' \
                 OR create_time NOT GLOB '[0-9][0-9][0-9][0-9]-*'"
            )
            .await,
            0
        );
        let due = TIMES.iter().filter(|(_, later)| !later).count();
        eventually(30, "the notices due delivered", || async {
            notifier.sweep_once(100).await.unwrap();
            (rec.count() == due).then_some(())
        })
        .await;
        for (id, time, later) in &ids {
            let view = find::show(&db.db, *id).await.unwrap();
            assert!(view.unreadable.is_none(), "{time}: read");
            match later {
                true => {
                    assert_eq!(rec.count_for(*id), 0, "{time}: not before its time");
                    assert!(view.scheduled, "{time}: scheduled ({view:?})");
                    let at = view.not_before.expect("delayed");
                    let ahead = at - chrono::Utc::now().naive_utc();
                    assert!(
                        ahead > chrono::Duration::hours(1),
                        "{time}: read as {at} (UTC)"
                    );
                }
                false => assert_eq!(rec.count_for(*id), 1, "{time}: delivered once"),
            }
        }
        // The -05:00 time an hour ago is 4 hours ahead in UTC; the +02:00
        // one 3 hours ago.
        let (_, t, _) = ids[4];
        assert!(t.contains("-05:00"));
        let (live_before, done_before) = db.counts().await;
        // What SQLite reads as no time is refused at the insert, naming
        // the column; nothing is written.
        for bad in ["'tomorrow'", "X'00'", "'2026-11-28T10:00:00+0200'", "''"] {
            let e = exec(&db, &insert(bad)).await.expect_err(bad);
            assert!(
                e.to_string().contains("next_call_time is not a time"),
                "{bad}: {e}"
            );
        }
        assert_eq!(db.counts().await, (live_before, done_before));
        let (ok, out, err) = cli(&db, &["list"]);
        assert!(ok, "{out} {err}");
    })
    .await
}

/// A sweep, and the park check (a definition id that is none): neither
/// stops for an odd row.
async fn pass(notifier: &solid_notify::Notifier) {
    notifier
        .sweep_once(1_000)
        .await
        .expect("a sweep stops for no odd row");
    notifier
        .park_orphans(1_000)
        .await
        .expect("the park check stops for no odd row");
}
