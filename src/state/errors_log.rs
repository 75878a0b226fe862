//! Errors log: the `errors` column, one line per failed attempt or
//! operator action (`<time> attempt N: reason`, `<time> requeued by …`).

use chrono::NaiveDateTime;

/// Longest reason kept on one line, in bytes; longer reasons are cut.
pub const MAX_REASON_BYTES: usize = 1_000;
/// Largest log kept, in bytes; the oldest lines are dropped past it (the
/// column must fit MySQL's TEXT and stay cheap to rewrite).
pub const MAX_LOG_BYTES: usize = 32 * 1_024;

/// Longest note a handler's success may append to `description`, in bytes;
/// longer notes are cut.
pub const MAX_NOTE_BYTES: usize = 8 * 1_024;

/// A handler's success note as stored: NUL characters (which PostgreSQL
/// text refuses) dropped, cut at [`MAX_NOTE_BYTES`]. Anything the database
/// would refuse here would otherwise make a delivered success unrecordable.
pub(crate) fn clean_note(note: &str) -> String {
    truncate(&note.replace('\0', ""), MAX_NOTE_BYTES)
}

/// Appends `time attempt N: reason` to `log`, keeping it under [`MAX_LOG_BYTES`].
pub(crate) fn append_error(log: &str, at: NaiveDateTime, attempt: u32, reason: &str) -> String {
    append_line(log, at, &format!("attempt {attempt}: {}", clean(reason)))
}

/// Appends `time attempt N, try K: reason` to `log`: one failed try of an
/// attempt tried again at once within its claim (immediate retries).
pub(crate) fn append_try(
    log: &str,
    at: NaiveDateTime,
    attempt: u32,
    try_no: u32,
    reason: &str,
) -> String {
    append_line(
        log,
        at,
        &format!("attempt {attempt}, try {try_no}: {}", clean(reason)),
    )
}

/// Appends `time what` to `log` (an operator's audit line, say), keeping it
/// under [`MAX_LOG_BYTES`].
pub(crate) fn append_note(log: &str, at: NaiveDateTime, what: &str) -> String {
    append_line(log, at, &clean(what))
}

/// One line: control characters blanked, cut at [`MAX_REASON_BYTES`] (as
/// the failure log writes a reason).
pub(crate) fn clean(text: &str) -> String {
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(text.trim(), MAX_REASON_BYTES)
}

fn append_line(log: &str, at: NaiveDateTime, text: &str) -> String {
    let line = format!("{} {text}", at.format("%Y-%m-%dT%H:%M:%S%.3fZ"));
    let mut lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    lines.push(&line);
    let mut dropped = 0usize;
    let size = |lines: &[&str]| lines.iter().map(|l| l.len() + 1).sum::<usize>() + 40;
    while lines.len() > 1 && size(&lines) > MAX_LOG_BYTES {
        let first = lines.remove(0);
        dropped += first
            .strip_prefix("[")
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1);
    }
    let mut out = String::new();
    if dropped > 0 {
        out.push_str(&format!("[{dropped} earlier lines dropped]\n"));
    }
    out.push_str(&lines.join("\n"));
    out
}

/// `s` cut to at most `max` bytes on a character boundary, `…` marking a cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> NaiveDateTime {
        chrono::DateTime::from_timestamp(0, 0).unwrap().naive_utc()
    }

    #[test]
    fn notes_lose_nul_and_are_capped() {
        assert_eq!(clean_note("a\0b\nc"), "ab\nc");
        let long = clean_note(&"x".repeat(MAX_NOTE_BYTES * 2));
        assert!(long.len() <= MAX_NOTE_BYTES + '…'.len_utf8());
    }

    #[test]
    fn one_line_per_attempt() {
        let log = append_error("", at(), 1, "boom\nwith newline");
        let log = append_error(&log, at(), 2, "again");
        assert_eq!(
            log,
            "1970-01-01T00:00:00.000Z attempt 1: boom with newline\n1970-01-01T00:00:00.000Z attempt 2: again"
        );
    }

    #[test]
    fn log_is_capped_and_counts_dropped_lines() {
        let mut log = String::new();
        let reason = "é".repeat(600);
        for n in 1..=200 {
            log = append_error(&log, at(), n, &reason);
        }
        assert!(log.len() <= MAX_LOG_BYTES);
        assert!(log.ends_with("…"));
        let first = log.lines().next().unwrap();
        let kept = log.lines().count() - 1;
        assert_eq!(first, format!("[{} earlier lines dropped]", 200 - kept));
        assert!(log.lines().last().unwrap().contains("attempt 200"));
    }
}
