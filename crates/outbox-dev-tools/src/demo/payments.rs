//! Payments in, as a provider sends them: the demo registers a `stripe`
//! source, then signs Stripe events as Stripe does and posts them to
//! `/inbound/stripe`: order #1's payment (twice, the second a repeat) and a
//! refund of another order. A third payment never arrives as a webhook:
//! [`recover_undelivered`] finds it in Stripe's event log (a local stand-in)
//! and applies it as `outbox-relay inbox reconcile` does, `via = reconcile`.

use std::time::Duration;

use anyhow::Context as _;
use diesel::prelude::*;
use serde_json::{Value, json};

use order_service::db::{PoolOptions, build_pool};
use order_service::inbox::reconcile::api_key;
use order_service::inbox::reconcile::stripe_events::{RetryPolicy, StripeEvents};
use order_service::inbox::reconcile::{Reconciler, Report};

use order_service::inbox::list::{Filter, list_messages};
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::inbox::verify::stripe_signature;
use order_service::schema::orders;
use order_service::sealed::Keyring;

use super::sinks::stripe_events::{StripeEventLog, payment_succeeded};

/// The demo's Stripe source, and how to post to it.
pub(super) struct Stripe {
    client: reqwest::Client,
    url: String,
    secret: String,
    database_url: String,
}

impl Stripe {
    /// Adds the source `stripe` with a fresh secret, as
    /// `outbox-relay sources add --name stripe --kind stripe` would.
    pub(super) async fn register(api_url: &str, database_url: &str) -> anyhow::Result<Stripe> {
        let url = database_url.to_owned();
        let secret = tokio::task::spawn_blocking(move || {
            let secret = source::new_secret()?;
            let mut conn = order_service::db::establish(&url)?;
            // A kept database (--database-url) may have it from an earlier run.
            match source::find(&mut conn, "stripe")? {
                Some(_) => source::rotate_secret(
                    &mut conn,
                    "stripe",
                    &secret,
                    std::time::Duration::ZERO,
                    &Keyring::none(),
                )?,
                None => source::add(
                    &mut conn,
                    "stripe",
                    SourceKind::Stripe,
                    SourceMode::Any,
                    &secret,
                    &Keyring::none(),
                )?,
            };
            anyhow::Ok(secret)
        })
        .await??;
        Ok(Stripe {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(std::time::Duration::from_secs(15))
                .build()
                .context("building the HTTP client")?,
            url: format!("{api_url}/inbound/stripe"),
            secret,
            database_url: database_url.to_owned(),
        })
    }

