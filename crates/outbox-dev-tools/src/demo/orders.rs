//! How the demo places its sample orders over the API's HTTP.

use std::time::Duration;

use anyhow::Context as _;

use super::samples;
use order_service::orders::Currency;

/// An order the demo placed.
#[derive(Debug, Clone)]
pub(super) struct Placed {
    pub(super) id: i64,
    pub(super) customer: String,
    pub(super) total: String,
}

/// A plain-HTTP client for talking to the API, sending the run's API key;
/// never through a proxy, since the API is on loopback.
pub(super) fn http_client(api_key: &str) -> anyhow::Result<reqwest::Client> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {api_key}"))
        .context("the API key as a header")?;
    bearer.set_sensitive(true);
    let headers = reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, bearer)]);
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(Duration::from_secs(15))
        .build()
        .context("building the HTTP client")
}

pub(super) async fn place_order(
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
