//! Periodic jobs: a named job enqueued at each slot of a schedule (an
//! interval or a cron expression), by every worker pool that declares it and yet
//! once per slot, through a unique key in the database rather than a leader.
//!
//! A slot is a scheduled time. Interval slots are multiples of the interval
//! since the Unix epoch, and cron slots are the expression's times in UTC,
//! so every worker pool computes the same slots whatever its start time. At a slot
//! a worker pool inserts `(name, slot)` into `periodic_slots` and, in the same
//! transaction, enqueues the job; the primary key lets one insert through
//! (`sql/claim_periodic_slot.sql`). A worker pool only ever tries the latest slot
//! that has come, and only one later than every slot recorded: after an
//! outage the slots missed collapse into one run.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeZone as _, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz};
use serde::Serialize;

use super::args::JobArgs;
use super::{Enqueuer, JobOptions, NewJob};

/// The shortest interval a periodic job may have: below it the enqueue's
/// round trips would be a fair share of the period.
pub const MIN_PERIODIC_INTERVAL: Duration = Duration::from_millis(100);

/// Slots of each job kept in `periodic_slots` (the newest always).
const SLOTS_KEPT: i64 = 100;

/// When a periodic job runs: every interval, or at the times of a cron
/// expression (UTC). Its text form ([`fmt::Display`], read back by
/// [`Schedule::parse`]) is `every 15m` or `cron 0 3 * * *`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// Whole milliseconds, at least [`MIN_PERIODIC_INTERVAL`].
    Every(i64),
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// Every `interval` (at least [`MIN_PERIODIC_INTERVAL`], whole
    /// milliseconds): slots at the multiples of `interval` since the Unix
    /// epoch, so `every 15m` runs at :00, :15, :30 and :45.
    pub fn every(interval: Duration) -> Result<Schedule, String> {
        let millis = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
        if interval < MIN_PERIODIC_INTERVAL {
            return Err(format!(
                "interval {}: must be at least {}",
                humantime::format_duration(interval),
                humantime::format_duration(MIN_PERIODIC_INTERVAL)
            ));
        }
        if !interval.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(format!(
                "interval {}: must be whole milliseconds",
                humantime::format_duration(interval)
            ));
        }
        // A slot must stay a timestamp PostgreSQL and chrono can hold.
        if millis > 100 * 365 * 86_400_000 {
            return Err(format!(
                "interval {}: must be at most 100 years",
                humantime::format_duration(interval)
            ));
        }
        Ok(Schedule(Repr::Every(millis)))
    }

    /// At the times of a cron expression, in UTC: five fields (minute, hour,
    /// day of month, month, day of week) or six with seconds first, as the
    /// `croner` crate reads them (`*/15 * * * *`, `0 3 * * MON-FRI`,
    /// `@daily`).
    pub fn cron(expression: &str) -> Result<Schedule, String> {
        let cron: croner::Cron = expression
            .parse()
            .map_err(|e| format!("cron expression {expression:?}: {e}"))?;
        // An expression that can never match (`0 0 31 2 *`) would leave the
        // job declared and never run: refuse it here.
        let epoch = Utc.timestamp_opt(0, 0).single().unwrap_or_default();
        if cron.find_next_occurrence(&epoch, false).is_err() {
            return Err(format!("cron expression {expression:?}: never matches"));
        }
        Ok(Schedule(Repr::Cron(Box::new(cron))))
    }

    /// Reads the text form back: `every <duration>` or `cron <expression>`.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("every ") {
            let interval = humantime::parse_duration(rest.trim())
                .map_err(|e| format!("interval {rest:?}: {e}"))?;
            return Schedule::every(interval);
        }
        if let Some(rest) = text.strip_prefix("cron ") {
            return Schedule::cron(rest.trim());
        }
        Err(format!(
            "schedule {text:?}: expected \"every <duration>\" or \"cron <expression>\""
        ))
    }

    /// The latest slot at or before `now`, if there is one.
    pub fn latest_slot(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.0 {
            Repr::Every(millis) => {
                let slot = now.timestamp_millis().div_euclid(*millis) * millis;
                Utc.timestamp_millis_opt(slot).single()
            }
            Repr::Cron(cron) => cron.find_previous_occurrence(&now, true).ok(),
        }
    }

    /// The first slot after `now`, if there is one.
    pub fn next_slot(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.0 {
            Repr::Every(millis) => {
                let slot = (now.timestamp_millis().div_euclid(*millis) + 1).checked_mul(*millis)?;
                Utc.timestamp_millis_opt(slot).single()
            }
            Repr::Cron(cron) => cron.find_next_occurrence(&now, false).ok(),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Every(millis) => {
                let interval = Duration::from_millis(u64::try_from(*millis).unwrap_or(0));
                write!(f, "every {}", humantime::format_duration(interval))
            }
            Repr::Cron(cron) => write!(f, "cron {}", cron.as_str()),
        }
    }
}

