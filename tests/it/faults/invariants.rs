//! The invariants every fault scenario ends with, checked by one function.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use diesel::prelude::*;
use order_service::orders::OrderId;
use order_service::schema::{jobs_all, orders, receipts};

use crate::support::http::Recorded;
use crate::support::smtp::Mail;

pub use order_service::job_list::JobRow;

/// The order jobs, by id: every job but the relays' own periodic ones.
pub fn load_jobs(conn: &mut PgConnection) -> Vec<JobRow> {
    load_all_jobs(conn).1
}

/// The relays' periodic jobs (the order-expiry sweeps, the reconciliation)
/// apart from the order jobs: a relay that outlives a slot (a minute, on a
/// loaded machine) has enqueued one, which belongs to no order.
fn load_all_jobs(conn: &mut PgConnection) -> (Vec<JobRow>, Vec<JobRow>) {
    let periodic = periodic_kinds(conn);
    jobs_all::table
        .select(JobRow::as_select())
        .order(jobs_all::id)
        .load::<JobRow>(conn)
        .expect("load jobs")
        .into_iter()
        .partition(|job| job.order_id.is_none() && periodic.contains(&job.kind))
}

/// The kinds the relays' periodic jobs enqueue.
fn periodic_kinds(conn: &mut PgConnection) -> BTreeSet<String> {
    diesel::sql_query("SELECT DISTINCT kind FROM periodic_jobs")
        .load::<PeriodicKind>(conn)
        .expect("load periodic kinds")
        .into_iter()
        .map(|row| row.kind)
        .collect()
}

#[derive(QueryableByName)]
struct PeriodicKind {
    #[diesel(sql_type = diesel::sql_types::Text)]
    kind: String,
}

/// What a scenario ended with, for its own assertions and the report.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    pub orders: usize,
    /// The order jobs done and failed; the periodic jobs' are in `periodic`.
    pub done: usize,
    pub failed: usize,
    /// The relays' own periodic jobs without an order (all terminal).
    pub periodic: usize,
    pub receipts: usize,
    /// Webhook requests and mails (accepted or not) the sinks saw.
    pub webhook_requests: usize,
    pub mails: usize,
    /// Orders whose webhook was delivered more than once / mailed more than once.
    pub repeated_webhooks: usize,
    pub repeated_mails: usize,
}

