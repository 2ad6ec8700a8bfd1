//! The worker of [`OrderPublish`]: loads the endpoint, the order and the
//! event, and publishes the webhook's body to the endpoint's stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox_core::statements::ClaimedJob;
use outbox_core::worker::{EffectError, EffectResult, JobContext, Worker};
use serde::Deserialize as _;
use tracing::Instrument as _;

use super::attempt_log;
use super::connection::NatsConnections;
use super::loader::{BatchLoader, Prefetched, Rendered};
use super::outcome::{ErrorClass, Published, failure};
use super::{Acked, PUBLISH_TIMEOUT, Publication, PublishCounters, classify_publish, subject};
use crate::db::{PgPool, run_blocking};
use crate::effects::ledger::{EffectAnswer, record_effect};
use crate::effects::webhook::idempotency_key;
use crate::endpoints::EndpointCredentials;
use crate::endpoints::attempts::NewAttempt;
use crate::endpoints::nats_credentials::{self, Unusable};
use crate::orders::jobs::OrderPublish;
use crate::orders::{EndpointId, EventId};
use crate::schema::endpoints;
use crate::sealed::Keyring;

/// How long a worker trusts an endpoint's row: every job of an endpoint
/// needs its stream and prefix, which change only by an operator's hand.
const TARGET_TTL: Duration = Duration::from_secs(5);

/// How long a publish waits for a connection that is not up before it gives
/// its slot back: publishing into a dead connection would hold the slot for
/// [`PUBLISH_TIMEOUT`] per attempt, and enough of them would starve the
/// relay's other jobs (webhooks, emails) for as long as NATS is down.
const CONNECTED_GRACE: Duration = Duration::from_secs(1);

/// How old a connection's last error may be to be named in a publish's
/// `last_error`: the reconnection attempts are at most seconds apart.
const RECENT_ERROR: Duration = Duration::from_secs(30);

/// How long a read made as a job's claim returned waits for the job: a job
/// claimed ahead of the slots starts within milliseconds, and one that never
/// starts here (its lease lost, the relay stopping) leaves its read behind,
/// dropped by the next claim after this.
const PREFETCH_KEPT: Duration = Duration::from_secs(60);

/// Publishes order events to NATS endpoints over the relay's shared
/// connections.
#[derive(Debug, Clone)]
pub struct PublishWorker {
    orders: BatchLoader,
    pool: PgPool,
    connections: NatsConnections,
    /// Opens the endpoints' sealed credentials.
    secrets: Keyring,
    targets: Arc<Mutex<HashMap<EndpointId, Cached>>>,
    /// One reader of each endpoint's row at a time: a relay starting on a
    /// backlog, or an endpoint's row going stale under load, would otherwise
    /// read it once per job then running (106 reads in one drain of 20,000).
    loading: Arc<Mutex<HashMap<EndpointId, Arc<tokio::sync::Mutex<()>>>>>,
    /// Reads started as the jobs' claim returned, by job id, and when.
    prefetched: Arc<Mutex<HashMap<i64, (Instant, Prefetched)>>>,
}

impl PublishWorker {
    pub fn new(pool: PgPool, connections: NatsConnections, secrets: Keyring) -> PublishWorker {
        PublishWorker {
            orders: BatchLoader::new(pool.clone()),
            pool,
            connections,
            secrets,
            targets: Arc::default(),
            loading: Arc::default(),
            prefetched: Arc::default(),
        }
    }
}

/// An endpoint's row and when it was read.
type Cached = (Instant, Arc<Target>);

/// Where an endpoint's events go.
#[derive(Debug, Clone)]
struct Target {
    id: EndpointId,
    name: String,
    url: String,
    stream: Option<String>,
    subject_prefix: Option<String>,
    /// Added with `--allow-http`: a server without TLS is accepted.
    plaintext: bool,
    /// Its own credentials (else the relay's `NATS_CREDENTIALS`), or why
    /// the stored ones cannot be read.
    credentials: Result<Option<EndpointCredentials>, Unusable>,
    /// Its outcomes' counters.
    counters: Arc<PublishCounters>,
}

impl Worker<OrderPublish> for PublishWorker {
    async fn work(&self, args: OrderPublish, ctx: JobContext) -> EffectResult {
        let span = crate::effects::order_loader::order_span(args.order_id);
        self.publish(args, ctx).instrument(span).await
    }

