//! The jobs an order queues, typed: each carries its order as an
//! [`OrderId`] argument, which is also how the job's `jobs.order_id` is set
//! ([`order_enqueuer`]). The relay's workers for them are in
//! [`crate::effects`].

use diesel::prelude::*;
use outbox_core::outbox::{Enqueuer, JobOptions, NewJob};
use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

use super::OrderId;
use crate::db::{PrepareOnce, prepare_insert};
use crate::kinds::EffectKind;

/// The confirmation of a placed order. A job queued before `order_email`
/// existed may name a later event, and sends that event's email.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmationEmail {
    /// The order the email is about.
    pub order_id: OrderId,
    /// The event the email announces.
    pub event_id: i64,
}

impl JobArgs for ConfirmationEmail {
    const KIND: &'static str = EffectKind::ConfirmationEmail.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

/// The email of an order's later event: shipped, cancelled, refunded,
/// expired (the template follows the event's type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderEmail {
    /// The order the email is about.
    pub order_id: OrderId,
    /// The event the email announces.
    pub event_id: i64,
}

impl JobArgs for OrderEmail {
    const KIND: &'static str = EffectKind::OrderEmail.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

/// The PDF receipt of an order, stored in `receipts` when the job completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptPdf {
    /// The order to render.
    pub order_id: OrderId,
}

impl JobArgs for ReceiptPdf {
    const KIND: &'static str = EffectKind::ReceiptPdf.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

/// The delivery of an order event to one webhook endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderWebhook {
    /// The order the event belongs to.
    pub order_id: OrderId,
    /// The event to deliver.
    pub event_id: i64,
    /// The endpoint to deliver to; none for a delivery queued while no
    /// endpoint existed, which goes to the endpoint named `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<i64>,
}

impl JobArgs for OrderWebhook {
    const KIND: &'static str = EffectKind::OrderWebhook.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

/// An order event published to a NATS JetStream endpoint (see
/// [`crate::effects::nats`]); enqueued with the ordering key
/// `endpoint:<endpoint id>:order:<order id>`, so an order's subjects reach the
/// stream in event order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderPublish {
    /// The order the event belongs to.
    pub order_id: OrderId,
    /// The event to publish.
    pub event_id: i64,
    /// The `nats://` endpoint to publish to.
    pub endpoint_id: i64,
}

impl JobArgs for OrderPublish {
    const KIND: &'static str = EffectKind::OrderPublish.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

impl OrderPublish {
    /// `endpoint:<endpoint id>:order:<order id>`, the key every delivery of
    /// an order to one endpoint shares.
    pub fn ordering_key(&self) -> String {
        super::delivery_key(self.endpoint_id, self.order_id.get())
    }
}

/// The deliveries of one order event to more endpoints than its transaction
/// writes itself (`FANOUT_INLINE`): the endpoints subscribed when the event
/// happened, written as delivery jobs after commit ([`super::expand_fanout`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderFanout {
    /// The order the event belongs to.
    pub order_id: OrderId,
    /// The event to deliver.
    pub event_id: i64,
    /// `max_attempts` of each delivery.
    pub max_attempts: i32,
    /// Enabled http(s) endpoints subscribed to the event, by id, ascending.
    #[serde(with = "id_runs")]
    pub webhook_endpoints: Vec<i64>,
    /// Enabled NATS endpoints subscribed to the event, by id, ascending.
    #[serde(with = "id_runs")]
    pub nats_endpoints: Vec<i64>,
    /// `default`, when its delivery queues behind the order's deliveries
    /// queued while no endpoint existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_behind_unaddressed: Option<i64>,
}

impl JobArgs for OrderFanout {
    const KIND: &'static str = EffectKind::OrderFanout.as_str();

    fn extend_job(&self, job: NewJob) -> NewJob {
        job.with_extension(self.order_id)
    }
}

/// Ascending ids as runs of consecutive ones, `[[first, last], …]`: the
/// endpoints of a fan-out are mostly one run, so the job the order's
/// transaction writes stays a few bytes however many endpoints it names.
mod id_runs {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(ids: &[i64], serializer: S) -> Result<S::Ok, S::Error> {
        let mut runs: Vec<[i64; 2]> = Vec::new();
        for &id in ids {
            match runs.last_mut() {
                Some(run) if run[1].checked_add(1) == Some(id) => run[1] = id,
                _ => runs.push([id, id]),
            }
        }
        serializer.collect_seq(runs)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i64>, D::Error> {
        let runs = Vec::<[i64; 2]>::deserialize(deserializer)?;
        let mut ids = Vec::new();
        for [first, last] in runs {
            let len = last
                .checked_sub(first)
                .and_then(|n| usize::try_from(n).ok());
            match len {
                Some(n) if n < 1_000_000 => ids.extend(first..=last),
                _ => return Err(D::Error::custom(format!("bad id run [{first}, {last}]"))),
            }
        }
        Ok(ids)
    }
}

/// The service's typed job as the row the outbox inserts. The arguments are
/// plain structs, which always serialize; a failure would be a Diesel
/// serialization error, rolling back the caller's transaction.
pub fn new_job<A: JobArgs>(args: &A, options: &JobOptions) -> diesel::QueryResult<NewJob> {
    NewJob::for_args(args, options)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))
}