/// A periodic job declared with a bad name or schedule: names the job and
/// the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("periodic job {name:?}: {why}")]
pub struct InvalidPeriodicJob {
    /// The job's name, as declared.
    pub name: String,
    /// What is wrong, naming the value.
    pub why: String,
}

/// A named job enqueued at each slot of its [`Schedule`], declared on the
/// worker pools' [`PoolSettings::periodic_jobs`](crate::worker_pool::PoolSettings::periodic_jobs).
///
/// Any number of worker pools may declare it: each slot is enqueued once, by
/// whichever worker pool gets there first, and a slot missed while every worker pool was
/// down runs once when one comes back (only the latest of several missed
/// slots). A new job runs at its first slot after it is first declared, not
/// at once. Each slot's job is due at the slot (its `run_after`), so a worker pool
/// whose clock runs ahead enqueues it early but it does not run early.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::outbox::PeriodicJob;
/// use outbox_core::worker::JobArgs;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct PurgeSessions {}
/// impl JobArgs for PurgeSessions {
///     const KIND: &'static str = "purge_sessions";
/// }
///
/// let every = PeriodicJob::every("purge_sessions", Duration::from_secs(900), &PurgeSessions {})?;
/// let nightly = PeriodicJob::cron("nightly_purge", "0 3 * * *", &PurgeSessions {})?;
/// assert_eq!(every.schedule().to_string(), "every 15m");
/// assert!(PeriodicJob::cron("broken", "61 * * * *", &PurgeSessions {}).is_err());
/// # Ok::<(), outbox_core::outbox::InvalidPeriodicJob>(())
/// ```
#[derive(Debug, Clone)]
pub struct PeriodicJob {
    name: String,
    schedule: Schedule,
    job: NewJob,
}

impl PeriodicJob {
    /// `args` enqueued every `interval` under `name` (see [`Schedule::every`]).
    pub fn every<A: JobArgs>(
        name: impl Into<String>,
        interval: Duration,
        args: &A,
    ) -> Result<PeriodicJob, InvalidPeriodicJob> {
        let name = name.into();
        match Schedule::every(interval) {
            Ok(schedule) => PeriodicJob::for_args(name, schedule, args),
            Err(why) => Err(InvalidPeriodicJob { name, why }),
        }
    }

    /// `args` enqueued at the times of a cron expression under `name` (see
    /// [`Schedule::cron`]).
    pub fn cron<A: JobArgs>(
        name: impl Into<String>,
        expression: &str,
        args: &A,
    ) -> Result<PeriodicJob, InvalidPeriodicJob> {
        let name = name.into();
        match Schedule::cron(expression) {
            Ok(schedule) => PeriodicJob::for_args(name, schedule, args),
            Err(why) => Err(InvalidPeriodicJob { name, why }),
        }
    }

    /// An untyped job (see [`NewJob::new`]) enqueued at each slot of
    /// `schedule` under `name`. Its `run_after` is replaced by each slot, and
    /// parents make no sense for it: it is enqueued without any.
    pub fn new(
        name: impl Into<String>,
        schedule: Schedule,
        job: NewJob,
    ) -> Result<PeriodicJob, InvalidPeriodicJob> {
        let name = name.into();
        let refuse = |why: &str| InvalidPeriodicJob {
            name: name.clone(),
            why: why.to_owned(),
        };
        if name.trim().is_empty() {
            return Err(refuse("the name must not be empty"));
        }
        if name.len() > 200 || name.chars().any(char::is_control) {
            return Err(refuse(
                "the name must be at most 200 bytes, without control characters",
            ));
        }
        let mut job = job.with_options(&JobOptions::default()).trace_context(None);
        job.run_after = None;
        Ok(PeriodicJob {
            name,
            schedule,
            job,
        })
    }

