//! `outbox-relay bench`: drain throughput of the real relay next to the raw-SQL
//! ceiling of the same design, measured side by side in one run, plus
//! enqueue-to-start latency and the relay's costs (RSS, CPU, transactions, WAL).
//!
//! Machines are noisy; the figures worth quoting are the ratios between runs
//! made minutes apart on the same machine, which this command prints.

mod arrival;
mod auth_cost;
mod backlog;
mod buffers;
mod ceiling;
mod depth;
mod drain;
mod endpoints;
mod growth;
mod http_floor;
mod inbound;
mod index_entries;
mod latency;
mod listening;
mod open_loop;
mod orders;
mod percentiles;
mod phases;
mod placement;
mod plot;
mod publish;
mod publish_floor;
mod queue;
mod real;
mod report;
mod stats;
mod window_cost;
mod workflow;

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::scratch::ScratchDatabase;
use order_service::config::{parse_count, parse_database_url};

pub use arrival::ArrivalRate;
pub use report::BenchReport;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server to create the scratch database on (it is dropped at the end).
    #[arg(long, env = "DATABASE_URL", value_parser = parse_database_url, hide_env_values = true,
          default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub database_url: String,
    /// `noop` jobs to drain in each throughput run.
    #[arg(long, default_value_t = 200_000, value_parser = parse_jobs)]
    pub jobs: usize,
    /// The relay's effects in flight (RELAY_CONCURRENCY of the relay under test).
    #[arg(long, default_value_t = order_service::worker_pool::DEFAULT_CONCURRENCY, value_parser = parse_count)]
    pub concurrency: usize,
    /// Jobs per claim, for the relay and the ceiling alike.
    #[arg(long, default_value_t = order_service::worker_pool::DEFAULT_BATCH_SIZE, value_parser = parse_count)]
    pub batch: usize,
    /// Also drain at the relay's defaults (RELAY_CONCURRENCY and
    /// RELAY_BATCH_SIZE unset) in each round, right after the drain at
    /// `--concurrency` / `--batch`, so the two are compared inside one run.
    #[arg(long)]
    pub against_defaults: bool,
    /// Parallel claim loops of the raw-SQL ceiling (default: concurrency / batch,
    /// so that the ceiling holds as many jobs in flight as the relay may).
    #[arg(long, value_parser = parse_count)]
    pub ceiling_workers: Option<usize>,
    /// Jobs enqueued one at a time for the latency run (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub latency_samples: usize,
    /// Pause between latency samples.
    #[arg(long, default_value = "3ms", value_parser = order_service::config::parse_duration)]
    pub latency_interval: Duration,
    /// Concurrent clients posting orders to the API (0 skips the placement run).
    #[arg(long, default_value_t = 16)]
    pub api_clients: usize,
    /// Idle half-open connections held open during a second placement run,
    /// to measure what they cost real clients (0 skips that run).
    #[arg(long, default_value_t = 5000)]
    pub half_open: usize,
    /// How long each placement run lasts.
    #[arg(long, default_value = "5s", value_parser = order_service::config::parse_positive_duration)]
    pub api_duration: Duration,
    /// Open-loop runs: orders sent through the API at this fixed rate (orders
    /// per second, or `50%` of the saturation run's rate), while a relay at
    /// the defaults drains their jobs. Repeat the flag or give a comma list.
    /// A share needs the saturation run (`--api-clients` above 0).
    #[arg(long, value_name = "RATE", value_delimiter = ',', default_value = "50%,80%",
          value_parser = arrival::parse_arrival_rate, allow_negative_numbers = true)]
    pub arrival_rate: Vec<ArrivalRate>,
    /// How long each open-loop run sends orders.
    #[arg(long, default_value = "10s", value_parser = order_service::config::parse_positive_duration)]
    pub open_loop_duration: Duration,
    /// Runs of each throughput measurement; the median is reported.
    #[arg(long, default_value_t = 1, value_parser = parse_count)]
    pub repeat: usize,
    /// `real` adds a drain whose jobs do real I/O: confirmation emails to a
    /// local SMTP sink and signed webhooks to a local HTTP sink.
    #[arg(long, value_enum, default_value_t = EffectsMode::Noop)]
    pub effects: EffectsMode,
    /// NATS server of the real-effects run's publish drain (skipped when
    /// none answers there).
    #[arg(long, env = "BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Jobs in the real-effects drain (half emails, half webhooks), and in
    /// its publish drain.
    #[arg(long, default_value_t = 10_000, value_parser = parse_jobs)]
    pub real_jobs: usize,
    /// Only the NATS publish run, `--repeat` times: `--real-jobs` publish
    /// jobs, the same jobs as `noop`, and the raw async-nats loop, at
    /// `--concurrency` and `--batch`.
    #[arg(long, conflicts_with_all = ["api_only", "endpoints"])]
    pub publish_only: bool,
    /// Only the order placement runs (through the API, with and without
    /// half-open connections, and pgbench) and the open-loop runs: no
    /// drains, no latency run.
    #[arg(long)]
    pub api_only: bool,
    /// Skip the batch-1 pair, which at a large concurrency is slow and opens
    /// as many connections as the ceiling has loops.
    #[arg(long)]
    pub no_batch_1: bool,
    /// Also drain with the MVCC horizon pinned: a REPEATABLE READ transaction
    /// on its own connection takes its snapshot before the enqueue and holds
    /// it for up to this long (or until the drain ends), as a long report
    /// query or a stuck client would. Reported against the unpinned drain of
    /// the same round.
    #[arg(long, value_parser = order_service::config::parse_positive_duration)]
    pub pinned_horizon: Option<Duration>,
    /// Also drain the `noop` jobs spread over this many concurrency keys (no
    /// limits: the cost of claiming through the keys), reported against the
    /// keyless drain of the same round.
    #[arg(long, value_parser = parse_count)]
    pub concurrency_keys: Option<usize>,
    /// Another build of `outbox-relay` (the previous release, say): each
    /// round also drains with its relay, right after this one's, for a
    /// before-and-after measured in one run.
    #[arg(long, env = "BENCH_BASELINE_RELAY")]
    pub baseline_relay: Option<std::path::PathBuf>,
    /// Only the endpoints' fairness run: orders fanned out to a healthy
    /// endpoint and a slow one, each with a local receiver; the healthy one's
    /// delivery latency alone and beside the slow one, and the slow one's
    /// most calls open at once against its max_in_flight.
    #[arg(long)]
    pub endpoints: bool,
    /// Only the dependencies' run: release latency (a parent's finish to
    /// its dependent's start, idle relay, `--latency-samples` pairs), a
    /// 10,000-child fan-out and a 1,000-parent fan-in, each with its time.
    #[arg(long, conflicts_with_all = ["api_only", "endpoints", "publish_only"])]
    pub workflow: bool,
    /// Only the inbound payments' run: `--inbound-events` orders paid through
    /// the API's `pay` flat out, as many paid by Stripe-signed
    /// `payment_intent.succeeded` events to `/inbound/{source}` flat out,
    /// and as many again by events at half that rate on a fixed schedule
    /// (their answers' p50 and p99); `--api-clients` loops.
    #[arg(long, conflicts_with_all = ["api_only", "endpoints", "publish_only", "workflow"])]
    pub inbound: bool,
    /// Orders in each of the `--inbound` runs.
    #[arg(long, default_value_t = 2000, value_parser = parse_count)]
    pub inbound_events: usize,
    /// Payments `--inbound` recovers by reconciling against a local Stripe
    /// event log, beside its webhooks' rate.
    #[arg(long, default_value_t = 10_000, value_parser = parse_count)]
    pub reconcile_events: usize,
    /// How long the slow endpoint's receiver takes to answer (`--endpoints`).
    #[arg(long, default_value = "25s", value_parser = order_service::config::parse_positive_duration)]
    pub slow_answer: Duration,
    /// Orders placed in each `--endpoints` run, 50 a second.
    #[arg(long, default_value_t = 500, value_parser = parse_count)]
    pub endpoint_orders: usize,
    /// Also the growth rows, after the others: the drain rate off the top of
    /// each `--growth-backlogs` backlog, placement with each
    /// `--growth-endpoints` count of endpoints subscribed, and idle
    /// enqueue-to-start latency (`--latency-samples`) with
    /// `--growth-archive` done jobs archived against an empty archive.
    #[arg(long)]
    pub growth: bool,
    /// Pending jobs behind the timed drain of each growth row, smallest first.
    #[arg(long, value_delimiter = ',', default_value = "50000,1000000", value_parser = parse_jobs)]
    pub growth_backlogs: Vec<usize>,
    /// Jobs timed off the top of each growth backlog.
    #[arg(long, default_value_t = 20_000, value_parser = parse_jobs)]
    pub growth_drained: usize,
    /// Endpoints subscribed to `order.placed` in each growth placement row.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000", value_parser = parse_endpoint_count)]
    pub growth_endpoints: Vec<usize>,
    /// Done jobs in the archive for the growth latency row.
    #[arg(long, default_value_t = 1_000_000, value_parser = parse_jobs)]
    pub growth_archive: usize,
    /// Write an SVG plot of the growth rows and the open-loop runs' p99 here.
    #[arg(long, value_name = "PATH")]
    pub plot: Option<std::path::PathBuf>,
}

