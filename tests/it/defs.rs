//! Definitions: the shipped `definitions/` folder, sync, and the CLI.

use std::{path::Path, process::Command, sync::Arc};

use solid_notify::def::{file, store};

use crate::{db_test, support::TestDb};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_solid-notify"))
}

db_test!(
    shipped_definitions_sync_and_resync,
    |db: Arc<TestDb>| async move {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("definitions");
        let specs: Vec<_> = file::load_dir(&dir)
            .unwrap()
            .into_iter()
            .map(|d| d.spec)
            .collect();
        assert!(!specs.is_empty());
        let first = store::sync(&db.db, &specs).await.unwrap();
        assert_eq!(first.inserted.len(), specs.len());
        let again = store::sync(&db.db, &specs).await.unwrap();
        assert_eq!((again.inserted.len(), again.updated.len()), (0, 0));
        assert_eq!(again.unchanged.len(), specs.len());
        let listed = store::list(&db.db).await.unwrap();
        // The files' definitions plus the reserved alert definition.
        assert_eq!(listed.len(), specs.len() + 1);
        assert!(
            listed
                .iter()
                .any(|(row, _)| row.name == solid_notify::alert::ALERT_DEF)
        );
        assert!(listed.iter().all(|(_, def)| def.is_ok()));
    }
);

db_test!(cli_migrates_syncs_and_lists, |db: Arc<TestDb>| async move {
    let dir = tempdir();
    std::fs::write(
        dir.join("a.toml"),
        "[cli_def]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\nretry_interval = \"1m,5m\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = bin()
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, _, err) = run(&["migrate"]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["defs", "sync", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("inserted: cli_def"), "{out}");
    let (ok, out, _) = run(&["defs", "list"]);
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.contains("cli_def") && l.contains("1m,5m") && l.ends_with("ok")),
        "{out}"
    );

    std::fs::write(
        dir.join("b.toml"),
        "[bad_def]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\nalert_trigger_type = 3\n",
    )
    .unwrap();
    let (ok, _, err) = run(&["defs", "sync", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("b.toml")
            && err.contains("bad_def")
            && err.contains("alert_trigger_fail_times"),
        "{err}"
    );
    assert_eq!(
        store::list(&db.db).await.unwrap().len(),
        2,
        "nothing synced from a bad folder (cli_def and the alert definition only)"
    );
    std::fs::remove_dir_all(dir).ok();
});

#[test]
fn check_reports_every_problem_in_every_file() {
    let dir = tempdir();
    std::fs::write(
        dir.join("a.toml"),
        "[good]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\n\n\
         [bad_interval]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\nretry_interval = \"soon\"\n\n\
         [bad_channel]\nchannel = \"pigeon\"\ntarget = {}\n",
    )
    .unwrap();
    std::fs::write(dir.join("b.toml"), "[broken\n").unwrap();
    std::fs::write(
        dir.join("c.toml"),
        "[good]\nchannel = \"handler\"\ntarget = { handler = \"h\" }\n",
    )
    .unwrap();
    let (defs, errors) = file::check_dir(&dir);
    assert_eq!(defs.len(), 1);
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 4, "{text:#?}");
    for needle in [
        "bad_interval",
        "bad_channel",
        "b.toml",
        "already defined in",
    ] {
        assert!(
            text.iter().any(|t| t.contains(needle)),
            "{needle}: {text:#?}"
        );
    }
    let out = bin()
        .args(["defs", "sync", "--check", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        err.matches("error:").count(),
        5,
        "four problems and the summary: {err}"
    );
    assert!(err.contains("4 error(s)"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

fn tempdir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("sn_defs_{}_{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
