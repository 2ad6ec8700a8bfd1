//! The background check of the database that `/healthz` reads ([`Health`]),
//! run on the API's own gate in front of the pool.

use diesel::RunQueryDsl as _;
use tokio_util::sync::CancellationToken;

use super::health::{CHECK_TIMEOUT, HEALTH_CHECK_INTERVAL};
use super::state::Db;

/// One check; its outcome lands in `db`'s [`Health`](super::health::Health) (see `Db::read`).
pub(crate) async fn check(db: &Db) {
    let ping = db.read(|conn| {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    });
    if tokio::time::timeout(CHECK_TIMEOUT, ping).await.is_err() {
        db.health().down(serde_json::json!({
            "code": "database_unavailable",
            "message": format!(
                "the database did not answer within {}",
                humantime::format_duration(CHECK_TIMEOUT)
            ),
        }));
    }
}

/// Checks every [`HEALTH_CHECK_INTERVAL`] until `stop`.
pub(crate) async fn run_checks(db: Db, stop: CancellationToken) {
    let mut tick = tokio::time::interval(HEALTH_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => check(&db).await,
        }
    }
}
