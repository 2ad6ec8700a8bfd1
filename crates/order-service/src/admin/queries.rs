//! The dashboard's reads, and its audit log. Every statement is in `sql/`
//! with a comment on the index it relies on; every read runs in a read-only
//! transaction under the dashboard's own `statement_timeout`. The bulk
//! actions' batched writes are in `bulk.rs`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Double, Jsonb, Nullable, Text, Timestamptz};
use serde::Serialize;

use crate::job_list::{self, JobFilter};

/// Ids the jobs page walks at most per query when no index narrows the filter.
pub(super) const SEARCH_WINDOW: i64 = 50_000;

/// Runs `f` in a read-only transaction whose statements stop after `timeout`.
pub(super) fn read<T>(
    conn: &mut PgConnection,
    timeout: Duration,
    f: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    conn.build_transaction().read_only().run(|conn| {
        set_local_timeouts(conn, timeout)?;
        f(conn)
    })
}

/// `statement_timeout` and `lock_timeout` for the rest of the transaction
/// (`set_config(.., true)` is `SET LOCAL` in one statement that takes binds).
pub(super) fn set_local_timeouts(conn: &mut PgConnection, timeout: Duration) -> QueryResult<()> {
    let ms = timeout.as_millis().clamp(1, 600_000).to_string();
    diesel::sql_query(
        "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true)",
    )
    .bind::<Text, _>(ms)
    .execute(conn)
    .map(drop)
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct KindStatusCount {
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct QueueHealth {
    #[diesel(sql_type = Nullable<Double>)]
    pub oldest_due_pending_seconds: Option<f64>,
    #[diesel(sql_type = BigInt)]
    pub expired_leases: i64,
    #[diesel(sql_type = BigInt)]
    pub estimated_rows: i64,
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct MinuteCount {
    #[diesel(sql_type = Timestamptz)]
    pub minute: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub done: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
}

#[derive(Debug, Clone, QueryableByName, Serialize)]
pub(super) struct RelaySeen {
    #[diesel(sql_type = Text)]
    pub worker: String,
    #[diesel(sql_type = BigInt)]
    pub in_flight: i64,
    #[diesel(sql_type = BigInt)]
    pub done_5m: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub last_seen: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub(super) struct Overview {
    pub counts: Vec<KindStatusCount>,
    pub health: QueueHealth,
    pub minutes: Vec<MinuteCount>,
    pub relays: Vec<RelaySeen>,
}

pub(super) fn overview(conn: &mut PgConnection, timeout: Duration) -> QueryResult<Overview> {
    read(conn, timeout, |conn| {
        Ok(Overview {
            counts: diesel::sql_query(include_str!("sql/kind_status_counts.sql")).load(conn)?,
            health: diesel::sql_query(include_str!("sql/queue_health.sql")).get_result(conn)?,
            minutes: diesel::sql_query(include_str!("sql/throughput.sql")).load(conn)?,
            relays: diesel::sql_query(include_str!("sql/relays.sql")).load(conn)?,
        })
    })
}

/// A job as the dashboard shows it.
#[derive(Debug, Clone, QueryableByName)]
pub(super) struct AdminJob {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub order_id: Option<crate::orders::OrderId>,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    pub run_after: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub locked_by: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub locked_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub lease_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub finished_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    /// Waiting behind an earlier unfinished job of its ordering key.
    #[diesel(sql_type = Bool)]
    pub blocked: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub ordering_key: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub payload: Option<String>,
}

/// One page of jobs and where the search stopped.
#[derive(Debug, Clone)]
pub(super) struct JobPage {
    pub jobs: Vec<AdminJob>,
    /// The cursor of the next page (`before=`), when there may be more.
    pub next_before: Option<i64>,
    /// The ids searched: `floor..before`. Shown when the window ran out
    /// before the page filled.
    pub searched: (i64, i64),
    /// The page is short because the window ended, not because no older job matches.
    pub window_exhausted: bool,
}

pub(super) fn list_jobs(
    conn: &mut PgConnection,
    timeout: Duration,
    filter: &JobFilter,
    before: Option<i64>,
    page_size: i64,
    hide_payload: bool,
) -> QueryResult<JobPage> {
    read(conn, timeout, |conn| {
        let before = match before {
            Some(before) => before,
            None => job_list::newest_job_id(conn)?.saturating_add(1),
        };
        let floor = if filter.narrowed_by_index() {
            0
        } else {
            before.saturating_sub(SEARCH_WINDOW).max(0)
        };
        let mut jobs: Vec<AdminJob> =
            job_list::page(conn, filter, floor..before, page_size + 1, hide_payload)?;
        let full = jobs.len() as i64 > page_size;
        jobs.truncate(usize::try_from(page_size).unwrap_or(0));
        let (next_before, window_exhausted) = if full {
            (jobs.last().map(|j| j.id), false)
        } else if floor > 1 {
            (Some(floor), true)
        } else {
            (None, false)
        };
        Ok(JobPage {
            jobs,
            next_before,
            searched: (floor.max(1), before.saturating_sub(1)),
            window_exhausted,
        })
    })
}

pub(super) fn insert_audit(
    conn: &mut PgConnection,
    actor: &str,
    action: &str,
    target: &serde_json::Value,
    affected: i64,
) -> QueryResult<()> {
    diesel::sql_query(include_str!("sql/insert_audit.sql"))
        .bind::<Text, _>(actor)
        .bind::<Text, _>(action)
        .bind::<Jsonb, _>(target)
        .bind::<BigInt, _>(affected)
        .execute(conn)
        .map(drop)
}

#[derive(Debug, Clone, QueryableByName, Serialize)]
pub(super) struct AuditEntry {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Timestamptz)]
    pub at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    pub actor: String,
    #[diesel(sql_type = Text)]
    pub action: String,
    #[diesel(sql_type = Text)]
    pub target: String,
    #[diesel(sql_type = BigInt)]
    pub affected: i64,
}

pub(super) fn list_audit(
    conn: &mut PgConnection,
    timeout: Duration,
    limit: i64,
) -> QueryResult<Vec<AuditEntry>> {
    read(conn, timeout, |conn| {
        diesel::sql_query(include_str!("sql/list_audit.sql"))
            .bind::<BigInt, _>(limit)
            .load(conn)
    })
}

#[derive(Debug, Clone, QueryableByName)]
pub(super) struct ReceiptInfo {
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub bytes: i64,
}

#[derive(Debug, Clone)]
pub(super) struct Timeline {
    pub order: crate::orders::Order,
    pub events: Vec<crate::orders::OrderEvent>,
    pub jobs: Vec<AdminJob>,
    pub receipt: Option<ReceiptInfo>,
    /// The order's jobs that wait for parents, and the parents they wait for.
    pub waiting: Vec<WaitingJob>,
    /// The order's effect ledger: what each job's peer answered.
    pub effects: Vec<crate::orders::EffectEntry>,
}

/// A job that waits for parents (`waiting_on`).
#[derive(Debug, Clone, QueryableByName)]
pub(super) struct WaitingJob {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Array<BigInt>)]
    pub waiting_on: Vec<i64>,
}

