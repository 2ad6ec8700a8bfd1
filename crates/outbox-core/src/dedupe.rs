//! The inbox: receiving a message once.
//!
//! The outbox's twin. A sender that retries (a partner's HTTP callbacks,
//! a broker's redeliveries) hands the same message over more than once, in
//! any order, sometimes to two receivers at once. [`record_message`] stores
//! its `(source, message_id)` inside the caller's Diesel transaction and says
//! whether this is the first time: apply the message in that same
//! transaction, and skip it on a [`Received::Repeat`]. The record and the
//! effect then commit together, so a crash between them is impossible, and
//! a copy that arrives while the first is still being applied waits for it
//! and then sees a repeat: no error, no second effect.
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
//! use diesel::Connection as _;
//! use outbox_core::dedupe::{Received, record_message};
//!
//! conn.transaction(|conn| {
//!     match record_message(conn, "billing", "evt_1NG8Du2eZvKYlo2C")? {
//!         Received::First { .. } => { /* apply it: your writes, your enqueues */ }
//!         Received::Repeat => { /* applied before: change nothing */ }
//!     }
//!     Ok(())
//! })
//! # }
//! ```
//!
//! The table (`inbox_messages`, from this crate's migrations) holds only what
//! the inbox needs; an application may add columns of its own. To write its
//! row once, with those columns, it claims the message instead
//! ([`claim_message`]): the claim takes the message's turn and says whether
//! it was recorded before, and the application applies it and then inserts
//! the row itself, with the claim's id, in the same transaction:
//!
//! ```no_run
//! # fn demo(conn: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
//! use diesel::sql_types::{BigInt, Text};
//! use diesel::{Connection as _, RunQueryDsl as _};
//! use outbox_core::dedupe::{Claim, claim_message};
//!
//! conn.transaction(|conn| {
//!     match claim_message(conn, "billing", "evt_1NG8Du2eZvKYlo2C")? {
//!         Claim::New { id } => {
//!             /* apply it: your writes, your enqueues; then its row, once */
//!             diesel::sql_query(
//!                 "INSERT INTO inbox_messages (id, source, message_id) VALUES ($1, $2, $3)",
//!             )
//!             .bind::<BigInt, _>(id)
//!             .bind::<Text, _>("billing")
//!             .bind::<Text, _>("evt_1NG8Du2eZvKYlo2C")
//!             .execute(conn)?;
//!         }
//!         Claim::Repeat { .. } => { /* applied before: change nothing */ }
//!     }
//!     Ok(())
//! })
//! # }
//! ```
//!
//! Ids are kept until
//! [`prune_messages`] removes them: keep them longer than the sender retries
//! (Stripe retries for 3 days and resends by hand for 30), or a late retry
//! is applied a second time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Text, Timestamptz};

/// What [`record_message`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Recorded now: apply the message in this transaction. `id` is the new
    /// row of `inbox_messages`.
    First {
        /// `inbox_messages.id`.
        id: i64,
    },
    /// Already recorded by a committed transaction: change nothing.
    Repeat,
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Records message `message_id` of `source` in the caller's transaction, or
/// reports it a [`Received::Repeat`]. Call it inside a transaction that also
/// applies the message: outside one, the record commits on its own and a
/// crash before the effect loses the message.
///
/// A concurrent transaction recording the same message makes this call wait
/// until that one ends (its entry in the unique index), then answer
/// `Repeat` if it committed, or record the message if it rolled back.
pub fn record_message(
    conn: &mut PgConnection,
    source: &str,
    message_id: &str,
) -> QueryResult<Received> {
    let rows: Vec<Inserted> = diesel::sql_query(RECORD_MESSAGE_SQL)
        .bind::<Text, _>(source)
        .bind::<Text, _>(message_id)
        .load(conn)?;
    Ok(match rows.first() {
        Some(row) => Received::First { id: row.id },
        None => Received::Repeat,
    })
}

