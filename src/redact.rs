//! Redaction: what a viewer may see of a URL or a secret.
//!
//! A URL keeps its scheme, host, port and path; its password and the values
//! of its query become `***` (`?api_key=***`), so a key carried in a query
//! string never reaches a page, a log line, `errors` or an alert.

/// What stands for a hidden value.
pub const HIDDEN: &str = "***";

/// `url` without its user name, password, fragment and query values (a
/// query with a bare key, hidden whole); text that is not a URL
/// comes back as `***` when it holds a `?` or an `@`, else unchanged.
pub fn url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return match url.contains(['?', '@']) {
            true => HIDDEN.into(),
            false => url.into(),
        };
    };
    // `amqp:user:password@host` (no `//`) parses with all of that as its
    // path: nothing of it is shown.
    if parsed.cannot_be_a_base() {
        return format!("{}:{HIDDEN}", parsed.scheme());
    }
    // A user name may be a token too (`https://sk_live_…@host/`).
    if !parsed.username().is_empty() {
        let _ = parsed.set_username(HIDDEN);
    }
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some(HIDDEN));
    }
    parsed.set_fragment(None);
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        // A bare `?S3CR3T` (a key without a value) is hidden whole.
        match pairs.iter().any(|(_, v)| v.is_empty()) {
            true => parsed.set_query(Some(HIDDEN)),
            false => {
                let hidden = pairs.into_iter().map(|(k, _)| (k, HIDDEN));
                parsed.query_pairs_mut().clear().extend_pairs(hidden);
            }
        }
    }
    parsed.to_string()
}

/// `text` (a client library's error message, which may echo the URL it
/// was given) with `url` shown as [`url`](fn@url) shows it, and its user
/// name and password (as written, and decoded) replaced by `***`.
pub fn scrub(text: &str, url: &str) -> String {
    let mut out = text.replace(url, &self::url(url));
    let mut secrets: Vec<String> = Vec::new();
    match url::Url::parse(url) {
        Ok(parsed) if parsed.cannot_be_a_base() => secrets.push(parsed.path().to_string()),
        Ok(parsed) => {
            secrets.extend(parsed.password().map(str::to_string));
            secrets.push(parsed.username().to_string());
        }
        Err(_) => secrets.push(url.to_string()),
    }
    let decoded: Vec<String> = secrets
        .iter()
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    secrets.extend(decoded);
    // Longest first: a password is hidden whole, not around a shorter
    // secret inside it. Very short ones would blank ordinary words.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(secret.as_str(), HIDDEN);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_written_without_slashes_show_no_part_of_them() {
        assert_eq!(super::url("amqp:guest:s3cr3tpw@127.0.0.1:5672"), "amqp:***");
        let said = "Invalid URL: 'amqp:guest:s3cr3tpw@127.0.0.1:5672'";
        let scrubbed = super::scrub(said, "amqp:guest:s3cr3tpw@127.0.0.1:5672");
        assert!(!scrubbed.contains("s3cr3tpw"), "{scrubbed}");
        let said = "connection refused by amqp://guest:p%40ss-word@h:5672/ (user guest, password p@ss-word)";
        let scrubbed = super::scrub(said, "amqp://guest:p%40ss-word@h:5672/");
        assert!(
            !scrubbed.contains("p@ss-word") && !scrubbed.contains("p%40ss"),
            "{scrubbed}"
        );
    }

    #[test]
    fn urls_lose_passwords_and_query_values() {
        assert_eq!(
            super::url("https://u:pw@h.example:8443/p?api_key=s3cr3t&x=1#t=f"),
            "https://***:***@h.example:8443/p?api_key=***&x=***"
        );
        assert_eq!(
            super::url("https://sk_live@h.example/p?S3CR3T"),
            "https://***@h.example/p?***"
        );
        assert_eq!(super::url("http://h/p"), "http://h/p");
        assert_eq!(super::url("not a url?key=s3cr3t"), "***");
    }
}

/// A stored target (or `steps`) as a viewer may see it: header values
/// hidden, URLs through [`url`](fn@url); text that is not JSON comes back as `***`.
pub fn target_text(text: &str) -> String {
    if text.trim().is_empty() {
        return text.into();
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(mut value) if value.is_object() || value.is_array() => {
            hide(&mut value);
            value.to_string()
        }
        // Not JSON, or JSON text in a string: shown as nothing.
        _ => HIDDEN.into(),
    }
}

fn hide(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match (key.as_str(), item) {
                    ("headers", Value::Object(headers)) => {
                        headers
                            .values_mut()
                            .for_each(|v| *v = Value::String(HIDDEN.into()));
                    }
                    ("headers", other) => *other = Value::String(HIDDEN.into()),
                    ("url", Value::String(u)) => *u = url(u),
                    (_, item) => hide(item),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(hide),
        _ => {}
    }
}

/// A `notify_def` row as a viewer may see it ([`target_text`] of its
/// target and steps).
pub fn def_row(mut row: crate::entity::notify_def::Model) -> crate::entity::notify_def::Model {
    row.target = target_text(&row.target);
    row.steps = target_text(&row.steps);
    row
}

#[cfg(test)]
mod target_tests {
    #[test]
    fn header_values_and_url_keys_are_hidden() {
        let shown = super::target_text(
            r#"{"url":"http://h/x?api_key=k1","headers":{"Authorization":"Bearer t0k"},"signing_secret":"NAME"}"#,
        );
        assert!(!shown.contains("k1") && !shown.contains("t0k"), "{shown}");
        assert!(
            shown.contains("Authorization") && shown.contains("NAME"),
            "{shown}"
        );
        let steps = super::target_text(
            r#"[{"channel":"http","target":{"url":"http://h","headers":{"X-Key":"s3"}}}]"#,
        );
        assert!(!steps.contains("s3"), "{steps}");
        for odd in [
            r#""{\"headers\":{\"A\":\"s3\"}}""#,
            r#"{"headers":["Authorization: s3"]}"#,
        ] {
            assert!(!super::target_text(odd).contains("s3"), "{odd}");
        }
    }
}