    /// Reads the orders and events of the claim's publish jobs in one
    /// statement, now: each job then finds its body ready as it starts,
    /// rather than asking for it then, with the jobs that happen to start at
    /// the same moment (one read per claim, where jobs started one by one as
    /// slots freed were read a few at a time).
    fn claimed(&self, jobs: &[&ClaimedJob]) {
        let (ids, pairs): (Vec<i64>, Vec<_>) = jobs
            .iter()
            .filter_map(|job| {
                // A payload that does not decode fails in `work`, saying why.
                let args = OrderPublish::deserialize(&job.payload).ok()?;
                Some((job.id, (args.order_id, EventId::new(args.event_id))))
            })
            .unzip();
        if pairs.is_empty() {
            return;
        }
        let reads = self.orders.prefetch(pairs);
        let now = Instant::now();
        if let Ok(mut prefetched) = self.prefetched.lock() {
            prefetched.retain(|_, (at, _)| now.duration_since(*at) < PREFETCH_KEPT);
            prefetched.extend(
                ids.into_iter()
                    .zip(reads.into_iter().map(|read| (now, read))),
            );
        }
    }
}

impl PublishWorker {
    async fn publish(&self, args: OrderPublish, ctx: JobContext) -> EffectResult {
        let target = self.target(EndpointId::new(args.endpoint_id)).await?;
        let (Some(stream), Some(prefix)) = (&target.stream, &target.subject_prefix) else {
            return Err(EffectError::permanent(format!(
                "permanent: endpoint {:?} ({}) is not a NATS endpoint",
                target.name, target.url
            )));
        };
        let Rendered { event_type, body } = self.body_of(&args, ctx.id()).await?;
        let message_id = idempotency_key(ctx.id());
        let publication = Publication {
            subject: subject(prefix, &event_type, args.order_id.get()),
            message_id: &message_id,
            stream,
            traceparent: crate::trace_context::current_traceparent(),
            body,
        };
        let started_at = chrono::Utc::now();
        let started = Instant::now();
        let result = self.send(&target, stream, &publication).await;
        target.counters.count(&result);
        log_attempt(&target, &ctx, started_at, started.elapsed(), &result);
        let Acked {
            published,
            sequence,
            stream: acked_by,
        } = result?;
        if published != Published::New {
            tracing::info!(
                endpoint = %target.name,
                subject = %publication.subject,
                outcome = published.as_str(),
                "the stream already had this event; done"
            );
        }
        Ok(Some(record_effect(
            ctx.id(),
            EffectAnswer::Publish {
                endpoint: target.name.clone(),
                webhook_id: message_id,
                stream: acked_by.unwrap_or_else(|| stream.clone()),
                stream_seq: sequence,
                duplicate: published != Published::New,
            },
        )))
    }

    /// The job's body: the read its claim started, or else one of its own.
    async fn body_of(&self, args: &OrderPublish, job_id: i64) -> Result<Rendered, EffectError> {
        let prefetched = self
            .prefetched
            .lock()
            .ok()
            .and_then(|mut prefetched| prefetched.remove(&job_id));
        if let Some((_, read)) = prefetched
            && let Some(loaded) = read.get().await
        {
            return loaded;
        }
        self.orders
            .load(args.order_id, EventId::new(args.event_id))
            .await
    }

    /// The publish over the connection of the endpoint's server and
    /// credentials.
    async fn send(
        &self,
        target: &Target,
        stream: &str,
        publication: &Publication<'_>,
    ) -> Result<Acked, EffectError> {
        let own = target.credentials.as_ref().map_err(|why| {
            // A missing SECRETS_KEY is the relay's configuration, not the
            // job's: retried, so that the publish goes once the key is set.
            let class = if why.is_missing_key() {
                ErrorClass::Retryable
            } else {
                ErrorClass::Permanent
            };
            failure(class, &target.name, stream, &why.to_string())
        })?;
        let connection = self
            .connections
            .get(&target.url, target.plaintext, own.as_ref())
            .await
            .map_err(|e| failure(ErrorClass::Retryable, &target.name, stream, &e.to_string()))?;
        if connection.connected_within(CONNECTED_GRACE).await {
            classify_publish(&connection, &target.name, publication).await
        } else {
            Err(not_connected(&connection, &target.name, stream))
        }
    }
}