pub(super) fn timeline(
    conn: &mut PgConnection,
    timeout: Duration,
    order_id: i64,
    hide_payload: bool,
) -> QueryResult<Option<Timeline>> {
    let id = crate::orders::OrderId::new(order_id);
    read(conn, timeout, |conn| {
        let Some(order) = crate::orders::load_order(conn, id)? else {
            return Ok(None);
        };
        let events = crate::orders::load_order_events(conn, id)?;
        let jobs = diesel::sql_query(include_str!("sql/order_jobs.sql"))
            .bind::<BigInt, _>(order_id)
            .bind::<Bool, _>(hide_payload)
            .load(conn)?;
        let receipt = diesel::sql_query(include_str!("sql/receipt_of_order.sql"))
            .bind::<BigInt, _>(order_id)
            .get_result(conn)
            .optional()?;
        let waiting = diesel::sql_query(include_str!("sql/order_waiting.sql"))
            .bind::<BigInt, _>(order_id)
            .load(conn)?;
        let effects = crate::orders::load_effect_ledger(conn, id)?;
        Ok(Some(Timeline {
            order,
            events,
            jobs,
            receipt,
            waiting,
            effects,
        }))
    })
}

/// One job and its dependency columns, for its page.
#[derive(Debug, Clone, QueryableByName)]
pub(super) struct JobDetail {
    #[diesel(embed)]
    pub job: AdminJob,
    /// Parents not yet done (`run` dependents drop failed ones too).
    #[diesel(sql_type = Array<BigInt>)]
    pub waiting_on: Vec<i64>,
    /// Every parent the job was enqueued with.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub depends_on: Option<Vec<i64>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub dependency_policy: Option<String>,
    /// Parents that did not finish `done`, which a `run` job went without.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub unfinished_parents: Option<Vec<i64>>,
}

/// A parent or a child of a job.
#[derive(Debug, Clone, QueryableByName, Serialize)]
pub(super) struct Relative {
    /// `parent` or `child`.
    #[diesel(sql_type = Text)]
    pub relation: String,
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub order_id: Option<i64>,
    /// A parent the job still waits for; a child still waiting for the job.
    #[diesel(sql_type = Bool)]
    pub waiting: bool,
}

/// Children a job page lists at most.
pub(super) const CHILDREN_SHOWN: i64 = 200;

/// A job, its parents and its children; `None` when no job has the id.
pub(super) fn job_detail(
    conn: &mut PgConnection,
    timeout: Duration,
    id: i64,
    hide_payload: bool,
) -> QueryResult<Option<(JobDetail, Vec<Relative>)>> {
    read(conn, timeout, |conn| {
        let Some(detail) = diesel::sql_query(include_str!("sql/job_by_id.sql"))
            .bind::<BigInt, _>(id)
            .bind::<Bool, _>(hide_payload)
            .get_result::<JobDetail>(conn)
            .optional()?
        else {
            return Ok(None);
        };
        let relatives = diesel::sql_query(include_str!("sql/job_relatives.sql"))
            .bind::<BigInt, _>(id)
            .bind::<Array<BigInt>, _>(detail.depends_on.clone().unwrap_or_default())
            .bind::<BigInt, _>(CHILDREN_SHOWN)
            .bind::<Array<BigInt>, _>(&detail.waiting_on)
            .load(conn)?;
        Ok(Some((detail, relatives)))
    })
}
