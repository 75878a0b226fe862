//! The baseline migration builds the very schema the 24 pre-release
//! migrations built (ADR 0013), on each backend: columns in order with
//! their types, defaults and generation, constraints, indexes, triggers,
//! functions, sequences and table options, and the built-in alert
//! definition. A database the old chain migrated is adopted; one it left
//! part way is refused. An application's own role, no superuser, migrates
//! and runs.

use std::collections::BTreeSet;

use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, Statement};
use sea_orm_migration::MigratorTrait;
use solid_notify::entity::notify_def;

use crate::{
    legacy::Legacy,
    support::{Backend, TestDb},
};

/// `text` with runs of white space made one space, and none beside
/// brackets, commas and semicolons: the baseline files are laid out for
/// reading, and SQLite and the function bodies keep the text as written.
/// (White space inside string literals is normalized too: a literal that
/// differs only in its spaces would pass.)
fn normalized(text: &str) -> String {
    let spaced = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(spaced.len());
    let chars: Vec<char> = spaced.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let tight = |x: Option<&char>| x.is_some_and(|x| "(),;".contains(*x));
        if c == ' '
            && (tight(chars.get(i + 1)) || tight(i.checked_sub(1).and_then(|j| chars.get(j))))
        {
            continue;
        }
        out.push(c);
    }
    out
}

