//! `outbox-relay demo`: the whole system end to end with nothing to set up.
//!
//! A database (a private PostgreSQL from the machine's installation, or a
//! scratch database on `DATABASE_URL`'s server), the order API and a relay in
//! this process, a local SMTP sink, two webhook endpoints with receivers of
//! their own writing into the out directory (one of them down for its first
//! calls), a NATS endpoint when a server answers on 127.0.0.1:4222, and a
//! handful of sample orders placed over real HTTP. The demo waits until every
//! job has finished, fetches the receipts from the API, and prints where
//! everything is. Ctrl-C at any point stops it cleanly, removing the database.
//!
//! The endpoints are added in `endpoints.rs`, the API and the relay started in
//! `services.rs`, the orders placed in `orders.rs` (and one left to expire
//! unpaid in `expiry.rs`), the jobs followed in `watch.rs` and the outcome
//! printed in `summary.rs`.

mod database;
mod endpoints;
mod endpoints_summary;
mod expiry;
mod ledger;
mod orders;
mod payments;
mod progress;
mod samples;
mod services;
pub mod sinks;
mod summary;
mod watch;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use database::DemoDatabase;
use endpoints::Subscribers;
use order_service::config::{
    EnqueueArgs, ReceiptArgs, parse_database_url, parse_positive_duration,
};
use order_service::effects::EffectKind;
use orders::{Placed, http_client, place_order};
use progress::{LiveView, Narrator};
use services::{Running, start_services};
use sinks::smtp::SmtpSink;
use watch::watch;

/// Sender of the confirmation emails.
pub const MAIL_FROM: &str = "Outbox Relay Demo Shop <orders@shop.example>";
/// The relay's own `WEBHOOK_SECRET`: the demo's deliveries go to endpoint
/// rows, each signed with that endpoint's secret, so this one signs nothing.
pub const WEBHOOK_SECRET: &str = "demo-secret";
/// How long the demo waits for every job to finish before summing up anyway.
const SETTLE_DEADLINE: Duration = Duration::from_secs(45);
const POLL_EVERY: Duration = Duration::from_millis(150);
/// Short, so stopping never keeps anyone waiting: the demo's effects are local.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Use this PostgreSQL server (the demo creates a scratch database on it
    /// and drops it on exit) instead of starting a private one.
    #[arg(long, env = "DATABASE_URL", value_parser = parse_database_url, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Sample orders to place.
    #[arg(long, default_value_t = 5, value_parser = parse_orders)]
    pub orders: usize,
    /// Where the emails (.eml), webhooks (JSON, a directory per endpoint) and
    /// receipts (PDF) are written.
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    /// Leave the API and the relay running after the summary, until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// First retry delay (short, so the demo's retry is seen quickly).
    #[arg(long, env = "RELAY_BACKOFF_BASE", default_value = "500ms", value_parser = parse_positive_duration)]
    pub backoff_base: Duration,
    #[command(flatten)]
    pub enqueue: EnqueueArgs,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
}

fn parse_orders(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(1..=500).contains(&n) {
        return Err("must be between 1 and 500".into());
    }
    Ok(n)
}

/// The out directory and its three parts.
#[derive(Debug, Clone)]
struct OutDir {
    root: PathBuf,
    emails: PathBuf,
    webhooks: PathBuf,
    receipts: PathBuf,
}

impl OutDir {
    /// Creates the directories and removes what an earlier run left in them
    /// (only the demo's own kinds of file), so order numbers do not mix.
    fn prepare(root: &Path) -> anyhow::Result<(OutDir, usize)> {
        let out = OutDir {
            root: root.to_owned(),
            emails: root.join("emails"),
            webhooks: root.join("webhooks"),
            receipts: root.join("receipts"),
        };
        let mut cleared = 0;
        for (dir, extension) in [
            (&out.emails, "eml"),
            // Earlier runs wrote every webhook here; now each endpoint has its own.
            (&out.webhooks, "json"),
            (&out.webhooks.join(endpoints::ERP), "json"),
            (&out.webhooks.join(endpoints::ANALYTICS), "json"),
            (&out.receipts, "pdf"),
        ] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            for entry in std::fs::read_dir(dir)
                .with_context(|| format!("cannot read {}", dir.display()))?
                .flatten()
            {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == extension) && path.is_file() {
                    std::fs::remove_file(&path)
                        .with_context(|| format!("cannot remove {}", path.display()))?;
                    cleared += 1;
                }
            }
        }
        Ok((out, cleared))
    }
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    // The API logs every request at info; here the live view is the interface.
    order_service::telemetry::set_default_log_filter("error");
    let shutdown = order_service::shutdown::on_signals();
    let started = Instant::now();

    match &args.database_url {
        None => println!("Starting a private PostgreSQL (initdb in a temporary directory)…"),
        Some(_) => println!("Creating a scratch database on DATABASE_URL's server…"),
    }
    let url = args.database_url.clone();
    let opened = tokio::task::spawn_blocking(move || DemoDatabase::open(url.as_deref())).await?;
    let database = match opened {
        Ok(database) => database,
        // Ctrl-C reaches initdb too; its failure is then no news.
        Err(_) if shutdown.is_cancelled() => {
            println!("Interrupted; nothing left behind.");
            return Ok(());
        }
        Err(error) => return Err(error),
    };
    println!(
        "Database ready after {:.1}s: {}.",
        started.elapsed().as_secs_f64(),
        database.describe()
    );

    let root = args.out.clone();
    let result = match tokio::task::spawn_blocking(move || OutDir::prepare(&root)).await {
        Ok(Ok((out, cleared))) => {
            if cleared > 0 {
                println!(
                    "Removed {cleared} files of an earlier run from {}.",
                    out.root.display()
                );
            }
            run_on(&args, &database.url, &out, &shutdown, started).await
        }
        Ok(Err(error)) => Err(error),
        Err(error) => Err(error.into()),
    };
    if shutdown.is_cancelled() {
        println!("Interrupted: stopping…");
    }
    let removing = database.name();
    database.remove().await;
    match &result {
        Ok(()) => println!("Stopped; removed {removing}."),
        Err(_) => eprintln!("Removed {removing}."),
    }
    result
}

