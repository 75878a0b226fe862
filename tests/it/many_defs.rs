//! A hundred thousand definitions: claims whose size does not depend on the
//! number of definitions (PostgreSQL and MariaDB take at most 65,535 bound
//! parameters, SQLite 32,766), pages that read what they show, and a sweep
//! that fails repeatedly raising its own signal.

use std::{sync::Arc, time::Duration};

use sea_orm::{
    ActiveValue::NotSet, ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter,
};
use solid_notify::entity::{notify_def, notify_msg};

use crate::{
    receiver::{Receiver, Reply},
    support::{Backend, TestDb, eventually},
};

/// Copies the definition `template` as `{prefix}{i}` for `i` in `1..n`,
/// a few hundred rows per statement (SQLite's limit of bound parameters).
async fn copy_defs(db: &TestDb, template: &str, prefix: &str, n: usize) {
    copy_defs_with(db, template, prefix, n, |_| {}).await
}

/// [`copy_defs`], each row changed by `edit` first.
async fn copy_defs_with(
    db: &TestDb,
    template: &str,
    prefix: &str,
    n: usize,
    edit: impl Fn(&mut notify_def::ActiveModel),
) {
    let model = notify_def::Entity::find()
        .filter(notify_def::Column::Name.eq(template))
        .one(&db.db)
        .await
        .unwrap()
        .expect("template");
    let rows: Vec<notify_def::ActiveModel> = (1..n)
        .map(|i| {
            let mut row: notify_def::ActiveModel = model.clone().into();
            row.id = NotSet;
            row.name = Set(format!("{prefix}{i}"));
            edit(&mut row);
            row
        })
        .collect();
    for chunk in rows.chunks(500) {
        notify_def::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(&db.db)
            .await
            .unwrap();
    }
}

/// `n` due notices spread round-robin over the definitions `defs`.
async fn spread_notices(db: &TestDb, defs: &[i64], n: usize) {
    let now = chrono::Utc::now().naive_utc();
    let rows: Vec<notify_msg::ActiveModel> = (0..n)
        .map(|i| notify_msg::ActiveModel {
            def_id: Set(defs[i % defs.len()]),
            param: Set(format!("{{\"i\":{i}}}")),
            next_call_time: Set(now),
            create_time: Set(now),
            ..Default::default()
        })
        .collect();
    for chunk in rows.chunks(500) {
        notify_msg::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(&db.db)
            .await
            .unwrap();
    }
}

crate::db_test!(
    a_hundred_thousand_definitions_drain,
    |db: Arc<TestDb>| async move {
        const DEFS: usize = 100_000;
        const BUSY: u64 = 10_000;
        const NOTICES: usize = 20_000;
        let receiver = Receiver::start(|_| Reply::ok()).await;
        crate::faults::http_def(&db, "tenant_0", &receiver.url, |_| {}).await;
        copy_defs(&db, "tenant_0", "tenant_", DEFS).await;
        let busy: Vec<i64> = {
            use sea_orm::{QueryOrder, QuerySelect};
            notify_def::Entity::find()
                .select_only()
                .column(notify_def::Column::Id)
                .filter(notify_def::Column::Name.like("tenant_%"))
                .order_by_asc(notify_def::Column::Id)
                .limit(BUSY)
                .into_tuple()
                .all(&db.db)
                .await
                .unwrap()
        };
        assert_eq!(busy.len() as u64, BUSY);
        spread_notices(&db, &busy, NOTICES).await;

        // The pages the dashboard and the API read, at 100,000 definitions.
        let timed = std::time::Instant::now();
        let o = solid_notify::ops::overview::overview(&db.db).await.unwrap();
        let overview = timed.elapsed();
        let timed = std::time::Instant::now();
        let page = solid_notify::def::store::page(&db.db, None, None, 1_000)
            .await
            .unwrap();
        let api_defs = timed.elapsed();
        eprintln!("at {DEFS} definitions: overview {overview:?}, /api/defs page {api_defs:?}");
        assert_eq!(o.def_count, DEFS as u64 + 1, "the alert definition too");
        assert_eq!(page.len(), 1_000);
        // A bound against reading every definition (seconds at this size),
        // with room for a machine busy with other tests; the figures are
        // printed above, and measured alone by the benchmarks.
        if db.backend == Backend::Postgres {
            assert!(
                overview < Duration::from_secs(3),
                "overview took {overview:?}"
            );
            assert!(
                api_defs < Duration::from_secs(3),
                "/api/defs took {api_defs:?}"
            );
        }

        // A worker process with its defaults drains them, metrics on.
        let (mut child, addr) = crate::support::metrics_worker(&db, &[]).await;
        let started = std::time::Instant::now();
        eventually(600, "every notice delivered", || async {
            (db.counts().await == (0, NOTICES as u64)).then_some(())
        })
        .await;
        eprintln!(
            "{NOTICES} notices over {BUSY} of {DEFS} definitions drained in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert_eq!(
            receiver.delivered().len(),
            NOTICES,
            "every notice delivered"
        );
        assert_eq!(receiver.duplicates(), 0, "each once");
        assert_eq!(receiver.overlaps(), Vec::<i64>::new());
        // Its metrics stay small: series for at most 100 definitions.
        let text = eventually(30, "the metrics", || async {
            let text = reqwest::get(&addr).await.ok()?.text().await.ok()?;
            text.contains(r#"def="_other""#).then_some(text)
        })
        .await;
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        eprintln!(
            "metrics at {DEFS} definitions: {} bytes, {series} series",
            text.len()
        );
        assert!(text.len() < 300 * 1024, "{} bytes of metrics", text.len());
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("solid_notify_sweeps_failed_total ")
                    && l.trim_end() != "solid_notify_sweeps_failed_total 0"),
            "no sweep failed"
        );
        let _ = child.0.kill();
    }
);

