//! File: the TOML format of `definitions/`, loaded and validated.
//!
//! Each `*.toml` file holds one or more definitions, one table per definition,
//! keyed by its unique name. Every `notify_def` column is a key; all but
//! `channel` and `target` have defaults (see [`DefSpec`]).
//!
//! ```toml
//! [order_paid]
//! channel = "http"
//! description = "tell the warehouse an order was paid"
//! retry_interval = "30s,1m,3m,30m"   # n-th retry waits the n-th entry, last repeats
//! max_retry_times = 5                # retries after the first attempt; -1 = unlimited
//! max_retry_interval = 60            # minutes; 0 = no cap
//! alert_trigger_type = 3             # 0 final, 1 every failure, 2 never, 3 after N
//! alert_trigger_fail_times = 3
//! email = "ops@example.com, oncall@example.com"
//! need_confirm = false
//! max_confirm_delay = 0              # seconds; 0 = forever
//! target = { url = "http://127.0.0.1:8080/hook", expected_body = "success" }
//! immediate_retries = 2              # tries again at once, within the claim
//! immediate_retry_delay = "200ms"    # before each of them
//! retry_jitter = "20%"               # spread each scheduled wait by ±20%
//! rate_limit = "50/s"                # tries started per second across all workers
//! ordering = "per_key"               # one at a time per ordering_key, oldest first
//! stop_on_failure = true             # a final failure holds its key's later notices
//! events_to = "ops_webhook"          # where its operational events go (crate::event)
//! encrypt = false                    # params sealed at rest (crate::crypto)
//! ```

use std::path::{Path, PathBuf};

use serde_json::Value;
use toml::Table;

use super::{DefSpec, DefSpec as Spec};
use crate::error::{DefinitionError, Error, Result};

/// A definition read from a file, validated, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct FileDef {
    /// The file it was read from.
    pub path: PathBuf,
    /// Its column values.
    pub spec: DefSpec,
}

/// Reads every `*.toml` file in `dir` (sorted by name) and validates each
/// definition. Fails on the first problem; a name defined twice is a problem.
/// [`check_dir`] reports every problem instead.
pub fn load_dir(dir: &Path) -> Result<Vec<FileDef>> {
    let (defs, mut errors) = check_dir(dir);
    if errors.is_empty() {
        Ok(defs)
    } else {
        Err(errors.remove(0))
    }
}

/// Reads every `*.toml` file in `dir` (sorted by name) and validates every
/// definition, going on past problems: the valid definitions, and every
/// problem found (an unreadable file, TOML that does not parse, the first
/// invalid field of each definition, a name defined twice).
pub fn check_dir(dir: &Path) -> (Vec<FileDef>, Vec<Error>) {
    let io_err = |e: std::io::Error| Error::DefinitionFile {
        path: dir.display().to_string(),
        problem: e.to_string(),
    };
    let mut paths = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return (Vec::new(), vec![io_err(e)]),
    };
    for entry in entries {
        match entry {
            Ok(entry) if entry.path().extension().is_some_and(|e| e == "toml") => {
                paths.push(entry.path())
            }
            Ok(_) => {}
            Err(e) => return (Vec::new(), vec![io_err(e)]),
        }
    }
    paths.sort();
    let mut defs: Vec<FileDef> = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        let (found, problems) = check_file(&path);
        errors.extend(problems);
        for def in found {
            if let Some(first) = defs.iter().find(|d| d.spec.name == def.spec.name) {
                errors.push(
                    DefinitionError {
                        origin: path.display().to_string(),
                        def: def.spec.name,
                        field: "name".into(),
                        problem: format!("already defined in {}", first.path.display()),
                    }
                    .into(),
                );
            } else {
                defs.push(def);
            }
        }
    }
    (defs, errors)
}

/// Reads and validates the definitions of one TOML file.
pub fn load_file(path: &Path) -> Result<Vec<FileDef>> {
    let (defs, mut errors) = check_file(path);
    if errors.is_empty() {
        Ok(defs)
    } else {
        Err(errors.remove(0))
    }
}

