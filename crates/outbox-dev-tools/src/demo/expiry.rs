//! A payment window in the demo: one more sample order, placed the way
//! `serve` places every order under `ORDER_PAYMENT_WINDOW`, which nobody
//! pays. The relay's expiry sweep expires it a few seconds later: the event
//! `order.expired`, delivered to every endpoint, and an email to the
//! customer.

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::progress::LiveView;
use super::{Demo, POLL_EVERY, samples};
use order_service::orders::{Cause, NewOrder, OrderStatus, order_enqueuer, place_order_by};
use order_service::schema::{order_events, orders};

/// The window of the demo's unpaid order: short, so it expires while the
/// relay still works on the other orders.
const WINDOW: Duration = Duration::from_secs(3);
/// How long after its window the demo waits for the expiry before it moves on.
const GRACE: Duration = Duration::from_secs(15);

impl Demo<'_> {
    /// Places sample order `n` under [`WINDOW`], and says so.
    pub(super) async fn place_expiring(
        &self,
        view: &LiveView,
        n: usize,
    ) -> anyhow::Result<Expiring> {
        let expiring = Expiring::place(
            &self.running.database_url,
            n,
            self.args.enqueue.max_attempts,
        )
        .await?;
        view.line(format!(
            "  + order #{:<3} placed with a {}s payment window, which nobody pays",
            expiring.id,
            WINDOW.as_secs()
        ));
        Ok(expiring)
    }

    /// Waits for the relay to expire it, and says so.
    pub(super) async fn await_expiry(
        &self,
        view: &LiveView,
        expiring: &mut Expiring,
    ) -> anyhow::Result<()> {
        view.status(format!(
            "waiting for order #{}'s payment window to close",
            expiring.id
        ));
        let said = expiring
            .wait(&self.running.database_url, self.shutdown)
            .await?;
        view.line(said);
        Ok(())
    }
}

/// The order placed under [`WINDOW`], and what became of it.
pub(super) struct Expiring {
    id: i64,
    expires_at: DateTime<Utc>,
    /// When its `order.expired` was recorded; `None` until then.
    expired_at: Option<DateTime<Utc>>,
}

impl Expiring {
    /// Places sample order `n` with a payment window of [`WINDOW`]. Through
    /// the library, not `POST /orders`: the demo's API places the other
    /// orders without a window, and a window is the API's setting.
    async fn place(database_url: &str, n: usize, max_attempts: i32) -> anyhow::Result<Expiring> {
        let order = NewOrder::parse(&samples::order_body(n))
            .map_err(|e| anyhow::anyhow!("the sample order: {e}"))?;
        let url = database_url.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut conn = order_service::db::establish(&url)?;
            let placed = place_order_by(
                &mut conn,
                &order_enqueuer(),
                &order,
                None,
                max_attempts,
                Cause::default(),
                Some(WINDOW),
            )?;
            let id = placed.order_id();
            let created = placed
                .created
                .context("the order with a payment window was not created")?;
            let expires_at = created
                .order
                .expires_at
                .context("the order has no expires_at")?;
            anyhow::Ok(Expiring {
                id,
                expires_at,
                expired_at: None,
            })
        })
        .await?
    }

    /// Waits until the relay's sweep has expired the order (its event and
    /// jobs committed with it), or [`GRACE`] past its window, or Ctrl-C.
    /// The line that tells it.
    async fn wait(
        &mut self,
        database_url: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<String> {
        let deadline = self.expires_at + GRACE;
        loop {
            let (url, id) = (database_url.to_owned(), self.id);
            let (status, expired_at) = tokio::task::spawn_blocking(move || {
                let mut conn = order_service::db::establish(&url)?;
                let status: String = orders::table
                    .find(id)
                    .select(orders::status)
                    .first(&mut conn)?;
                let expired_at: Option<DateTime<Utc>> = order_events::table
                    .filter(order_events::order_id.eq(id))
                    .filter(order_events::event_type.eq(OrderStatus::Expired.event_type()))
                    .select(order_events::created_at)
                    .first(&mut conn)
                    .optional()?;
                anyhow::Ok((status, expired_at))
            })
            .await??;
            if let Some(at) = expired_at {
                self.expired_at = Some(at);
                return Ok(format!(
                    "  ⌛ order #{:<3} expired unpaid, {} after its window closed: order.expired \
                     goes to every endpoint, an email to the customer",
                    self.id,
                    lateness(self.expires_at, at)
                ));
            }
            anyhow::ensure!(
                Utc::now() < deadline,
                "order #{} is still {status} {}s after its payment window closed",
                self.id,
                GRACE.as_secs()
            );
            tokio::select! {
                () = shutdown.cancelled() => return Ok(String::new()),
                () = tokio::time::sleep(POLL_EVERY) => {}
            }
        }
    }

    /// The summary's words on it.
    pub(super) fn summary(&self) -> String {
        match self.expired_at {
            Some(at) => format!(
                "Payment window: order #{} was placed with a {}s window (ORDER_PAYMENT_WINDOW) and \
                 nobody paid it: the relays' sweep expired it {} after its expires_at, and \
                 order.expired went to every endpoint and an email to its customer.",
                self.id,
                WINDOW.as_secs(),
                lateness(self.expires_at, at)
            ),
            None => format!(
                "Payment window: order #{} was placed with a {}s window and has not expired yet.",
                self.id,
                WINDOW.as_secs()
            ),
        }
    }
}

/// `0.8s`: how long after `due` it happened.
fn lateness(due: DateTime<Utc>, at: DateTime<Utc>) -> String {
    let late = (at - due).to_std().unwrap_or_default();
    format!("{:.1}s", late.as_secs_f64())
}
