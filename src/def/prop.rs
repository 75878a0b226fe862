//! Property tests: every parser of definitions, and of the operators'
//! filters and times, takes any input without panicking, and what it
//! accepts validates without panicking.

use proptest::prelude::*;
use serde_json::Value;

use super::{Channel, DefSpec, RateLimit, Target, file};

/// Keys the targets and steps know (every channel's fields, the policy
/// keys, a step's own and a secret reference's), mixed into generated
/// objects so that the parsers get past their first check.
fn keys() -> Vec<&'static str> {
    Channel::ALL
        .into_iter()
        .flat_map(super::overrides::fields_of)
        .copied()
        .chain([
            "signing_secret",
            "allow_private_network",
            super::overrides::OVERRIDABLE,
            super::overrides::CREDENTIALS_FOLLOW,
            "channel",
            "target",
            "secret",
            "X-Api-Key",
        ])
        .collect()
}

/// Strings the parsers look for, and anything else.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "http://h/x",
            "https://a.b:8080/p?k=v",
            "http://",
            "POST",
            "GET",
            "10s",
            "0s",
            "5s,5m,1h,1d",
            "50/s",
            "20%",
            "per_key",
            "retry",
            "http",
            "amqp",
            "email",
            "handler",
            "a@b.c",
            "",
        ])
        .prop_map(String::from),
        "\\PC{0,16}",
        any::<String>(),
    ]
}

/// Any JSON value, a few levels deep, with the keys the parsers know.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        let key = prop_oneof![prop::sample::select(keys()).prop_map(String::from), text()];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A TOML value: text quoted, numbers, booleans, arrays, inline tables.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        text().prop_map(|s| toml::Value::String(s).to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        (-1e12f64..1e12).prop_map(|f| format!("{f:?}")),
        json().prop_map(|v| match toml::Value::try_from(&v) {
            Ok(t) => t.to_string(),
            Err(_) => "[]".into(),
        }),
    ]
}

/// The keys of a definition file, and one it does not know.
fn file_keys() -> Vec<&'static str> {
    file::KNOWN.iter().copied().chain(["unknown"]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn intervals_and_rates_never_panic(t in text()) {
        let _ = crate::schedule::parse_interval(&t);
        let _ = t.parse::<crate::schedule::RetryIntervals>();
        let _ = RateLimit::parse(&t);
        let _ = crate::ops::When::parse(&t);
        let _ = crate::status::Status::parse(&t);
        let _ = Channel::parse(&t);
        let _ = <cron::Schedule as std::str::FromStr>::from_str(&t);
    }

    #[test]
    fn accepted_durations_and_rates_round_trip(n in 1u64..1_000_000, unit in prop::sample::select(vec!["ms", "s", "m", "h", "d"])) {
        let text = format!("{n}{unit}");
        if let Ok(d) = crate::schedule::parse_interval(&text) {
            prop_assert!(d.as_millis() > 0);
        }
        let rate = format!("{}/{}", n.min(u64::from(crate::def::MAX_RATE_COUNT)), &unit[..1]);
        let _ = RateLimit::parse(&rate);
    }

    #[test]
    fn targets_never_panic(channel in prop::sample::select(Channel::ALL.to_vec()), target in json()) {
        if let Ok(parsed) = Target::parse(channel, &target) {
            prop_assert_eq!(parsed.channel(), channel);
        }
    }

    #[test]
    fn steps_and_whole_specs_never_panic(steps in json(), target in json(), channel in text()) {
        let mut spec = DefSpec::new("p", Channel::Http, target);
        spec.channel = channel;
        let _ = spec.validate(1, "prop");
        spec.steps = steps;
        let _ = spec.validate(1, "prop");
    }

    #[test]
    fn definition_files_never_panic(
        lines in prop::collection::vec((prop::sample::select(file_keys()), toml_value()), 0..6),
        raw in "\\PC{0,64}",
    ) {
        let mut text = String::from("[p]\nchannel = \"http\"\ntarget = { url = \"http://h/x\" }\n");
        let mut seen = std::collections::HashSet::new();
        for (key, value) in lines {
            if seen.insert(key) && key != "channel" && key != "target" {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        if let Ok(specs) = file::parse(&text, "prop.toml") {
            for spec in specs {
                let _ = spec.validate(1, "prop.toml");
            }
        }
        let _ = file::parse(&raw, "raw.toml");
        let _ = file::parse(&format!("{text}{raw}"), "mixed.toml");
    }
}
