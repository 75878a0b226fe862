//! Control: whether a statement the caller sends through a
//! [`NoticeTx`](super::NoticeTx) may open a savepoint, take back work done
//! in the transaction, or end it.
//!
//! A savepoint is opened only by a statement naming `SAVEPOINT`, and work is
//! taken back only by one naming `ROLLBACK` (or PostgreSQL's `ABORT`): the
//! check is a search for these words anywhere in the text, so that it needs
//! no SQL parser, and a statement that merely mentions one (in a string, a
//! comment or a name) only costs the transaction the cheaper path (see
//! [`producer`](super)). A statement that ends the transaction starts with
//! `COMMIT`, `END`, `PREPARE` (PostgreSQL's two-phase commit) or, on MySQL,
//! `BEGIN`/`START` (an implicit commit): these are looked for at the start
//! of each `;`-separated part. (The words `END` and `PREPARE` appear in
//! ordinary statements too, never at their start.) Such statements cost the
//! cheaper path as well: the notices buffered so far are written before
//! them, so that they commit with the business data. Ending a
//! transaction with SQL rather than [`NoticeTx::commit`](super::NoticeTx::commit)
//! or `rollback` is not supported beyond that: later adds may fail, and
//! `commit` may report an error for work that committed.

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

/// Whether a part of `sql` starts with a word that ends the transaction
/// (see the module docs).
pub(crate) fn may_commit(sql: &str) -> bool {
    const WORDS: [&str; 5] = ["commit", "end", "prepare", "begin", "start"];
    sql.split(';').any(|part| {
        let word: String = skip_comments(part)
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect();
        WORDS.iter().any(|w| word.eq_ignore_ascii_case(w))
    })
}

/// `part` without leading white space and comments (`-- …` lines and
/// `/* … */` blocks).
fn skip_comments(mut part: &str) -> &str {
    loop {
        part = part.trim_start();
        if let Some(rest) = part.strip_prefix("--") {
            part = rest.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(rest) = part.strip_prefix("/*") {
            part = rest.split_once("*/").map_or("", |(_, after)| after);
        } else {
            return part;
        }
    }
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
    use super::{may_commit, may_end, may_take_back};

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

    #[test]
    fn a_commit_is_seen_at_the_start_of_any_part() {
        for sql in [
            "COMMIT",
            "  commit work",
            "END",
            "PREPARE TRANSACTION 'x'",
            "INSERT INTO t VALUES (1); COMMIT",
            "-- done\nCOMMIT",
            "/* a */ /* b */ end;",
            "start transaction",
            "BEGIN",
        ] {
            assert!(may_commit(sql), "{sql}");
        }
        for sql in [
            "SELECT CASE WHEN a THEN 1 END FROM t",
            "UPDATE t SET ended = true",
            "INSERT INTO t (commit_sha) VALUES ('x')",
            "SELECT 'begin'",
        ] {
            assert!(!may_commit(sql), "{sql}");
        }
    }
}