/// Everything after the database: sinks, API, relay, orders, the watch and
/// the summary. Stops what it started before returning, on every path.
async fn run_on(
    args: &DemoArgs,
    database_url: &str,
    out: &OutDir,
    shutdown: &CancellationToken,
    started: Instant,
) -> anyhow::Result<()> {
    let smtp = SmtpSink::start(Some(out.emails.clone()))
        .await
        .context("starting the SMTP sink")?;
    let subscribers = Subscribers::start(database_url, &out.webhooks).await?;
    let services = shutdown.child_token();
    let running = match start_services(args, database_url, &smtp, &subscribers, &services).await {
        Ok(running) => running,
        Err(error) => {
            subscribers.stop().await;
            return Err(error);
        }
    };
    println!(
        "Order API on {}, a relay and an SMTP sink on {} are running.",
        running.api_url,
        smtp.url(),
    );
    subscribers.describe();

    let demo = Demo {
        args,
        running: &running,
        out,
        smtp: &smtp,
        subscribers: &subscribers,
        shutdown,
        started,
    };
    let result = demo.exercise().await;
    if result.is_ok() && args.keep_running && !shutdown.is_cancelled() {
        println!();
        println!(
            "Still running (--keep-running): the API at {} and the relay; new orders go \
             through the same sinks into {}. Ctrl-C stops everything and removes the database.",
            running.api_url,
            out.root.display()
        );
        shutdown.cancelled().await;
    }
    running.stop(&services).await;
    subscribers.stop().await;
    result
}

/// How the watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Settled,
    TimedOut,
    Interrupted,
}

/// What the demo's steps share once everything runs.
struct Demo<'a> {
    args: &'a DemoArgs,
    running: &'a Running,
    out: &'a OutDir,
    smtp: &'a SmtpSink,
    subscribers: &'a Subscribers,
    shutdown: &'a CancellationToken,
    started: Instant,
}

