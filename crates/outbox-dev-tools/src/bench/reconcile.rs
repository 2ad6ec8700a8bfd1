//! `bench --inbound`'s reconciliation row: `--reconcile-events` payments
//! found in Stripe's event log (the local stand-in, `crate::stripe_events`)
//! and applied by `Reconciler::source`, the code `inbox reconcile` runs, a
//! page of 100 at a time, each event in its own transaction. Set beside
//! the same payments sent as signed webhooks in the same run.

use std::time::{Duration, Instant};

use order_service::db::{PoolOptions, build_pool};
use order_service::inbox::reconcile::Reconciler;
use order_service::inbox::source;
use order_service::inbox::stripe_events::{RetryPolicy, StripeEvents};
use order_service::sealed::Keyring;

use crate::stripe_events::{StripeEventLog, payment_succeeded};

const API_KEY: &str = "rk_test_bench0a1b2c3d4e5f60718293a4b5";

/// Reconciles source `source` against a log that pays every order of
/// `ids` (`total_cents` EUR each); the events applied a second. Every
/// event must be recovered, none found already stored.
pub async fn reconcile(
    url: &str,
    source_name: &str,
    ids: &[i64],
    total_cents: i64,
) -> anyhow::Result<f64> {
    let log = StripeEventLog::start(API_KEY).await?;
    let created = chrono::Utc::now().timestamp();
    for id in ids {
        log.add(payment_succeeded(
            &format!("evt_bench_reconcile_{id}"),
            created,
            *id,
            total_cents,
            "eur",
            &format!("pi_bench_reconcile_{id}"),
        ));
    }
    let (db, name) = (url.to_owned(), source_name.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut conn = order_service::db::establish(&db)?;
        source::set_api_key(&mut conn, &name, API_KEY, &Keyring::none())
            .map_err(|e| anyhow::anyhow!("giving the bench's source an API key: {e}"))
    })
    .await??;
    let reconciler = Reconciler {
        pool: build_pool(
            url,
            &PoolOptions {
                size: 2,
                ..PoolOptions::default()
            },
        ),
        events: StripeEvents::new(&log.base_url(), RetryPolicy::default())?,
        keys: Keyring::none(),
        enqueuer: order_service::orders::order_enqueuer(),
        max_attempts: outbox_core::outbox::DEFAULT_MAX_ATTEMPTS,
    };
    let started = Instant::now();
    let report = reconciler
        .source(source_name, Some(Duration::from_secs(3600)))
        .await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        report.recovered == ids.len() as u64 && report.already == 0,
        "reconcile recovered {} of {} events ({} already stored)",
        report.recovered,
        ids.len(),
        report.already
    );
    Ok(ids.len() as f64 / elapsed.as_secs_f64())
}
