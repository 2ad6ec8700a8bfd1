//! The demo's subscribers, as endpoint rows like any operator's: two webhook
//! endpoints, each with a local receiver and a `whsec_` secret of its own
//! (`analytics` is down for its first few calls, then recovers), and, when a
//! NATS server answers on 127.0.0.1:4222, a NATS endpoint publishing to a
//! JetStream stream made for this run and deleted when it ends.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;

use super::sinks::webhook::{Answer, WebhookSink};
use order_service::db;
use order_service::effects::nats as nats_effect;
use order_service::endpoints::spec::{
    DEFAULT_MAX_IN_FLIGHT, EndpointName, EndpointUrl, EventTypes,
};
use order_service::endpoints::{
    NatsTarget, NewEndpoint, SigningSecret, StreamName, SubjectPrefix, store,
};
use order_service::sealed::Keyring;

/// The healthy webhook endpoint.
pub const ERP: &str = "shop-erp";
/// The webhook endpoint that is down for a while.
pub const ANALYTICS: &str = "analytics";
/// Calls `analytics` refuses with a 503 before it recovers: a receiver down for
/// a moment, which each delivery's own backoff rides out (too short to trip
/// its breaker, which waits for `ENDPOINT_TRIP_AFTER` of nothing but failures).
pub const ANALYTICS_DOWN_FOR: usize = 3;
/// The NATS endpoint.
pub const EVENTS: &str = "events";
/// Where the demo looks for NATS.
pub const NATS_ADDR: &str = "127.0.0.1:4222";
/// How long a NATS server gets to accept the demo's TCP connection.
const NATS_PROBE: Duration = Duration::from_millis(300);

/// A webhook endpoint, its receiver and its secret.
pub(super) struct WebhookEndpoint {
    pub(super) name: &'static str,
    pub(super) id: i64,
    pub(super) secret: SigningSecret,
    pub(super) sink: WebhookSink,
}

/// The NATS endpoint and its stream, or why there is none.
pub(super) enum Nats {
    Publishing(Box<DemoStream>),
    Skipped(String),
}

/// The stream the `events` endpoint publishes to.
pub(super) struct DemoStream {
    pub(super) url: String,
    pub(super) stream: String,
    pub(super) subject_prefix: String,
    pub(super) id: i64,
    client: async_nats::Client,
}

/// Everything the orders are delivered to.
pub(super) struct Subscribers {
    pub(super) webhooks: [WebhookEndpoint; 2],
    pub(super) nats: Nats,
}

impl Subscribers {
    /// Starts the receivers (each writing what it gets into
    /// `webhooks/<name>/`) and adds the endpoint rows.
    pub(super) async fn start(database_url: &str, webhooks: &Path) -> anyhow::Result<Subscribers> {
        let erp = WebhookSink::start([], Answer::status(200), Some(webhooks.join(ERP)))
            .await
            .context("starting shop-erp's receiver")?;
        let down = (1..=ANALYTICS_DOWN_FOR).map(|n| {
            Answer::status(503).body(format!(
                "demo receiver: down on purpose ({n} of {ANALYTICS_DOWN_FOR})"
            ))
        });
        let analytics =
            WebhookSink::start(down, Answer::status(200), Some(webhooks.join(ANALYTICS)))
                .await
                .context("starting analytics' receiver")?;
        let erp = add_webhook(database_url, ERP, erp).await?;
        let analytics = add_webhook(database_url, ANALYTICS, analytics).await?;
        let nats = match DemoStream::start(database_url).await {
            Ok(nats) => nats,
            Err(error) => Nats::Skipped(format!("{error:#}")),
        };
        Ok(Subscribers {
            webhooks: [erp, analytics],
            nats,
        })
    }

    /// Deletes the run's stream, if it made one.
    pub(super) async fn stop(self) {
        if let Nats::Publishing(stream) = self.nats {
            stream.delete().await;
        }
    }

    /// Every endpoint's name, by id.
    pub(super) fn names(&self) -> std::collections::HashMap<i64, String> {
        let mut names: std::collections::HashMap<i64, String> = self
            .webhooks
            .iter()
            .map(|w| (w.id, w.name.to_owned()))
            .collect();
        if let Some(stream) = self.stream() {
            names.insert(stream.id, EVENTS.to_owned());
        }
        names
    }

    pub(super) fn stream(&self) -> Option<&DemoStream> {
        match &self.nats {
            Nats::Publishing(stream) => Some(stream),
            Nats::Skipped(_) => None,
        }
    }
}

async fn add_webhook(
    database_url: &str,
    name: &'static str,
    sink: WebhookSink,
) -> anyhow::Result<WebhookEndpoint> {
    let secret = SigningSecret::generate().context("no randomness for an endpoint's secret")?;
    sink.verify_signatures_with(secret.expose());
    let new = NewEndpoint {
        name: EndpointName::parse(name)?,
        url: EndpointUrl::parse(sink.url().as_str(), true)?,
        event_types: EventTypes::ALL,
        rate_limit: None,
        max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        secret: secret.clone(),
        nats: None,
    };
    let id = add_row(database_url, new).await?;
    Ok(WebhookEndpoint {
        name,
        id,
        secret,
        sink,
    })
}

