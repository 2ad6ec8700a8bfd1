//! How a claim connection plans the claim: one generic plan, pinned to the
//! walk the claim was written for, or PostgreSQL's choice for each claim.
//!
//! A prepared statement is planned for its parameters (a custom plan) until
//! a generic plan is estimated to cost no more. The claim's generic plan
//! cannot estimate its `LIMIT` (a parameter less a subquery), so on a deep
//! queue it never wins, and every claim is planned afresh: on a drain of
//! noop jobs at batch 256 that planning (about half a millisecond a claim)
//! held the raw-SQL ceiling about a fifth below its rate with one generic
//! plan.
//!
//! A generic plan is made once, from the statistics of that moment, and a
//! queue's statistics are always behind its table: rows arrive and leave
//! faster than autovacuum analyzes. Made while `jobs` held a few rows, the
//! generic plan read the claimed ids by a sequential scan of the whole
//! table, and took the due jobs by a bitmap scan of every entry of
//! `jobs_claim_idx` and a sort; kept while the table grew, at 700 orders a
//! second both read about 900 pages a claim, the most of the server's CPU.
//! So the generic plan is pinned: with sequential scans, bitmap scans and
//! sorts disabled for the session, the only plan left is the one the claim
//! and its indexes were written for (an ordered walk of `jobs_claim_idx`
//! that stops at the batch, and probes of the primary key), whatever the
//! statistics said when it was made. Any plan cached under other settings
//! is dropped when the mode changes.
//!
//! A custom plan earns its cost only for a worker pool whose kinds are rare
//! in the table: it walks `jobs_kind_claim_idx` for them, where the ordered
//! walk reads every other kind's row on its way (200,000 rows for 16 jobs
//! of a rare kind, in a test: 92 ms against 1.3 ms). So the choice follows
//! the planner's own statistics: where the pool's kinds are at least
//! [`GENERIC_SHARE`] of the table's rows, the ordered walk reads at most
//! about two rows a job and the connection keeps its generic plan; where
//! they are rarer it leaves the choice to PostgreSQL (sequential scans stay
//! off: no claim wants one). Before `jobs` has statistics (a new or empty
//! table, not yet analyzed) the pool gets the generic plan: a relay that
//! starts on an empty queue is the common case, and a pool of rare kinds
//! pays the walk only until autovacuum's first analyze of the table. The
//! share is read again every [`CHECK_EVERY`] (a read of the catalog, next
//! to which a claim costs more), so a backlog of another kind that builds
//! up later turns the custom plans on as soon as an analyze has seen it.

use std::time::Duration;

use tokio_postgres::{Client, Statement};

/// The least share of `jobs`' rows the pool's kinds must have, by the
/// planner's statistics, for a claim connection to keep one generic plan.
pub const GENERIC_SHARE: f64 = 0.5;

/// How often a claim connection reads the share again.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How a worker pool's connections other than the claims' plan their
/// statements (the finish, the heartbeat, the reaper's).
///
/// Every statement there reads and writes `jobs` by key (ids, lease tokens,
/// an ordering key, the parents a job waits on), and none wants a
/// sequential scan of it. But a plan is made from the statistics of its
/// moment, and a queue's are always behind its table: made while `jobs`
/// held a few rows, the finish's plan read it by four sequential scans, and
/// kept while the table grew, every finish read the whole of it. With
/// sequential scans disabled for the session the planner takes the indexes
/// whatever the statistics say, so one generic plan per statement is safe
/// to keep: each statement is planned once per connection, not (as when
/// the connections dropped their plans every second to see the table anew)
/// five times a second, which at 200 orders a second was four finishes in
/// ten and half of the finish's server time. A local write's statement
/// ([`crate::outbox::LocalWrite`]), prepared on the same connection, is
/// planned the same way: keep it to rows found by key.
pub const BY_KEY_PLANNING: &str =
    "SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan";

/// Whether `jobs.kind` has statistics, the share of `jobs`' rows whose
/// kind is in `$1` as the last analyze estimates it (the most common values'
/// frequencies: every kind, where there are a hundred kinds or fewer; a kind
/// not among them is rare, and counts nothing), and the session's planning
/// settings ([`ClaimPlan::planning`]). One read of `pg_stats`, prepared once
/// per connection ([`ClaimPlanner`]): planning it took most of its 0.8 ms,
/// which a claim waited for once a second.
const SHARE_SQL: &str = "\
SELECT count(*) > 0 AS analyzed,
       coalesce(sum(m.freq) FILTER (WHERE m.kind = ANY ($1::text[])), 0)::float8 AS share,
       concat_ws(' ', current_setting('plan_cache_mode'), current_setting('enable_seqscan'),
                 current_setting('enable_bitmapscan'), current_setting('enable_sort'))
           AS planning
FROM pg_stats AS s
LEFT JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
    AS m (kind, freq) ON true
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

    /// The plan for kinds with `share` of the table's rows, `None` when
    /// `jobs` has no statistics yet.
    pub fn for_statistics(share: Option<f64>) -> ClaimPlan {
        share.map_or(ClaimPlan::Generic, ClaimPlan::for_share)
    }

    /// The session's settings under this plan, as [`SHARE_SQL`] reads them.
    fn planning(self) -> &'static str {
        match self {
            ClaimPlan::Generic => "force_generic_plan off off off",
            ClaimPlan::Chosen => "auto off on on",
        }
    }

    /// What sets them; the plans cached under other settings are dropped.
    fn setting(self) -> &'static str {
        match self {
            ClaimPlan::Generic => {
                "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
                 SET enable_bitmapscan = off; SET enable_sort = off; DISCARD PLANS"
            }
            ClaimPlan::Chosen => {
                "SET plan_cache_mode = auto; SET enable_seqscan = off; \
                 SET enable_bitmapscan = on; SET enable_sort = on; DISCARD PLANS"
            }
        }
    }
}

/// Chooses a claim connection's plan: the read of the statistics, prepared
/// on that connection.
#[derive(Debug, Clone)]
pub struct ClaimPlanner {
    share: Statement,
}

impl ClaimPlanner {
    /// Prepares the read of the statistics on `client`.
    pub async fn prepare(client: &Client) -> Result<ClaimPlanner, tokio_postgres::Error> {
        Ok(ClaimPlanner {
            share: client.prepare(SHARE_SQL).await?,
        })
    }

    /// Reads the share of `kinds` and sets the session's planning on
    /// `client` (the connection it was prepared on) to match, where it does
    /// not already: for the claim connections of a worker pool of `kinds`,
    /// and a benchmark that runs the claim as they do.
    pub async fn choose(
        &self,
        client: &Client,
        kinds: &[String],
    ) -> Result<ClaimPlan, tokio_postgres::Error> {
        let row = client.query_one(&self.share, &[&kinds]).await?;
        let analyzed: bool = row.get(0);
        let plan = ClaimPlan::for_statistics(analyzed.then(|| row.get(1)));
        let planning: String = row.get(2);
        if planning != plan.planning() {
            client.batch_execute(plan.setting()).await?;
        }
        Ok(plan)
    }
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

    #[test]
    fn a_table_without_statistics_gets_the_generic_plan() {
        assert_eq!(ClaimPlan::for_statistics(None), ClaimPlan::Generic);
        assert_eq!(ClaimPlan::for_statistics(Some(0.2)), ClaimPlan::Chosen);
        assert_eq!(ClaimPlan::for_statistics(Some(0.7)), ClaimPlan::Generic);
    }
}
