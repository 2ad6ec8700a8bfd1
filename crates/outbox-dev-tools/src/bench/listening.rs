//! Waiting for a relay to be ready by what the server sees of it: a LISTEN
//! connection to the bench's database opened since the relay was started.
//! A fixed sleep stood in for this (1.5 s before each drain, 1 s before each
//! latency run); a relay is ready in a few tens of milliseconds.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

/// Time for the relay's first claim (on an empty queue) after its listener
/// is up, so that what follows finds it idle.
const SETTLE: Duration = Duration::from_millis(100);
/// A relay whose listener never appears still polls: after this the bench
/// goes on without it, as it did after its fixed sleep.
const LIMIT: Duration = Duration::from_secs(5);

/// The server's clock now, to compare with `pg_stat_activity.backend_start`.
pub(super) fn server_clock(conn: &mut PgConnection) -> anyhow::Result<String> {
    #[derive(QueryableByName)]
    struct Now {
        #[diesel(sql_type = Text)]
        now: String,
    }
    Ok(diesel::sql_query("SELECT clock_timestamp()::text AS now")
        .get_result::<Now>(conn)?
        .now)
}

/// Waits until a backend of this database that started at `since` or later
/// has run LISTEN, then [`SETTLE`]; at most [`LIMIT`].
pub(super) fn wait_for_listener(conn: &mut PgConnection, since: &str) -> anyhow::Result<()> {
    #[derive(QueryableByName)]
    struct Listening {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        let listening = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN %' \
             AND backend_start >= $1::timestamptz",
        )
        .bind::<Text, _>(since)
        .get_result::<Listening>(conn)?;
        if listening.n > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(SETTLE);
    Ok(())
}
