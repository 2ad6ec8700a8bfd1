//! Whether a claim connection keeps one generic plan of the claim, or lets
//! PostgreSQL plan each claim for its parameters.
//!
//! A prepared statement is planned for its parameters (a custom plan) until
//! a generic plan is estimated to cost no more. The claim's generic plan
//! cannot estimate its `LIMIT` (a parameter less a subquery), so on a deep
//! queue it never wins, and every claim is planned afresh: on a drain of
//! noop jobs at batch 256 that planning (about half a millisecond a claim)
//! held the raw-SQL ceiling about a fifth below its rate with one generic
//! plan.
//!
//! A custom plan earns its cost only for a worker pool whose kinds are rare
//! in the table: it walks `jobs_kind_claim_idx` for them, where the generic
//! plan walks the whole queue in claim order, reading every other kind's
//! row on its way (200,000 rows for 16 jobs of a rare kind, in a test:
//! 92 ms against 1.3 ms). So the choice follows the planner's own
//! statistics: where the pool's kinds are at least [`GENERIC_SHARE`] of the
//! table's rows, the generic plan walks at most about two rows a job and the
//! connection keeps it; anywhere else, or with no statistics, it leaves the
//! choice to PostgreSQL, as before. The share is read again every
//! [`CHECK_EVERY`] (a read of the catalog, next to which a claim costs
//! more), so a backlog of another kind that builds up later turns the
//! custom plans back on as soon as an analyze has seen it.

use std::time::Duration;

use tokio_postgres::Client;

/// The least share of `jobs`' rows the pool's kinds must have, by the
/// planner's statistics, for a claim connection to keep one generic plan.
pub const GENERIC_SHARE: f64 = 0.5;

/// How often a claim connection reads the share again.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The share of `jobs`' rows whose kind is in `$1`, as the statistics of the
/// last analyze estimate it: the most common values' frequencies (every kind,
/// where there are a hundred kinds or fewer). A kind not among them is rare,
/// and counts nothing; no statistics at all read as 0.
const SHARE_SQL: &str = "\
SELECT coalesce(sum(m.freq) FILTER (WHERE m.kind = ANY ($1::text[])), 0)::float8 AS share
FROM pg_stats AS s
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m (kind, freq)
WHERE s.schemaname = current_schema() AND s.tablename = 'jobs' AND s.attname = 'kind'";

/// How a claim connection's prepared claim is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPlan {
    /// One generic plan, kept (`plan_cache_mode = force_generic_plan`).
    Generic,
    /// PostgreSQL's own choice (`plan_cache_mode = auto`).
    Chosen,
}

impl ClaimPlan {
    /// The plan for kinds with `share` of the table's rows.
    pub fn for_share(share: f64) -> ClaimPlan {
        if share >= GENERIC_SHARE {
            ClaimPlan::Generic
        } else {
            ClaimPlan::Chosen
        }
    }

    fn setting(self) -> &'static str {
        match self {
            ClaimPlan::Generic => "SET plan_cache_mode = force_generic_plan",
            ClaimPlan::Chosen => "SET plan_cache_mode = auto",
        }
    }
}

/// Reads the share of `kinds` and sets the session's plan mode on `client`
/// to match: for the claim connections of a worker pool of `kinds`, and a
/// benchmark that runs the claim as they do. Changes no cached plan: the
/// mode is read on each execution.
pub async fn choose_claim_plan(
    client: &Client,
    kinds: &[String],
) -> Result<ClaimPlan, tokio_postgres::Error> {
    let share: f64 = client.query_one(SHARE_SQL, &[&kinds]).await?.get(0);
    let plan = ClaimPlan::for_share(share);
    client.batch_execute(plan.setting()).await?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_half_the_rows_or_more_keep_a_generic_plan_and_rarer_ones_do_not() {
        assert_eq!(ClaimPlan::for_share(1.0), ClaimPlan::Generic);
        assert_eq!(ClaimPlan::for_share(GENERIC_SHARE), ClaimPlan::Generic);
        assert_eq!(ClaimPlan::for_share(0.49), ClaimPlan::Chosen);
        assert_eq!(ClaimPlan::for_share(0.0), ClaimPlan::Chosen);
    }
}