/// What the drained jobs do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EffectsMode {
    /// Only `noop` jobs: the relay and the queue, nothing else.
    Noop,
    /// The `noop` drains, then one of email and webhook jobs against local sinks.
    Real,
}

impl BenchArgs {
    /// Claim loops of the ceiling at `batch`.
    pub fn ceiling_workers(&self, batch: usize) -> usize {
        // Capped like the relay's own pool (at most 64 + 4 connections), and
        // below PostgreSQL's default max_connections of 100.
        self.ceiling_workers
            .unwrap_or_else(|| self.concurrency.div_ceil(batch.max(1)).min(64))
            .max(1)
    }
}

fn parse_endpoint_count(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number of endpoints".to_owned())?;
    if !(1..=10_000).contains(&n) {
        return Err("must be between 1 and 10000".into());
    }
    Ok(n)
}

fn parse_jobs(raw: &str) -> Result<usize, String> {
    let n: usize = raw
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_owned())?;
    if !(100..=10_000_000).contains(&n) {
        return Err("must be between 100 and 10000000".into());
    }
    Ok(n)
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.endpoints {
        // The relay runs in this process; the slow calls it interrupts when
        // each run ends would log a warning apiece over the table.
        order_service::telemetry::set_default_log_filter("error");
        let fairness = endpoints::measure(&args).await?;
        println!("{}", fairness.table());
        println!("{}", serde_json::to_string(&fairness.json())?);
        return Ok(());
    }
    let admin = args.database_url.clone();
    let scratch = tokio::task::spawn_blocking(move || -> anyhow::Result<ScratchDatabase> {
        let scratch = ScratchDatabase::create(&admin, "outbox_bench")?;
        order_service::db::migrate_url(&scratch.url)?;
        Ok(scratch)
    })
    .await??;
    eprintln!(
        "bench: scratch database {} ({} jobs per run, batch {}, relay concurrency {}, ceiling loops {})",
        scratch.name,
        args.jobs,
        args.batch,
        args.concurrency,
        args.ceiling_workers(args.batch)
    );

    if args.workflow {
        for round in 1..=args.repeat {
            eprintln!("bench: round {round} of {}", args.repeat);
            let workflow = workflow::measure(&scratch.url, &args)
                .await
                .context("measuring the dependencies' release")?;
            println!("{}", workflow.summary());
            println!("{}", serde_json::to_string(&workflow.json())?);
        }
        drop(scratch);
        return Ok(());
    }
    if args.inbound {
        for round in 1..=args.repeat {
            eprintln!("bench: round {round} of {}", args.repeat);
            let inbound = inbound::measure(&scratch.url, &args)
                .await
                .context("measuring inbound payments")?;
            println!("{}", inbound.table());
            println!("{}", serde_json::to_string(&inbound.json())?);
        }
        drop(scratch);
        return Ok(());
    }
    if args.publish_only {
        for round in 1..=args.repeat {
            eprintln!("bench: round {round} of {}", args.repeat);
            match publish::measure(&scratch.url, &args, args.batch)
                .await
                .context("draining NATS publishes")?
            {
                Some(publish) => {
                    println!("{}", publish.summary());
                    println!("{}", serde_json::to_string(&publish.json())?);
                }
                None => break,
            }
        }
        drop(scratch);
        return Ok(());
    }
    let mut report = BenchReport::new(&args);
    let rounds = if args.api_only { 0 } else { args.repeat };
    for round in 1..=rounds {
        eprintln!("bench: round {round} of {}", args.repeat);
        let ceiling = ceiling::measure(&scratch.url, &args)
            .await
            .context("measuring the ceiling")?;
        eprintln!(
            "  ceiling: {:.0} jobs/s, {} transactions",
            ceiling.jobs_per_second(),
            ceiling.server.transactions
        );
        report.ceiling.push(ceiling);
        let relay = drain::measure(&scratch.url, &args, args.batch)
            .await
            .context("draining with the relay")?;
        // The transactions of each round, not only the median's: a drain
        // slowed by small outcome batches shows as more of them.
        eprintln!(
            "  relay:   {:.0} jobs/s, {} transactions",
            relay.jobs_per_second(),
            relay.server.transactions
        );
        report.relay.push(relay);
        if args.against_defaults {
            let defaults = BenchArgs {
                concurrency: order_service::worker_pool::DEFAULT_CONCURRENCY,
                batch: order_service::worker_pool::DEFAULT_BATCH_SIZE,
                ..args.clone()
            };
            let run = drain::measure(&scratch.url, &defaults, defaults.batch)
                .await
                .context("draining with the relay at its defaults")?;
            eprintln!(
                "  relay at the defaults: {:.0} jobs/s",
                run.jobs_per_second()
            );
            report.defaults.push(run);
        }
        if let Some(exe) = &args.baseline_relay {
            let baseline = drain::measure_baseline(&scratch.url, &args, args.batch, exe)
                .await
                .with_context(|| format!("draining with the baseline relay {}", exe.display()))?;
            eprintln!("  baseline relay: {:.0} jobs/s", baseline.jobs_per_second());
            report.baseline.push(baseline);
        }
        if let Some(hold) = args.pinned_horizon {
            let pinned = drain::measure_pinned(&scratch.url, &args, args.batch, Some(hold))
                .await
                .context("draining with the relay under a pinned horizon")?;
            eprintln!(
                "  relay, pinned horizon: {:.0} jobs/s",
                pinned.jobs_per_second()
            );
            report.pinned.push(pinned);
        }
        if let Some(keys) = args.concurrency_keys {
            let keyed = drain::measure_keyed(&scratch.url, &args, args.batch, keys)
                .await
                .context("draining keyed jobs with the relay")?;
            eprintln!(
                "  relay, {keys} concurrency keys: {:.0} jobs/s",
                keyed.jobs_per_second()
            );
            report.keyed.push(keyed);
        }
        if args.batch != 1 && !args.no_batch_1 {
            let ceiling1 = ceiling::measure_at(&scratch.url, &args, 1).await?;
            eprintln!(
                "  ceiling (batch 1): {:.0} jobs/s",
                ceiling1.jobs_per_second()
            );
            report.ceiling_batch1.push(ceiling1);
            let relay1 = drain::measure(&scratch.url, &args, 1).await?;
            eprintln!(
                "  relay (batch 1):   {:.0} jobs/s",
                relay1.jobs_per_second()
            );
            report.relay_batch1.push(relay1);
        }
        if args.effects == EffectsMode::Real {
            let real = real::measure(&scratch.url, &args, args.batch)
                .await
                .context("draining real effects")?;
            eprintln!(
                "  relay (real effects): {:.0} jobs/s",
                real.jobs_per_second()
            );
            report.real.push(real);
            if let Some(publish) = publish::measure(&scratch.url, &args, args.batch)
                .await
                .context("draining NATS publishes")?
            {
                eprintln!("  {}", publish.summary());
            }
        }
    }
    if args.api_clients > 0 {
        let placement = placement::measure(&scratch.url, &args)
            .await
            .context("measuring order placement")?;
        eprintln!(
            "  orders through the API: {:.0}/s",
            placement.api_orders_per_second
        );
        if let Some(loaded) = &placement.half_open {
            eprintln!(
                "  ... with {} half-open connections held: {:.0}/s",
                loaded.connections, loaded.orders_per_second
            );
        }
        report.placement = Some(placement);
    }
    let saturation = report.placement.as_ref().map(|p| p.api_orders_per_second);
    report.open_loop = open_loop::measure_all(&scratch.url, &args, saturation)
        .await
        .context("the open-loop runs")?;
    if args.latency_samples > 0 && !args.api_only {
        report.latency = Some(
            latency::measure(&scratch.url, &args)
                .await
                .context("measuring latency")?,
        );
        if args.api_clients > 0 {
            report.latency_loaded = Some(
                latency::measure_loaded(&scratch.url, &args)
                    .await
                    .context("measuring latency under API load")?,
            );
        }
    }
    if args.growth {
        report.growth = Some(
            growth::measure(&scratch.url, &args)
                .await
                .context("the growth rows")?,
        );
    }
    if let Some(path) = &args.plot {
        plot::write(path, &report)
            .with_context(|| format!("writing the plot {}", path.display()))?;
        eprintln!("bench: plot written to {}", path.display());
    }
    println!("{}", report.table());
    println!("{}", serde_json::to_string(&report.json())?);
    drop(scratch);
    Ok(())
}
