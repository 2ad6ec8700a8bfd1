//! Where an open-loop run's enqueue-to-start time goes, job by job: from
//! `created_at` (the placing statement's start) to `locked_at` (the claim's
//! start), the wait to be claimed, which holds the placement's commit, the
//! wake-up and the claim loop's pace; then from `locked_at` to the executor
//! starting the job, which holds the claim statement itself and the hand-off
//! to an effect slot. For the slowest 1% it also says how the tail spreads
//! over the run (one stall or many), and what the server's sessions were
//! waiting on through it, sampled every [`SAMPLE_EVERY`].
//!
//! Both stamps come from the server's clock and the start from this host's,
//! the same clock on one machine (as the open loop's waits already assume).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};

use super::percentiles::Latency;

/// How often the server's wait events are read during a run.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The width of the slots the tail's spread is counted in.
const SLOT_MS: i64 = 100;

/// One job's start, as the recording executor saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Start {
    pub id: i64,
    pub kind: &'static str,
    pub created_at: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
}

impl Start {
    /// Its enqueue-to-start wait. Same host, same realtime clock as the
    /// server's now(); a step of that clock mid-run could make a wait
    /// negative: 0.
    pub(super) fn wait_micros(&self) -> u64 {
        micros(self.created_at, self.started_at)
    }
}

/// Where a run's enqueue-to-start time went.
#[derive(Debug, Clone)]
pub struct Phases {
    /// `created_at` to `locked_at`, every job of the run.
    pub to_claim: Latency,
    /// From the moment the job could be claimed (its `created_at`, or for a
    /// job that waited for parents the last parent's `finished_at`) to the
    /// executor's start, every job of the run: the queue's own latency,
    /// without the parents' runs a dependent waits through.
    pub from_claimable: Latency,
    /// `locked_at` to the executor's start, every job of the run.
    pub claim_to_start: Latency,
    /// The slowest 1% of the jobs by enqueue-to-start, and their medians.
    pub tail_jobs: usize,
    pub tail_to_claim_ms: f64,
    pub tail_claim_to_start_ms: f64,
    /// The tail's jobs by kind, most first.
    pub tail_kinds: Vec<(&'static str, usize)>,
    /// How many [`SLOT_MS`] slots of the run the tail's jobs were created
    /// in: few means one stall, many a steady share of slow jobs.
    pub tail_slots: usize,
    /// The run's length in those slots.
    pub run_slots: usize,
    /// The server's waits during the run, each with the start of the
    /// statement that waited (past its comments, unless the server's
    /// `track_activity_query_size` kept only comments): the average number
    /// of active sessions in each
    /// (`CPU` when a session waited on nothing), most first, and of sessions
    /// idle inside a transaction.
    pub waits: Vec<(String, f64)>,
    pub idle_in_transaction: f64,
}

/// Reads `pg_stat_activity` every [`SAMPLE_EVERY`] on a connection of its
/// own until [`WaitSampler::finish`].
pub(super) struct WaitSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<WaitCounts>>,
}

#[derive(Debug, Default)]
pub(super) struct WaitCounts {
    samples: u64,
    active: HashMap<String, u64>,
    idle_in_transaction: u64,
}

#[derive(QueryableByName)]
struct WaitRow {
    #[diesel(sql_type = Text)]
    wait: String,
    #[diesel(sql_type = BigInt)]
    sessions: i64,
}

impl WaitSampler {
    pub(super) fn start(url: &str) -> anyhow::Result<WaitSampler> {
        let mut conn = PgConnection::establish(url)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bench-wait-sampler".to_owned())
            .spawn(move || -> anyhow::Result<WaitCounts> {
                let mut counts = WaitCounts::default();
                while !stopping.load(Ordering::Relaxed) {
                    let rows = diesel::sql_query(
                        "SELECT CASE WHEN state = 'idle in transaction' THEN 'idle in transaction' \
                                     ELSE coalesce(wait_event_type || ':' || wait_event, 'CPU') \
                                          || ' (' || coalesce(nullif(left(btrim(regexp_replace( \
                                             regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g')), 20), ''), \
                                             left(query, 24)) || ')' \
                                END AS wait, \
                                count(*) AS sessions \
                         FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid() \
                           AND backend_type = 'client backend' \
                           AND state IN ('active', 'idle in transaction') \
                         GROUP BY 1",
                    )
                    .load::<WaitRow>(&mut conn)?;
                    counts.samples += 1;
                    for row in rows {
                        let sessions = u64::try_from(row.sessions).unwrap_or(0);
                        if row.wait == "idle in transaction" {
                            counts.idle_in_transaction += sessions;
                        } else {
                            *counts.active.entry(row.wait).or_default() += sessions;
                        }
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
                Ok(counts)
            })?;
        Ok(WaitSampler { stop, thread })
    }

    pub(super) fn finish(self) -> anyhow::Result<WaitCounts> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the wait sampler panicked"))?
    }
}

/// A finished job of the run, or a parent of one.
#[derive(QueryableByName)]
struct Done {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<Timestamptz>)]
    locked_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    finished_at: DateTime<Utc>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Array<BigInt>>)]
    depends_on: Option<Vec<i64>>,
}