crate::db_test!(
    the_overview_and_pages_show_what_matters_among_many,
    |db: Arc<TestDb>| async move {
        const DEFS: usize = 2_000;
        db.def("tenant_0", "tenant", |_| {}).await;
        copy_defs(&db, "tenant_0", "tenant_", DEFS).await;
        db.insert_due("tenant_1234", 3, |_| 0).await;
        let ops = db.notifier().build().unwrap();
        ops.pause(
            "tenant_77",
            solid_notify::ops::PauseEnd::OnResume,
            &solid_notify::ops::Audit::new("t", "many"),
        )
        .await
        .unwrap();
        let o = solid_notify::ops::overview::overview(&db.db).await.unwrap();
        assert_eq!(o.def_count, DEFS as u64 + 1, "the alert definition too");
        let shown: Vec<&str> = o.defs.iter().map(|d| d.name.as_str()).collect();
        assert!(shown.contains(&"tenant_1234"), "busy: {shown:?}");
        assert!(shown.contains(&"tenant_77"), "paused: {shown:?}");
        assert!(o.defs.len() as u64 <= solid_notify::ops::overview::OVERVIEW_DEFS);
        assert_eq!(o.others.defs, o.def_count - o.defs.len() as u64);
        let found = solid_notify::ops::overview::overview_of(
            &db.db,
            &solid_notify::ops::overview::OverviewQuery {
                search: Some("tenant_199".into()),
                limit: 0,
            },
        )
        .await
        .unwrap();
        let names: Vec<&str> = found.defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names.len(), 11, "{names:?}");
        assert!(names.iter().all(|n| n.contains("tenant_199")));
        // Pages by name.
        let first = solid_notify::def::store::page(&db.db, Some("tenant_"), None, 100)
            .await
            .unwrap();
        assert_eq!(first.len(), 100);
        let next = solid_notify::def::store::page(
            &db.db,
            Some("tenant_"),
            Some(&first.last().unwrap().name),
            100,
        )
        .await
        .unwrap();
        assert!(next[0].name > first[99].name);
    }
);

crate::db_test!(
    a_sweep_that_keeps_failing_shows_in_the_metrics,
    |db: Arc<TestDb>| async move {
        db.def("d", "d", |_| {}).await;
        let (mut child, addr) = crate::support::metrics_worker(&db, &[]).await;
        let failing = |text: &str| -> Option<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix("solid_notify_sweeps_failing_in_a_row "))
                .and_then(|v| v.trim().parse().ok())
        };
        // The worker sweeps; then its table goes away under it.
        eventually(30, "a first sweep", || async {
            let text = reqwest::get(&addr).await.ok()?.text().await.ok()?;
            text.contains("solid_notify_sweep_duration_seconds")
                .then_some(())
        })
        .await;
        db.db
            .execute_unprepared("ALTER TABLE notify_msg RENAME TO notify_msg_away")
            .await
            .unwrap();
        eventually(30, "failed sweeps counted", || async {
            let text = reqwest::get(&addr).await.ok()?.text().await.ok()?;
            (failing(&text)? >= 3.0).then_some(())
        })
        .await;
        db.db
            .execute_unprepared("ALTER TABLE notify_msg_away RENAME TO notify_msg")
            .await
            .unwrap();
        eventually(30, "sweeps succeed again", || async {
            let text = reqwest::get(&addr).await.ok()?.text().await.ok()?;
            let total: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("solid_notify_sweeps_failed_total "))?
                .trim()
                .parse()
                .ok()?;
            (failing(&text)? == 0.0 && total >= 3.0).then_some(())
        })
        .await;
        let _ = child.0.kill();
    }
);