/// Asserts, after a scenario:
/// - every job is terminal: `done`, or `failed` with a non-empty `last_error`;
/// - every order has exactly its three jobs;
/// - every webhook request carries the Idempotency-Key of its order's
///   order_webhook job, and every mail the Message-ID of its order's
///   confirmation_email job, so an effect seen more than once is recognisably
///   the same effect; every done job's effect was seen at least once;
/// - receipts: exactly one per order whose receipt_pdf job is done, none else.
pub fn assert_invariants(
    conn: &mut PgConnection,
    webhooks: &[Recorded],
    mails: &[Mail],
) -> Summary {
    // A periodic job has to end like every job, but belongs to no order.
    let (upkeep, jobs) = load_all_jobs(conn);
    let order_ids: BTreeSet<i64> = orders::table
        .select(orders::id)
        .load::<i64>(conn)
        .expect("load orders")
        .into_iter()
        .collect();
    let receipt_orders: Vec<i64> = receipts::table
        .select(receipts::order_id)
        .load(conn)
        .expect("load receipts");

    let mut summary = Summary {
        orders: order_ids.len(),
        webhook_requests: webhooks.len(),
        mails: mails.len(),
        ..Summary::default()
    };

    // Terminal states.
    for job in &upkeep {
        assert!(
            job.status == "done"
                || (job.status == "failed"
                    && job
                        .last_error
                        .as_deref()
                        .is_some_and(|e| !e.trim().is_empty())),
            "periodic job not terminal, or failed without a reason: {job:?}"
        );
    }
    summary.periodic = upkeep.len();
    for job in &jobs {
        match job.status.as_str() {
            "done" => summary.done += 1,
            "failed" => {
                summary.failed += 1;
                assert!(
                    job.last_error
                        .as_deref()
                        .is_some_and(|e| !e.trim().is_empty()),
                    "failed job without a reason: {job:?}"
                );
            }
            _ => panic!("job not terminal: {job:?}"),
        }
    }

    // Each order has its three jobs, one of each kind.
    let mut by_order: HashMap<i64, BTreeMap<&str, &JobRow>> = HashMap::new();
    for job in &jobs {
        let order_id = job
            .order_id
            .map(OrderId::get)
            .unwrap_or_else(|| panic!("job without an order: {job:?}"));
        let previous = by_order
            .entry(order_id)
            .or_default()
            .insert(job.kind.as_str(), job);
        assert!(
            previous.is_none(),
            "order {order_id} has two {} jobs",
            job.kind
        );
    }
    for order_id in &order_ids {
        let kinds: Vec<&str> = by_order
            .get(order_id)
            .map(|k| k.keys().copied().collect())
            .unwrap_or_default();
        let mut expected = order_service::orders::ORDER_JOB_KINDS.to_vec();
        expected.sort_unstable();
        assert_eq!(kinds, expected, "jobs of order {order_id}");
    }
    let job_of = |order_id: i64, kind: &str| -> &JobRow {
        by_order
            .get(&order_id)
            .and_then(|k| k.get(kind))
            .unwrap_or_else(|| panic!("an effect for order {order_id}, which has no {kind} job"))
    };

    // Webhooks: every request carries its job's key.
    let mut webhook_count: HashMap<i64, usize> = HashMap::new();
    for request in webhooks {
        let body = request.json();
        let order_id = body["order"]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("webhook body without order.id: {body}"));
        let job = job_of(order_id, "order_webhook");
        assert_eq!(
            request.header("idempotency-key"),
            Some(format!("order-webhook-{}", job.id).as_str()),
            "Idempotency-Key of a webhook for order {order_id}"
        );
        *webhook_count.entry(order_id).or_default() += 1;
    }
    summary.repeated_webhooks = webhook_count.values().filter(|n| **n > 1).count();

    // Mails: every message carries its job's Message-ID.
    let mut mail_count: HashMap<i64, usize> = HashMap::new();
    let mut accepted: BTreeSet<i64> = BTreeSet::new();
    for mail in mails {
        let subject = mail.header("subject").unwrap_or_default();
        let order_id: i64 = subject
            .strip_prefix("Your order #")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected subject {subject:?}"));
        let job = job_of(order_id, "confirmation_email");
        let message_id = mail.header("message-id").unwrap_or_default();
        assert!(
            message_id.starts_with(&format!("<job-{}.confirmation@", job.id)),
            "Message-ID {message_id:?} of a mail for order {order_id} (job {})",
            job.id
        );
        *mail_count.entry(order_id).or_default() += 1;
        if mail.accepted() {
            accepted.insert(order_id);
        }
    }
    summary.repeated_mails = mail_count.values().filter(|n| **n > 1).count();

    // Every done effect was seen at least once.
    for job in jobs.iter().filter(|j| j.status == "done") {
        let order_id = job.order_id.map(OrderId::get).unwrap_or_default();
        match job.kind.as_str() {
            "order_webhook" => assert!(
                webhook_count.contains_key(&order_id),
                "webhook job {} is done but the receiver never saw it",
                job.id
            ),
            "confirmation_email" => assert!(
                accepted.contains(&order_id),
                "email job {} is done but no mail was accepted for it",
                job.id
            ),
            _ => {}
        }
    }

    // Receipts: one per done receipt_pdf job, none for the others.
    let done_receipts: BTreeSet<i64> = jobs
        .iter()
        .filter(|j| j.kind == "receipt_pdf" && j.status == "done")
        .filter_map(|j| j.order_id.map(OrderId::get))
        .collect();
    let stored: BTreeSet<i64> = receipt_orders.iter().copied().collect();
    assert_eq!(receipt_orders.len(), stored.len(), "a receipt stored twice");
    assert_eq!(
        stored, done_receipts,
        "receipts stored vs receipt jobs done"
    );
    summary.receipts = stored.len();
    summary
}
