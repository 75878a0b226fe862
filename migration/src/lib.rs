//! Schema migrations of solid-notify.
//!
//! Creates `notify_def`, `notify_msg`, `notify_msg_history`,
//! `notify_worker` and `notify_rate` on SQLite, PostgreSQL and
//! MySQL/MariaDB. The migrator keeps its own tracking table,
//! [`MIGRATION_TABLE`], so it never collides with the application's migrator.
//!
//! Run it with `cargo run -p solid-notify-migration -- up` (the standard sea-orm-migration
//! CLI, reading `DATABASE_URL`), `solid-notify migrate`, or
//! `solid_notify::migrate(&db)` from code.
//!
//! The first release starts from one baseline migration
//! ([`m20261215_000001_baseline`]), which builds what 24 pre-release
//! migrations built (ADR 0013). A database those migrated is adopted by
//! [`adopt_pre_release`] (which `solid_notify::migrate` calls).

pub use sea_orm_migration::prelude::*;

pub mod m20261215_000001_baseline;

/// The channel the PostgreSQL triggers notify and workers listen on.
pub const WAKE_CHANNEL: &str = "solid_notify";

/// Name of the table recording which solid-notify migrations ran.
pub const MIGRATION_TABLE: &str = "solid_notify_migrations";

/// The solid-notify migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(m20261215_000001_baseline::Migration)]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(MIGRATION_TABLE).into_iden()
    }
}

/// The last of the 24 pre-release migrations: a database that ran it has
/// the baseline's schema.
pub const PRE_RELEASE_LAST: &str = "m20261214_000024_origin";

/// Whether `version` names a pre-release migration: they are dated from
/// 2026-11-22 to 2026-12-14, before the baseline.
fn pre_release(version: &str) -> bool {
    version.starts_with("m2026") && version < "m20261215"
}

/// Adopts a database the pre-release migrations built: when
/// [`MIGRATION_TABLE`] records [`PRE_RELEASE_LAST`], their records are
/// replaced by the baseline's, in one transaction (the schema is the
/// baseline's already; nothing else changes). It trusts the records: a
/// database migrated before a pre-release migration was edited in place
/// may differ from the baseline, and is best recreated. A database that
/// stopped part way through them is refused: it must be recreated, or
/// migrated to their end by the pre-release build first. Returns whether
/// it adopted (false too when another process adopted it meanwhile).
/// Without the tracking table, or without pre-release records, it does
/// nothing.
pub async fn adopt_pre_release(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<bool, DbErr> {
    let exists = SchemaManager::new(db).has_table(MIGRATION_TABLE).await?;
    if !exists {
        return Ok(false);
    }
    let versions = recorded(db).await?;
    let old: Vec<&String> = versions.iter().filter(|v| pre_release(v)).collect();
    if old.is_empty() {
        return Ok(false);
    }
    if !versions.iter().any(|v| v == PRE_RELEASE_LAST) {
        return Err(DbErr::Custom(format!(
            "this database was migrated by a pre-release build of solid-notify and stopped \
             part way ({} of its 24 migrations ran, not {PRE_RELEASE_LAST}): recreate it, \
             or migrate it to the end with that build first",
            old.len()
        )));
    }
    let baseline = m20261215_000001_baseline::Migration.name().to_string();
    match record_baseline(db, &old, &baseline).await {
        Ok(()) => Ok(true),
        // Another process adopted it meanwhile (its record is there).
        Err(_) if recorded(db).await?.contains(&baseline) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The versions [`MIGRATION_TABLE`] records.
async fn recorded(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<Vec<String>, DbErr> {
    let select = Query::select()
        .column(Alias::new("version"))
        .from(Alias::new(MIGRATION_TABLE))
        .to_owned();
    Ok(db
        .query_all(&select)
        .await?
        .iter()
        .filter_map(|row| row.try_get_by_index::<String>(0).ok())
        .collect())
}

/// Replaces the records `old` by `baseline`'s, in one transaction.
async fn record_baseline(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
    old: &[&String],
    baseline: &str,
) -> Result<(), DbErr> {
    use sea_orm_migration::sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    let delete = Query::delete()
        .from_table(Alias::new(MIGRATION_TABLE))
        .and_where(Expr::col(Alias::new("version")).is_in(old.iter().map(|v| v.as_str())))
        .to_owned();
    txn.execute(&delete).await?;
    let applied_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let insert = Query::insert()
        .into_table(Alias::new(MIGRATION_TABLE))
        .columns([Alias::new("version"), Alias::new("applied_at")])
        .values_panic([baseline.into(), applied_at.into()])
        .to_owned();
    txn.execute(&insert).await?;
    txn.commit().await
}
