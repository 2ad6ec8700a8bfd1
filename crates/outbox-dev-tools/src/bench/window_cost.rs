//! What a payment window (`ORDER_PAYMENT_WINDOW`) costs order placement:
//! the API placing every order with an `expires_at`, and so an entry in the
//! expiry sweep's partial index, against the same API without a window, on
//! the same database, in the same run.

use std::time::Duration;

use super::orders::{ApiUnderTest, LoadRun, load, load_client, truncate};

/// A window no order of the run reaches: the cost measured is the placing
/// of it, not an expiry.
const WINDOW: Duration = Duration::from_secs(30 * 60);

/// Placement with a payment window against placement without: two servers
/// on the same database, loaded in turn, `ROUNDS` slices each, so drift on
/// a shared machine falls on both alike. Half of the run's duration in all:
/// the difference is one column and one index entry, not worth minutes.
#[derive(Debug, Clone)]
pub struct WindowCost {
    pub with_window_orders_per_second: f64,
    pub without_orders_per_second: f64,
    pub with_window_errors: u64,
    pub without_errors: u64,
}

impl WindowCost {
    const ROUNDS: u32 = 2;

    /// With a window over without: 1.0 is free.
    pub fn ratio(&self) -> f64 {
        self.with_window_orders_per_second / self.without_orders_per_second
    }
}

/// [`WindowCost`]: `plain` (the run's API, without a window) and a server
/// with a window started here.
pub(super) async fn measure(
    url: &str,
    plain: &ApiUnderTest,
    plain_client: &reqwest::Client,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<WindowCost> {
    let windowed = ApiUnderTest::with_payment_window(url, clients, WINDOW).await?;
    let windowed_client = load_client(clients, windowed.api_key.as_deref())?;
    load(
        &windowed_client,
        &windowed.endpoint(),
        clients,
        Duration::from_millis(300),
    )
    .await;
    let slice = duration / (2 * WindowCost::ROUNDS);
    let (mut with_window, mut without) = (Vec::new(), Vec::new());
    for _ in 0..WindowCost::ROUNDS {
        truncate(url).await?;
        with_window.push(load(&windowed_client, &windowed.endpoint(), clients, slice).await);
        truncate(url).await?;
        without.push(load(plain_client, &plain.endpoint(), clients, slice).await);
    }
    windowed.stop().await?;
    let rate = |runs: &[LoadRun]| {
        let ok: u64 = runs.iter().map(|r| r.ok).sum();
        let secs: f64 = runs.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        ok as f64 / secs
    };
    let errors = |runs: &[LoadRun]| runs.iter().map(|r| r.errors).sum();
    Ok(WindowCost {
        with_window_orders_per_second: rate(&with_window),
        without_orders_per_second: rate(&without),
        with_window_errors: errors(&with_window),
        without_errors: errors(&without),
    })
}
