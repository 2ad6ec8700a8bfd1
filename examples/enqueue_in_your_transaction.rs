//! Enqueueing a job inside your own Diesel transaction: your row and its job
//! commit together, or neither does.
//!
//! ```sh
//! createdb -h 127.0.0.1 -U postgres outbox_example
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_example \
//!     cargo run --example enqueue_in_your_transaction
//! ```
//!
//! Point it at a development database: it migrates it (the outbox's tables),
//! writes to a temporary table of its own, and leaves one `noop` job that any
//! relay will run.

use anyhow::Context as _;
use diesel::prelude::*;
use order_service::effects::Noop;
use order_service::outbox::{Enqueuer, JobOptions};

// Your application's own table; temporary here, so the example leaves no trace of it.
diesel::table! {
    shipments (id) {
        id -> BigInt,
        address -> Text,
    }
}

fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").context("set DATABASE_URL to a PostgreSQL URL")?;
    let mut conn = PgConnection::establish(&url).context("connecting to DATABASE_URL")?;
    order_service::db::run_migrations(&mut conn)?;
    diesel::sql_query(
        "CREATE TEMPORARY TABLE shipments (id bigserial PRIMARY KEY, address text NOT NULL)",
    )
    .execute(&mut conn)?;

    // Built once, kept in your application's state.
    let enqueuer = Enqueuer::new();

    // Committed: the shipment and its job exist together, and relays are
    // notified when (and only when) the transaction commits.
    let (shipment_id, job_id) = conn.transaction(|conn| -> anyhow::Result<(i64, i64)> {
        let shipment_id: i64 = diesel::insert_into(shipments::table)
            .values(shipments::address.eq("Nevsky Prospekt 28, St Petersburg"))
            .returning(shipments::id)
            .get_result(conn)?;
        let job = Noop(serde_json::json!({ "shipment_id": shipment_id }));
        let job_id = enqueuer.enqueue(conn, &job, &JobOptions::default().max_attempts(5))?;
        Ok((shipment_id, job_id))
    })?;
    println!("committed shipment {shipment_id} with job {job_id}");

    // Rolled back: the job goes with the shipment; no relay ever sees it.
    let mut doomed_job = None;
    let outcome = conn.transaction(|conn| -> anyhow::Result<()> {
        let shipment_id: i64 = diesel::insert_into(shipments::table)
            .values(shipments::address.eq("nowhere"))
            .returning(shipments::id)
            .get_result(conn)?;
        let job = Noop(serde_json::json!({ "shipment_id": shipment_id }));
        doomed_job = Some(enqueuer.enqueue(conn, &job, &JobOptions::default())?);
        anyhow::bail!("payment declined after the job was enqueued")
    });
    if let (Err(why), Some(job_id)) = (outcome, doomed_job) {
        use order_service::schema::jobs;
        let left: i64 = jobs::table.find(job_id).count().get_result(&mut conn)?;
        println!("rolled back ({why}): job {job_id} exists {left} times");
    }
    Ok(())
}
