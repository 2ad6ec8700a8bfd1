//! `outbox-relay demo`: the whole system end to end with nothing to set up.
//!
//! A database (a private PostgreSQL from the machine's installation, or a
//! scratch database on `DATABASE_URL`'s server), the order API and a relay in
//! this process, a local SMTP sink and webhook receiver writing into the out
//! directory, and a handful of sample orders placed over real HTTP. The first
//! order's webhook is refused twice so a retry with backoff is seen. The demo
//! waits until every job has finished, fetches the receipts from the API, and
//! prints where everything is. Ctrl-C at any point stops it cleanly, removing
//! the database.

mod database;
mod progress;
mod samples;
pub mod sinks;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiSettings, Application};
use crate::config::{EnqueueArgs, ReceiptArgs, parse_database_url, parse_positive_duration};
use crate::db::{self, PgPool, run_blocking};
use crate::effects::email::{EmailConfig, Mailer};
use crate::effects::webhook::{WebhookConfig, WebhookSender};
use crate::effects::{self, EffectKind};
use crate::orders::Currency;
use crate::relay::{BackoffPolicy, Relay, RelaySettings};
use database::DemoDatabase;
use progress::{JobState, KindCounts, LiveView, Narrator};
use sinks::smtp::SmtpSink;
use sinks::webhook::{Answer, WebhookSink};

/// Sender of the confirmation emails.
pub const MAIL_FROM: &str = "Outbox Relay Demo Shop <orders@shop.example>";
/// Key of the webhooks' `X-Signature`; the receiver checks every signature with it.
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
    /// Where the emails (.eml), webhooks (JSON) and receipts (PDF) are written.
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
            (&out.webhooks, "json"),
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
    crate::telemetry::set_default_log_filter("error");
    let shutdown = crate::shutdown::on_signals();
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
    let webhook = WebhookSink::start([], Answer::status(200), Some(out.webhooks.clone()))
        .await
        .context("starting the webhook receiver")?;
    webhook.verify_signatures_with(WEBHOOK_SECRET);
    webhook.answer_matching_with(
        samples::is_flaky_webhook,
        [
            Answer::status(500).body("demo receiver: failing on purpose (1 of 2)"),
            Answer::status(500).body("demo receiver: failing on purpose (2 of 2)"),
        ],
    );

    let services = shutdown.child_token();
    let running = start_services(args, database_url, &smtp, &webhook, &services).await?;
    println!(
        "Order API on {}, a relay, an SMTP sink on {} and a webhook receiver on {} are running.",
        running.api_url,
        smtp.url(),
        webhook.url()
    );

    let demo = Demo {
        args,
        running: &running,
        out,
        smtp: &smtp,
        webhook: &webhook,
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
    result
}

/// The API and the relay, running in this process.
struct Running {
    api_url: String,
    /// The dashboard's operator token, with `--keep-running` (printed with its URL).
    admin_token: Option<String>,
    database_url: String,
    /// A small pool for the demo's own reads of the jobs table.
    watch_pool: PgPool,
    api: tokio::task::JoinHandle<std::io::Result<()>>,
    relay: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_services(
    args: &DemoArgs,
    database_url: &str,
    smtp: &SmtpSink,
    webhook: &WebhookSink,
    services: &CancellationToken,
) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the API to a free port")?;
    // A run that stays up gets the dashboard, with a fresh token nobody else knows.
    let admin_token = args.keep_running.then(demo_admin_token).transpose()?;
    let admin = admin_token.as_deref().map(|token| {
        let tokens =
            api::admin::parse_admin_tokens(Some(&format!("op:{token}")), None).unwrap_or_default();
        let mut settings = api::admin::AdminSettings::new(tokens);
        settings.mail_domain = crate::effects::email::mail_from_domain(MAIL_FROM);
        settings
    });
    let api_settings = ApiSettings {
        max_attempts: args.enqueue.max_attempts,
        shutdown_grace: SHUTDOWN_GRACE,
        admin,
        ..ApiSettings::default()
    };
    let app = Application::build(
        api::connect(database_url, &api_settings),
        api_settings,
        listener,
    )?;
    let api_url = format!("http://{}", app.local_addr());