/// When a job was claimed, and when its last parent finished (none when it
/// waited for none).
type ClaimTimes = (DateTime<Utc>, Option<DateTime<Utc>>);

/// The claim times of `starts`' jobs (done, so in `jobs_done`), and the
/// breakdown; `None` when no job of the run is found there.
pub(super) fn measure(
    conn: &mut PgConnection,
    starts: &[Start],
    waits: WaitCounts,
    run: Duration,
) -> anyhow::Result<Option<Phases>> {
    let (Some(first), Some(last)) = (
        starts.iter().map(|s| s.id).min(),
        starts.iter().map(|s| s.id).max(),
    ) else {
        return Ok(breakdown(starts, &HashMap::new(), waits, run));
    };
    // One range of ids, the run's jobs and their parents (enqueued by the
    // same placements), read once through the BRIN index on `id` and joined
    // here: a subquery or an `= ANY` per job probed that index once per id,
    // minutes after a run of 60,000 jobs.
    let done: HashMap<i64, Done> = diesel::sql_query(
        "SELECT id, locked_at, finished_at, depends_on FROM jobs_done \
         WHERE id BETWEEN $1 AND $2",
    )
    .bind::<BigInt, _>(first)
    .bind::<BigInt, _>(last)
    .load::<Done>(conn)?
    .into_iter()
    .map(|d| (d.id, d))
    .collect();
    let claimed: HashMap<i64, ClaimTimes> = starts
        .iter()
        .filter_map(|s| {
            let job = done.get(&s.id)?;
            let released_at = job
                .depends_on
                .iter()
                .flatten()
                .filter_map(|parent| done.get(parent).map(|p| p.finished_at))
                .max();
            Some((s.id, (job.locked_at?, released_at)))
        })
        .collect();
    Ok(breakdown(starts, &claimed, waits, run))
}

fn micros(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_microseconds().unwrap_or(0)).unwrap_or(0)
}

fn median_ms(mut values: Vec<u64>) -> f64 {
    values.sort_unstable();
    Latency::from_sorted_micros(&values).p50_ms
}

