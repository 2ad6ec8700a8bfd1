//! The inbox's retention (`INBOX_RETENTION`): message ids are kept long
//! enough to know a provider's late retry as a repeat, then deleted, except
//! what still needs a person.
//!
//! - A `held` message is never pruned while it is held: it is an operator's
//!   to decide ("refund needed", "paid again"), however long that takes. Once
//!   decided, it is kept for the retention after its decision too.
//! - An `unmatched` payment is money that came in for no order. It goes with
//!   the retention, but never silently: each one pruned is a WARN naming it.
//!
//! The core's [`outbox_core::dedupe::prune_messages`] knows nothing of these
//! statuses, so the service prunes with its own statement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Timestamptz};
use serde_json::Value;

use super::MessageStatus;
use super::event::{Intent, Meaning};
use super::held::interpret_stored;

/// Rows deleted per statement: short transactions beside the receivers.
pub const PRUNE_BATCH: i64 = 1000;

/// One pruned message, as the statement returns it.
#[derive(QueryableByName)]
struct PrunedRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = Nullable<Text>)]
    message_type: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    status: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    order_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    reason: Option<String>,
    /// Only an unmatched message's.
    #[diesel(sql_type = Nullable<Jsonb>)]
    payload: Option<Value>,
}

/// What one prune removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub messages: u64,
    /// Of those, unmatched payments and refunds: each was logged at WARN.
    pub unmatched_payments: u64,
}

/// Deletes the messages received and decided more than `retention` ago,
/// `batch` rows a statement, keeping every held one.
pub fn prune_messages(
    conn: &mut PgConnection,
    retention: Duration,
    batch: i64,
) -> QueryResult<Pruned> {
    let before = chrono::Duration::from_std(retention)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    prune_messages_before(conn, before, batch)
}

/// [`prune_messages`] with the cutoff given.
pub fn prune_messages_before(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    batch: i64,
) -> QueryResult<Pruned> {
    let batch = batch.max(1);
    let mut pruned = Pruned::default();
    loop {
        let rows: Vec<PrunedRow> = diesel::sql_query(include_str!("sql/prune_messages.sql"))
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(batch)
            .load(conn)?;
        pruned.messages += rows.len() as u64;
        for row in &rows {
            if warn_if_money(row) {
                pruned.unmatched_payments += 1;
            }
        }
        if (rows.len() as i64) < batch {
            return Ok(pruned);
        }
    }
}

/// A WARN for an unmatched payment or refund being forgotten; whether it was one.
fn warn_if_money(row: &PrunedRow) -> bool {
    if row.status.as_deref() != Some(MessageStatus::Unmatched.as_str()) {
        return false;
    }
    let Some(Meaning::Payment(payment)) = row.payload.as_ref().map(interpret_stored) else {
        return false;
    };
    let what = match payment.intent {
        Intent::Pay => "an unmatched payment was pruned: money came in for no order",
        Intent::Refund => "an unmatched refund was pruned: money went out for no order",
    };
    tracing::warn!(
        inbox_message_id = row.id,
        source = row.source.as_str(),
        message_id = row.message_id.as_str(),
        message_type = row.message_type.as_deref().unwrap_or(""),
        order_id = row.order_id,
        amount_cents = payment.amount_cents,
        currency = payment.currency.as_deref().unwrap_or(""),
        reference = payment.reference.as_deref().unwrap_or(""),
        reason = row.reason.as_deref().unwrap_or(""),
        "{what} (source {}, message {}); check it at the provider",
        row.source,
        row.message_id,
    );
    true
}
