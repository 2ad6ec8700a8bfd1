//! The order service's database: the queue core's pool and helpers, and the
//! service's own migrations, which build the core's tables too.

use diesel::pg::PgConnection;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
pub use outbox_core::db::{
    DbError, Failure, PgPool, PoolOptions, build_pool, establish, run_blocking,
};

/// The service's migrations (`migrations/`): orders, their items, events and
/// receipts, the admin audit, and the history of the jobs tables, which
/// predates the core crate. They end by recording the core's baseline as
/// applied, so [`run_migrations`] applies only what the core adds later.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Applies the service's pending migrations, then the core's, under one
/// advisory lock. Safe to call from many processes at once.
pub fn run_migrations(conn: &mut PgConnection) -> anyhow::Result<()> {
    Ok(outbox_core::db::run_migration_sets(
        conn,
        [MIGRATIONS, outbox_core::db::MIGRATIONS],
    )?)
}

/// Connects once and migrates; used at the start of `serve`, `relay` and `demo`.
pub fn migrate_url(database_url: &str) -> anyhow::Result<()> {
    run_migrations(&mut establish(database_url)?)
}

/// A URL as logs and error messages may show it: any password replaced by
/// `***`; an unparsable one not shown at all, since it may still hold a
/// password. For database and SMTP URLs alike.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "(unparsable URL, not shown)".to_owned(),
    }
}
