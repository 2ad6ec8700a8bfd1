//! The part of the summary about the endpoints: what each got, how often it
//! was called and refused, whether its requests verify with its own secret
//! (and not with the other's), the failing endpoint's recovery, the walked
//! orders' events as that endpoint saw them, and the NATS stream's count.

use super::endpoints::{ANALYTICS, ANALYTICS_DOWN_FOR, ERP, EVENTS, Nats, WebhookEndpoint};
use super::progress::JobState;
use super::sinks::webhook::Recorded;
use super::{Demo, Placed};
use order_service::effects::signature::Secrets;

/// An endpoint's delivery jobs: done, and all.
fn deliveries(jobs: &[JobState], endpoint_id: i64) -> (usize, usize) {
    let mine: Vec<&JobState> = jobs
        .iter()
        .filter(|j| j.endpoint_id() == Some(endpoint_id))
        .collect();
    let done = mine.iter().filter(|j| j.status == "done").count();
    (done, mine.len())
}

fn accepted(request: &Recorded) -> bool {
    (200..300).contains(&request.answered)
}

impl Demo<'_> {
    pub(super) fn summarize_endpoints(
        &self,
        jobs: &[JobState],
        placed: &[Placed],
        nats_messages: Option<anyhow::Result<u64>>,
    ) {
        let webhooks = &self.subscribers.webhooks;
        println!();
        println!(
            "  {:<10} {:>10} {:>6} {:>8}  SIGNATURES",
            "ENDPOINT", "DELIVERED", "CALLS", "REFUSED"
        );
        for (endpoint, other) in [(&webhooks[0], &webhooks[1]), (&webhooks[1], &webhooks[0])] {
            let requests = endpoint.sink.requests();
            let (done, all) = deliveries(jobs, endpoint.id);
            let refused = requests.iter().filter(|r| !accepted(r)).count();
            println!(
                "  {:<10} {:>10} {:>6} {:>8}  {}",
                endpoint.name,
                format!("{done} of {all}"),
                requests.len(),
                refused,
                signatures(endpoint, other, &requests)
            );
        }
        match &self.subscribers.nats {
            Nats::Publishing(stream) => {
                let (done, all) = deliveries(jobs, stream.id);
                let held = match nats_messages {
                    Some(Ok(n)) => format!(
                        "stream {} holds {n} message{}: one per event",
                        stream.stream,
                        if n == 1 { "" } else { "s" }
                    ),
                    Some(Err(error)) => format!("stream {}: {error:#}", stream.stream),
                    None => format!("stream {}", stream.stream),
                };
                println!(
                    "  {EVENTS:<10} {:>10} {:>6} {:>8}  {held}",
                    format!("{done} of {all}"),
                    "",
                    ""
                );
            }
            Nats::Skipped(why) => println!("  NATS: skipped ({why}): nothing was published."),
        }

        self.tell_recovery(placed);
    }

    /// How `analytics` failed and came back, and the walked orders' events
    /// as it received them.
    fn tell_recovery(&self, placed: &[Placed]) {
        let Some(analytics) = self
            .subscribers
            .webhooks
            .iter()
            .find(|w| w.name == ANALYTICS)
        else {
            return;
        };
        let requests = analytics.sink.requests();
        let refused = requests.iter().filter(|r| !accepted(r)).count();
        let recovered = requests
            .iter()
            .rposition(|r| !accepted(r))
            .is_some_and(|last| requests[last + 1..].iter().any(accepted));
        println!();
        if refused > 0 {
            println!(
                "  {ANALYTICS} was down on purpose: it answered 503 to its first {ANALYTICS_DOWN_FOR} \
                 calls{}; the relay retried them with backoff, and {ERP} was never held back.",
                if recovered {
                    ", then recovered"
                } else {
                    " and has not recovered yet"
                }
            );
        }
        for order in placed.iter().take(2) {
            let arrivals: Vec<String> = requests
                .iter()
                .filter_map(|r| arrival(r, order.id))
                .collect();
            if arrivals.len() > 1 {
                println!(
                    "  Order #{}'s events at {ANALYTICS}, as they arrived: {}",
                    order.id,
                    arrivals.join(" → ")
                );
            }
        }
        if placed.len() >= 2 {
            println!(
                "  An order's events to one endpoint share an ordering key: a refused delivery \
                 holds back that order's later events to that endpoint only."
            );
        }
    }
}

/// `2:order.paid ✓` when `request` carries an event of order `order_id`.
fn arrival(request: &Recorded, order_id: i64) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(&request.body).ok()?;
    let id = body
        .pointer("/data/order/id")
        .or_else(|| body.pointer("/order/id"))
        .and_then(serde_json::Value::as_i64)?;
    if id != order_id {
        return None;
    }
    let seq = body
        .pointer("/data/seq")
        .and_then(serde_json::Value::as_i64)
        .map(|s| format!("{s}:"))
        .unwrap_or_default();
    let kind = body["type"].as_str().unwrap_or("order.placed");
    let mark = if accepted(request) {
        "✓".to_owned()
    } else {
        format!("✗{}", request.answered)
    };
    Some(format!("{seq}{kind} {mark}"))
}

/// `9 of 9 verify with shop-erp's secret, 0 with analytics'`.
fn signatures(
    endpoint: &WebhookEndpoint,
    other: &WebhookEndpoint,
    requests: &[Recorded],
) -> String {
    let own = requests
        .iter()
        .filter(|r| r.signature_valid == Some(true))
        .count();
    let crossed = Secrets::parse(other.secret.expose()).map_or(0, |secrets| {
        requests
            .iter()
            .filter(|r| r.verifies_with(&secrets))
            .count()
    });
    format!(
        "{own} of {} verify with {} secret, {crossed} with {}",
        requests.len(),
        possessive(endpoint.name),
        possessive(other.name)
    )
}

/// `shop-erp's`, `analytics'`.
fn possessive(name: &str) -> String {
    if name.ends_with('s') {
        format!("{name}'")
    } else {
        format!("{name}'s")
    }
}