    /// The order's total and currency, as the provider would charge them.
    pub(super) async fn charge_of(&self, order_id: i64) -> anyhow::Result<(i64, String)> {
        let url = self.database_url.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = order_service::db::establish(&url)?;
            let (total, currency): (i64, String) = orders::table
                .find(order_id)
                .select((orders::total_cents, orders::currency))
                .first(&mut conn)?;
            anyhow::Ok((total, currency.trim().to_ascii_lowercase()))
        })
        .await?
    }

    /// A `payment_intent.succeeded` for the order, its full amount.
    pub(super) async fn payment(&self, event_id: &str, order_id: i64) -> anyhow::Result<Vec<u8>> {
        let (amount, currency) = self.charge_of(order_id).await?;
        event(
            event_id,
            "payment_intent.succeeded",
            json!({"id": format!("pi_demo_{order_id}"), "object": "payment_intent",
                   "amount": amount, "amount_received": amount, "currency": currency,
                   "status": "succeeded", "metadata": {"order_id": order_id.to_string()}}),
        )
    }

    /// A `charge.refunded` of the order's whole payment.
    pub(super) async fn refund(&self, event_id: &str, order_id: i64) -> anyhow::Result<Vec<u8>> {
        let (amount, currency) = self.charge_of(order_id).await?;
        event(
            event_id,
            "charge.refunded",
            json!({"id": format!("ch_demo_{order_id}"), "object": "charge", "amount": amount,
                   "amount_refunded": amount, "currency": currency, "refunded": true,
                   "payment_intent": format!("pi_demo_{order_id}"),
                   "metadata": {"order_id": order_id.to_string()}}),
        )
    }

    /// Signs `body` now and posts it; the answer's `status`.
    pub(super) async fn send(&self, body: &[u8]) -> anyhow::Result<String> {
        let signature = stripe_signature(&self.secret, chrono::Utc::now().timestamp(), body);
        let response = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(body.to_vec())
            .send()
            .await
            .context("POST /inbound/stripe")?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .with_context(|| format!("POST /inbound/stripe answered {status} without JSON"))?;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "POST /inbound/stripe answered {status}: {answer}"
        );
        Ok(answer["status"].as_str().unwrap_or("?").to_owned())
    }

    /// The inbox's rows, oldest first, for the summary.
    pub(super) async fn inbox_lines(&self) -> anyhow::Result<Vec<String>> {
        let url = self.database_url.clone();
        let mut messages = tokio::task::spawn_blocking(move || {
            let mut conn = order_service::db::establish(&url)?;
            anyhow::Ok(list_messages(
                &mut conn,
                &Filter {
                    limit: 20,
                    ..Filter::default()
                },
            )?)
        })
        .await??;
        messages.reverse();
        Ok(messages
            .iter()
            .map(|m| {
                format!(
                    "  {:<8} {:<22} {:<26} {:<9} {:<10} {}",
                    m.source,
                    order_service::text::one_line(&m.message_id, 22),
                    m.message_type.as_deref().unwrap_or("-"),
                    m.order_id
                        .map_or_else(|| "-".to_owned(), |id| format!("#{id}")),
                    m.via,
                    m.status.as_deref().unwrap_or("-")
                )
            })
            .collect())
    }
}

fn event(id: &str, event_type: &str, object: Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "type": event_type,
        "created": chrono::Utc::now().timestamp(),
        "livemode": false,
        "data": {"object": object},
    }))?)
}

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
        api_key::set_api_key(&mut conn, "stripe", &api_key, &Keyring::none())?;
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

impl Stripe {
    /// The inbox as the demo left it, oldest first; `reconciled`: the order
    /// whose payment came by reconciliation.
    pub(super) async fn print_inbox(&self, reconciled: Option<i64>) -> anyhow::Result<()> {
        println!();
        println!("Inbox (POST /inbound/stripe), oldest first:");
        println!(
            "  {:<8} {:<22} {:<26} {:<9} {:<10} STATUS",
            "SOURCE", "MESSAGE", "TYPE", "ORDER", "VIA"
        );
        for line in self.inbox_lines().await? {
            println!("{line}");
        }
        if let Some(order_id) = reconciled {
            println!(
                "  Order #{order_id} was paid via reconcile: Stripe never delivered its webhook, \
                 and `outbox-relay inbox reconcile` found the payment in Stripe's event \
                 log and applied it as the webhook would have."
            );
        }
        Ok(())
    }
}

impl super::Demo<'_> {
    /// A payment whose webhook Stripe could not deliver, recovered from
    /// Stripe's event log by reconciliation.
    pub(super) async fn recover(
        &self,
        view: &super::progress::LiveView,
        stripe: &Stripe,
        order_id: i64,
        run: u32,
    ) -> anyhow::Result<()> {
        view.line(format!(
            "Stripe pays order #{order_id} but cannot deliver the webhook; reconciling against Stripe's event log (outbox-relay inbox reconcile):"
        ));
        let recovered = recover_undelivered(
            stripe,
            &self.running.database_url,
            order_id,
            &format!("evt_demo_{run:08x}_4"),
        )
        .await?;
        let report = &recovered.report;
        view.line(format!(
            "  → fetched {} event in {} page: recovered {}, already in the inbox {}; order #{order_id:<3} now {} (via reconcile)",
            report.fetched, report.pages, report.recovered, report.already, recovered.status
        ));
        Ok(())
    }
}
