//! Large payloads: a worker's memory is bounded in bytes, not rows. Notices
//! of 1 MiB of incompressible text (written by plain SQL, so no producer's
//! limit applies) are drained by a `solid-notify worker` process with its
//! defaults; its peak resident memory, read from `/proc`, stays under the
//! default bound of 64 MiB plus a base of 64 MiB, and every notice is
//! delivered once. A notice larger than the bound goes, alone, without
//! holding up the others.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, Statement, Value};

use super::http_def;
use crate::{
    receiver::{Receiver, Reply},
    support::{Backend, TestDb, eventually, worker_process},
};

const MIB: usize = 1024 * 1024;

/// `bytes` of random hex digits, as a JSON string (`"…"`): valid JSON that
/// does not compress.
fn random_json(bytes: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = Vec::with_capacity(bytes);
    text.push(b'"');
    while text.len() < bytes - 1 {
        let mut word = fastrand::u64(..);
        for _ in 0..16 {
            text.push(HEX[(word & 15) as usize]);
            word >>= 4;
        }
    }
    text.truncate(bytes - 1);
    text.push(b'"');
    String::from_utf8(text).unwrap()
}

/// Notices of `bytes` of random text each: one random block, made once,
/// each notice's its own by its number in front (each row on its own does
/// not compress).
fn random_params(n: usize, bytes: usize) -> impl Iterator<Item = String> {
    let block = random_json(bytes);
    (0..n).map(move |i| {
        let number = format!("\"{i:08}");
        let mut param = block.clone();
        param.replace_range(..number.len(), &number);
        param
    })
}

/// Inserts notices of `def` with these params, as a plain-SQL producer
/// would, a few per statement (made as they go: never all in memory), on
/// a connection of its own (opened after [`allow_packets`]).
async fn insert_params(db: &TestDb, def: &str, params: impl Iterator<Item = String>) {
    let backend = db.db.get_database_backend();
    let def_id = db
        .scalar(&format!("SELECT id FROM notify_def WHERE name = '{def}'"))
        .await;
    let conn = TestDb::connect_to(&db.url).await;
    let mut params = params.peekable();
    while params.peek().is_some() {
        let chunk: Vec<String> = params.by_ref().take(4).collect();
        let rows: Vec<String> = (0..chunk.len())
            .map(|i| match backend {
                sea_orm::DbBackend::Postgres => format!("({def_id}, ${})", i + 1),
                _ => format!("({def_id}, ?)"),
            })
            .collect();
        let values: Vec<Value> = chunk.into_iter().map(Value::from).collect();
        conn.execute_raw(Statement::from_sql_and_values(
            backend,
            format!(
                "INSERT INTO notify_msg (def_id, param) VALUES {}",
                rows.join(", ")
            ),
            values,
        ))
        .await
        .unwrap();
    }
    conn.close().await.ok();
}

/// Lets MariaDB take (and send back) rows of `bytes`: its packet limit.
async fn allow_packets(db: &TestDb, bytes: usize) {
    if db.backend == Backend::MySql {
        db.db
            .execute_unprepared(&format!(
                "SET GLOBAL max_allowed_packet = {}",
                (bytes + 8 * MIB).max(64 * MIB)
            ))
            .await
            .unwrap();
    }
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

crate::db_test!(
    a_worker_holds_its_bound_in_bytes_for_large_payloads,
    |db: Arc<TestDb>| async move {
        // 600 MiB through a 64 MiB budget, ten times over. (2,000 until
        // 2026-11-28: its 2 GiB of writes per backend, beside the rest of
        // the suite, stalled every commit on the disk for minutes.)
        const N: usize = 600;
        let receiver = Receiver::start(|_| Reply::ok()).await;
        http_def(&db, "big", &receiver.url, |_| {}).await;
        allow_packets(&db, 4 * MIB).await;
        let started = std::time::Instant::now();
        insert_params(&db, "big", random_params(N, MIB)).await;
        let inserted = started.elapsed();
        let mut worker = worker_process(&db, &[]);
        eventually(600, "every notice delivered", || async {
            (db.counts().await == (0, N as u64)).then_some(())
        })
        .await;
        eprintln!(
            "inserted in {:.1} s, drained in {:.1} s",
            inserted.as_secs_f64(),
            (started.elapsed() - inserted).as_secs_f64()
        );
        let peak = peak_rss(worker.0.id());
        worker.0.kill().ok();
        eprintln!(
            "peak RSS draining {N} notices of 1 MiB: {:.1} MiB",
            peak as f64 / MIB as f64
        );
        assert!(
            peak <= 128 * MIB,
            "the worker's peak RSS was {:.1} MiB, over 64 MiB + 64 MiB",
            peak as f64 / MIB as f64
        );
        assert_eq!(receiver.delivered().len(), N, "lost notices");
        assert_eq!(receiver.duplicates(), 0, "a notice delivered twice");
        assert_eq!(receiver.overlaps(), Vec::<i64>::new());
    }
);

crate::db_test!(
    a_notice_over_the_bound_goes_alone_and_holds_nobody_up,
    |db: Arc<TestDb>| async move {
        const SMALL: usize = 300;
        let receiver = Receiver::start(|_| Reply::ok().after(Duration::from_millis(5))).await;
        http_def(&db, "big", &receiver.url, |_| {}).await;
        allow_packets(&db, 16 * MIB).await;
        // One notice of 16 MiB, twice the worker's bound (8 MiB), first in
        // line, then small ones.
        insert_params(&db, "big", std::iter::once(random_json(16 * MIB))).await;
        insert_params(&db, "big", (0..SMALL).map(|i| format!("{{\"small\":{i}}}"))).await;
        let _worker = worker_process(&db, &["--max-in-flight-bytes", &(8 * MIB).to_string()]);
        eventually(120, "every notice delivered", || async {
            (db.counts().await == (0, 1 + SMALL as u64)).then_some(())
        })
        .await;
        assert_eq!(receiver.delivered().len(), 1 + SMALL, "lost notices");
        assert_eq!(receiver.duplicates(), 0, "a notice delivered twice");
        assert!(
            db.history()
                .await
                .iter()
                .all(|h| h.status == solid_notify::Status::Succeeded)
        );
    }
);