const PG_SCHEMA: &str = "
SELECT 'column ' || c.relname || ' ' || lpad((row_number() OVER (PARTITION BY c.relname ORDER BY a.attnum))::text, 3, '0')
       || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || COALESCE(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || CASE a.attidentity WHEN 'd' THEN ' identity by default' WHEN 'a' THEN ' identity always' ELSE '' END
       || CASE a.attgenerated WHEN 's' THEN ' generated stored' ELSE '' END
       || COALESCE(' collate ' || NULLIF(a.attcollation::regcollation::text, 'default'), '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0
   AND NOT a.attisdropped AND c.relname <> 'solid_notify_migrations'
UNION ALL
SELECT 'table ' || relname || ' ' || COALESCE(array_to_string(reloptions, ','), '')
  FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
   AND relname <> 'solid_notify_migrations'
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes
 WHERE schemaname = 'public' AND tablename <> 'solid_notify_migrations'
UNION ALL
SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'public'::regnamespace
   AND conrelid::regclass::text <> 'solid_notify_migrations'
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'function ' || pg_get_functiondef(oid) || COALESCE(' comment ' || obj_description(oid, 'pg_proc'), '')
  FROM pg_proc WHERE pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'sequence ' || sequencename || ' ' || data_type::text || ' ' || start_value || ' ' || increment_by
  FROM pg_sequences WHERE schemaname = 'public'";

const MYSQL_TRIGGERS: &str = "
SELECT CAST(CONCAT_WS(' ', 'trigger', trigger_name, action_timing, event_manipulation,
       event_object_table, action_order, action_statement) AS CHAR)
  FROM information_schema.triggers WHERE trigger_schema = DATABASE()";

const MYSQL_TABLES: &str = "
SELECT CAST(table_name AS CHAR) FROM information_schema.tables
 WHERE table_schema = DATABASE() AND table_name <> 'solid_notify_migrations'";

const SQLITE_SCHEMA: &str = "
SELECT type || ' ' || name || ' ' || tbl_name || ' ' || COALESCE(sql, '') FROM sqlite_master
 WHERE name NOT LIKE 'sqlite_%' AND tbl_name <> 'solid_notify_migrations'";

async fn texts(db: &DatabaseConnection, sql: &str, column: usize) -> Vec<String> {
    db.query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.try_get_by_index::<String>(column).unwrap())
        .collect()
}

/// Everything the schema of `db` is made of, one normalized line each.
async fn schema(db: &TestDb) -> BTreeSet<String> {
    let lines = match db.backend {
        Backend::Postgres => texts(&db.db, PG_SCHEMA, 0).await,
        Backend::Sqlite => texts(&db.db, SQLITE_SCHEMA, 0).await,
        Backend::MySql => {
            let mut lines = texts(&db.db, MYSQL_TRIGGERS, 0).await;
            for table in texts(&db.db, MYSQL_TABLES, 0).await {
                let create = texts(&db.db, &format!("SHOW CREATE TABLE `{table}`"), 1).await;
                // The next id is data, not schema.
                let create = create[0]
                    .split(' ')
                    .filter(|w| !w.starts_with("AUTO_INCREMENT="))
                    .collect::<Vec<_>>()
                    .join(" ");
                lines.push(create);
            }
            lines
        }
    };
    lines.iter().map(|l| normalized(l)).collect()
}

/// The definitions the migrations wrote, their times aside.
async fn definitions(db: &TestDb) -> Vec<notify_def::Model> {
    notify_def::Entity::find()
        .all(&db.db)
        .await
        .unwrap()
        .into_iter()
        .map(|m| notify_def::Model {
            create_time: Default::default(),
            update_time: Default::default(),
            ..m
        })
        .collect()
}

async fn recorded(db: &TestDb) -> Vec<String> {
    texts(
        &db.db,
        "SELECT version FROM solid_notify_migrations ORDER BY version",
        0,
    )
    .await
}

async fn the_baseline_builds_what_the_old_chain_built(backend: Backend) {
    if !backend.selected() {
        return;
    }
    let old = TestDb::blank(backend).await;
    let started = std::time::Instant::now();
    Legacy::up(&old.db, None).await.unwrap();
    let chain = started.elapsed();
    let new = TestDb::blank(backend).await;
    let started = std::time::Instant::now();
    solid_notify::migrate(&new.db).await.unwrap();
    // For the record (ADR 0013), not a limit.
    eprintln!(
        "{backend:?}: the old chain took {chain:?}, the baseline {:?}",
        started.elapsed()
    );
    let (was, is) = (schema(&old).await, schema(&new).await);
    assert!(was.len() >= 9, "{was:#?}");
    let only_old: Vec<_> = was.difference(&is).collect();
    let only_new: Vec<_> = is.difference(&was).collect();
    assert!(
        only_old.is_empty() && only_new.is_empty(),
        "{backend:?}: only the old chain's: {only_old:#?}\nonly the baseline's: {only_new:#?}"
    );
    assert_eq!(definitions(&old).await, definitions(&new).await);
    assert_eq!(recorded(&new).await, ["m20261215_000001_baseline"]);
    // Down and up again: the baseline undoes itself whole.
    migration::Migrator::down(&new.db, None).await.unwrap();
    solid_notify::migrate(&new.db).await.unwrap();
    assert_eq!(schema(&new).await, is);
    old.cleanup().await;
    new.cleanup().await;
}

async fn a_pre_release_database_is_adopted_and_a_partial_one_refused(backend: Backend) {
    if !backend.selected() {
        return;
    }
    let old = TestDb::blank(backend).await;
    Legacy::up(&old.db, None).await.unwrap();
    let before = schema(&old).await;
    solid_notify::migrate(&old.db).await.unwrap();
    assert_eq!(recorded(&old).await, ["m20261215_000001_baseline"]);
    assert_eq!(schema(&old).await, before, "adopting changes no schema");
    solid_notify::telemetry::readiness(&old.db).await.unwrap();
    // Twice is once.
    solid_notify::migrate(&old.db).await.unwrap();
    assert_eq!(recorded(&old).await, ["m20261215_000001_baseline"]);

    let partial = TestDb::blank(backend).await;
    Legacy::up(&partial.db, Some(10)).await.unwrap();
    let err = solid_notify::migrate(&partial.db).await.unwrap_err();
    assert!(err.to_string().contains("part way"), "{err}");
    assert_eq!(recorded(&partial).await.len(), 10, "nothing recorded");
    old.cleanup().await;
    partial.cleanup().await;
}

/// The server-side setup of a role that is no superuser, as a DBA gives
/// an application: it owns its database (PostgreSQL; since 15 the `public`
/// schema's owner is the database's), or has every privilege on it and
/// nothing else (MariaDB). Returns the role's URL of the database.
async fn application_role(db: &TestDb, role: &str) -> String {
    let admin = db.admin().expect("a server database");
    let name = db.name();
    let statements = match db.backend {
        Backend::Postgres => vec![
            format!("CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"),
            format!("ALTER DATABASE {name} OWNER TO {role}"),
        ],
        _ => ["%", "localhost", "127.0.0.1"]
            .iter()
            .flat_map(|host| {
                [
                    format!("CREATE USER '{role}'@'{host}'"),
                    format!("GRANT ALL PRIVILEGES ON `{name}`.* TO '{role}'@'{host}'"),
                ]
            })
            .collect(),
    };
    for sql in statements {
        admin.execute_unprepared(&sql).await.unwrap();
    }
    let at = db.url.find("://").expect("a URL") + 3;
    let rest = &db.url[at..];
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{}{role}@{host}", &db.url[..at])
}

/// Drops the role [`application_role`] made.
async fn drop_role(db: &TestDb, role: &str) {
    let admin = db.admin().expect("a server database");
    let statements = match db.backend {
        Backend::Postgres => vec![format!("DROP ROLE IF EXISTS {role}")],
        _ => ["%", "localhost", "127.0.0.1"]
            .iter()
            .map(|host| format!("DROP USER IF EXISTS '{role}'@'{host}'"))
            .collect(),
    };
    for sql in statements {
        admin.execute_unprepared(&sql).await.ok();
    }
}

async fn a_role_that_is_no_superuser_migrates_and_runs(backend: Backend) {
    if !backend.selected() || backend == Backend::Sqlite {
        return;
    }
    let db = TestDb::blank(backend).await;
    let role = format!("app_{}", db.name());
    let url = application_role(&db, &role).await;
    let app = sea_orm::Database::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    solid_notify::migrate(&app)
        .await
        .expect("migrate as the application");
    assert_eq!(recorded(&db).await, ["m20261215_000001_baseline"]);
    solid_notify::telemetry::readiness(&app).await.unwrap();
    // And runs: a notice added, attempted and recorded, as that role.
    let spec = solid_notify::def::DefSpec::new(
        "ship",
        solid_notify::def::Channel::Handler,
        serde_json::json!({"handler": "ship"}),
    );
    solid_notify::def::store::sync(&app, &[spec]).await.unwrap();
    let notifier = solid_notify::Notifier::builder(app.clone())
        .config(crate::support::test_config())
        .handler("ship", |_: solid_notify::Notice| async {
            Ok(solid_notify::Outcome::success())
        })
        .build()
        .unwrap();
    let tx = notifier.begin().await.unwrap();
    tx.add(solid_notify::NewNotice::new("ship", &serde_json::json!({})))
        .await
        .unwrap();
    let reports = tx.commit_and_wait().await.unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].result, solid_notify::AttemptResult::Succeeded);
    notifier
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    app.close().await.ok();
    db.cleanup().await;
    // (The database is gone: nothing of the role's is left to own.)
    let admin = TestDb::blank(backend).await;
    drop_role(&admin, &role).await;
    admin.cleanup().await;
}

