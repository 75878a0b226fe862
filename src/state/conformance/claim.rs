//! Claim: a due row is taken once, at a new version, with a lease; a stale
//! read, a live lease, a reservation of another notice or a notice out of
//! its key's turn is not taken, and nothing is written.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use super::{Fixture, LEASE, conformance, on_postgres};
use crate::state::{
    claim::{self, DueFilter},
    clock::Due,
    floor::Floor,
    insert,
};

conformance!(claims_a_due_row_once, |f: Fixture| async move {
    let id = f.notice().await;
    let taken = claim::claim_due(&f.store, &DueFilter::default(), 10, false, u64::MAX)
        .await
        .unwrap();
    assert_eq!(taken.leases.len(), 1);
    let lease = &taken.leases[0];
    assert_eq!((lease.id(), lease.version()), (id, 1));
    let row = f.live(id).await.unwrap();
    assert!(row.leased);
    assert_eq!(row.version, 1);
    let again = claim::claim_due(&f.store, &DueFilter::default(), 10, false, u64::MAX)
        .await
        .unwrap();
    assert!(again.leases.is_empty(), "a leased row was claimed twice");
    f
});

conformance!(does_not_claim_from_a_stale_read, |f: Fixture| async move {
    let id = f.notice().await;
    let read = f.live(id).await.unwrap();
    let _first = f.claim(id).await;
    let before = f.live(id).await.unwrap();
    assert!(claim::claim_one(&f.store, &read).await.unwrap().is_none());
    f.unchanged(id, &before).await;
    f
});

conformance!(does_not_claim_under_a_live_lease, |f: Fixture| async move {
    let id = f.notice().await;
    let _first = f.claim(id).await;
    let current = f.live(id).await.unwrap();
    assert!(
        claim::claim_one(&f.store, &current)
            .await
            .unwrap()
            .is_none()
    );
    f.unchanged(id, &current).await;
    f
});

conformance!(claims_a_row_whose_lease_ran_out, |f: Fixture| async move {
    let id = f.notice().await;
    let (stale, current) = f.stale_and_current(id).await;
    assert_eq!((stale.version(), current.version()), (1, 2));
    assert_eq!(f.live(id).await.unwrap().version, 2);
    stale.forget();
    current.forget();
    f
});

conformance!(
    takes_only_its_own_notices_reservation,
    |f: Fixture| async move {
        let row = f.row(None, Due::Reserved(LEASE));
        let id = insert::insert_plain(&f.store.db, &row).await.unwrap();
        let before = f.live(id).await.unwrap();
        let started = std::time::Instant::now();
        // The same id, another notice's content: an id a rolled-back
        // insert left behind and another notice took.
        let other = crate::entity::notify_msg::Model {
            param: "{\"n\":-1}".into(),
            ..before.clone()
        };
        assert!(
            claim::claim_reserved(&f.store, &other, started)
                .await
                .unwrap()
                .is_none()
        );
        f.unchanged(id, &before).await;
        // The same id and param, another definition.
        let other_def = crate::entity::notify_msg::Model {
            def_id: before.def_id + 1,
            ..before.clone()
        };
        assert!(
            claim::claim_reserved(&f.store, &other_def, started)
                .await
                .unwrap()
                .is_none()
        );
        // Nor is it released for another notice.
        let released =
            claim::release_reserved(&f.store, &[(id, before.def_id, "{\"n\":-1}".to_string())])
                .await
                .unwrap();
        assert_eq!(released, 0);
        f.unchanged(id, &before).await;
        let lease = claim::claim_reserved(&f.store, &before, started)
            .await
            .unwrap()
            .expect("its own reservation");
        assert_eq!(lease.version(), 1);
        assert!(
            claim::claim_reserved(&f.store, &before, started)
                .await
                .unwrap()
                .is_none(),
            "a reservation was claimed twice"
        );
        lease.forget();
        f
    }
);

conformance!(
    does_not_claim_a_notice_out_of_its_keys_turn,
    |f: Fixture| async move {
        f.exec("UPDATE notify_def SET ordering = 'per_key'").await;
        let first = f.keyed("k").await;
        let second = f.keyed("k").await;
        let before = f.live(second).await.unwrap();
        assert!(
            claim::claim_in_turn(&f.store, second)
                .await
                .unwrap()
                .is_none()
        );
        f.unchanged(second, &before).await;
        let lease = claim::claim_in_turn(&f.store, first)
            .await
            .unwrap()
            .expect("the oldest of its key");
        // While it is held, the next one is still not in turn.
        let held = f.live(second).await.unwrap();
        assert!(claim::claim_one(&f.store, &held).await.unwrap().is_none());
        lease.forget();
        f
    }
);

