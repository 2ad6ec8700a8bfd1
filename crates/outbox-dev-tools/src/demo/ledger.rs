//! The part of the summary that shows one order's effect ledger, read back
//! through `GET /orders/{id}/effects`: each job, its final lease token, and
//! what its peer answered.

use anyhow::Context as _;
use order_service::orders::EffectLedger;

/// Prints the ledger of order `order_id`, as the API at `api_url` answers it
/// to `client` (which sends the demo's key), as a compact table.
pub(super) async fn print_ledger(
    client: &reqwest::Client,
    api_url: &str,
    order_id: i64,
) -> anyhow::Result<()> {
    let url = format!("{api_url}/orders/{order_id}/effects");
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        anyhow::bail!("GET {url} answered {status}");
    }
    let ledger: EffectLedger = response
        .json()
        .await
        .with_context(|| format!("the answer of GET {url}"))?;
    println!();
    println!(
        "Effect ledger of order #{order_id} (GET /orders/{order_id}/effects, or `orders effects {order_id}`):"
    );
    println!(
        "  {:>5} {:<18} {:<9} {:>3} {:>6}  ANSWER",
        "JOB", "KIND", "STATUS", "TRY", "TOKEN"
    );
    for entry in &ledger.effects {
        println!(
            "  {:>5} {:<18} {:<9} {:>3} {:>6}  {}",
            entry.job_id,
            entry.kind,
            entry.status,
            entry.attempts,
            entry
                .lease_token
                .map_or_else(|| "-".to_owned(), |t| t.to_string()),
            entry.answer_summary()
        );
    }
    Ok(())
}