    let mailer = Mailer::new(&EmailConfig {
        smtp_url: smtp.url(),
        mail_from: MAIL_FROM.to_owned(),
        // Links in the emails lead to this run's API.
        public_base_url: api_url.clone(),
    })?;
    let sender = WebhookSender::new(&WebhookConfig {
        url: webhook.url(),
        secret: WEBHOOK_SECRET.to_owned(),
        timeout: Duration::from_secs(10),
    })?;
    let kinds = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];
    let mut settings = RelaySettings::new(
        format!("demo-{}", std::process::id()),
        kinds.iter().map(|k| k.as_str().to_owned()).collect(),
    )
    .with_lease(Duration::from_secs(30));
    // Two cores are plenty for a handful of orders; leave room for the build.
    settings.concurrency = 8;
    settings.batch_size = 8;
    // Retries become due between NOTIFYs; a short poll picks them up on time.
    settings.poll_interval = Duration::from_millis(100);
    settings.shutdown_grace = SHUTDOWN_GRACE;
    settings.backoff = BackoffPolicy {
        base: args.backoff_base,
        max: args.backoff_base.max(Duration::from_secs(5)),
    };
    // Reading and parsing a 20 MB font must not hold up a runtime thread: the
    // signal watcher runs on them and a second Ctrl-C must get through.
    let receipt_args = args.receipt.clone();
    let receipt = tokio::task::spawn_blocking(move || receipt_args.settings(true)).await??;
    let relay_pool = db::build_pool(database_url, 12, false);
    let executor = Arc::new(effects::workers(
        relay_pool.clone(),
        Some(mailer),
        Some(sender),
        receipt,
    ));
    let relay = Relay::new(relay_pool, database_url, settings, executor)?;

    Ok(Running {
        api_url,
        admin_token,
        database_url: database_url.to_owned(),
        watch_pool: db::build_pool(database_url, 2, false),
        api: tokio::spawn(app.run_until_stopped(services.clone())),
        relay: tokio::spawn(relay.run_until_stopped(services.clone())),
    })
}

/// 128 random bits, hex: the demo dashboard's operator token.
fn demo_admin_token() -> anyhow::Result<String> {
    let mut bytes = [0_u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("no randomness for the admin token: {e}"))?;
    Ok(hex::encode(bytes))
}

impl Running {
    async fn stop(self, services: &CancellationToken) {
        services.cancel();
        let limit = SHUTDOWN_GRACE * 2;
        match tokio::time::timeout(limit, self.relay).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => eprintln!("the relay stopped with an error: {error:#}"),
            Ok(Err(error)) => eprintln!("the relay task failed: {error}"),
            Err(_) => eprintln!("the relay did not stop within {limit:?}"),
        }
        match tokio::time::timeout(limit, self.api).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => eprintln!("the API stopped with an error: {error}"),
            Ok(Err(error)) => eprintln!("the API task failed: {error}"),
            Err(_) => eprintln!("the API did not stop within {limit:?}"),
        }
    }
}

/// An order the demo placed.
#[derive(Debug, Clone)]
struct Placed {
    id: i64,
    customer: String,
    total: String,
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
    webhook: &'a WebhookSink,
    shutdown: &'a CancellationToken,
    started: Instant,
}

