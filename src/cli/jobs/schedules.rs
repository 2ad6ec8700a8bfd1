//! What `jobs schedules` prints: the periodic jobs relays declared, with the
//! last slot enqueued and the next, as a table or JSON.

use anyhow::Context as _;

use super::{SchedulesArgs, with_conn};
use crate::cli::table::{Align, print_list};
use crate::outbox;

pub(super) async fn schedules(args: SchedulesArgs) -> anyhow::Result<()> {
    let rows = with_conn(&args.db, |conn| {
        outbox::periodic_schedules(conn, chrono::Utc::now()).context("listing periodic jobs")
    })
    .await?;
    let when = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map_or_else(
            || "-".to_owned(),
            |at| at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
        )
    };
    print_list(
        &rows,
        args.json,
        "no periodic jobs (relays declare them when they start)",
        &[
            ("NAME", Align::Left),
            ("SCHEDULE", Align::Left),
            ("KIND", Align::Left),
            ("LAST RUN", Align::Left),
            ("LAST JOB", Align::Right),
            ("NEXT RUN", Align::Left),
        ],
        |row| {
            vec![
                row.name.clone(),
                row.schedule.clone(),
                row.kind.clone(),
                when(row.last_run),
                row.last_job_id
                    .map_or_else(|| "-".to_owned(), |id| id.to_string()),
                when(row.next_run),
            ]
        },
    )
}