conformance!(
    claims_only_what_fits_in_its_bytes,
    |f: Fixture| async move {
        // Params of 100 bytes each: a bound of 150 takes the first two (the
        // second starts under it), a bound of 1 the first only; the rows left
        // stay due, unclaimed. Both without and with the turn's variant.
        let param = format!("\"{}\"", "x".repeat(98));
        for set_aside in [false, true] {
            let mut ids = Vec::new();
            for _ in 0..3 {
                let row = crate::state::insert::NewRow {
                    param: param.clone(),
                    ..f.row(None, Due::Now)
                };
                ids.push(insert::insert_plain(&f.store.db, &row).await.unwrap());
            }
            let taken = claim::claim_due(&f.store, &DueFilter::default(), 10, set_aside, 150)
                .await
                .unwrap();
            let taken_ids: Vec<i64> = taken.leases.iter().map(|l| l.id()).collect();
            assert_eq!(taken_ids, ids[..2], "set_aside {set_aside}");
            assert!(!f.live(ids[2]).await.unwrap().leased);
            let one = claim::claim_due(&f.store, &DueFilter::default(), 10, set_aside, 1)
                .await
                .unwrap();
            let one_ids: Vec<i64> = one.leases.iter().map(|l| l.id()).collect();
            assert_eq!(one_ids, ids[2..], "set_aside {set_aside}");
            for lease in taken.leases.into_iter().chain(one.leases) {
                lease.succeed(None, &[]).await.unwrap().unwrap();
            }
        }
        f
    }
);

/// 40 notices a step on, each holding the previous step's result of 20,000
/// bytes (a param of 2): `(ids, one row's payload)`.
async fn step_results(f: &Fixture) -> (Vec<i64>, u64) {
    let result = format!("\"{}\"", "r".repeat(19_998));
    let mut ids = Vec::new();
    for _ in 0..40 {
        let id = f.notice().await;
        f.exec(&format!(
            "UPDATE notify_msg SET param = '{{}}', step = 1, step_result = '{result}' WHERE id = {id}"
        ))
        .await;
        ids.push(id);
    }
    (ids, 2 + result.len() as u64)
}

/// The payload bytes a claim of at most `budget` bytes holds, with and
/// without setting aside (the two forms of the claim).
async fn claimed_bytes(f: &Fixture, budget: u64, set_aside: bool) -> (u64, usize) {
    let taken = claim::claim_due(&f.store, &DueFilter::default(), 1_000, set_aside, budget)
        .await
        .unwrap();
    let bytes = taken.leases.iter().map(|l| l.payload_bytes()).sum();
    let n = taken.leases.len();
    for lease in taken.leases {
        lease.forget();
    }
    (bytes, n)
}

conformance!(
    a_claim_counts_the_previous_steps_result_in_its_bytes,
    |f: Fixture| async move {
        let (ids, row) = step_results(&f).await;
        let budget = 100_000;
        for set_aside in [false, true] {
            let (bytes, n) = claimed_bytes(&f, budget, set_aside).await;
            assert!(n >= 1, "at least one row");
            assert!(
                bytes <= budget + row,
                "set_aside {set_aside}: {n} rows hold {bytes} bytes, over {budget} plus a row"
            );
            for id in &ids {
                f.expire(*id).await;
            }
        }
        f
    }
);

conformance!(
    a_claim_counts_a_param_rewritten_in_place,
    |f: Fixture| async move {
        // A rekey (or a hand edit) rewrites params in place: 40 params of
        // 2 bytes become 20,000.
        let big = format!("\"{}\"", "p".repeat(19_998));
        let mut ids = Vec::new();
        for _ in 0..40 {
            ids.push(f.notice().await);
        }
        f.exec(&format!("UPDATE notify_msg SET param = '{big}'"))
            .await;
        let budget = 100_000;
        let (bytes, n) = claimed_bytes(&f, budget, false).await;
        assert!(
            bytes <= budget + big.len() as u64,
            "{n} rows hold {bytes} bytes, over {budget} plus a row"
        );
        f
    }
);

/// The ids `claimed` took.
fn ids_of(claimed: &claim::Claimed) -> Vec<i64> {
    claimed.leases.iter().map(|l| l.id()).collect()
}

/// Moves notice `id`'s due time a minute back: written below any floor
/// (the `due_at` triggers follow on PostgreSQL).
async fn due_a_minute_ago(f: &Fixture, id: i64) {
    let sql = match f.store.backend() {
        DbBackend::Postgres => {
            "UPDATE notify_msg SET next_call_time = (statement_timestamp() AT TIME ZONE 'UTC') - interval '1 minute' WHERE id = $1"
        }
        DbBackend::MySql => {
            "UPDATE notify_msg SET next_call_time = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE id = ?"
        }
        _ => {
            "UPDATE notify_msg SET next_call_time = strftime('%Y-%m-%d %H:%M:%f', 'now', '-60 seconds') WHERE id = ?"
        }
    };
    f.store
        .db
        .execute_raw(Statement::from_sql_and_values(
            f.store.backend(),
            sql,
            [id.into()],
        ))
        .await
        .unwrap();
}