outbox_core::queue_row!(QueueRow for crate::schema::jobs);

/// A job row as this service writes it: the queue's columns and `order_id`,
/// which the service added to `jobs` and the queue does not know.
#[derive(Insertable)]
#[diesel(table_name = crate::schema::jobs)]
struct OrderJobRow<'a> {
    #[diesel(embed)]
    queue: QueueRow<'a>,
    order_id: Option<OrderId>,
}

/// The service's enqueuer: the queue's rows, with `order_id` written
/// (`insert_order_jobs`); NOTIFY in the transaction. The API adds its
/// waker to it ([`Enqueuer::wake_after_commit`]).
pub fn order_enqueuer() -> Enqueuer {
    Enqueuer::new().insert_with(insert_order_jobs)
}

/// The service's [`InsertJobs`](outbox_core::outbox::InsertJobs): the
/// queue's rows with `order_id` set from the [`OrderId`] each order job's
/// arguments attach (their `extend_job`); other jobs have none. One
/// multi-row INSERT, as the queue's own.
fn insert_order_jobs(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    let rows: Vec<OrderJobRow<'_>> = new_jobs
        .iter()
        .map(|job| OrderJobRow {
            queue: QueueRow::from(job),
            order_id: job.extension::<OrderId>().copied(),
        })
        .collect();
    let shapes = rows
        .iter()
        .map(|row| (row.queue.shape() << 1) | u32::from(row.order_id.is_some()));
    let insert = diesel::insert_into(crate::schema::jobs::table)
        .values(&rows)
        .returning(crate::schema::jobs::id);
    if prepare_insert(shapes) {
        insert.prepared().get_results(conn)
    } else {
        insert.get_results(conn)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Payloads as jobs already queued hold them: `order_id` a bare number.
    #[test]
    fn queued_payloads_decode_and_new_ones_are_written_the_same() {
        let queued = [
            (
                ConfirmationEmail::KIND,
                json!({"order_id": 7, "event_id": 3}),
            ),
            (OrderEmail::KIND, json!({"order_id": 7, "event_id": 4})),
            (ReceiptPdf::KIND, json!({"order_id": 7})),
            (
                OrderWebhook::KIND,
                json!({"order_id": 7, "event_id": 3, "endpoint_id": 2}),
            ),
            (
                OrderPublish::KIND,
                json!({"order_id": 7, "event_id": 3, "endpoint_id": 2}),
            ),
        ];
        for (kind, payload) in queued {
            let job = match kind {
                ConfirmationEmail::KIND => {
                    let args: ConfirmationEmail =
                        serde_json::from_value(payload.clone()).expect("decodes");
                    new_job(&args, &JobOptions::default())
                }
                OrderEmail::KIND => {
                    let args: OrderEmail =
                        serde_json::from_value(payload.clone()).expect("decodes");
                    new_job(&args, &JobOptions::default())
                }
                ReceiptPdf::KIND => {
                    let args: ReceiptPdf =
                        serde_json::from_value(payload.clone()).expect("decodes");
                    new_job(&args, &JobOptions::default())
                }
                OrderWebhook::KIND => {
                    let args: OrderWebhook =
                        serde_json::from_value(payload.clone()).expect("decodes");
                    new_job(&args, &JobOptions::default())
                }
                _ => {
                    let args: OrderPublish =
                        serde_json::from_value(payload.clone()).expect("decodes");
                    new_job(&args, &JobOptions::default())
                }
            }
            .expect("a job");
            assert_eq!(job.payload(), &payload, "{kind}");
            assert_eq!(job.kind(), kind);
            assert_eq!(
                job.extension::<OrderId>(),
                Some(&OrderId::new(7)),
                "{kind} carries its order to insert_order_jobs"
            );
        }
    }

    #[test]
    fn a_fanout_names_its_endpoints_as_runs_and_reads_them_back() {
        let fanout = OrderFanout {
            order_id: OrderId::new(7),
            event_id: 3,
            max_attempts: 8,
            webhook_endpoints: (1..=1000).chain([1002, 1003, 1010]).collect(),
            nats_endpoints: vec![],
            default_behind_unaddressed: None,
        };
        let payload = serde_json::to_value(&fanout).expect("serializes");
        assert_eq!(
            payload["webhook_endpoints"],
            json!([[1, 1000], [1002, 1003], [1010, 1010]])
        );
        assert_eq!(payload["nats_endpoints"], json!([]));
        let back: OrderFanout = serde_json::from_value(payload).expect("decodes");
        assert_eq!(back, fanout);
        for bad in [json!([[5, 4]]), json!([[0, 2_000_000]]), json!([[1]])] {
            let mut payload = serde_json::to_value(&fanout).expect("serializes");
            payload["webhook_endpoints"] = bad.clone();
            assert!(
                serde_json::from_value::<OrderFanout>(payload).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_order_id_that_is_not_a_number_is_refused() {
        let text = serde_json::from_value::<ReceiptPdf>(json!({"order_id": "7"}));
        assert!(text.is_err(), "{text:?}");
    }
}
