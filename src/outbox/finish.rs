//! Recording outcomes: done, retry, failed, all fenced, many per statement.

use std::collections::HashSet;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Integer, Nullable, Text};

use super::claim::millis;

/// A write that must commit together with the job's completion, and only then:
/// this is what makes a local effect (the stored receipt) happen exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalWrite {
    Receipt { order_id: i64, pdf: Vec<u8> },
}

/// What happened to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done {
        local: Option<LocalWrite>,
    },
    /// Back to `pending`, due after `delay`.
    Retry {
        delay: Duration,
        error: String,
    },
    Failed {
        error: String,
    },
}

impl Outcome {
    fn status(&self) -> &'static str {
        match self {
            Outcome::Done { .. } => "done",
            Outcome::Retry { .. } => "pending",
            Outcome::Failed { .. } => "failed",
        }
    }
}

/// One job's outcome, with the fencing token it was claimed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub job_id: i64,
    pub attempt: i32,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinishReport {
    /// Jobs whose outcome was recorded.
    pub applied: Vec<i64>,
    /// Jobs this worker no longer owned (lease reaped, job re-claimed): nothing changed.
    pub lost: Vec<i64>,
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Records `finishes` for `worker_id` in one transaction: one fenced UPDATE for
/// all of them, then the local writes of the jobs whose update matched.
pub fn finish_jobs(
    conn: &mut PgConnection,
    worker_id: &str,
    finishes: &[Finish],
) -> QueryResult<FinishReport> {
    if finishes.is_empty() {
        return Ok(FinishReport::default());
    }
    let mut ids = Vec::with_capacity(finishes.len());
    let mut attempts = Vec::with_capacity(finishes.len());
    let mut statuses = Vec::with_capacity(finishes.len());
    let mut delays = Vec::with_capacity(finishes.len());
    let mut errors: Vec<Option<&str>> = Vec::with_capacity(finishes.len());
    for finish in finishes {
        ids.push(finish.job_id);
        attempts.push(finish.attempt);
        statuses.push(finish.outcome.status());
        match &finish.outcome {
            Outcome::Done { .. } => {
                delays.push(0);
                errors.push(None);
            }
            Outcome::Retry { delay, error } => {
                delays.push(millis(*delay));
                errors.push(Some(error));
            }
            Outcome::Failed { error } => {
                delays.push(0);
                errors.push(Some(error));
            }
        }
    }

    let update = diesel::sql_query(include_str!("sql/finish_jobs.sql"))
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Array<Integer>, _>(&attempts)
        .bind::<Array<Text>, _>(&statuses)
        .bind::<Array<BigInt>, _>(&delays)
        .bind::<Array<Nullable<Text>>, _>(&errors)
        .bind::<Text, _>(worker_id);
    let has_local_writes = finishes.iter().any(|f| {
        matches!(
            f.outcome,
            Outcome::Done {
                local: Some(LocalWrite::Receipt { .. })
            }
        )
    });
    // Without local writes the UPDATE is atomic on its own; a transaction
    // would only add BEGIN and COMMIT round trips to the hot path.
    let applied: HashSet<i64> = if has_local_writes {
        conn.transaction(|conn| {
            let applied: HashSet<i64> = update
                .load::<IdRow>(conn)?
                .into_iter()
                .map(|r| r.id)
                .collect();
            for finish in finishes.iter().filter(|f| applied.contains(&f.job_id)) {
                if let Outcome::Done {
                    local: Some(LocalWrite::Receipt { order_id, pdf }),
                } = &finish.outcome
                {
                    diesel::sql_query(include_str!("sql/insert_receipt.sql"))
                        .bind::<BigInt, _>(order_id)
                        .bind::<Bytea, _>(pdf)
                        .execute(conn)?;
                }
            }
            QueryResult::Ok(applied)
        })?
    } else {
        update
            .load::<IdRow>(conn)?
            .into_iter()
            .map(|r| r.id)
            .collect()
    };

    let (applied_ids, lost): (Vec<i64>, Vec<i64>) = ids.iter().partition(|id| applied.contains(id));
    Ok(FinishReport {
        applied: applied_ids,
        lost,
    })
}
