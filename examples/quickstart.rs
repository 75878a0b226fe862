//! Quickstart on the embedded default: a SQLite file, no services.
//!
//! Migrates, syncs `definitions/`, commits business transactions that add
//! notices, and drives retries until every notice has finished: one handler
//! fails twice then succeeds, another always fails and ends in history as a
//! final failure, whose alert e-mail lands as a file in the mail folder (no
//! SMTP server configured). An HTTP notice goes to a local receiver. A
//! rolled-back transaction shows that nothing is sent.
//!
//! Run: `cargo run --example quickstart`

use std::{error::Error, path::Path, time::Duration};

use sea_orm::ConnectionTrait;
use serde_json::json;
use solid_notify::{
    Config, MailConfig, Notice, Notifier, Outcome, def,
    ops::{Page, Place},
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // Alerts of final failures are logged at `error` level by the default hook.
    tracing_subscriber::fmt()
        .with_env_filter("solid_notify=error")
        .with_target(false)
        .init();
    let path = std::env::temp_dir().join("solid-notify-quickstart.db");
    // Alerts go to lettre's file transport here: a fresh folder per run.
    let mail_dir = std::env::temp_dir().join("solid-notify-quickstart-mail");
    std::fs::remove_dir_all(&mail_dir).ok();
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
    }
    let db = sea_orm::Database::connect(format!("sqlite://{}?mode=rwc", path.display())).await?;
    solid_notify::migrate(&db).await?;
    db.execute_unprepared("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
        .await?;

    let defs_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("definitions");
    let specs: Vec<_> = def::load_dir(&defs_dir)?
        .into_iter()
        .map(|d| d.spec)
        .collect();
    let report = def::sync(&db, &specs).await?;
    println!("synced definitions: inserted {:?}", report.inserted);

    // The flaky mailer fails the first two attempts of each notice.
    let notifier = Notifier::builder(db.clone())
        .config(Config {
            // The quickstart's receiver listens on 127.0.0.1: without this,
            // requests go to public addresses only.
            allow_private_network: true,
            lease: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(2),
            mail: MailConfig {
                smtp_url: None,
                file_dir: mail_dir,
                ..MailConfig::default()
            },
            ..Config::default()
        })
        .handler("flaky_mailer", |n: Notice| async move {
            println!(
                "  flaky_mailer  notice {} attempt {}: {}",
                n.id, n.attempt, n.param
            );
            Ok(if n.attempt <= 2 {
                Outcome::retry(format!("SMTP busy (attempt {})", n.attempt))
            } else {
                Outcome::success()
            })
        })
        .handler("broken_crm", |n: Notice| async move {
            println!(
                "  broken_crm    notice {} attempt {}: {}",
                n.id, n.attempt, n.param
            );
            Ok(Outcome::retry("CRM answered 503"))
        })
        .build()?;

    println!("\n1. a business transaction that rolls back: nothing is stored or sent");
    let tx = notifier.begin().await?;
    tx.execute_unprepared("INSERT INTO orders (id, item) VALUES (1, 'lamp')")
        .await?;
    tx.add_notice("welcome_mail", &json!({"order": 1}), "rolled back")
        .await?;
    tx.rollback().await?;

    println!("\n2. two committed transactions: each notice is attempted right after commit");
    for (id, item) in [(2, "chair"), (3, "desk")] {
        let tx = notifier.begin().await?;
        tx.execute_unprepared(&format!(
            "INSERT INTO orders (id, item) VALUES ({id}, '{item}')"
        ))
        .await?;
        tx.add_notice(
            "welcome_mail",
            &json!({"order": id, "item": item}),
            "order placed",
        )
        .await?;
        tx.add_notice("crm_sync", &json!({"order": id}), "order placed")
            .await?;
        for report in tx.commit_and_wait().await? {
            println!("  -> notice {}: {:?}", report.notice_id, report.result);
        }
    }

    println!("\n3. an HTTP notice to a local receiver (per-notice URL override)");
    let receiver = receiver().await?;
    let tx = notifier.begin().await?;
    let url = format!("{receiver}/hooks/invoice/2");
    tx.add(
        solid_notify::NewNotice::new("invoice_webhook", &json!({"invoice": 2, "total": 99}))
            .target_override(json!({ "url": url })),
    )
    .await?;
    for report in tx.commit_and_wait().await? {
        println!("  -> notice {}: {:?}", report.notice_id, report.result);
    }

    println!("\n4. retries, as a sweeper drives them (intervals of 1-2 s)");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !live_is_empty(&notifier).await? {
        for report in notifier.sweep_once(100).await? {
            println!("  -> notice {}: {:?}", report.notice_id, report.result);
        }
        if std::time::Instant::now() > deadline {
            return Err("retries did not finish within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    println!("\n5. history (notify_msg_history): every notice has finished");
    let page = Page {
        limit: 1_000,
        ..Page::default()
    };
    let mut rows = notifier
        .list(Place::History, &Default::default(), page)
        .await?;
    rows.reverse(); // oldest first
    for row in &rows {
        let param: String = row.param.to_string().chars().take(60).collect();
        println!(
            "  notice {} ({}) status {} after {} failures, param {param}",
            row.id, row.description, row.status, row.retry_times
        );
        for line in &row.errors {
            println!("      {line}");
        }
    }
    let orders = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM orders",
        ))
        .await?
        .map(|r| r.try_get::<i64>("", "n"))
        .transpose()?
        .unwrap_or(0);
    println!(
        "\norders committed: {orders}; notices finished: {}",
        rows.len()
    );
    println!("database file: {}", path.display());
    let mail_dir = &notifier.config().mail.file_dir;
    println!("alert e-mails (file transport): {}", mail_dir.display());
    if let Ok(entries) = std::fs::read_dir(mail_dir) {
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if let Some(subject) = text.lines().find(|l| l.starts_with("Subject:")) {
                println!("  {}  {subject}", entry.file_name().to_string_lossy());
            }
        }
    }
    Ok(())
}

/// A webhook receiver on 127.0.0.1 that prints what it gets and answers
/// `success`; its base URL.
async fn receiver() -> Result<String, Box<dyn Error>> {
    use axum::http::{HeaderMap, Uri};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app =
        axum::Router::new().fallback(|uri: Uri, headers: HeaderMap, body: String| async move {
            println!(
                "  receiver got {} notice-id={:?} body={body}",
                uri.path(),
                headers.get("x-notice-id")
            );
            "success"
        });
    tokio::spawn(async move { axum::serve(listener, app).await.ok() });
    Ok(url)
}

async fn live_is_empty(notifier: &Notifier) -> Result<bool, solid_notify::Error> {
    let page = Page {
        limit: 1,
        ..Page::default()
    };
    let live = notifier
        .list(Place::InFlight, &Default::default(), page)
        .await?;
    Ok(live.is_empty())
}
