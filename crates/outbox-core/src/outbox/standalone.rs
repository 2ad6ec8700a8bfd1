//! The shorter finish for standalone jobs (`sql/finish_standalone_jobs.sql`):
//! a `done` that changes no other row is a fenced move to the archive and
//! nothing else, so it skips the machinery finish_jobs.sql runs for keys,
//! dependents, slots and its busy report. Every claim it does not end goes
//! on to finish_jobs.sql, which answers it applied, busy or lost as always.

use std::collections::HashSet;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::finish::{Finish, FinishReport, Outcome};
use super::prepared::HotStatements;

/// The standalone finish (`sql/finish_standalone_jobs.sql`).
pub(crate) const FINISH_STANDALONE_SQL: &str = include_str!("sql/finish_standalone_jobs.sql");

impl HotStatements {
    /// [`HotStatements::finish`], with the `done` outcomes of the claims
    /// `standalone` marks ([`ClaimedJob::standalone`](crate::statements::ClaimedJob::standalone))
    /// sent to the standalone finish first. Every other outcome, and every
    /// marked claim the standalone finish did not end (the claim lost, a
    /// dependent enqueued since, or a row lock it waited for past its bound),
    /// goes through finish_jobs.sql after it. `standalone` may be shorter
    /// than `finishes` (false for the rest).
    ///
    /// Two statements, each its own transaction: an outcome is applied once
    /// or not at all, but not atomically with the rest of its batch. Should
    /// the second fail once the first has ended some claims, those are
    /// answered applied and the others busy (written again shortly), not an
    /// error that would send the applied ones back to be written again.
    /// Outcomes with local writes take [`HotStatements::finish_with_rows`].
    pub async fn finish_standalone_first(
        &self,
        client: &Client,
        finishes: &[Finish],
        standalone: &[bool],
    ) -> Result<FinishReport, tokio_postgres::Error> {
        let (alone, mut others) = split(finishes, standalone);
        if alone.is_empty() {
            return self.finish(client, finishes).await;
        }
        let ids: Vec<i64> = alone.iter().map(|f| f.job_id).collect();
        let tokens: Vec<i64> = alone.iter().map(|f| f.lease_token).collect();
        let ended: HashSet<(i64, i64)> = match client
            .query(&self.finish_standalone, &[&ids, &tokens])
            .await
        {
            Ok(rows) => rows
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<_, tokio_postgres::Error>>()?,
            // A row held past the bound: nothing was written.
            Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => HashSet::new(),
            Err(error) => return Err(error),
        };
        let (applied, left): (Vec<Finish>, Vec<Finish>) = alone
            .into_iter()
            .partition(|f| ended.contains(&(f.job_id, f.lease_token)));
        others.extend(left);
        let applied: Vec<i64> = applied.iter().map(|f| f.job_id).collect();
        match self.finish(client, &others).await {
            Ok(mut report) => {
                report.applied.extend(applied);
                Ok(report)
            }
            Err(error) if !applied.is_empty() => {
                tracing::warn!(%error, "writing outcomes failed after the standalone finish; the rest will be written again");
                Ok(FinishReport {
                    applied,
                    busy: others.iter().map(|f| f.job_id).collect(),
                    ..FinishReport::default()
                })
            }
            Err(error) => Err(error),
        }
    }
}

/// The finishes the standalone finish may end (`done`, with no local write,
/// of a claim marked standalone), and the others, each in their order.
fn split(finishes: &[Finish], standalone: &[bool]) -> (Vec<Finish>, Vec<Finish>) {
    finishes.iter().enumerate().fold(
        (Vec::new(), Vec::new()),
        |(mut alone, mut others), (index, finish)| {
            let marked = standalone.get(index).copied().unwrap_or(false);
            if marked && matches!(finish.outcome, Outcome::Done { local: None }) {
                alone.push(finish.clone());
            } else {
                others.push(finish.clone());
            }
            (alone, others)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::finish::LocalWrite;

    fn finish(job_id: i64, outcome: Outcome) -> Finish {
        Finish {
            job_id,
            lease_token: job_id * 10,
            outcome,
        }
    }

    fn done() -> Outcome {
        Outcome::Done { local: None }
    }

    struct Nothing;

    impl crate::outbox::finish::CommitHook for Nothing {
        fn apply(&self, _: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
            Ok(())
        }
        fn describe(&self) -> String {
            "nothing".to_owned()
        }
    }

    #[test]
    fn only_marked_plain_dones_go_to_the_standalone_finish() {
        let finishes = vec![
            finish(1, done()),
            finish(2, done()),
            finish(
                3,
                Outcome::Retry {
                    delay: std::time::Duration::from_secs(1),
                    error: "again".to_owned(),
                },
            ),
            finish(
                4,
                Outcome::Done {
                    local: Some(LocalWrite::new(Nothing)),
                },
            ),
            finish(5, done()),
        ];
        // The fifth has no mark: the slice is shorter.
        let (alone, others) = split(&finishes, &[true, false, true, true]);
        let ids = |f: &[Finish]| f.iter().map(|f| f.job_id).collect::<Vec<_>>();
        assert_eq!(ids(&alone), [1]);
        assert_eq!(ids(&others), [2, 3, 4, 5]);
    }
}
