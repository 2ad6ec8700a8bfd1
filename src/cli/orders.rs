//! `outbox-relay orders ...`: an order as operators look into it.

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cli::table::{Align, Table};
use crate::cli::with_conn;
use crate::config::DatabaseArgs;
use crate::orders::load_ledger;

#[derive(Debug, Subcommand)]
pub enum OrdersCommand {
    /// The order's effect ledger: each job, and what its peer answered (the
    /// SMTP reply, the webhook's status and answer digest, the stream
    /// sequence, the receipt's digest). As `GET /orders/{id}/effects`.
    #[command(after_help = "Examples:\n  \
        outbox-relay orders effects 42\n  \
        outbox-relay orders effects 42 --json")]
    Effects(EffectsArgs),
}

#[derive(Debug, Args)]
pub struct EffectsArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The order's id.
    #[arg(value_parser = clap::value_parser!(i64).range(1..))]
    id: i64,
    /// Print the JSON `GET /orders/{id}/effects` answers instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(command: OrdersCommand) -> anyhow::Result<()> {
    match command {
        OrdersCommand::Effects(args) => effects(args).await,
    }
}

async fn effects(args: EffectsArgs) -> anyhow::Result<()> {
    let id = args.id;
    let ledger = with_conn(&args.db, move |conn| {
        load_ledger(conn, id).context("reading the effect ledger")
    })
    .await?
    .with_context(|| format!("order {id} does not exist"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ledger)?);
        return Ok(());
    }
    if ledger.effects.is_empty() {
        println!("order {id} has no jobs");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("JOB", Align::Right),
        ("KIND", Align::Left),
        ("STATUS", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("TOKEN", Align::Right),
        ("ANSWER", Align::Left),
    ]);
    for entry in &ledger.effects {
        table.push(vec![
            entry.job_id.to_string(),
            entry.kind.clone(),
            entry.status.clone(),
            entry.attempts.to_string(),
            entry
                .lease_token
                .map_or_else(|| "-".to_owned(), |t| t.to_string()),
            entry.answer_summary(),
        ]);
    }
    print!("{table}");
    Ok(())
}