conformance!(
    a_row_written_below_the_floor_waits_only_while_claims_find_others,
    |f: Fixture| async move {
        let filter = DueFilter {
            floor: Floor::kept(),
            ..DueFilter::default()
        };
        let claim = || claim::claim_due(&f.store, &filter, 10, false, u64::MAX);
        let first = f.notice().await;
        // Held to the end (a lease dropped gives its row back).
        let held = claim().await.unwrap();
        assert_eq!(ids_of(&held), [first]);
        // Written due before the floor the first claim computed (a producer
        // that committed long after its insert, or plain SQL), and one
        // above it.
        let late = f.notice().await;
        due_a_minute_ago(&f, late).await;
        let busy = f.notice().await;
        let mut taken = claim().await.unwrap();
        let mut got = ids_of(&taken);
        if f.store.backend() != DbBackend::Postgres {
            // No floor on SQLite and MariaDB.
            got.sort_unstable();
            assert_eq!(got, [late, busy]);
        } else {
            assert_eq!(got, [busy], "a claim read below its floor");
            // Not lost: a claim that finds nothing above the floor looks
            // below it.
            let started = Instant::now();
            let again = loop {
                let again = claim().await.unwrap();
                if !again.leases.is_empty() {
                    break again;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "a row below the floor was not claimed by claims that found nothing"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(ids_of(&again), [late]);
            taken.leases.extend(again.leases);
        }
        held.leases.into_iter().for_each(|l| l.forget());
        taken.leases.into_iter().for_each(|l| l.forget());
        f
    }
);

/// The buffers PostgreSQL read or hit running `select`, by index scans
/// only (a sequential scan would hide what the floor changes).
async fn pg_buffers(
    f: &Fixture,
    select: sea_orm::Select<crate::entity::notify_msg::Entity>,
) -> u64 {
    use sea_orm::{QueryTrait, TransactionTrait};
    let built = select.build(DbBackend::Postgres);
    let txn = f.store.db.pool().begin().await.unwrap();
    txn.execute_unprepared("SET LOCAL enable_seqscan = off")
        .await
        .unwrap();
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", built.sql),
            built.values.map(|v| v.0).unwrap_or_default(),
        ))
        .await
        .unwrap()
        .unwrap();
    txn.rollback().await.unwrap();
    let plan: serde_json::Value = row.try_get("", "QUERY PLAN").unwrap();
    let top = &plan[0]["Plan"];
    ["Shared Hit Blocks", "Shared Read Blocks"]
        .iter()
        .map(|k| top[k].as_u64().unwrap_or(0))
        .sum()
}

conformance!(
    the_floor_bounds_the_scan_under_a_long_reader,
    |f: Fixture| async move {
        if !on_postgres(&f) {
            return f;
        }
        use sea_orm::TransactionTrait;
        // A REPEATABLE READ reader whose snapshot predates the rows below.
        let reader = f
            .store
            .db
            .pool()
            .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
            .await
            .unwrap();
        reader
            .execute_unprepared("SELECT count(*) FROM notify_msg")
            .await
            .unwrap();
        // 3,000 notices due half a minute ago, sent and gone: while the
        // reader lives, their index entries stay at the due index's start.
        let sent = format!(
            "INSERT INTO notify_msg (def_id, param, next_call_time) SELECT {}, '{{}}', \
             (statement_timestamp() AT TIME ZONE 'UTC') - interval '30 seconds' FROM generate_series(1, 3000)",
            f.def_id
        );
        f.store.db.execute_unprepared(&sent).await.unwrap();
        f.store
            .db
            .execute_unprepared("DELETE FROM notify_msg")
            .await
            .unwrap();
        let live = f.notice().await;
        let filter = DueFilter {
            floor: Floor::kept(),
            ..DueFilter::default()
        };
        let floor = claim::floor_of(&f.store, &filter).await;
        assert!(floor.is_some(), "no floor on PostgreSQL");
        let whole = pg_buffers(&f, claim::due_select(&f.store, &filter, None, 10)).await;
        let bounded = pg_buffers(&f, claim::due_select(&f.store, &filter, floor, 10)).await;
        eprintln!("buffers: {whole} from the index's start, {bounded} from the floor");
        assert!(
            whole >= 30,
            "the whole index's scan read {whole} buffers: the dead entries are not there"
        );
        assert!(
            bounded * 5 <= whole,
            "the scan from the floor read {bounded} buffers, against {whole} from the index's start"
        );
        // And the claim from the floor takes the live row.
        let taken = claim::claim_due(&f.store, &filter, 10, false, u64::MAX)
            .await
            .unwrap();
        assert_eq!(ids_of(&taken), [live]);
        taken.leases.into_iter().for_each(|l| l.forget());
        reader.rollback().await.unwrap();
        f
    }
);