impl Demo<'_> {
    /// Places the orders, watches the relay work, and sums up.
    async fn exercise(&self) -> anyhow::Result<()> {
        let client = http_client()?;
        let orders = self.args.orders;
        let api_url = &self.running.api_url;
        let view = LiveView::new(orders as u64);
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

        if let Err(error) = self.walk(&client, &view, &placed).await {
            view.clear();
            return Err(error);
        }
        view.status("the relay is working: an email, a receipt and a webhook for every order");
        let watched = watch(
            self.running,
            self.out,
            &client,
            &view,
            &placed,
            self.shutdown,
        )
        .await;
        view.clear();
        if watched.ending != Ending::Interrupted {
            self.summarize(&placed, &watched);
        }
        Ok(())
    }

    /// Moves the first order through pay, ship and deliver and the second
    /// through cancel, over HTTP, while the relay delivers their events.
    async fn walk(
        &self,
        client: &reqwest::Client,
        view: &LiveView,
        placed: &[Placed],
    ) -> anyhow::Result<()> {
        let steps: Vec<(i64, &str, serde_json::Value)> = match placed {
            [first, second, ..] => vec![
                (
                    first.id,
                    "pay",
                    serde_json::json!({"payment_reference": "demo-pay-1"}),
                ),
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
            view.line("Moving order #1 through pay, ship and deliver, and cancelling order #2:");
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
        Ok(())
    }

    fn summarize(&self, placed: &[Placed], watched: &Watched) {
        let Demo {
            args,
            running,
            out,
            smtp,
            webhook,
            started,
            ..
        } = self;
        let (jobs, receipts, ending) = (&watched.jobs, &watched.receipts, watched.ending);
        let elapsed = started.elapsed().as_secs_f64();
        let total = |f: fn(&KindCounts) -> u64| -> u64 {
            crate::orders::ORDER_JOB_KINDS
                .iter()
                .map(|k| f(&KindCounts::of(jobs, k)))
                .sum()
        };
        println!();
        match ending {
            Ending::Settled => println!(
                "Done in {elapsed:.1}s: {} orders placed, {} jobs: {} done, {} failed.",
                placed.len(),
                jobs.len(),
                total(|c| c.done),
                total(|c| c.failed)
            ),
            _ => println!(
                "Stopped waiting after {elapsed:.1}s: {} orders placed, {} jobs: {} done, {} failed, {} not finished.",
                placed.len(),
                jobs.len(),
                total(|c| c.done),
                total(|c| c.failed),
                total(|c| c.pending + c.retrying + c.processing)
            ),
        }
        println!();
        println!(
            "  {:<20} {:>5} {:>7} {:>12} {:>9}",
            "KIND", "DONE", "FAILED", "NOT FINISHED", "ATTEMPTS"
        );
        for kind in crate::orders::ORDER_JOB_KINDS {
            let c = KindCounts::of(jobs, kind);
            println!(
                "  {:<20} {:>5} {:>7} {:>12} {:>9}",
                kind,
                c.done,
                c.failed,
                c.pending + c.retrying + c.processing,
                c.attempts
            );
        }

        let requests = webhook.requests();
        let flaky_key = requests
            .iter()
            .find(|r| samples::is_flaky_webhook(&r.body))
            .and_then(|r| r.header("idempotency-key").map(str::to_owned));
        if let Some(key) = flaky_key {
            let answers: Vec<String> = requests
                .iter()
                .filter(|r| r.header("idempotency-key") == Some(key.as_str()))
                .map(|r| r.answered.to_string())
                .collect();
            println!();
            println!(
                "  The receiver refused order #{}'s webhook on purpose: answers {} to the same \
                 request (Idempotency-Key {key}); the relay retried it with backoff.",
                placed.first().map_or(0, |p| p.id),
                answers.join(", ")
            );
        }

        // Each walked order's events as the receiver got them, in arrival order.
        for order in placed.iter().take(2) {
            let arrivals: Vec<String> = requests
                .iter()
                .filter_map(|r| {
                    let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
                    let id = body
                        .pointer("/data/order/id")
                        .or_else(|| body.pointer("/order/id"))
                        .and_then(serde_json::Value::as_i64)?;
                    (id == order.id).then(|| {
                        let seq = body
                            .pointer("/data/seq")
                            .and_then(serde_json::Value::as_i64);
                        let kind = body["type"].as_str().unwrap_or("order.placed");
                        let mark = if (200..300).contains(&r.answered) {
                            "✓".to_owned()
                        } else {
                            format!("✗{}", r.answered)
                        };
                        format!(
                            "{}{kind} {mark}",
                            seq.map(|s| format!("{s}:")).unwrap_or_default()
                        )
                    })
                })
                .collect();
            if arrivals.len() > 1 {
                println!(
                    "  Order #{}'s webhooks, in the order they arrived: {}",
                    order.id,
                    arrivals.join(" → ")
                );
            }
        }
        if placed.len() >= 2 {
            println!(
                "  Events of one order share an ordering key: a refused delivery holds back \
                 the order's later events until it succeeds."
            );
        }

        let mails = smtp.accepted();
        let signed = requests
            .iter()
            .filter(|r| r.signature_valid == Some(true))
            .count();
        println!();
        println!("What the relay produced is in {}/:", out.root.display());
        println!(
            "  emails/    {} emails (confirmations, shipping, cancellation) as .eml files; open one in a mail client{}",
            mails.len(),
            first_file(mails.iter().filter_map(|m| m.saved_as.as_deref()))
        );
        println!(
            "  webhooks/  {} requests as JSON with their headers; {signed} of {} signatures valid \
             (WEBHOOK_SECRET={WEBHOOK_SECRET}){}",
            requests.len(),
            requests.len(),
            first_file(requests.iter().filter_map(|r| r.saved_as.as_deref()))
        );
        println!(
            "  receipts/  {} PDFs fetched from GET /orders/{{id}}/receipt.pdf{}",
            receipts.len(),
            first_file(receipts.iter().map(PathBuf::as_path))
        );

        let exe = command_name();
        println!();
        if args.keep_running {
            println!("Look further (while this runs):");
            println!("  curl {}/orders/1", running.api_url);
            println!(
                "  DATABASE_URL={} {exe} jobs stats",
                db::redact_url(&running.database_url)
            );
            println!(
                "  DATABASE_URL={} {exe} jobs list",
                db::redact_url(&running.database_url)
            );
            println!("  curl {}/metrics", running.api_url);
            if let Some(token) = &running.admin_token {
                println!();
                println!("Dashboard: {}/admin", running.api_url);
                println!("  log in with the admin token {token}");
            }
        } else {
            println!("Look further: the database is gone with the demo; to explore, run");
            println!("  {exe} demo --keep-running");
            println!(
                "which leaves the API and the relay up until Ctrl-C and prints the `jobs stats` \
                 command for its database."
            );
        }
    }
}

/// A plain-HTTP client for talking to the API; never through a proxy, since
/// the API is on loopback.
fn http_client() -> anyhow::Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .context("building the HTTP client")
}