impl Demo<'_> {
    /// The job kinds of this run: an order's, the emails of its later
    /// events, and a publish when NATS answered.
    fn kinds(&self) -> Vec<&'static str> {
        let mut kinds = order_service::orders::ORDER_JOB_KINDS.to_vec();
        kinds.insert(1, EffectKind::OrderEmail.as_str());
        if self.subscribers.stream().is_some() {
            kinds.push(EffectKind::OrderPublish.as_str());
        }
        kinds
    }

    /// Places the orders, watches the relay work, and sums up.
    async fn exercise(&self) -> anyhow::Result<()> {
        let client = http_client(&self.running.api_key)?;
        let orders = self.args.orders;
        let api_url = &self.running.api_url;
        let kinds = self.kinds();
        let view = LiveView::new(orders as u64, &kinds);
        view.status(format!("placing {orders} orders through POST /orders"));
        view.line(format!(
            "Placing {orders} sample orders through POST {api_url}/orders:"
        ));
        let run_id = fastrand::u32(..);
        let mut placed = Vec::new();
        for n in 0..orders {
            if self.shutdown.is_cancelled() {
                view.clear();
                return Ok(());
            }
            match place_order(&client, api_url, n, run_id).await {
                Ok(order) => {
                    view.line(format!(
                        "  + order #{:<3} {} — {}",
                        order.id, order.customer, order.total
                    ));
                    placed.push(order);
                }
                Err(error) => {
                    view.clear();
                    return Err(error);
                }
            }
        }

        let mut expiring = match self.place_expiring(&view, orders).await {
            Ok(expiring) => expiring,
            Err(error) => {
                view.clear();
                return Err(error);
            }
        };

        let stripe = match self.walk(&client, &view, &placed).await {
            Ok(stripe) => stripe,
            Err(error) => {
                view.clear();
                return Err(error);
            }
        };
        if let Err(error) = self.await_expiry(&view, &mut expiring).await {
            view.clear();
            return Err(error);
        }
        view.status("the relay is working: emails, receipts, and every event to every endpoint");
        let narrator = Narrator::with_endpoints(self.subscribers.names());
        // At least a job of each kind every order gets (webhooks: one per
        // endpoint); only the orders that move on get an order_email.
        let every_order = kinds
            .iter()
            .filter(|k| **k != EffectKind::OrderEmail.as_str());
        let expected = placed.len() * every_order.count();
        let watched = watch(
            self.running,
            self.out,
            &client,
            &view,
            (narrator, expected),
            self.shutdown,
        )
        .await;
        view.clear();
        if watched.ending != Ending::Interrupted {
            let nats_messages = match self.subscribers.stream() {
                Some(stream) => Some(stream.messages().await),
                None => None,
            };
            self.summarize(&placed, &watched, nats_messages);
            if let Some(first) = placed.first()
                && let Err(error) = ledger::print_ledger(&client, api_url, first.id).await
            {
                println!("  the effect ledger could not be read: {error:#}");
            }
            if let Some(stripe) = &stripe {
                stripe.print_inbox(placed.get(3).map(|p| p.id)).await?;
            }
            println!();
            println!("{}", expiring.summary());
        }
        Ok(())
    }

    /// Pays the first order as a payment provider would (a Stripe-signed
    /// event to `/inbound/stripe`, sent twice), moves it through ship and
    /// deliver and the second through cancel over the API, and has the
    /// provider pay and refund the third; the relay delivers their events
    /// meanwhile. The Stripe source, when there were orders to pay.
    async fn walk(
        &self,
        client: &reqwest::Client,
        view: &LiveView,
        placed: &[Placed],
    ) -> anyhow::Result<Option<payments::Stripe>> {
        let Some(first) = placed.first() else {
            return Ok(None);
        };
        let stripe =
            payments::Stripe::register(&self.running.api_url, &self.running.database_url).await?;
        let run = fastrand::u32(..);
        view.line(format!(
            "Paying order #{} as Stripe would: a signed payment_intent.succeeded to POST /inbound/stripe, sent twice:",
            first.id
        ));
        let payment = stripe
            .payment(&format!("evt_demo_{run:08x}_1"), first.id)
            .await?;
        let answer = stripe.send(&payment).await?;
        view.line(format!(
            "  → order #{:<3} payment_intent.succeeded: {answer}",
            first.id
        ));
        let again = stripe.send(&payment).await?;
        view.line(format!(
            "  → the same event again (Stripe retries): {again}, nothing changed"
        ));
        let steps: Vec<(i64, &str, serde_json::Value)> = match placed {
            [first, second, ..] => vec![
                (
                    first.id,
                    "ship",
                    serde_json::json!({"carrier": "DHL", "tracking_number": "JD014600006281"}),
                ),
                (first.id, "deliver", serde_json::json!({})),
                (
                    second.id,
                    "cancel",
                    serde_json::json!({"reason": "out of stock"}),
                ),
            ],
            _ => Vec::new(),
        };
        if !steps.is_empty() {
            view.line("Moving order #1 through ship and deliver, and cancelling order #2:");
        }
        for (id, action, body) in steps {
            let url = format!("{}/orders/{id}/{action}", self.running.api_url);
            let response = client
                .post(&url)
                .json(&body)
                .send()
                .await
                .with_context(|| format!("POST /orders/{id}/{action}"))?;
            let status = response.status();
            let answer: serde_json::Value = response.json().await.with_context(|| {
                format!("POST /orders/{id}/{action} answered {status} without JSON")
            })?;
            anyhow::ensure!(
                status == reqwest::StatusCode::OK,
                "POST /orders/{id}/{action} answered {status}: {answer}"
            );
            view.line(format!(
                "  → order #{id:<3} {action:<8} now {}",
                answer["status"].as_str().unwrap_or("?")
            ));
        }
        if let Some(third) = placed.get(2) {
            view.line(format!(
                "Stripe pays order #{} and then refunds it (charge.refunded):",
                third.id
            ));
            let paid = stripe
                .send(
                    &stripe
                        .payment(&format!("evt_demo_{run:08x}_3"), third.id)
                        .await?,
                )
                .await?;
            view.line(format!(
                "  → order #{:<3} payment_intent.succeeded: {paid}",
                third.id
            ));
            let refunded = stripe
                .send(
                    &stripe
                        .refund(&format!("evt_demo_{run:08x}_3r"), third.id)
                        .await?,
                )
                .await?;
            view.line(format!(
                "  → order #{:<3} charge.refunded: {refunded}",
                third.id
            ));
        }
        if let Some(fourth) = placed.get(3) {
            self.recover(view, &stripe, fourth.id, run).await?;
        }
        Ok(Some(stripe))
    }
}