async fn add_row(database_url: &str, new: NewEndpoint) -> anyhow::Result<i64> {
    let url = database_url.to_owned();
    let name = new.name.to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = db::establish(&url)?;
        anyhow::Ok(store::add(&mut conn, &new, &Keyring::none())?.id)
    })
    .await?
    .with_context(|| format!("adding the endpoint {name}"))
}

impl DemoStream {
    /// A stream `DEMO_ORDERS_<random>` capturing `demo_orders_<random>.>`,
    /// made through the endpoints' own create-stream path, and the endpoint
    /// publishing to it; [`Nats::Skipped`] when nothing answers on
    /// [`NATS_ADDR`]. A random name keeps two demos (or a test) on one server
    /// apart: JetStream refuses streams whose subjects overlap.
    async fn start(database_url: &str) -> anyhow::Result<Nats> {
        let answered = tokio::time::timeout(NATS_PROBE, tokio::net::TcpStream::connect(NATS_ADDR))
            .await
            .is_ok_and(|connected| connected.is_ok());
        if !answered {
            return Ok(Nats::Skipped(format!("nothing answers on {NATS_ADDR}")));
        }
        let url = format!("nats://{NATS_ADDR}");
        let tag = format!("{:08x}", fastrand::u32(..));
        let target = NatsTarget {
            stream: StreamName::parse(&format!("DEMO_ORDERS_{tag}"))?,
            subject_prefix: SubjectPrefix::parse(&format!("demo_orders_{tag}"))?,
        };
        // The local server speaks plaintext on loopback: both opt-ins, as
        // `endpoints add --allow-http` with WEBHOOK_ALLOW_PRIVATE=true.
        let transport = nats_effect::connection::Transport {
            plaintext: true,
            allow_private: true,
        };
        let client = nats_effect::connection::connect_once(
            &url,
            &nats_effect::connection::Auth::None,
            transport,
        )
        .await?;
        nats_effect::stream::check_stream(
            client.clone(),
            &url,
            target.stream.as_str(),
            target.subject_prefix.as_str(),
            true,
        )
        .await?;
        let stream = DemoStream {
            url: url.clone(),
            stream: target.stream.as_str().to_owned(),
            subject_prefix: target.subject_prefix.as_str().to_owned(),
            id: 0,
            client,
        };
        let secret = SigningSecret::generate().context("no randomness for an endpoint's secret")?;
        let new = NewEndpoint {
            name: EndpointName::parse(EVENTS)?,
            url: EndpointUrl::parse(&url, true)?,
            event_types: EventTypes::ALL,
            rate_limit: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            secret,
            nats: Some(target),
        };
        match add_row(database_url, new).await {
            Ok(id) => Ok(Nats::Publishing(Box::new(DemoStream { id, ..stream }))),
            Err(error) => {
                stream.delete().await;
                Err(error)
            }
        }
    }

    /// Messages the stream holds now.
    pub(super) async fn messages(&self) -> anyhow::Result<u64> {
        let mut stream = jetstream::new(self.client.clone())
            .get_stream(&self.stream)
            .await
            .with_context(|| format!("looking up stream {}", self.stream))?;
        let info = stream
            .info()
            .await
            .with_context(|| format!("reading stream {}'s state", self.stream))?;
        Ok(info.state.messages)
    }

    async fn delete(self) {
        if let Err(error) = jetstream::new(self.client)
            .delete_stream(&self.stream)
            .await
        {
            eprintln!(
                "the demo's stream {} could not be deleted: {error}",
                self.stream
            );
        }
    }
}

impl Subscribers {
    /// The endpoints, one line each, as the run starts.
    pub(super) fn describe(&self) {
        println!("Endpoints (rows of the endpoints table, each with a whsec_ secret of its own):");
        for endpoint in &self.webhooks {
            let behaviour = if endpoint.name == ANALYTICS {
                format!("answers 503 to its first {ANALYTICS_DOWN_FOR} calls, then 200")
            } else {
                "answers 200".to_owned()
            };
            println!(
                "  {:<10} {}  (a local receiver that {behaviour})",
                endpoint.name,
                endpoint.sink.url()
            );
        }
        match &self.nats {
            Nats::Publishing(stream) => println!(
                "  {EVENTS:<10} {}  (stream {}, subjects {}.<event>.<order id>; made for this run, deleted at its end)",
                stream.url, stream.stream, stream.subject_prefix
            ),
            Nats::Skipped(why) => {
                println!("  NATS: skipped publishing to JetStream ({why}).");
            }
        }
    }
}
