//! The relay's upkeep of what grows or expires by itself: old rows of
//! `delivery_attempts` and `admin_audit` are deleted after their retention,
//! and the `previous_secret` of an endpoint or a source is cleared once its
//! window ends (it no longer signs or verifies anything then, and a secret
//! kept is a secret to leak).
//! Every relay runs it; the statements are idempotent, so several relays
//! running them at once only repeat each other's work.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Timestamptz};
use tokio_util::sync::CancellationToken;

use crate::db::{PgPool, run_blocking};

/// `DELIVERY_ATTEMPTS_RETENTION` when not set.
pub const DEFAULT_ATTEMPTS_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// `ADMIN_AUDIT_RETENTION` when not set: a year and a month.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(400 * 24 * 3600);
/// How often the upkeep runs (and once at the relay's start).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(3600);
/// Rows deleted per statement: short transactions beside the claims.
const BATCH: i64 = 1000;

/// How long each log is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub attempts: Duration,
    pub audit: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            attempts: DEFAULT_ATTEMPTS_RETENTION,
            audit: DEFAULT_AUDIT_RETENTION,
        }
    }
}

/// What one run of the upkeep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Upkept {
    pub attempts: u64,
    pub audit: u64,
    pub secrets_cleared: u64,
}

fn cutoff(age: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Runs the upkeep once.
pub fn run_once(conn: &mut PgConnection, retention: &Retention) -> QueryResult<Upkept> {
    let attempts = super::attempts::prune(conn, retention.attempts, BATCH)?;
    let audit_cutoff = cutoff(retention.audit);
    let mut audit = 0u64;
    loop {
        let deleted = diesel::sql_query(
            "DELETE FROM admin_audit WHERE id IN ( \
                 SELECT id FROM admin_audit WHERE at < $1 LIMIT $2)",
        )
        .bind::<Timestamptz, _>(audit_cutoff)
        .bind::<BigInt, _>(BATCH)
        .execute(conn)?;
        audit += deleted as u64;
        if (deleted as i64) < BATCH {
            break;
        }
    }
    let mut secrets_cleared = 0u64;
    for table in ["endpoints", "sources"] {
        secrets_cleared += diesel::sql_query(format!(
            "UPDATE {table} SET previous_secret = NULL, previous_secret_expires_at = NULL \
             WHERE previous_secret IS NOT NULL \
               AND (previous_secret_expires_at IS NULL OR previous_secret_expires_at <= now())"
        ))
        .execute(conn)? as u64;
    }
    Ok(Upkept {
        attempts,
        audit,
        secrets_cleared,
    })
}

/// Runs the upkeep at once, then every `every`, until `shutdown`.
pub async fn run(pool: PgPool, retention: Retention, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match run_blocking(&pool, move |conn| Ok(run_once(conn, &retention)?)).await {
            Ok(upkept) if upkept != Upkept::default() => tracing::info!(
                delivery_attempts = upkept.attempts,
                admin_audit = upkept.audit,
                previous_secrets_cleared = upkept.secrets_cleared,
                "upkeep: old log rows deleted, expired previous secrets cleared"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "upkeep failed; it runs again later"),
        }
    }
}
