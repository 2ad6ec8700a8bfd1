//! A payment Stripe could not deliver: its webhook never reaches the shop,
//! yet Stripe's event log lists it. The demo gives its `stripe` source an
//! API key, serves the log locally (`crate::stripe_events`), and reconciles
//! as `outbox-relay inbox reconcile --source stripe` does: the order
//! becomes `paid`, its message stored `via = reconcile`.

use std::time::Duration;

use anyhow::Context as _;
use diesel::prelude::*;

use order_service::db::{PoolOptions, build_pool};
use order_service::inbox::reconcile::{Reconciler, Report};
use order_service::inbox::source;
use order_service::inbox::stripe_events::{RetryPolicy, StripeEvents};
use order_service::schema::orders;
use order_service::sealed::Keyring;

use super::payments::Stripe;
use crate::stripe_events::{StripeEventLog, payment_succeeded};

/// What the reconciliation did for the order.
pub(super) struct Recovered {
    pub report: Report,
    /// The order's status afterwards.
    pub status: String,
}

/// Pays `order_id` in Stripe's log only (event `event_id`, never sent as
/// a webhook) and reconciles the `stripe` source against that log.
pub(super) async fn recover_undelivered(
    stripe: &Stripe,
    database_url: &str,
    order_id: i64,
    event_id: &str,
) -> anyhow::Result<Recovered> {
    let api_key = format!("rk_test_demo{:016x}", fastrand::u64(..));
    let log = StripeEventLog::start(&api_key)
        .await
        .context("starting the local Stripe event log")?;
    let (amount, currency) = stripe.charge_of(order_id).await?;
    log.add(payment_succeeded(
        event_id,
        chrono::Utc::now().timestamp(),
        order_id,
        amount,
        &currency,
        &format!("pi_demo_{order_id}"),
    ));
    let url = database_url.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn = order_service::db::establish(&url)?;
        source::set_api_key(&mut conn, "stripe", &api_key, &Keyring::none())?;
        anyhow::Ok(())
    })
    .await??;
    let reconciler = Reconciler {
        pool: build_pool(
            database_url,
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
    let report = reconciler
        .source("stripe", Some(Duration::from_secs(3600)))
        .await?;
    let url = database_url.to_owned();
    let status = tokio::task::spawn_blocking(move || {
        let mut conn = order_service::db::establish(&url)?;
        anyhow::Ok(
            orders::table
                .find(order_id)
                .select(orders::status)
                .first::<String>(&mut conn)?,
        )
    })
    .await??;
    Ok(Recovered { report, status })
}