/// What [`claim_message`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Not recorded yet, and this transaction holds the message's turn
    /// until it ends: apply the message, then insert its row with this
    /// `id` (`inbox_messages.id`), `source` and `message_id`, before the
    /// transaction commits.
    New {
        /// The id the message's row takes (from the table's sequence).
        id: i64,
    },
    /// Already recorded by a committed transaction, as row `id`: change nothing.
    Repeat {
        /// `inbox_messages.id` of the first copy.
        id: i64,
    },
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Bool)]
    recorded: bool,
}

/// Claims message `message_id` of `source` for the caller's transaction,
/// which writes the message's row itself: [`record_message`] for an
/// application whose row has columns of its own, filled only once it has
/// applied the message, so the row is written once, complete.
///
/// The claim is a transaction-scoped advisory lock on `(source,
/// message_id)`, then a look for the row: a copy claimed while the first is
/// being applied waits until that transaction ends, then answers
/// [`Claim::Repeat`] if it committed (its row is there), or [`Claim::New`]
/// if it rolled back. The record and the effect commit together, as with
/// [`record_message`]. Call it in a READ COMMITTED transaction (PostgreSQL's
/// default), before anything else that transaction locks: each statement
/// then sees what committed before it began, and the look runs after the
/// wait. The unique index on `(source, message_id)` stays the last word: a
/// row inserted without the claim (by [`record_message`], say) makes the
/// claimed insert fail, and its transaction, effect and all, rolls back.
pub fn claim_message(
    conn: &mut PgConnection,
    source: &str,
    message_id: &str,
) -> QueryResult<Claim> {
    diesel::sql_query(CLAIM_TURN_SQL)
        .bind::<Text, _>(source)
        .bind::<Text, _>(message_id)
        .execute(conn)?;
    let claimed: Claimed = diesel::sql_query(CLAIM_MESSAGE_SQL)
        .bind::<Text, _>(source)
        .bind::<Text, _>(message_id)
        .get_result(conn)?;
    Ok(if claimed.recorded {
        Claim::Repeat { id: claimed.id }
    } else {
        Claim::New { id: claimed.id }
    })
}

/// The claim's first statement (`dedupe/sql/claim_turn.sql`): the
/// message's advisory lock; `$1` source, `$2` message id.
const CLAIM_TURN_SQL: &str = include_str!("dedupe/sql/claim_turn.sql");

/// The claim's second statement (`dedupe/sql/claim_message.sql`): the
/// recorded row's id and `recorded = true`, or a new id and `false`.
const CLAIM_MESSAGE_SQL: &str = include_str!("dedupe/sql/claim_message.sql");

/// The dedupe's statement (`dedupe/sql/record_message.sql`): `$1` source, `$2`
/// message id; returns the new row's `id`, or no row for a repeat. For a test
/// that runs it on a connection of its own, as [`record_message`] does.
pub const RECORD_MESSAGE_SQL: &str = include_str!("dedupe/sql/record_message.sql");

/// Deletes the messages received more than `older_than` ago, `batch` rows a
/// statement; returns how many went. A message id pruned is forgotten: a
/// copy received afterwards is new again.
pub fn prune_messages(
    conn: &mut PgConnection,
    older_than: Duration,
    batch: i64,
) -> QueryResult<u64> {
    prune_messages_before(conn, cutoff(Utc::now(), older_than), batch)
}

/// [`prune_messages`] with the cutoff given: messages received before `before` go.
pub fn prune_messages_before(
    conn: &mut PgConnection,
    before: DateTime<Utc>,
    batch: i64,
) -> QueryResult<u64> {
    let batch = batch.max(1);
    let mut total = 0u64;
    loop {
        let deleted = diesel::sql_query(include_str!("dedupe/sql/prune_messages.sql"))
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(batch)
            .execute(conn)?;
        total += deleted as u64;
        if (deleted as i64) < batch {
            return Ok(total);
        }
    }
}

fn cutoff(now: DateTime<Utc>, older_than: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_longer_than_time_itself_prunes_nothing() {
        let now = Utc::now();
        assert_eq!(cutoff(now, Duration::MAX), DateTime::<Utc>::MIN_UTC);
        assert_eq!(
            cutoff(now, Duration::from_secs(60)),
            now - chrono::Duration::seconds(60)
        );
    }
}