/// Logs the attempt in `delivery_attempts`, with the job's outcome whatever it
/// is (see [`attempt_log`](super::attempt_log)).
fn log_attempt(
    target: &Target,
    ctx: &JobContext,
    started_at: chrono::DateTime<chrono::Utc>,
    duration: Duration,
    result: &Result<Acked, EffectError>,
) {
    let (outcome, excerpt, stream_sequence) = match result {
        Ok(acked) => (
            "ok",
            Some(match acked.sequence {
                Some(sequence) => format!("{}: sequence {sequence}", acked.published.as_str()),
                None => acked.published.as_str().to_owned(),
            }),
            acked.sequence.and_then(|s| i64::try_from(s).ok()),
        ),
        Err(error) => (
            ErrorClass::of(error).as_str(),
            Some(error.to_string()),
            None,
        ),
    };
    let attempt = NewAttempt {
        job_id: ctx.id(),
        endpoint_id: target.id,
        attempt: ctx.attempt(),
        started_at,
        duration,
        status_code: None,
        outcome,
        excerpt,
        stream_sequence,
    };
    ctx.write_with_outcome(attempt_log::log_attempt(&attempt));
}

impl PublishWorker {
    /// The endpoint's row, at most [`TARGET_TTL`] old.
    async fn target(&self, endpoint_id: EndpointId) -> Result<Arc<Target>, EffectError> {
        if let Some(target) = self.cached_target(endpoint_id) {
            return Ok(target);
        }
        let reader = self
            .loading
            .lock()
            .ok()
            .map(|mut loading| Arc::clone(loading.entry(endpoint_id).or_default()));
        let _reading = match &reader {
            Some(reader) => Some(reader.lock().await),
            None => None,
        };
        // Read by the job that held the lock while this one waited.
        if let Some(target) = self.cached_target(endpoint_id) {
            return Ok(target);
        }
        let target = Arc::new(self.load_target(endpoint_id).await?);
        if let Ok(mut targets) = self.targets.lock() {
            targets.insert(endpoint_id, (Instant::now(), Arc::clone(&target)));
        }
        Ok(target)
    }

    fn cached_target(&self, endpoint_id: EndpointId) -> Option<Arc<Target>> {
        let targets = self.targets.lock().ok()?;
        let (at, target) = targets.get(&endpoint_id)?;
        (at.elapsed() < TARGET_TTL).then(|| Arc::clone(target))
    }

    async fn load_target(&self, endpoint_id: EndpointId) -> Result<Target, EffectError> {
        let secrets = self.secrets.clone();
        run_blocking(&self.pool, move |conn| {
            let row = endpoints::table
                .find(endpoint_id.get())
                .select((
                    endpoints::name,
                    endpoints::url,
                    endpoints::stream,
                    endpoints::subject_prefix,
                    endpoints::allow_http,
                ))
                .first::<(String, String, Option<String>, Option<String>, bool)>(conn)
                .optional()?;
            let Some((name, url, stream, subject_prefix, plaintext)) = row else {
                return Ok(None);
            };
            let credentials = nats_credentials::load(conn, endpoint_id.get(), &secrets)?;
            Ok(Some(Target {
                id: endpoint_id,
                counters: Arc::new(PublishCounters::new(&name)),
                name,
                url,
                stream,
                subject_prefix,
                plaintext,
                credentials,
            }))
        })
        .await
        .map_err(|e| EffectError::retryable(format!("loading endpoint {endpoint_id}: {e}")))?
        .ok_or_else(|| {
            EffectError::permanent(format!(
                "permanent: endpoint {endpoint_id} no longer exists"
            ))
        })
    }
}

/// A publish not sent because the connection is down: nothing reached the
/// server, so the retry cannot duplicate anything. It is tried again no
/// sooner than a timed-out publish would have been, so that an outage
/// spends attempts at the same pace as before while freeing the slot.
fn not_connected(
    connection: &super::connection::Connection,
    endpoint: &str,
    stream: &str,
) -> EffectError {
    let message = failure(
        ErrorClass::Retryable,
        endpoint,
        stream,
        &format!(
            "not connected to {} (connection {}{}); nothing was sent, retried once it is back",
            connection.url,
            connection.state(),
            connection
                .recent_server_error(RECENT_ERROR)
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default()
        ),
    )
    .to_string();
    EffectError::Retryable {
        message,
        retry_after: Some(PUBLISH_TIMEOUT),
    }
}
