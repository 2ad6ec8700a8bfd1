//! An order's effect ledger: one entry per job of the order, with what the
//! effect's peer answered (`GET /orders/{id}/effects`, `orders effects`, the
//! dashboard's order page). The answers are written by the transaction that
//! finished each job (`effects::ledger`), so an entry says no more than the
//! job's outcome does.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use serde::{Deserialize, Serialize};

use super::OrderId;
use crate::schema::orders;

/// One job of an order and what its peer answered. Every answer field is
/// null until the job is done, and for kinds it does not belong to.
#[derive(
    Debug, Clone, PartialEq, Eq, QueryableByName, Serialize, Deserialize, utoipa::ToSchema,
)]
pub struct EffectEntry {
    #[diesel(sql_type = BigInt)]
    pub job_id: i64,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    /// The fencing token of the job's last claim: for a done job, the claim
    /// whose completion was recorded.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lease_token: Option<i64>,
    /// An email's `Message-ID`.
    #[diesel(sql_type = Nullable<Text>)]
    pub message_id: Option<String>,
    /// The SMTP server's reply to the message: its code and text.
    #[diesel(sql_type = Nullable<Text>)]
    pub smtp_reply: Option<String>,
    /// A delivery's endpoint, by name.
    #[diesel(sql_type = Nullable<Text>)]
    pub endpoint: Option<String>,
    /// A delivery's `webhook-id` (a NATS publish's `Nats-Msg-Id`).
    #[diesel(sql_type = Nullable<Text>)]
    pub webhook_id: Option<String>,
    /// A webhook's final HTTP status.
    #[diesel(sql_type = Nullable<Integer>)]
    pub status_code: Option<i32>,
    /// SHA-256 (hex) of the receiver's answer body, as read (its first 8 KiB).
    #[diesel(sql_type = Nullable<Text>)]
    pub answer_sha256: Option<String>,
    /// A publish's stream, from its PubAck.
    #[diesel(sql_type = Nullable<Text>)]
    pub stream: Option<String>,
    /// A publish's stream sequence, from its PubAck (the original one for a
    /// duplicate); null when the stream said the subject held it already.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub stream_seq: Option<i64>,
    /// The stream had the message already, from an earlier attempt.
    #[diesel(sql_type = Nullable<Bool>)]
    pub duplicate: Option<bool>,
    /// SHA-256 (hex) of the stored receipt PDF (`receipts.pdf`).
    #[diesel(sql_type = Nullable<Text>)]
    pub pdf_sha256: Option<String>,
    /// When the answer was recorded: the job's completion.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub recorded_at: Option<DateTime<Utc>>,
}

/// The ledger of order `order_id`, in job id order; empty for an order with
/// no jobs or none at all (the caller tells those apart).
pub fn load_effect_ledger(
    conn: &mut PgConnection,
    order_id: OrderId,
) -> QueryResult<Vec<EffectEntry>> {
    diesel::sql_query(include_str!("sql/effect_ledger.sql"))
        .bind::<BigInt, _>(order_id.get())
        .load(conn)
}

/// An order's effect ledger: one entry per job of the order, in job id order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EffectLedger {
    pub order_id: i64,
    pub effects: Vec<EffectEntry>,
}

/// Reads order `order_id`'s ledger under one snapshot; none when no such
/// order exists.
pub fn load_ledger(conn: &mut PgConnection, order_id: i64) -> QueryResult<Option<EffectLedger>> {
    conn.build_transaction()
        .read_only()
        .repeatable_read()
        .run(|conn| {
            let exists: bool = diesel::select(diesel::dsl::exists(orders::table.find(order_id)))
                .get_result(conn)?;
            if !exists {
                return Ok(None);
            }
            Ok(Some(EffectLedger {
                order_id,
                effects: load_effect_ledger(conn, OrderId::new(order_id))?,
            }))
        })
}

impl EffectEntry {
    /// What the peer answered, on one line for a table cell: the kind's own
    /// fields, `-` when nothing is recorded (yet).
    pub fn answer_summary(&self) -> String {
        let short = |digest: &str| digest.chars().take(12).collect::<String>();
        let mut parts: Vec<String> = Vec::new();
        if let Some(reply) = &self.smtp_reply {
            parts.push(format!("smtp {reply}"));
        }
        if let Some(message_id) = &self.message_id {
            parts.push(message_id.clone());
        }
        if let Some(endpoint) = &self.endpoint {
            parts.push(format!("endpoint {endpoint}"));
        }
        if let Some(status) = self.status_code {
            parts.push(format!("http {status}"));
        }
        if let Some(digest) = &self.answer_sha256 {
            parts.push(format!("answer sha256 {}", short(digest)));
        }
        if let Some(stream) = &self.stream {
            let seq = self
                .stream_seq
                .map_or_else(|| "on its subject".to_owned(), |s| format!("seq {s}"));
            let duplicate = if self.duplicate == Some(true) {
                " (duplicate)"
            } else {
                ""
            };
            parts.push(format!("stream {stream} {seq}{duplicate}"));
        }
        if let Some(digest) = &self.pdf_sha256 {
            parts.push(format!("pdf sha256 {}", short(digest)));
        }
        if parts.is_empty() {
            "-".to_owned()
        } else {
            crate::text::one_line(&parts.join("; "), 160)
        }
    }
}

/// Deletes the ledger's answers recorded more than `older_than` ago (with
/// the done jobs `jobs prune` deletes), in batches of `batch`; returns how
/// many went. An answer whose job is still kept (a day's partition is
/// dropped whole, so a job may outlive the cutoff) stays with it: a job
/// that is shown has its answer.
pub fn prune(
    conn: &mut PgConnection,
    older_than: std::time::Duration,
    batch: i64,
) -> QueryResult<u64> {
    crate::db::AgedTable {
        table: "effect_results",
        key: "job_id",
        time: "recorded_at",
        keep_while: Some(
            "EXISTS (SELECT 1 FROM jobs_all WHERE jobs_all.id = effect_results.job_id)",
        ),
    }
    .prune(conn, older_than, batch)
}