/// The valid definitions of one TOML file, and a problem per invalid one.
fn check_file(path: &Path) -> (Vec<FileDef>, Vec<Error>) {
    let source = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            return (
                Vec::new(),
                vec![Error::DefinitionFile {
                    path: source,
                    problem: e.to_string(),
                }],
            );
        }
    };
    let specs = match parse_each(&text, &source) {
        Ok(specs) => specs,
        Err(e) => return (Vec::new(), vec![e]),
    };
    let mut defs = Vec::new();
    let mut errors = Vec::new();
    for spec in specs {
        match spec.and_then(|spec| {
            spec.check_columns(&source)?;
            spec.validate(0, &source)?;
            Ok(spec)
        }) {
            Ok(spec) => defs.push(FileDef {
                path: path.to_path_buf(),
                spec,
            }),
            Err(e) => errors.push(e),
        }
    }
    (defs, errors)
}

/// Parses TOML text into specs (not yet validated); `source` names it in errors.
pub fn parse(text: &str, source: &str) -> Result<Vec<DefSpec>> {
    parse_each(text, source)?.into_iter().collect()
}

/// Parses TOML text into one spec, or one problem, per definition.
fn parse_each(text: &str, source: &str) -> Result<Vec<Result<DefSpec>>> {
    let table: Table = text
        .parse()
        .map_err(|e: toml::de::Error| Error::DefinitionFile {
            path: source.to_string(),
            problem: e.to_string(),
        })?;
    Ok(table
        .into_iter()
        .map(|(name, value)| {
            let fail = |field: &str, problem: String| DefinitionError {
                origin: source.to_string(),
                def: name.clone(),
                field: field.to_string(),
                problem,
            };
            let toml::Value::Table(fields) = value else {
                return Err(fail("", "a definition must be a table `[name]`".into()).into());
            };
            spec_from_table(&name, fields).map_err(|(f, p)| fail(&f, p).into())
        })
        .collect())
}

/// The keys a definition's table may hold.
pub(crate) const KNOWN: [&str; 23] = [
    "encrypt",
    "events_to",
    "steps",
    "ordering",
    "stop_on_failure",
    "rate_limit",
    "immediate_retries",
    "immediate_retry_delay",
    "retry_jitter",
    "circuit",
    "on_error",
    "channel",
    "target",
    "retry_interval",
    "max_retry_times",
    "max_retry_interval",
    "alert_trigger_type",
    "alert_trigger_fail_times",
    "email",
    "need_confirm",
    "max_confirm_delay",
    "description",
    "name",
];

type FieldResult<T> = std::result::Result<T, (String, String)>;

/// The spec of definition `name` from its table: `Err` names the first
/// field that is unknown or invalid, in the order checked.
fn spec_from_table(name: &str, mut t: Table) -> FieldResult<DefSpec> {
    if let Some(unknown) = t.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err((unknown.clone(), "unknown field".into()));
    }
    if let Some(inner) = t.remove("name")
        && inner.as_str() != Some(name)
    {
        return Err((
            "name".into(),
            "must equal the table key or be left out".into(),
        ));
    }
    let mut spec = Spec::new(name, super::Channel::Handler, Value::Null);
    channel_and_target_from_toml(&mut spec, &mut t)?;
    if let Some(v) = take_str(&mut t, "retry_interval")? {
        spec.retry_interval = v;
    }
    numbers_and_flags_from_toml(&mut spec, &mut t)?;
    texts_from_toml(&mut spec, &mut t)?;
    if let Some(v) = t.remove("circuit") {
        circuit_from_toml(&mut spec, v)?;
    }
    Ok(spec)
}

