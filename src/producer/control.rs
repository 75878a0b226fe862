//! Control: whether a statement the caller sends through a
//! [`NoticeTx`](super::NoticeTx) may open a savepoint, or take back work
//! done in the transaction.
//!
//! A savepoint is opened only by a statement naming `SAVEPOINT`, and work is
//! taken back only by one naming `ROLLBACK` (or PostgreSQL's `ABORT`). A
//! statement that names none of them, whatever else it does, cannot make a
//! notice added through the wrapper disappear before the commit. The check
//! is a search for the words anywhere in the text, so that it needs no SQL
//! parser: a statement that merely mentions one (in a string, a comment or a
//! name) only costs the transaction the cheaper path (see
//! [`producer`](super)).

/// Whether `sql` may open a savepoint or roll work back.
pub(crate) fn may_take_back(sql: &str) -> bool {
    names_any(sql, &[b"savepoint", b"rollback", b"abort"])
}

/// Whether `sql` may roll the whole transaction back (a `ROLLBACK` that
/// names no savepoint): the next add asks the database whether a
/// transaction is still open.
pub(crate) fn may_end(sql: &str) -> bool {
    names_any(sql, &[b"rollback", b"abort"])
}

fn names_any(sql: &str, words: &[&[u8]]) -> bool {
    let bytes = sql.as_bytes();
    words.iter().any(|word| {
        bytes
            .windows(word.len())
            .any(|window| window.eq_ignore_ascii_case(word))
    })
}

#[cfg(test)]
mod tests {
    use super::{may_end, may_take_back};

    #[test]
    fn savepoints_and_rollbacks_are_seen_in_any_case_and_place() {
        for sql in [
            "SAVEPOINT sp",
            "savepoint sp",
            "  /* mine */ SaVePoInT a1",
            "ROLLBACK TO SAVEPOINT sp",
            "rollback to sp",
            "ROLLBACK",
            "abort",
            "INSERT INTO t VALUES (1); SAVEPOINT x",
            "RELEASE SAVEPOINT sp",
        ] {
            assert!(may_take_back(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO orders (id) VALUES (1)",
            "SELECT * FROM notify_def WHERE name = $1",
            "RELEASE sp",
            "COMMIT",
            "",
        ] {
            assert!(!may_take_back(sql), "{sql}");
        }
        assert!(may_end("rollback"));
        assert!(may_end("ROLLBACK TO SAVEPOINT sp"));
        assert!(!may_end("SAVEPOINT sp"));
    }
}
