//! The inbox's messages, newest first, for `inbox list` and the dashboard.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Serialize;

use super::MessageStatus;
use crate::schema::inbox_messages;

/// One received message as operators see it.
#[derive(Debug, Clone, Queryable, Selectable, Serialize)]
#[diesel(table_name = inbox_messages)]
pub struct InboxMessage {
    pub id: i64,
    pub source: String,
    pub message_id: String,
    #[serde(rename = "type")]
    pub message_type: Option<String>,
    pub order_id: Option<i64>,
    pub status: Option<String>,
    pub reason: Option<String>,
    pub received_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    /// `webhook`, or `reconcile` for a message fetched from the provider's log.
    pub via: String,
}

/// Which messages to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub status: Option<MessageStatus>,
    pub source: Option<String>,
    /// Only ids below this one: the next page after a page ending there.
    pub before: Option<i64>,
    pub limit: i64,
}

/// Messages matching `filter`, newest first, at most `filter.limit`: a
/// keyset page on the primary key (or `inbox_messages_status_idx`), never a
/// count of the table.
pub fn list_messages(conn: &mut PgConnection, filter: &Filter) -> QueryResult<Vec<InboxMessage>> {
    let mut query = inbox_messages::table
        .select(InboxMessage::as_select())
        .order(inbox_messages::id.desc())
        .limit(filter.limit.clamp(1, 1000))
        .into_boxed();
    if let Some(status) = filter.status {
        query = query.filter(inbox_messages::status.eq(status.as_str()));
    }
    if let Some(source) = &filter.source {
        query = query.filter(inbox_messages::source.eq(source.clone()));
    }
    if let Some(before) = filter.before {
        query = query.filter(inbox_messages::id.lt(before));
    }
    query.load(conn)
}

/// One message with its payload, for the dashboard's detail and the CLI.
pub fn payload_of(conn: &mut PgConnection, id: i64) -> QueryResult<Option<serde_json::Value>> {
    Ok(inbox_messages::table
        .find(id)
        .select(inbox_messages::payload)
        .first::<Option<serde_json::Value>>(conn)
        .optional()?
        .flatten())
}

/// Which of `message_ids` source `source` has stored (the unique index on
/// `(source, message_id)`).
pub fn stored_message_ids(
    conn: &mut PgConnection,
    source: &str,
    message_ids: &[String],
) -> QueryResult<std::collections::HashSet<String>> {
    Ok(inbox_messages::table
        .filter(inbox_messages::source.eq(source))
        .filter(inbox_messages::message_id.eq_any(message_ids))
        .select(inbox_messages::message_id)
        .load::<String>(conn)?
        .into_iter()
        .collect())
}
