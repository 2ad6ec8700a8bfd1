//! Storing a rendered receipt, exactly once, with the job's completion.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea};

use crate::orders::OrderId;
use crate::outbox::{CommitHook, LocalWrite};

/// The write a successful `receipt_pdf` job hands to the outbox: the PDF is
/// stored in the transaction that marks the job done, and only if this claim
/// still held the job, so the receipt exists once however often the job runs.
pub fn store_receipt(order_id: OrderId, pdf: Vec<u8>) -> LocalWrite {
    LocalWrite::new(StoreReceipt { order_id, pdf })
}

struct StoreReceipt {
    order_id: OrderId,
    pdf: Vec<u8>,
}

impl CommitHook for StoreReceipt {
    fn apply(&self, conn: &mut PgConnection) -> QueryResult<()> {
        diesel::sql_query(include_str!("insert_receipt.sql"))
            .bind::<BigInt, _>(self.order_id)
            .bind::<Bytea, _>(&self.pdf)
            .execute(conn)
            .map(drop)
    }

    fn describe(&self) -> String {
        format!(
            "receipt of order {} ({} bytes)",
            self.order_id,
            self.pdf.len()
        )
    }
}