async fn place_order(
    client: &reqwest::Client,
    api_url: &str,
    n: usize,
    run_id: u32,
) -> anyhow::Result<Placed> {
    let body = samples::order_body(n);
    let response = client
        .post(format!("{api_url}/orders"))
        .header("Idempotency-Key", format!("demo-{run_id:08x}-{n}"))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("POST /orders (sample order {})", n + 1))?;
    let status = response.status();
    let answer: serde_json::Value = response
        .json()
        .await
        .with_context(|| format!("POST /orders answered {status} with a body that is not JSON"))?;
    anyhow::ensure!(
        status == reqwest::StatusCode::CREATED,
        "POST /orders answered {status}: {answer}"
    );
    let id = answer["id"]
        .as_i64()
        .with_context(|| format!("POST /orders answered without an order id: {answer}"))?;
    let total = answer["total_cents"].as_i64().unwrap_or(0);
    let total = answer["currency"]
        .as_str()
        .and_then(Currency::parse)
        .map_or_else(|| total.to_string(), |c| c.format(total));
    let items = answer["items"].as_array().map_or(0, Vec::len);
    Ok(Placed {
        id,
        customer: body["customer_name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        total: format!("{items} item(s), {total}"),
    })
}

/// What the watch saw last.
#[derive(Debug)]
struct Watched {
    ending: Ending,
    jobs: Vec<JobState>,
    /// Receipts saved, by order id.
    receipts: Vec<PathBuf>,
}

