//! `outbox-relay inbox ...`: the messages received on `/inbound/{source}`,
//! and an operator's decision on a held one (audited).

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::cli::table::{Align, print_list};
use crate::cli::with_conn;
use crate::config::{
    ConfigError, DatabaseArgs, EnqueueArgs, SecretsKeyArgs, StripeApiArgs, parse_positive_duration,
};
use crate::inbox::MessageStatus;
use crate::inbox::held::{apply_held, dismiss_held};
use crate::inbox::list::{Filter, InboxMessage, list_messages};
use crate::inbox::reconcile::stripe_events::{RetryPolicy, StripeEvents};
use crate::inbox::reconcile::{Reconciler, Report};

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Received messages, newest first: what each did, and why.
    #[command(after_help = "Examples:\n  \
        outbox-relay inbox list --status held\n  \
        outbox-relay inbox list --source stripe --json")]
    List(ListArgs),
    /// Apply a held message anyway: its order's transition, event and jobs.
    Apply(DecideArgs),
    /// Dismiss a held message: its order stays as it is.
    Dismiss(DismissArgs),
    /// Fetch Stripe's events (sources with an API key) and apply those the
    /// inbox never received, as their webhooks would have.
    #[command(after_help = "Examples:\n  \
        outbox-relay inbox reconcile\n  \
        outbox-relay inbox reconcile --source stripe --since 7d --json")]
    Reconcile(ReconcileArgs),
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    enqueue: EnqueueArgs,
    #[command(flatten)]
    stripe: StripeApiArgs,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
    /// Only this source (default: every stripe source with an API key).
    #[arg(long)]
    source: Option<String>,
    /// Events created this long ago or later (Stripe keeps 30 days);
    /// default: from each source's watermark, or 72h for a first run.
    #[arg(long, value_parser = parse_positive_duration)]
    since: Option<Duration>,
    /// Print {"fetched","recovered","already","pages","sources":[…]} as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// applied, held, unmatched, ignored or dismissed.
    #[arg(long)]
    status: Option<String>,
    /// Only this source's messages.
    #[arg(long)]
    source: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    enqueue: EnqueueArgs,
    /// The message's id (the first column of `inbox list`).
    id: i64,
}

#[derive(Debug, Args)]
pub struct DismissArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The message's id (the first column of `inbox list`).
    id: i64,
}

pub async fn run(command: InboxCommand) -> anyhow::Result<()> {
    match command {
        InboxCommand::List(args) => list(args).await,
        InboxCommand::Apply(args) => apply(args).await,
        InboxCommand::Dismiss(args) => dismiss(args).await,
        InboxCommand::Reconcile(args) => reconcile(args).await,
    }
}

/// Who decided, for the audit log: the operator's login where there is one.
fn actor() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.is_empty() => format!("cli:{}", crate::text::one_line(&user, 40)),
        _ => "cli".to_owned(),
    }
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let status = args
        .status
        .as_deref()
        .map(|s| {
            s.parse::<MessageStatus>()
                .map_err(|e| ConfigError(format!("--status: {e}")))
        })
        .transpose()?;
    let filter = Filter {
        status,
        source: args.source.clone(),
        before: None,
        limit: args.limit,
    };
    let messages: Vec<InboxMessage> = with_conn(&args.db, move |conn| {
        list_messages(conn, &filter).context("reading inbox_messages")
    })
    .await?;
    print_list(
        &messages,
        args.json,
        "no inbox messages",
        &[
            ("ID", Align::Right),
            ("SOURCE", Align::Left),
            ("MESSAGE", Align::Left),
            ("TYPE", Align::Left),
            ("ORDER", Align::Right),
            ("STATUS", Align::Left),
            ("VIA", Align::Left),
            ("REASON", Align::Left),
            ("RECEIVED", Align::Left),
        ],
        |m| {
            vec![
                m.id.to_string(),
                m.source.clone(),
                crate::text::one_line(&m.message_id, 32),
                m.message_type.clone().unwrap_or_else(|| "-".into()),
                m.order_id.map_or_else(|| "-".into(), |id| id.to_string()),
                m.status.clone().unwrap_or_else(|| "-".into()),
                m.via.clone(),
                m.reason
                    .as_deref()
                    .map_or_else(|| "-".into(), |r| crate::text::one_line(r, 80)),
                m.received_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]
        },
    )
}

async fn apply(args: DecideArgs) -> anyhow::Result<()> {
    let (id, jobs) = (args.id, args.enqueue.event_jobs());
    let order_id = with_conn(&args.db, move |conn| {
        let enqueuer = crate::orders::order_enqueuer();
        Ok(apply_held(conn, &enqueuer, id, &actor(), jobs)?)
    })
    .await?;
    println!("applied inbox message {id} to order {order_id}");
    Ok(())
}

async fn dismiss(args: DismissArgs) -> anyhow::Result<()> {
    let id = args.id;
    with_conn(&args.db, move |conn| Ok(dismiss_held(conn, id, &actor())?)).await?;
    println!("dismissed inbox message {id}; its order is unchanged");
    Ok(())
}

async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    let keys = args.secrets.keyring()?;
    let events = StripeEvents::new(&args.stripe.stripe_api_base, RetryPolicy::default())
        .map_err(|e| ConfigError(format!("STRIPE_API_BASE: {e:#}")))?;
    let pool = crate::db::build_pool(
        &args.db.database_url,
        &crate::db::PoolOptions {
            size: 2,
            ..crate::db::PoolOptions::default()
        },
    );
    let reconciler = Reconciler {
        pool,
        events,
        keys,
        enqueuer: crate::orders::order_enqueuer(),
        max_attempts: args.enqueue.max_attempts,
    };
    let outcomes = match &args.source {
        Some(name) => vec![(name.clone(), reconciler.source(name, args.since).await)],
        None => {
            let outcomes = reconciler
                .every_source(args.since)
                .await
                .context("reading the sources")?;
            if outcomes.is_empty() {
                anyhow::bail!(
                    "no stripe source has an API key: give one with `outbox-relay sources \
                     set-api-key NAME --api-key-file PATH`"
                );
            }
            outcomes
        }
    };
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for (source, outcome) in outcomes {
        match outcome {
            Ok(report) => reports.push(report),
            Err(error) => failures.push(format!("{source}: {error}")),
        }
    }
    if args.json {
        let total = |f: fn(&Report) -> u64| reports.iter().map(f).sum::<u64>();
        println!(
            "{}",
            json!({
                "fetched": total(|r| r.fetched),
                "recovered": total(|r| r.recovered),
                "already": total(|r| r.already),
                "pages": total(|r| r.pages),
                "sources": reports,
            })
        );
    } else {
        for r in &reports {
            println!(
                "{}: fetched {} events in {} pages since {}: recovered {}, already in the inbox {}",
                r.source,
                r.fetched,
                r.pages,
                r.since.map_or_else(
                    || "-".to_owned(),
                    |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
                ),
                r.recovered,
                r.already
            );
        }
    }
    match failures.len() {
        0 => Ok(()),
        _ => Err(anyhow::anyhow!(failures.join("\n"))),
    }
}