    fn for_args<A: JobArgs>(
        name: String,
        schedule: Schedule,
        args: &A,
    ) -> Result<PeriodicJob, InvalidPeriodicJob> {
        match NewJob::for_args(args, &JobOptions::default()) {
            Ok(job) => PeriodicJob::new(name, schedule, job),
            Err(e) => Err(InvalidPeriodicJob {
                name,
                why: format!("the arguments do not serialize: {e}"),
            }),
        }
    }

    /// The options each slot's job is enqueued with (`max_attempts`, an
    /// ordering or concurrency key); its `run_after` is the slot, and
    /// parents are ignored.
    pub fn options(mut self, options: &JobOptions) -> PeriodicJob {
        let options = JobOptions {
            run_after: None,
            depends_on: Vec::new(),
            ..options.clone()
        };
        self.job = self.job.with_options(&options);
        self
    }

    /// The job's name: unique among the periodic jobs of a database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When it runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The kind of the job each slot enqueues.
    pub fn kind(&self) -> &str {
        self.job.kind()
    }
}

/// Records `jobs` in `periodic_jobs` as declared at `now` (a new name's
/// first slot is its first after `now`; a known one keeps its first
/// declaration). A worker pool does this at start, before its first slot.
pub fn declare_periodic_jobs(
    conn: &mut PgConnection,
    jobs: &[PeriodicJob],
    now: DateTime<Utc>,
) -> QueryResult<()> {
    for job in jobs {
        diesel::sql_query(include_str!("sql/declare_periodic_job.sql"))
            .bind::<Text, _>(&job.name)
            .bind::<Text, _>(job.schedule.to_string())
            .bind::<Text, _>(job.kind())
            .bind::<Timestamptz, _>(now)
            .execute(conn)?;
    }
    Ok(())
}

/// The slot a worker pool enqueued: when it was due, and the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueuedSlot {
    /// The slot's scheduled time; the job's `run_after`.
    pub slot: DateTime<Utc>,
    /// The job enqueued for it.
    pub job_id: i64,
}

#[derive(QueryableByName)]
struct SlotRow {
    #[diesel(sql_type = Timestamptz)]
    slot: DateTime<Utc>,
}

/// Enqueues `job`'s latest slot at or before `now`, with `enqueuer`, unless
/// some worker pool already did, or a later slot ran, or the job was declared
/// after it ([`declare_periodic_jobs`] comes first): one transaction (a
/// savepoint inside the caller's), so the slot is recorded if and only if
/// its job is enqueued. `None`: nothing to do.
pub fn enqueue_due_slot(
    conn: &mut PgConnection,
    enqueuer: &Enqueuer,
    job: &PeriodicJob,
    now: DateTime<Utc>,
) -> QueryResult<Option<EnqueuedSlot>> {
    let Some(slot) = job.schedule.latest_slot(now) else {
        return Ok(None);
    };
    enqueuer.transaction(conn, |conn| {
        let claimed: Option<SlotRow> =
            diesel::sql_query(include_str!("sql/claim_periodic_slot.sql"))
                .bind::<Text, _>(&job.name)
                .bind::<Timestamptz, _>(slot)
                .get_result(conn)
                .optional()?;
        let Some(claimed) = claimed else {
            return Ok(None);
        };
        let mut new_job = job.job.clone();
        new_job.run_after = Some(claimed.slot);
        let job_id = enqueuer
            .enqueue_many(conn, std::slice::from_ref(&new_job))?
            .pop()
            .ok_or(diesel::result::Error::NotFound)?;
        diesel::sql_query(include_str!("sql/record_periodic_slot.sql"))
            .bind::<Text, _>(&job.name)
            .bind::<Timestamptz, _>(claimed.slot)
            .bind::<BigInt, _>(job_id)
            .bind::<BigInt, _>(SLOTS_KEPT)
            .execute(conn)?;
        Ok(Some(EnqueuedSlot {
            slot: claimed.slot,
            job_id,
        }))
    })
}

