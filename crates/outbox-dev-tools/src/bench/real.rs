//! `--effects real`: the same drain, but every job does real I/O. Each order
//! gets a confirmation email, sent over SMTP to a local sink with its stored
//! receipt attached, as the order service's email finds it once its receipt
//! job is done, and an order webhook, signed and POSTed to a local HTTP sink. Set next to the `noop`
//! drain at the same batch, it shows how much of a real job's time is the
//! relay's own machinery.
//!
//! Both sinks run inside the bench process, so they use the same two cores as
//! the relay and PostgreSQL; that is part of what the comparison measures.

use anyhow::Context as _;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Integer, Text};
use order_service::orders::{Currency, Order, OrderId, OrderItem, OrderStatus};

use super::BenchArgs;
use super::drain::{self, Workload};
use super::report::DrainRun;
use crate::demo::sinks::smtp::SmtpSink;
use crate::demo::sinks::webhook::{Answer, WebhookSink};

const KINDS: &str = "confirmation_email,order_webhook";
const SECRET: &str = "bench-secret";

/// Drains `args.real_jobs` jobs (half emails, half webhooks) at `batch`, then
/// checks that every one reached its sink.
pub async fn measure(url: &str, args: &BenchArgs, batch: usize) -> anyhow::Result<DrainRun> {
    let smtp = SmtpSink::start(None)
        .await
        .context("starting the SMTP sink")?;
    let webhook = WebhookSink::start([], Answer::status(200), None)
        .await
        .context("starting the webhook sink")?;
    let workload = Workload {
        label: format!("{batch}, real effects"),
        // Two jobs per order.
        jobs: args.real_jobs.div_ceil(2) * 2,
        kinds: KINDS.to_owned(),
        env: vec![
            ("SMTP_URL", smtp.url()),
            ("MAIL_FROM", "Bench Shop <orders@bench.invalid>".to_owned()),
            ("WEBHOOK_URL", webhook.url().to_string()),
            ("WEBHOOK_SECRET", SECRET.to_owned()),
            // The bench's receiver listens on 127.0.0.1, over plain http.
            ("WEBHOOK_ALLOW_PRIVATE", "true".to_owned()),
            ("WEBHOOK_ALLOW_HTTP", "true".to_owned()),
            // The emails' receipt links are signed; any key of 32 bytes does here.
            (
                "LINK_SIGNING_KEY",
                "bench-link-signing-key-of-32-bytes".to_owned(),
            ),
        ],
        enqueue: enqueue_orders,
        keys: None,
        pin: None,
        exe: None,
    };
    let (owned_url, concurrency) = (url.to_owned(), args.concurrency);
    let run = tokio::task::spawn_blocking(move || {
        let run = drain::run(&owned_url, &workload, concurrency, batch)?;
        let mut conn = PgConnection::establish(&owned_url)?;
        failed_jobs(&mut conn)?;
        anyhow::Ok(run)
    })
    .await??;

    let orders = run.jobs / 2;
    let accepted = smtp.accepted();
    let mails = accepted.len();
    let posts = webhook.requests().len();
    // At least once: a retried job may reach its sink twice, never zero times.
    anyhow::ensure!(
        mails >= orders && posts >= orders,
        "the sinks saw {mails} mails and {posts} webhooks for {orders} orders"
    );
    let bare = accepted
        .iter()
        .filter(|m| !m.data.contains("application/pdf"))
        .count();
    anyhow::ensure!(
        bare == 0,
        "{bare} of {mails} emails went without their stored receipt"
    );
    Ok(run)
}

/// Inserts `jobs / 2` orders like [`sample_order`], a stored receipt for
/// each, and their email and webhook jobs, in one transaction; the marks hold
/// the database's clock at commit.
fn enqueue_orders(
    conn: &mut PgConnection,
    jobs: usize,
) -> anyhow::Result<super::stats::EnqueueMarks> {
    use order_service::effects::receipt::{ReceiptSettings, render_receipt};
    let orders = i64::try_from(jobs / 2).unwrap_or(i64::MAX);
    let order = sample_order()?;
    let item = order
        .items
        .first()
        .context("the sample order has an item")?;
    // Without a stored receipt each email would go with its link only, and
    // the relay would warn once per email.
    let pdf = render_receipt(&order, &ReceiptSettings::default())
        .map_err(|e| anyhow::anyhow!("rendering the bench's receipt: {e}"))?;
    super::queue::enqueue_timed(
        conn,
        "jobs, order_items, order_events, orders, receipts",
        "confirmation_email",
        |conn| {
            diesel::sql_query(
                "WITH placed AS ( \
                     INSERT INTO orders (customer_email, customer_name, currency, total_cents) \
                     SELECT 'customer' || g || '@example.com', 'Customer ' || g, $3, $4 \
                     FROM generate_series(1, $1) AS g \
                     RETURNING id), \
                 items AS ( \
                     INSERT INTO order_items (order_id, sku, name, quantity, unit_price_cents) \
                     SELECT id, $5, $6, $7, $8 FROM placed), \
                 receipts AS ( \
                     INSERT INTO receipts (order_id, pdf) SELECT id, $2 FROM placed), \
                 events AS ( \
                     INSERT INTO order_events (order_id, seq, type) \
                     SELECT id, 1, 'order.placed' FROM placed \
                     RETURNING id, order_id) \
                 INSERT INTO jobs (order_id, kind, payload, has_dependents) \
                 SELECT order_id, kind, jsonb_build_object('order_id', order_id, 'event_id', id), \
                        false \
                 FROM events, unnest(ARRAY['confirmation_email', 'order_webhook']) AS kind",
            )
            .bind::<BigInt, _>(orders)
            .bind::<Bytea, _>(&pdf)
            .bind::<Text, _>(order.currency.to_string())
            .bind::<BigInt, _>(order.total_cents)
            .bind::<Text, _>(&item.sku)
            .bind::<Text, _>(&item.name)
            .bind::<Integer, _>(item.quantity)
            .bind::<BigInt, _>(item.unit_price_cents)
            .execute(conn)
            .map(drop)
        },
    )
}

/// The order every order of the run copies (but for its customer), and the
/// one its stored receipt is rendered from: two green teas.
fn sample_order() -> anyhow::Result<Order> {
    Ok(Order {
        id: OrderId::new(1),
        customer_email: "customer1@example.com".to_owned(),
        customer_name: "Customer 1".to_owned(),
        currency: Currency::parse("EUR").context("EUR is a currency")?,
        total_cents: 900,
        status: OrderStatus::Placed,
        created_at: chrono::Utc::now(),
        expires_at: None,
        items: vec![OrderItem {
            id: 1,
            sku: "TEA-1".to_owned(),
            name: "Green tea".to_owned(),
            quantity: 2,
            unit_price_cents: 450,
        }],
    })
}

/// An error naming the first failure, if any job failed: a throughput figure
/// for effects that did not happen would mean nothing.
fn failed_jobs(conn: &mut PgConnection) -> anyhow::Result<()> {
    #[derive(QueryableByName)]
    struct Failed {
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        example: Option<String>,
    }
    let row: Failed = diesel::sql_query(
        "SELECT count(*) AS n, min(last_error) AS example FROM jobs WHERE status = 'failed'",
    )
    .get_result(conn)?;
    anyhow::ensure!(
        row.n == 0,
        "{} jobs failed in the real-effects run, e.g.: {}",
        row.n,
        row.example.unwrap_or_default()
    );
    Ok(())
}