/// `steps`, or else `channel` and `target` (both required), taken from `t`
/// into `spec`; the row's channel and target are the first step's.
fn channel_and_target_from_toml(spec: &mut DefSpec, t: &mut Table) -> FieldResult<()> {
    if let Some(steps) = t.remove("steps") {
        if t.contains_key("channel") || t.contains_key("target") {
            return Err((
                "steps".into(),
                "give either `steps` or `channel` and `target`, not both".into(),
            ));
        }
        let steps =
            serde_json::to_value(steps).map_err(|e| ("steps".to_string(), e.to_string()))?;
        // The row's channel and target hold the first step's.
        let first = steps.get(0);
        spec.channel = first
            .and_then(|s| s.get("channel"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        spec.target = first
            .and_then(|s| s.get("target"))
            .cloned()
            .unwrap_or(Value::Null);
        spec.steps = steps;
    } else {
        let channel = take_str(t, "channel")?.ok_or(("channel".into(), "missing".into()))?;
        let target = t
            .remove("target")
            .ok_or(("target".to_string(), "missing".to_string()))?;
        spec.channel = channel;
        spec.target =
            serde_json::to_value(target).map_err(|e| ("target".to_string(), e.to_string()))?;
    }
    Ok(())
}

/// The integer and boolean fields, taken from `t` into `spec`.
fn numbers_and_flags_from_toml(spec: &mut DefSpec, t: &mut Table) -> FieldResult<()> {
    for (key, slot) in [
        ("max_retry_times", &mut spec.max_retry_times),
        ("max_retry_interval", &mut spec.max_retry_interval),
        ("alert_trigger_type", &mut spec.alert_trigger_type),
        (
            "alert_trigger_fail_times",
            &mut spec.alert_trigger_fail_times,
        ),
        ("max_confirm_delay", &mut spec.max_confirm_delay),
        ("immediate_retries", &mut spec.immediate_retries),
    ] {
        if let Some(v) = t.remove(key) {
            *slot = v
                .as_integer()
                .ok_or((key.to_string(), format!("must be an integer, got {v}")))?;
        }
    }
    for (key, slot) in [
        ("need_confirm", &mut spec.need_confirm),
        ("stop_on_failure", &mut spec.stop_on_failure),
        ("encrypt", &mut spec.encrypt),
    ] {
        if let Some(v) = t.remove(key) {
            *slot = v
                .as_bool()
                .ok_or((key.to_string(), format!("must be true or false, got {v}")))?;
        }
    }
    Ok(())
}

/// The text fields, taken from `t` into `spec`: the plain ones, then the
/// immediate retries' delay (a duration) and the jitter (a percentage).
fn texts_from_toml(spec: &mut DefSpec, t: &mut Table) -> FieldResult<()> {
    if let Some(v) = take_str(t, "email")? {
        spec.email = v;
    }
    if let Some(v) = take_str(t, "description")? {
        spec.description = v;
    }
    if let Some(v) = take_str(t, "rate_limit")? {
        spec.rate_limit = v;
    }
    if let Some(v) = take_str(t, "ordering")? {
        spec.ordering = v;
    }
    if let Some(v) = take_str(t, "events_to")? {
        spec.events_to = v;
    }
    if let Some(v) = take_str(t, "on_error")? {
        spec.on_error = v;
    }
    if let Some(v) = take_str(t, "immediate_retry_delay")? {
        let d = humantime::parse_duration(&v)
            .map_err(|e| ("immediate_retry_delay".to_string(), format!("`{v}`: {e}")))?;
        spec.immediate_retry_delay = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    }
    if let Some(v) = take_str(t, "retry_jitter")? {
        spec.retry_jitter = v
            .trim()
            .strip_suffix('%')
            .and_then(|n| n.trim().parse().ok())
            .ok_or((
                "retry_jitter".to_string(),
                format!("`{v}` is not a percentage like \"20%\""),
            ))?;
    }
    Ok(())
}

/// `circuit = { failures = 20, window = "1m", cool_down = "5m" }`.
fn circuit_from_toml(spec: &mut DefSpec, value: toml::Value) -> FieldResult<()> {
    let toml::Value::Table(mut t) = value else {
        return Err((
            "circuit".into(),
            "must be a table { failures = N, window = \"1m\", cool_down = \"5m\" }".into(),
        ));
    };
    if let Some(unknown) = t
        .keys()
        .find(|k| !["failures", "window", "cool_down"].contains(&k.as_str()))
    {
        return Err((format!("circuit.{unknown}"), "unknown field".into()));
    }
    let failures = t
        .remove("failures")
        .ok_or(("circuit.failures".to_string(), "missing".to_string()))?;
    spec.circuit_failures = failures.as_integer().ok_or((
        "circuit.failures".to_string(),
        format!("must be an integer, got {failures}"),
    ))?;
    for (key, slot) in [
        ("window", &mut spec.circuit_window),
        ("cool_down", &mut spec.circuit_cool_down),
    ] {
        if let Some(text) = take_str(&mut t, key).map_err(|(_, p)| (format!("circuit.{key}"), p))? {
            let d = humantime::parse_duration(&text)
                .map_err(|e| (format!("circuit.{key}"), format!("`{text}`: {e}")))?;
            *slot = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        }
    }
    Ok(())
}

fn take_str(t: &mut Table, key: &str) -> FieldResult<Option<String>> {
    match t.remove(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err((key.to_string(), format!("must be a string, got {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> DefinitionError {
        let specs = match parse(text, "t.toml") {
            Ok(specs) => specs,
            Err(Error::InvalidDef(e)) => return e,
            Err(other) => panic!("unexpected {other}"),
        };
        specs
            .iter()
            .find_map(|s| s.validate(0, "t.toml").err())
            .expect("expected a validation error")
    }

    #[test]
    fn full_definition_parses() {
        let specs = parse(
            r#"
            [order_paid]
            channel = "http"
            retry_interval = "30s,1m"
            max_retry_times = -1
            alert_trigger_type = 3
            alert_trigger_fail_times = 2
            email = "ops@example.com"
            need_confirm = true
            max_confirm_delay = 30
            target = { url = "http://127.0.0.1:1/x", expected_body = "success" }
            "#,
            "t.toml",
        )
        .unwrap();
        let def = specs[0].validate(0, "t.toml").unwrap();
        assert_eq!(def.name, "order_paid");
        assert_eq!(def.retry.max_retries, None);
        assert_eq!(def.alert_emails, ["ops@example.com"]);
    }

    #[test]
    fn errors_name_file_def_and_field() {
        let e = problem("[a]\nchannel = \"fax\"\ntarget = {}\n");
        assert_eq!(
            (e.origin.as_str(), e.def.as_str(), e.field.as_str()),
            ("t.toml", "a", "channel")
        );
        assert_eq!(
            problem("[a]\nchannel = \"handler\"\ntarget = {handler = \"h\"}\ncolour = 1\n").field,
            "colour"
        );
        assert_eq!(
            problem(
                "[a]\nchannel = \"handler\"\ntarget = {handler = \"h\"}\nmax_retry_times = \"5\"\n"
            )
            .field,
            "max_retry_times"
        );
        assert_eq!(problem("[a]\nchannel = \"handler\"\n").field, "target");
        assert_eq!(problem("[a]\nchannel = \"handler\"\ntarget = {handler = \"h\"}\nretry_interval = \"soon\"\n").field, "retry_interval");
    }

    #[test]
    fn ordering_fields() {
        let base = "[a]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\n";
        let def = |extra: &str| {
            parse(&format!("{base}{extra}"), "t.toml").unwrap()[0]
                .validate(1, "t.toml")
                .unwrap()
                .ordering
        };
        use crate::def::Ordering;
        assert_eq!(def(""), Ordering::Unordered);
        assert_eq!(
            def("ordering = \"per_key\"\n"),
            Ordering::PerKey {
                stop_on_failure: true
            }
        );
        assert_eq!(
            def("ordering = \"per_key\"\nstop_on_failure = false\n"),
            Ordering::PerKey {
                stop_on_failure: false
            }
        );
    }

    #[test]
    fn retry_shape_fields() {
        let specs = parse(
            "[a]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\nimmediate_retries = 2\nimmediate_retry_delay = \"250ms\"\nretry_jitter = \"20%\"\n",
            "t.toml",
        )
        .unwrap();
        let def = specs[0].validate(1, "t.toml").unwrap();
        assert_eq!(def.immediate.count, 2);
        assert_eq!(def.immediate.delay, std::time::Duration::from_millis(250));
        assert_eq!(def.retry.jitter_percent, 20);
        let base = "[a]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\n";
        for (extra, field) in [
            ("immediate_retries = \"2\"", "immediate_retries"),
            ("immediate_retries = 11", "immediate_retries"),
            ("immediate_retry_delay = \"soon\"", "immediate_retry_delay"),
            ("immediate_retry_delay = \"2m\"", "immediate_retry_delay"),
            ("immediate_retry_delay = 200", "immediate_retry_delay"),
            ("retry_jitter = \"20\"", "retry_jitter"),
            ("retry_jitter = \"150%\"", "retry_jitter"),
            ("rate_limit = 50", "rate_limit"),
            ("rate_limit = \"fast\"", "rate_limit"),
            ("ordering = \"per_customer\"", "ordering"),
            ("ordering = true", "ordering"),
            ("stop_on_failure = \"no\"", "stop_on_failure"),
        ] {
            let e = problem(&format!("{base}{extra}\n"));
            assert_eq!(
                (e.origin.as_str(), e.def.as_str(), e.field.as_str()),
                ("t.toml", "a", field),
                "{extra}: {e}"
            );
        }
    }

    #[test]
    fn steps_replace_channel_and_target() {
        let specs = parse(
            r#"
            [chain]
            steps = [
              { channel = "handler", target = { handler = "reserve_stock" } },
              { channel = "http", target = { url = "http://127.0.0.1:1/x" } },
            ]
            "#,
            "t.toml",
        )
        .unwrap();
        // The row's channel and target hold the first step's.
        assert_eq!(specs[0].channel, "handler");
        let def = specs[0].validate(1, "t.toml").unwrap();
        assert_eq!(def.steps.len(), 2);
        assert!(def.multi_step());
        assert_eq!(def.target.channel(), crate::def::Channel::Handler);
        let step =
            |s: &str| format!("{{ channel = \"handler\", target = {{ handler = \"{s}\" }} }}");
        for (text, field) in [
            ("steps = []".to_string(), "steps"),
            ("steps = \"one\"".to_string(), "steps"),
            (format!("steps = [{}, 1]", step("a")), "steps[1]"),
            (
                format!(
                    "steps = [{}, {{ channel = \"fax\", target = {{}} }}]",
                    step("a")
                ),
                "steps[1].channel",
            ),
            (
                "steps = [{ channel = \"handler\" }]".to_string(),
                "steps[0].target",
            ),
            (
                "steps = [{ target = { handler = \"h\" } }]".to_string(),
                "steps[0].channel",
            ),
            (
                "steps = [{ channel = \"http\", target = { url = \"ftp://x\" } }]".to_string(),
                "steps[0].target",
            ),
            (format!("steps = [{}]\ncolour = 1", step("a")), "colour"),
            (
                "steps = [{ channel = \"handler\", target = { handler = \"h\" }, retries = 2 }]"
                    .to_string(),
                "steps[0].retries",
            ),
            (
                format!("steps = [{}]\nchannel = \"handler\"", step("a")),
                "steps",
            ),
            (
                format!("steps = [{}]", vec![step("a"); 11].join(", ")),
                "steps",
            ),
        ] {
            let e = problem(&format!("[a]\n{text}\n"));
            assert_eq!(
                (e.origin.as_str(), e.def.as_str(), e.field.as_str()),
                ("t.toml", "a", field),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn on_error_is_retry_or_fail() {
        let specs = parse(
            "[a]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\non_error = \"fail\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(specs[0].on_error, "fail");
        assert_eq!(
            specs[0].validate(1, "t.toml").unwrap().on_error,
            crate::def::OnError::Fail
        );
        let e = problem(
            "[a]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\non_error = \"ignore\"\n",
        );
        assert_eq!(e.field, "on_error", "{e}");
    }
}
