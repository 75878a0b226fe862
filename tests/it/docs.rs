//! The pages against the code: every `SOLID_NOTIFY_*` variable the code
//! reads is named in docs/configuration.md (and the page names none it
//! does not read), and the Kubernetes manifests under examples/deploy/
//! parse and agree with the binary (its commands, probes, port and
//! shutdown deadline).

use std::{collections::BTreeSet, path::Path, time::Duration};

use yaml_rust2::{Yaml, YamlLoader};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `SOLID_NOTIFY_*` names in `text` (`SOLID_NOTIFY_SECRET_` as the
/// prefix it is).
fn names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("SOLID_NOTIFY_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // `SOLID_NOTIFY_*` in prose names no variable.
        if end > "SOLID_NOTIFY_".len() {
            found.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `SOLID_NOTIFY_*` name in the library's and the binary's source.
fn read_by_code() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files
        .iter()
        .flat_map(|f| names(&std::fs::read_to_string(f).unwrap()))
        .collect()
}

#[test]
fn every_variable_the_code_reads_is_on_the_configuration_page() {
    let code = read_by_code();
    assert!(code.len() >= 30, "found only {code:?}");
    let page = names(&std::fs::read_to_string(root().join("docs/configuration.md")).unwrap());
    let missing: Vec<_> = code.difference(&page).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name {missing:?}"
    );
    let stale: Vec<_> = page.difference(&code).collect();
    assert!(
        stale.is_empty(),
        "docs/configuration.md names {stale:?}, which no code reads"
    );
}

fn load(name: &str) -> Yaml {
    let path = root().join("examples/deploy").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(docs.len(), 1, "{name}: one document");
    let doc = docs.remove(0);
    for key in ["apiVersion", "kind"] {
        assert!(doc[key].as_str().is_some(), "{name}: no {key}");
    }
    assert!(
        doc["metadata"]["name"].as_str().is_some(),
        "{name}: no name"
    );
    doc
}

/// The first container of a pod template's spec, and its environment.
fn container(pod: &Yaml) -> (&Yaml, Vec<(String, Option<String>)>) {
    let container = &pod["containers"][0];
    assert!(!container.is_badvalue(), "no container");
    let env = container["env"]
        .as_vec()
        .map(|vars| {
            vars.iter()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap().to_string(),
                        v["value"].as_str().map(str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (container, env)
}

fn known_variables(env: &[(String, Option<String>)], code: &BTreeSet<String>) {
    for (name, _) in env {
        if name.starts_with("SOLID_NOTIFY_") {
            assert!(code.contains(name), "{name} is read by no code");
        } else {
            assert!(
                ["DATABASE_URL", "RUST_LOG"].contains(&name.as_str()),
                "{name}"
            );
        }
    }
}

#[test]
fn the_deployment_manifests_parse_and_agree_with_the_binary() {
    let code = read_by_code();

    let job = load("migrate-job.yaml");
    assert_eq!(job["kind"].as_str(), Some("Job"));
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"].as_str(), Some("Never"));
    let (migrate, env) = container(pod);
    known_variables(&env, &code);
    let script = migrate["args"][0].as_str().unwrap();
    assert!(script.contains("solid-notify migrate"), "{script}");
    assert!(script.contains("solid-notify defs sync"), "{script}");

    let worker = load("worker.yaml");
    assert_eq!(worker["kind"].as_str(), Some("Deployment"));
    assert_eq!(
        worker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as_i64(),
        Some(0)
    );
    let pod = &worker["spec"]["template"]["spec"];
    let (container, env) = container(pod);
    known_variables(&env, &code);
    assert_eq!(container["args"][0].as_str(), Some("worker"));
    let value = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // The metrics listener's port is the one the probes ask.
    let port: i64 = value("SOLID_NOTIFY_METRICS_ADDR")
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let ports = container["ports"].as_vec().unwrap();
    let metrics = ports
        .iter()
        .find(|p| p["containerPort"].as_i64() == Some(port))
        .expect("the metrics port is declared");
    let port_name = metrics["name"].as_str().unwrap();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some(port_name), "{probe}");
    }
    // /readyz answers within READY_TIMEOUT: the probe waits longer.
    let ready_wait = container["readinessProbe"]["timeoutSeconds"]
        .as_i64()
        .unwrap();
    assert!(
        Duration::from_secs(ready_wait as u64) > solid_notify::telemetry::READY_TIMEOUT,
        "readiness timeoutSeconds {ready_wait}"
    );
    // The grace period covers the whole shutdown: the deliveries' time,
    // then the release of what they did not finish.
    let shutdown = humantime::parse_duration(&value("SOLID_NOTIFY_SHUTDOWN_TIMEOUT")).unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    let needed = shutdown + solid_notify::RELEASE_GRACE + solid_notify::HARD_STOP_MARGIN;
    assert!(
        Duration::from_secs(grace as u64) >= needed,
        "terminationGracePeriodSeconds {grace} < {needed:?}"
    );
}
