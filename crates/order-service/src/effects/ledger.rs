//! The effect ledger's writes: what a job's peer answered, recorded in the
//! transaction that finishes the job done (a [`LocalWrite`]), so a row exists
//! exactly when the outcome does. The core runs the write only after the
//! fenced finish matched this claim: a zombie whose lease was lost records
//! nothing, however late its success comes.
//!
//! The receipt's digest is not recorded: it is read from `receipts.pdf`,
//! itself written by the receipt job's finishing transaction.

use diesel::prelude::*;
use diesel::sql_types::Jsonb;
use sha2::{Digest as _, Sha256};

use crate::outbox::{CommitHook, HookRow, LocalWrite};

/// What one effect's peer answered, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectAnswer {
    /// An email the SMTP server accepted.
    Email {
        /// The `Message-ID` the message carried.
        message_id: String,
        /// The server's reply to the message (after DATA): the code and its text.
        smtp_reply: String,
    },
    /// A webhook call the receiver accepted.
    Webhook {
        /// The endpoint's name when it was called.
        endpoint: String,
        /// The `webhook-id` header sent (the `Idempotency-Key`).
        webhook_id: String,
        status_code: u16,
        /// SHA-256 (hex) of the answer's body as read, at most the bytes the
        /// sender reads of any answer.
        answer_sha256: String,
    },
    /// A publish the stream acknowledged.
    Publish {
        endpoint: String,
        /// The `Nats-Msg-Id` sent (the delivery's `webhook-id`).
        webhook_id: String,
        stream: String,
        /// The PubAck's sequence; none when the stream refused the publish
        /// because its subject already held the message.
        stream_seq: Option<u64>,
        /// The stream had the message already: from an earlier attempt.
        duplicate: bool,
    },
}

/// The write that records `answer` for job `job_id` with the job's completion.
pub fn record_effect(job_id: i64, answer: EffectAnswer) -> LocalWrite {
    LocalWrite::new(RecordEffect { job_id, answer })
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Inserts a batch of ledger rows (`$1`, a JSON array of them, each an array
/// in the statement's column order); the bench replays it to measure what
/// the ledger costs.
pub const RECORD_EFFECTS_SQL: &str = include_str!("ledger/record_effects.sql");

struct RecordEffect {
    job_id: i64,
    answer: EffectAnswer,
}

impl RecordEffect {
    /// The row, for `ledger/record_effects.sql`: the core writes a batch's
    /// rows in one statement.
    fn ledger_row(&self) -> HookRow {
        let c = Columns::of(&self.answer);
        HookRow {
            statement: RECORD_EFFECTS_SQL,
            // An array in the statement's column order, not an object: a
            // row is built, copied and parsed for every job, and its names
            // would be most of it.
            row: serde_json::json!([
                self.job_id,
                c.message_id,
                c.smtp_reply,
                c.endpoint,
                c.webhook_id,
                c.status_code,
                c.answer_sha256,
                c.stream,
                c.stream_seq,
                c.duplicate,
            ]),
        }
    }
}

/// One row's columns, the kind's own set and nulls for the rest.
#[derive(Default)]
struct Columns<'a> {
    message_id: Option<&'a str>,
    smtp_reply: Option<&'a str>,
    endpoint: Option<&'a str>,
    webhook_id: Option<&'a str>,
    status_code: Option<i32>,
    answer_sha256: Option<&'a str>,
    stream: Option<&'a str>,
    stream_seq: Option<i64>,
    duplicate: Option<bool>,
}

impl<'a> Columns<'a> {
    fn of(answer: &'a EffectAnswer) -> Self {
        match answer {
            EffectAnswer::Email {
                message_id,
                smtp_reply,
            } => Columns {
                message_id: Some(message_id.as_str()),
                smtp_reply: Some(smtp_reply.as_str()),
                ..Columns::default()
            },
            EffectAnswer::Webhook {
                endpoint,
                webhook_id,
                status_code,
                answer_sha256,
            } => Columns {
                endpoint: Some(endpoint.as_str()),
                webhook_id: Some(webhook_id.as_str()),
                status_code: Some(i32::from(*status_code)),
                answer_sha256: Some(answer_sha256.as_str()),
                ..Columns::default()
            },
            EffectAnswer::Publish {
                endpoint,
                webhook_id,
                stream,
                stream_seq,
                duplicate,
            } => Columns {
                endpoint: Some(endpoint.as_str()),
                webhook_id: Some(webhook_id.as_str()),
                stream: Some(stream.as_str()),
                // A sequence past i64 is no sequence a stream hands out.
                stream_seq: stream_seq.and_then(|s| i64::try_from(s).ok()),
                duplicate: Some(*duplicate),
                ..Columns::default()
            },
        }
    }
}

impl CommitHook for RecordEffect {
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()> {
        let HookRow { statement, row } = self.ledger_row();
        diesel::sql_query(statement)
            .bind::<Jsonb, _>(serde_json::Value::Array(vec![row]))
            .execute(conn)
            .map(drop)
    }

    fn row(&self) -> Option<HookRow> {
        Some(self.ledger_row())
    }

    fn describe(&self) -> String {
        let kind = match self.answer {
            EffectAnswer::Email { .. } => "email",
            EffectAnswer::Webhook { .. } => "webhook",
            EffectAnswer::Publish { .. } => "publish",
        };
        format!("the {kind} answer of job {}", self.job_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_lowercase_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn each_kind_fills_only_its_own_columns() {
        let publish = EffectAnswer::Publish {
            endpoint: "events".into(),
            webhook_id: "order-webhook-9".into(),
            stream: "ORDERS".into(),
            stream_seq: Some(4),
            duplicate: true,
        };
        let c = Columns::of(&publish);
        assert_eq!(
            (c.stream, c.stream_seq, c.duplicate),
            (Some("ORDERS"), Some(4), Some(true))
        );
        assert_eq!(
            (c.message_id, c.status_code, c.answer_sha256),
            (None, None, None)
        );
    }
}