/// Follows the jobs table until every job of the placed orders has finished
/// and every rendered receipt has been fetched, or the deadline passes, or
/// Ctrl-C. Returns the last snapshot and the receipts saved.
async fn watch(
    running: &Running,
    out: &OutDir,
    client: &reqwest::Client,
    view: &LiveView,
    placed: &[Placed],
    shutdown: &CancellationToken,
) -> Watched {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut narrator = Narrator::default();
    let mut receipts: Vec<(i64, PathBuf)> = Vec::new();
    let mut jobs: Vec<JobState> = Vec::new();
    let mut last_error: Option<String> = None;
    let expected = placed.len() * crate::orders::ORDER_JOB_KINDS.len();
    loop {
        match run_blocking(&running.watch_pool, |conn| Ok(progress::load_jobs(conn)?)).await {
            Ok(snapshot) => {
                jobs = snapshot;
                last_error = None;
            }
            Err(error) => {
                let error = format!("reading the jobs table: {error}");
                if last_error.as_ref() != Some(&error) {
                    view.line(format!("  ! {error}"));
                }
                last_error = Some(error);
            }
        }
        for line in narrator.observe(&jobs, chrono::Utc::now()) {
            view.line(line);
        }
        view.show(&jobs);

        let rendered: Vec<i64> = jobs
            .iter()
            .filter(|j| j.kind == "receipt_pdf" && j.status == "done")
            .filter_map(|j| j.order_id)
            .filter(|id| !receipts.iter().any(|(done, _)| done == id))
            .collect();
        for order_id in rendered {
            match fetch_receipt(client, &running.api_url, order_id, &out.receipts).await {
                Ok(path) => receipts.push((order_id, path)),
                Err(error) => view.line(format!("  ! receipt of order #{order_id}: {error:#}")),
            }
        }

        let all_finished = jobs.len() >= expected && jobs.iter().all(JobState::is_finished);
        let receipts_due = jobs
            .iter()
            .filter(|j| j.kind == "receipt_pdf" && j.status == "done")
            .count();
        if all_finished && receipts.len() >= receipts_due {
            return watched(Ending::Settled, jobs, receipts);
        }
        if Instant::now() >= deadline {
            return watched(Ending::TimedOut, jobs, receipts);
        }
        tokio::select! {
            () = shutdown.cancelled() => return watched(Ending::Interrupted, jobs, receipts),
            () = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

fn watched(ending: Ending, jobs: Vec<JobState>, mut receipts: Vec<(i64, PathBuf)>) -> Watched {
    receipts.sort();
    Watched {
        ending,
        jobs,
        receipts: receipts.into_iter().map(|(_, path)| path).collect(),
    }
}

/// `GET /orders/{id}/receipt.pdf`, saved as `order-{id}.pdf`.
async fn fetch_receipt(
    client: &reqwest::Client,
    api_url: &str,
    order_id: i64,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let response = client
        .get(format!("{api_url}/orders/{order_id}/receipt.pdf"))
        .send()
        .await?;
    let status = response.status();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "GET /orders/{order_id}/receipt.pdf answered {status}"
    );
    let pdf = response.bytes().await?;
    anyhow::ensure!(
        pdf.starts_with(b"%PDF-"),
        "GET /orders/{order_id}/receipt.pdf did not answer a PDF"
    );
    let path = sinks::save(dir, &format!("order-{order_id}.pdf"), pdf.to_vec()).await?;
    Ok(path)
}

fn first_file<'a>(mut paths: impl Iterator<Item = &'a Path>) -> String {
    paths
        .next()
        .and_then(Path::file_name)
        .map(|name| format!(" (e.g. {})", name.to_string_lossy()))
        .unwrap_or_default()
}

/// How to run this binary again from here: its path relative to the current
/// directory when it is under it (`target/release/outbox-relay`), else its
/// name.
fn command_name() -> String {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    match (exe, cwd) {
        (Some(exe), Some(cwd)) => match exe.strip_prefix(&cwd) {
            Ok(relative) => relative.display().to_string(),
            Err(_) => exe.display().to_string(),
        },
        _ => "outbox-relay".to_owned(),
    }
}