macro_rules! each_backend {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(Backend::Postgres).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                super::$name(Backend::MySql).await
            }
        }
    };
}

each_backend!(the_baseline_builds_what_the_old_chain_built);
each_backend!(a_pre_release_database_is_adopted_and_a_partial_one_refused);
each_backend!(a_role_that_is_no_superuser_migrates_and_runs);

/// PostgreSQL: a pool whose connections get their `search_path` from a
/// hook (sea-orm's `set_schema_search_path`) is migrated in that schema,
/// as its statements will find it; the start check then finds it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_search_path_is_where_migrations_go() {
    if !Backend::Postgres.selected() {
        return;
    }
    let db = TestDb::blank(Backend::Postgres).await;
    db.db.execute_unprepared("CREATE SCHEMA app").await.unwrap();
    let mut options = sea_orm::ConnectOptions::new(db.url.clone());
    options.set_schema_search_path("app").sqlx_logging(false);
    let app = sea_orm::Database::connect(options).await.unwrap();
    solid_notify::migrate(&app).await.expect("migrate in app");
    let found = |table: &'static str| {
        let db = &db;
        async move {
            db.scalar(&format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema || '.' || table_name = '{table}'"
            ))
            .await
        }
    };
    assert_eq!(found("app.notify_msg").await, 1);
    assert_eq!(found("app.solid_notify_migrations").await, 1);
    assert_eq!(found("public.notify_msg").await, 0);
    let notifier = solid_notify::Notifier::builder(app.clone())
        .config(crate::support::test_config())
        .build()
        .unwrap();
    let check = notifier.check_database().await.unwrap();
    assert!(check.newer.is_empty());
    app.close().await.ok();
    db.cleanup().await;
}