/// A declared periodic job as `jobs schedules` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeriodicSchedule {
    /// Its name.
    pub name: String,
    /// Its schedule, as the latest worker pool to start declared it.
    pub schedule: String,
    /// The kind of the job each slot enqueues.
    pub kind: String,
    /// The newest slot enqueued (`None`: none yet).
    pub last_run: Option<DateTime<Utc>>,
    /// The job that slot enqueued.
    pub last_job_id: Option<i64>,
    /// The first slot after now, by the stored schedule (`None`: the
    /// schedule has no later slot, or this version cannot read it).
    pub next_run: Option<DateTime<Utc>>,
    /// When it was first declared.
    pub declared_at: DateTime<Utc>,
    /// The latest worker pool start that declared it.
    pub seen_at: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct ScheduleRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    schedule: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Timestamptz)]
    declared_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    seen_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_slot: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<BigInt>)]
    last_job_id: Option<i64>,
}

/// Every declared periodic job, by name, with its last and next run as of
/// `now`.
pub fn periodic_schedules(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> QueryResult<Vec<PeriodicSchedule>> {
    let rows: Vec<ScheduleRow> =
        diesel::sql_query(include_str!("sql/periodic_schedules.sql")).load(conn)?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let next_run = Schedule::parse(&row.schedule)
                .ok()
                .and_then(|schedule| schedule.next_slot(now));
            PeriodicSchedule {
                name: row.name,
                schedule: row.schedule,
                kind: row.kind,
                last_run: row.last_slot,
                last_job_id: row.last_job_id,
                next_run,
                declared_at: row.declared_at,
                seen_at: row.seen_at,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("a timestamp")
    }

    #[test]
    fn interval_slots_are_multiples_of_the_interval_since_the_epoch() {
        let schedule = Schedule::every(Duration::from_secs(900)).expect("valid");
        let now = at("2026-12-05T10:07:31Z");
        assert_eq!(schedule.latest_slot(now), Some(at("2026-12-05T10:00:00Z")));
        assert_eq!(schedule.next_slot(now), Some(at("2026-12-05T10:15:00Z")));
        let on_slot = at("2026-12-05T10:15:00Z");
        assert_eq!(schedule.latest_slot(on_slot), Some(on_slot));
        assert_eq!(
            schedule.next_slot(on_slot),
            Some(at("2026-12-05T10:30:00Z"))
        );
    }

    #[test]
    fn cron_slots_are_the_expressions_times_in_utc() {
        let schedule = Schedule::cron("0 3 * * *").expect("valid");
        let now = at("2026-12-05T10:07:31Z");
        assert_eq!(schedule.latest_slot(now), Some(at("2026-12-05T03:00:00Z")));
        assert_eq!(schedule.next_slot(now), Some(at("2026-12-06T03:00:00Z")));
    }

    #[test]
    fn a_schedule_reads_back_its_own_text() {
        for schedule in [
            Schedule::every(Duration::from_millis(1500)).expect("valid"),
            Schedule::every(Duration::from_secs(86_400)).expect("valid"),
            Schedule::cron("*/5 * * * *").expect("valid"),
        ] {
            assert_eq!(Schedule::parse(&schedule.to_string()), Ok(schedule));
        }
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Tick {}
    impl JobArgs for Tick {
        const KIND: &'static str = "tick";
    }

    #[test]
    fn a_bad_schedule_names_the_job_and_the_value() {
        let error = PeriodicJob::cron("nightly", "0 25 * * *", &Tick {}).expect_err("hour 25");
        assert_eq!(error.name, "nightly");
        assert!(error.to_string().contains("\"0 25 * * *\""), "{error}");
        let error =
            PeriodicJob::every("fast", Duration::from_millis(5), &Tick {}).expect_err("too short");
        assert!(error.to_string().contains("\"fast\""), "{error}");
        assert!(error.to_string().contains("5ms"), "{error}");
        assert!(PeriodicJob::cron("never", "0 0 31 2 *", &Tick {}).is_err());
        assert!(PeriodicJob::every("", Duration::from_secs(1), &Tick {}).is_err());
        assert!(Schedule::parse("hourly").is_err());
    }
}
