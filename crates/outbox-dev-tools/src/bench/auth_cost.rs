//! What API keys cost order placement: the API with keys against the same
//! API with `API_AUTH=none`, on the same database, in the same run.

use std::time::Duration;

use super::orders::{ApiUnderTest, LoadRun, load, load_client, truncate};
use order_service::api::ApiAuth;

/// Placement with API keys against placement without (`API_AUTH=none`):
/// two servers on the same database, loaded in turn, `ROUNDS` slices each,
/// so drift on a shared machine falls on both alike.
#[derive(Debug, Clone)]
pub struct AuthCost {
    pub with_keys_orders_per_second: f64,
    pub without_orders_per_second: f64,
    pub with_keys_errors: u64,
    pub without_errors: u64,
}

impl AuthCost {
    const ROUNDS: u32 = 2;

    /// With keys over without: 1.0 is free.
    pub fn ratio(&self) -> f64 {
        self.with_keys_orders_per_second / self.without_orders_per_second
    }
}

/// [`AuthCost`]: `keyed`, and a server with `API_AUTH=none` started here.
pub(super) async fn measure(
    url: &str,
    keyed: &ApiUnderTest,
    keyed_client: &reqwest::Client,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<AuthCost> {
    let open = ApiUnderTest::start(url, clients, 0, Duration::from_secs(30), ApiAuth::None).await?;
    let open_client = load_client(clients, None)?;
    load(
        &open_client,
        &open.endpoint(),
        clients,
        Duration::from_millis(500),
    )
    .await;
    let slice = duration / AuthCost::ROUNDS;
    let (mut with_keys, mut without) = (Vec::new(), Vec::new());
    for _ in 0..AuthCost::ROUNDS {
        truncate(url).await?;
        with_keys.push(load(keyed_client, &keyed.endpoint(), clients, slice).await);
        truncate(url).await?;
        without.push(load(&open_client, &open.endpoint(), clients, slice).await);
    }
    open.stop().await?;
    let rate = |runs: &[LoadRun]| {
        let ok: u64 = runs.iter().map(|r| r.ok).sum();
        let secs: f64 = runs.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        ok as f64 / secs
    };
    let errors = |runs: &[LoadRun]| runs.iter().map(|r| r.errors).sum();
    Ok(AuthCost {
        with_keys_orders_per_second: rate(&with_keys),
        without_orders_per_second: rate(&without),
        with_keys_errors: errors(&with_keys),
        without_errors: errors(&without),
    })
}