fn breakdown(
    starts: &[Start],
    claimed: &HashMap<i64, ClaimTimes>,
    waits: WaitCounts,
    run: Duration,
) -> Option<Phases> {
    let mut from_claimable = Vec::with_capacity(starts.len());
    // (enqueue-to-start, to claim, claim to start, created_at, kind)
    let mut jobs: Vec<(u64, u64, u64, DateTime<Utc>, &'static str)> = starts
        .iter()
        .filter_map(|s| {
            let (locked_at, released_at) = *claimed.get(&s.id)?;
            let claimable = released_at.map_or(s.created_at, |at| at.max(s.created_at));
            from_claimable.push(micros(claimable, s.started_at));
            Some((
                s.wait_micros(),
                micros(s.created_at, locked_at),
                micros(locked_at, s.started_at),
                s.created_at,
                s.kind,
            ))
        })
        .collect();
    let first = jobs.iter().map(|j| j.3).min()?;
    from_claimable.sort_unstable();
    let mut to_claim: Vec<u64> = jobs.iter().map(|j| j.1).collect();
    let mut claim_to_start: Vec<u64> = jobs.iter().map(|j| j.2).collect();
    to_claim.sort_unstable();
    claim_to_start.sort_unstable();
    jobs.sort_unstable_by_key(|j| std::cmp::Reverse(j.0));
    let tail = &jobs[..jobs.len().div_ceil(100)];
    let slots: std::collections::HashSet<i64> = tail
        .iter()
        .map(|j| (j.3 - first).num_milliseconds() / SLOT_MS)
        .collect();
    let mut tail_kinds: Vec<(&'static str, usize)> = Vec::new();
    for job in tail {
        match tail_kinds.iter_mut().find(|(kind, _)| *kind == job.4) {
            Some((_, n)) => *n += 1,
            None => tail_kinds.push((job.4, 1)),
        }
    }
    tail_kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let samples = waits.samples.max(1) as f64;
    let mut active: Vec<(String, f64)> = waits
        .active
        .into_iter()
        .map(|(wait, n)| (wait, n as f64 / samples))
        .collect();
    active.sort_by(|a, b| b.1.total_cmp(&a.1));
    Some(Phases {
        from_claimable: Latency::from_sorted_micros(&from_claimable),
        to_claim: Latency::from_sorted_micros(&to_claim),
        claim_to_start: Latency::from_sorted_micros(&claim_to_start),
        tail_jobs: tail.len(),
        tail_to_claim_ms: median_ms(tail.iter().map(|j| j.1).collect()),
        tail_claim_to_start_ms: median_ms(tail.iter().map(|j| j.2).collect()),
        tail_kinds,
        tail_slots: slots.len(),
        run_slots: usize::try_from(run.as_millis() / SLOT_MS as u128).unwrap_or(usize::MAX),
        waits: active,
        idle_in_transaction: waits.idle_in_transaction as f64 / samples,
    })
}

impl Phases {
    /// One line for the report: the tail's split, its spread, the top waits.
    pub fn line(&self) -> String {
        let kinds: Vec<String> = self
            .tail_kinds
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        let waits: Vec<String> = self
            .waits
            .iter()
            .take(6)
            .map(|(wait, sessions)| format!("{wait} {sessions:.2}"))
            .collect();
        format!(
            "from claimable p50 {:.2} p99 {:.2} ms; to claim p50 {:.2} p99 {:.2} ms, claim to start p50 {:.2} p99 {:.2} ms; \
             slowest {} jobs ({}): medians {:.2} to claim + {:.2} claim to start, created in {} of {} \
             {SLOT_MS} ms slots; active sessions by wait: {}; idle in transaction {:.2}",
            self.from_claimable.p50_ms,
            self.from_claimable.p99_ms,
            self.to_claim.p50_ms,
            self.to_claim.p99_ms,
            self.claim_to_start.p50_ms,
            self.claim_to_start.p99_ms,
            self.tail_jobs,
            kinds.join(", "),
            self.tail_to_claim_ms,
            self.tail_claim_to_start_ms,
            self.tail_slots,
            self.run_slots,
            waits.join(", "),
            self.idle_in_transaction,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_split_at_the_claim_and_counted_in_the_slots_it_was_created_in() {
        let base = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).expect("a time");
        let ms = |n: i64| base + chrono::Duration::milliseconds(n);
        let mut starts = Vec::new();
        let mut claimed = HashMap::new();
        // 198 quick jobs (1 ms to claim, 1 ms to start), two slow ones a
        // second apart whose 40 ms were spent waiting to be claimed.
        for i in 0..200 {
            let created = ms(i * 10);
            let (to_claim, to_start) = if i == 50 || i == 150 { (40, 2) } else { (1, 1) };
            // The slow ones waited 30 ms of their 40 for a parent.
            let released =
                (i == 50 || i == 150).then(|| created + chrono::Duration::milliseconds(30));
            claimed.insert(
                i,
                (created + chrono::Duration::milliseconds(to_claim), released),
            );
            starts.push(Start {
                id: i,
                kind: if i == 50 { "email" } else { "noop" },
                created_at: created,
                started_at: created + chrono::Duration::milliseconds(to_claim + to_start),
            });
        }
        let mut waits = WaitCounts {
            samples: 4,
            ..WaitCounts::default()
        };
        waits.active.insert("CPU".into(), 6);
        waits.active.insert("IO:WALSync".into(), 2);
        let phases = breakdown(&starts, &claimed, waits, Duration::from_secs(2)).expect("phases");
        assert_eq!(phases.tail_jobs, 2);
        assert_eq!(phases.to_claim.p50_ms, 1.0);
        assert_eq!(phases.tail_to_claim_ms, 40.0);
        assert_eq!(phases.tail_claim_to_start_ms, 2.0);
        assert_eq!(phases.to_claim.max_ms, 40.0);
        assert_eq!(phases.tail_slots, 2);
        assert_eq!(phases.tail_kinds, vec![("email", 1), ("noop", 1)]);
        // 12 ms from their parent's finish.
        assert_eq!(phases.from_claimable.max_ms, 12.0);
        assert_eq!(phases.from_claimable.p50_ms, 2.0);
        assert_eq!(phases.run_slots, 20);
        assert_eq!(phases.waits[0], ("CPU".to_owned(), 1.5));
        assert_eq!(phases.waits[1], ("IO:WALSync".to_owned(), 0.5));
    }
}
