//! The growth rows' drains: the first `--growth-drained` jobs off the top of
//! a backlog of each `--growth-backlogs` size, in `--repeat` rounds.
//!
//! One timed drain of 20,000 jobs lasts about 0.2 s here, short enough that
//! a single pair read anything from 0.76x to 1.20x on one build within a
//! minute. So each round drains every backlog in turn, smallest first, and
//! the row is the median of the rounds' paired ratios: drift of the machine
//! across a run moves both drains of a round alike.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use diesel::prelude::*;
use diesel::sql_types::BigInt;

use super::BenchArgs;
use super::buffers::{self, DrainBuffers};
use super::growth::{blocking, count};
use super::latency::{self, RecordingRelay};
use super::placement::median;

/// How long the timed part of one drain may take before the row fails.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// The drain rate off the top of one backlog, over the rounds.
#[derive(Debug, Clone)]
pub struct BacklogDrain {
    pub backlog: usize,
    /// Jobs timed in each round: from the first one's finish to the last one's.
    pub drained: usize,
    /// The median of `rounds`.
    pub jobs_per_second: f64,
    /// Each round's rate, in order.
    pub rounds: Vec<f64>,
    /// Pages per job over the relay's whole run in the median round (its
    /// start and whatever it finished past the timed jobs included).
    pub buffers: DrainBuffers,
}

impl BacklogDrain {
    /// Each round's rate over `base`'s in the same round.
    pub fn ratios_to(&self, base: &BacklogDrain) -> Vec<f64> {
        self.rounds
            .iter()
            .zip(&base.rounds)
            .map(|(rate, base)| rate / base.max(f64::MIN_POSITIVE))
            .collect()
    }
}

/// One timed drain.
struct Round {
    jobs_per_second: f64,
    buffers: DrainBuffers,
}

/// `--repeat` rounds of a drain off each backlog, smallest first.
pub async fn drain_rounds(url: &str, args: &BenchArgs) -> anyhow::Result<Vec<BacklogDrain>> {
    let rounds = args.repeat.max(1);
    let mut runs: Vec<Vec<Round>> = args.growth_backlogs.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for (&backlog, runs) in args.growth_backlogs.iter().zip(&mut runs) {
            let run = drain_off_backlog(url, args, backlog)
                .await
                .with_context(|| format!("draining off a backlog of {backlog}"))?;
            eprintln!(
                "  growth, round {round} of {rounds}: {} jobs off a backlog of {backlog}: {:.0} jobs/s",
                args.growth_drained.min(backlog),
                run.jobs_per_second
            );
            runs.push(run);
        }
    }
    Ok(args
        .growth_backlogs
        .iter()
        .zip(runs)
        .map(|(&backlog, mut runs)| {
            let rates: Vec<f64> = runs.iter().map(|r| r.jobs_per_second).collect();
            let jobs_per_second = median(&rates).unwrap_or(f64::NAN);
            // The buffers of the round nearest the median.
            let nearest = rates
                .iter()
                .enumerate()
                .min_by(|a, b| {
                    (a.1 - jobs_per_second)
                        .abs()
                        .total_cmp(&(b.1 - jobs_per_second).abs())
                })
                .map_or(0, |(i, _)| i);
            BacklogDrain {
                backlog,
                drained: args.growth_drained.min(backlog),
                jobs_per_second,
                buffers: runs.swap_remove(nearest).buffers,
                rounds: rates,
            }
        })
        .collect())
}

async fn drain_off_backlog(url: &str, args: &BenchArgs, backlog: usize) -> anyhow::Result<Round> {
    latency::reset(url).await?;
    blocking(url, move |conn| {
        diesel::sql_query(
            "INSERT INTO jobs (kind, payload, has_dependents) \
             SELECT 'noop', '{}'::jsonb, false FROM generate_series(1, $1)",
        )
        .bind::<BigInt, _>(count(backlog))
        .execute(conn)?;
        // A fresh table and fresh statistics, as the drains start from.
        diesel::sql_query("VACUUM ANALYZE jobs").execute(conn)?;
        // The setup's pages written back before the timed drain, for every
        // backlog alike. A backlog larger than shared_buffers leaves them
        // full of its dirty pages, so without this the drain's backends (and
        // the background writer) write back the setup's pages to find room
        // for their own: a cost of the INSERT above, charged to the larger
        // backlog's drain only. Not a superuser: the row runs as before.
        if let Err(error) = diesel::sql_query("CHECKPOINT").execute(conn) {
            eprintln!(
                "  growth: no CHECKPOINT after the setup ({error}); the drain off {backlog} \
                 may write back the setup's pages"
            );
        }
        Ok(())
    })
    .await?;
    let wanted = args.growth_drained.min(backlog);
    let before = blocking(url, |conn| Ok(buffers::read(conn)?)).await?;
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let done = wait_for_done(url, wanted).await;
    relay.stop().await?;
    done?;
    let after = blocking(url, |conn| Ok(buffers::read(conn)?)).await?;
    #[derive(QueryableByName)]
    struct Span {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Double>)]
        seconds: Option<f64>,
    }
    // From the first finish to the last of the first `wanted`: the relay's
    // start and its first claim are left out.
    let span: Span = blocking(url, move |conn| {
        Ok(diesel::sql_query(
            "SELECT extract(epoch FROM max(finished_at) - min(finished_at))::float8 AS seconds \
             FROM (SELECT finished_at FROM jobs_done ORDER BY finished_at LIMIT $1) AS first",
        )
        .bind::<BigInt, _>(count(wanted))
        .get_result(conn)?)
    })
    .await?;
    let seconds = span.seconds.context("no job finished")?;
    Ok(Round {
        jobs_per_second: wanted.saturating_sub(1) as f64 / seconds.max(1e-6),
        buffers: DrainBuffers::between(before, after),
    })
}

/// Waits until `wanted` jobs are done.
async fn wait_for_done(url: &str, wanted: usize) -> anyhow::Result<()> {
    blocking(url, move |conn| {
        #[derive(QueryableByName)]
        struct Done {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let deadline = Instant::now() + DRAIN_LIMIT;
        loop {
            let done: Done = diesel::sql_query(
                "SELECT count(*) AS n FROM (SELECT 1 FROM jobs_done LIMIT $1) AS d",
            )
            .bind::<BigInt, _>(count(wanted))
            .get_result(conn)?;
            if done.n >= count(wanted) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {} of {wanted} jobs done after {} s",
                done.n,
                DRAIN_LIMIT.as_secs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
}
