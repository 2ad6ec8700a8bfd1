//! The service's job types: what each job carries, and its kind.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use outbox_core::outbox::{Enqueuer, JobOptions, NewJob};
use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

/// The email about an order event (the confirmation for `order.placed`); no
/// event for jobs enqueued before events existed: the confirmation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmationEmail {
    /// The order the email is about.
    pub order_id: i64,
    /// The event the email announces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<i64>,
}

impl JobArgs for ConfirmationEmail {
    const KIND: &'static str = "confirmation_email";
}

/// The PDF receipt of an order, stored in `receipts` when the job completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptPdf {
    /// The order to render.
    pub order_id: i64,
    /// Accepted, and ignored, for jobs enqueued with an event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<i64>,
}

impl JobArgs for ReceiptPdf {
    const KIND: &'static str = "receipt_pdf";
}

/// The delivery of an order event to one webhook endpoint; no event: the
/// original `order.placed` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderWebhook {
    /// The order the event belongs to.
    pub order_id: i64,
    /// The event to deliver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<i64>,
    /// The endpoint to deliver to; none for a job queued before endpoints
    /// existed, which goes to the endpoint named `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<i64>,
}

impl JobArgs for OrderWebhook {
    const KIND: &'static str = "order_webhook";
}

/// A notice about the endpoints themselves (`endpoint.disabled`) to one
/// endpoint subscribed to it: the body is made when the notice is queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointNotice {
    /// The endpoint told.
    pub endpoint_id: i64,
    /// The event, as it is sent (`{"type","id","timestamp","data"}`).
    pub event: serde_json::Value,
}

impl JobArgs for EndpointNotice {
    const KIND: &'static str = "endpoint_notice";
}

/// An order event published to a NATS JetStream endpoint (see
/// [`super::nats`]); enqueued with the ordering key
/// `endpoint:<endpoint id>:order:<order id>`, so an order's subjects reach the
/// stream in event order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderPublish {
    /// The order the event belongs to.
    pub order_id: i64,
    /// The event to publish.
    pub event_id: i64,
    /// The `nats://` endpoint to publish to.
    pub endpoint_id: i64,
}

impl JobArgs for OrderPublish {
    const KIND: &'static str = "order_publish";
}

impl OrderPublish {
    /// `endpoint:<endpoint id>:order:<order id>`, the key every delivery of
    /// an order to one endpoint shares.
    pub fn ordering_key(&self) -> String {
        format!("endpoint:{}:order:{}", self.endpoint_id, self.order_id)
    }
}

/// Succeeds at once, whatever it carries (benchmarks, smoke tests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Noop(pub serde_json::Value);

impl JobArgs for Noop {
    const KIND: &'static str = "noop";
}

/// The service's typed job as the row the outbox inserts. The arguments are
/// plain structs, which always serialize; a failure would be a Diesel
/// serialization error, rolling back the caller's transaction.
pub fn new_job<A: JobArgs>(args: &A, options: &JobOptions) -> diesel::QueryResult<NewJob> {
    NewJob::for_args(args, options)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))
}

/// A job row as this service writes it: the queue's columns and `order_id`,
/// which the service added to `jobs` and the queue does not know.
#[derive(Insertable)]
#[diesel(table_name = crate::schema::jobs)]
struct OrderJobRow<'a> {
    order_id: Option<i64>,
    kind: &'a str,
    payload: &'a serde_json::Value,
    run_after: Option<DateTime<Utc>>,
    max_attempts: i32,
    ordering_key: Option<&'a str>,
    blocked: bool,
    trace_context: Option<&'a serde_json::Value>,
    concurrency_key: Option<&'a str>,
}

/// The service's enqueuer: the queue's rows, with `order_id` written
/// (`insert_order_jobs`); NOTIFY in the transaction. The API adds its
/// waker to it ([`Enqueuer::wake_after_commit`]).
pub fn order_enqueuer() -> Enqueuer {
    Enqueuer::new().insert_with(insert_order_jobs)
}

/// The service's [`InsertJobs`](outbox_core::outbox::InsertJobs): the
/// queue's rows with `order_id` set from each job's `order_id` argument,
/// which every order job carries. One multi-row INSERT, as the queue's own.
fn insert_order_jobs(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    let rows: Vec<OrderJobRow<'_>> = new_jobs
        .iter()
        .map(|job| OrderJobRow {
            order_id: job
                .payload()
                .get("order_id")
                .and_then(serde_json::Value::as_i64),
            kind: job.kind(),
            payload: job.payload(),
            run_after: job.run_after_value(),
            max_attempts: job.max_attempts_value(),
            ordering_key: job.ordering_key_value(),
            blocked: job.is_blocked(),
            trace_context: job.trace_context_value(),
            concurrency_key: job.concurrency_key_value(),
        })
        .collect();
    diesel::insert_into(crate::schema::jobs::table)
        .values(&rows)
        .returning(crate::schema::jobs::id)
        .get_results(conn)
}

/// The kinds this service performs: what `--kinds` accepts and what a relay
/// claims by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EffectKind {
    /// [`ConfirmationEmail`].
    ConfirmationEmail,
    /// [`ReceiptPdf`].
    ReceiptPdf,
    /// [`OrderWebhook`].
    OrderWebhook,
    /// [`EndpointNotice`].
    EndpointNotice,
    /// [`OrderPublish`].
    OrderPublish,
    /// [`Noop`].
    Noop,
}

impl EffectKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [EffectKind; 6] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
        EffectKind::EndpointNotice,
        EffectKind::OrderPublish,
        EffectKind::Noop,
    ];

    /// The kinds an order placement enqueues, one job each, in this order.
    pub const ORDER: [EffectKind; 3] = [
        EffectKind::ConfirmationEmail,
        EffectKind::ReceiptPdf,
        EffectKind::OrderWebhook,
    ];

    /// The name in `jobs.kind`: its job type's `KIND`.
    pub const fn as_str(self) -> &'static str {
        match self {
            EffectKind::ConfirmationEmail => ConfirmationEmail::KIND,
            EffectKind::ReceiptPdf => ReceiptPdf::KIND,
            EffectKind::OrderWebhook => OrderWebhook::KIND,
            EffectKind::EndpointNotice => EndpointNotice::KIND,
            EffectKind::OrderPublish => OrderPublish::KIND,
            EffectKind::Noop => Noop::KIND,
        }
    }
}

impl FromStr for EffectKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EffectKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = EffectKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown job kind {s:?} (known: {})", known.join(", "))
            })
    }
}

impl fmt::Display for EffectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
