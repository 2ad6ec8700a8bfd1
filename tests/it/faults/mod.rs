//! Fault injection: the built `outbox-relay` binary as separate processes
//! (`relay`, `serve`), a real PostgreSQL, and a real SMTP sink and HTTP webhook
//! receiver that the test controls. Each scenario injects one fault (a signal,
//! a lost connection, a server restart, an outage of a receiver, a burst) and
//! ends with [`invariants::assert_invariants`].
//!
//! - [`workers`]: SIGKILL, SIGSTOP/SIGCONT, SIGTERM, `--kinds`, a small pool;
//! - [`database`]: killed connections, a server restart;
//! - [`failover`]: a standby promoted under load, and back again;
//! - [`receivers`]: an SMTP outage, a misbehaving webhook receiver;
//! - [`inbox`]: payments in through two replicas, one SIGKILLed partway;
//! - [`bad_input`]: property tests over order parsing and the API, hostile values;
//! - [`security`]: the webhook signature checked independently, secrets in logs;
//! - [`ordering`]: ordered delivery of each order's events with real relays;
//! - [`hardening`]: hostile bytes, refused outcomes, deadlines, lost leases,
//!   locked rows, a relay that cannot claim (`/livez`), retry wake-ups.
//!
//! `cargo test faults` runs them all; process logs of a failed test are kept
//! under `target/tmp/fault-logs/`.

mod bad_input;
mod database;
mod failover;
mod hardening;
mod inbox;
mod invariants;
mod ordering;
mod receivers;
mod security;
mod tls;
mod workers;

use order_service::orders::order_enqueuer;
use std::net::SocketAddr;
use std::time::Duration;

use diesel::prelude::*;
use order_service::orders::place_order;
use order_service::schema::jobs_all;

use crate::support::http::{Answer, HttpSink};
use crate::support::process::Launch;
use crate::support::sample_order;
use crate::support::smtp::SmtpSink;

pub use invariants::{JobRow, Summary, assert_invariants, load_jobs};

/// The webhook signing key of every relay started here.
pub const WEBHOOK_SECRET: &str = "whsec-faults-7f3a9c1e5b";

/// The SMTP sink and the webhook receiver of one scenario.
pub struct Sinks {
    pub smtp: SmtpSink,
    pub http: HttpSink,
}

impl Sinks {
    /// A sink that accepts every mail, and a receiver that answers with
    /// `script` in order, then with `then`.
    pub async fn start(script: impl IntoIterator<Item = Answer>, then: Answer) -> Sinks {
        Sinks {
            smtp: SmtpSink::start().await,
            http: HttpSink::start(script, then).await,
        }
    }

    pub fn smtp_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.smtp.port()))
    }

    /// A relay of every kind, mailing to the sink and calling the receiver.
    pub fn relay(&self, name: &str, database_url: &str) -> Launch {
        Launch::relay(name, database_url)
            .env("SMTP_URL", self.smtp.url())
            .env("WEBHOOK_URL", self.http.url().as_str())
            .env("WEBHOOK_SECRET", WEBHOOK_SECRET)
    }

    /// The invariants, over what both sinks saw.
    pub fn check(&self, conn: &mut PgConnection) -> Summary {
        assert_invariants(conn, &self.http.requests(), &self.smtp.mails())
    }
}

/// Places `n` orders (three jobs each) with `max_attempts`; returns their ids.
pub fn place_orders(conn: &mut PgConnection, n: usize, max_attempts: i32) -> Vec<i64> {
    let order = sample_order();
    (0..n)
        .map(|_| {
            place_order(conn, &order_enqueuer(), &order, None, max_attempts)
                .expect("place order")
                .order_id()
        })
        .collect()
}

/// Jobs not yet `done` or `failed`.
pub fn unfinished(conn: &mut PgConnection) -> i64 {
    jobs_all::table
        .filter(jobs_all::status.ne_all(["done", "failed"]))
        .count()
        .get_result(conn)
        .expect("count unfinished jobs")
}

/// Waits until every job is `done` or `failed`; past `timeout`, fails
/// naming the jobs that are not, and their keys' state.
pub async fn wait_all_terminal(conn: &mut PgConnection, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while unfinished(conn) > 0 {
        if std::time::Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for every job done or failed; not yet:\n{}",
                unfinished_report(conn)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The unfinished jobs, one a line, and the concurrency keys they name.
fn unfinished_report(conn: &mut PgConnection) -> String {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = diesel::sql_types::Text)]
        line: String,
    }
    diesel::sql_query(
        "SELECT format('job %s %s %s attempts %s run_after %s lease %s key %s blocked %s \
                        waiting_on %s error %s',
                       id, kind, status, attempts, run_after, lease_expires_at,
                       concurrency_key, blocked, waiting_on, left(last_error, 200)) AS line
         FROM jobs ORDER BY id LIMIT 50",
    )
    .load::<Line>(conn)
    .map(|lines| {
        let mut out: Vec<String> = lines.into_iter().map(|l| l.line).collect();
        out.extend(
            diesel::sql_query(
                "SELECT format('key %s', to_jsonb(k)) AS line FROM job_concurrency_keys AS k \
                 WHERE k.key IN (SELECT concurrency_key FROM jobs)",
            )
            .load::<Line>(conn)
            .map(|keys| keys.into_iter().map(|l| l.line).collect::<Vec<_>>())
            .unwrap_or_else(|e| vec![format!("(keys: {e})")]),
        );
        out.join("\n")
    })
    .unwrap_or_else(|e| format!("(cannot list them: {e})"))
}

pub fn jobs_of_kind(conn: &mut PgConnection, kind: &str) -> Vec<JobRow> {
    load_jobs(conn)
        .into_iter()
        .filter(|j| j.kind == kind)
        .collect()
}

pub use crate::support::metric;