crate::db_test!(
    a_worker_filtered_to_many_definitions_takes_only_those,
    |db: Arc<TestDb>| async move {
        use sea_orm::{QueryOrder, QuerySelect};
        use solid_notify::{Notice, Outcome, Worker, WorkerConfig};
        db.def("tenant_0", "tenant", |_| {}).await;
        copy_defs(&db, "tenant_0", "tenant_", 400).await;
        let ids: Vec<i64> = notify_def::Entity::find()
            .select_only()
            .column(notify_def::Column::Id)
            .filter(notify_def::Column::Name.like("tenant_%"))
            .order_by_asc(notify_def::Column::Id)
            .into_tuple()
            .all(&db.db)
            .await
            .unwrap();
        spread_notices(&db, &ids, ids.len()).await;
        // 150 names: a list past IDS_INLINE, bound as one parameter.
        let names: Vec<String> = (0..150).map(|i| format!("tenant_{i}")).collect();
        let calls: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let recorded = calls.clone();
        let notifier = db
            .notifier()
            .handler("tenant", move |n: Notice| {
                let calls = recorded.clone();
                async move {
                    calls.lock().unwrap().push(n.def);
                    Ok(Outcome::success())
                }
            })
            .build()
            .unwrap();
        let worker = Arc::new(
            Worker::new(
                notifier,
                WorkerConfig {
                    defs: names.clone(),
                    delay: Duration::from_millis(20),
                    mode: solid_notify::worker::Mode::FixedDelay,
                    ..WorkerConfig::default()
                },
            )
            .unwrap(),
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let running = {
            let (worker, stop) = (worker.clone(), stop.clone());
            tokio::spawn(
                async move { worker.run(stop).await.expect("the worker refused to start") },
            )
        };
        eventually(60, "the 150 notices of the listed definitions", || async {
            (db.counts().await == (ids.len() as u64 - 150, 150)).then_some(())
        })
        .await;
        stop.cancel();
        running.await.unwrap();
        let mut got = calls.lock().unwrap().clone();
        got.sort_unstable();
        let mut wanted = names;
        wanted.sort_unstable();
        assert_eq!(got, wanted, "exactly the listed definitions, once each");
        assert_eq!(worker.stats().snapshot().sweeps_failed, 0);
    }
);

crate::db_test!(
    a_refresh_of_the_definitions_reads_only_what_changed,
    |db: Arc<TestDb>| async move {
        use solid_notify::def::cache::DefCache;
        const DEFS: usize = 1_000;
        db.def("r_0", "r", |_| {}).await;
        // Changed ten seconds ago: within the refresh's slack, yet known.
        let earlier = chrono::Utc::now().naive_utc() - chrono::Duration::seconds(10);
        copy_defs_with(&db, "r_0", "r_", DEFS, |row| row.update_time = Set(earlier)).await;
        // A TTL of zero: every use refreshes.
        let cache = DefCache::new(Duration::ZERO);
        let known = cache.known(&db.db).await.unwrap();
        assert!(known.len() >= DEFS);
        let first = cache.reads();
        assert_eq!(first.full, 1);
        // Nothing changed: no row is read whole again, though all changed
        // within the slack (but `r_0` and the alert definition, changed
        // within the last second).
        cache.known(&db.db).await.unwrap();
        let second = cache.reads();
        assert_eq!(second.full, 1);
        assert!(second.rows - first.rows <= 2, "{first:?} then {second:?}");
        // One row paused: that row is read again, and seen paused.
        db.db
            .execute_unprepared(
                "UPDATE notify_def SET paused_until = '2999-01-01 00:00:00' WHERE name = 'r_7'",
            )
            .await
            .unwrap();
        let def = cache.by_name(&db.db, "r_7").await.unwrap();
        assert!(def.paused_until.is_some(), "the pause is seen");
        let third = cache.reads();
        assert_eq!(third.full, 1);
        assert!(
            (1..=3).contains(&(third.rows - second.rows)),
            "the paused row (and the recent ones): {second:?} then {third:?}"
        );
        // Marked stale (a pause, a park check): refreshed, not read whole.
        cache.invalidate();
        cache.known(&db.db).await.unwrap();
        assert_eq!(cache.reads().full, 1, "{:?}", cache.reads());
        // Forgotten (`Notifier::reload_defs`): read whole.
        cache.forget();
        cache.known(&db.db).await.unwrap();
        assert_eq!(cache.reads().full, 2);
    }
);
