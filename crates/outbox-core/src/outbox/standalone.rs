//! The shorter finish for standalone jobs (`sql/finish_standalone_jobs.sql`):
//! a `done` that changes no other row is a fenced move to the archive and
//! nothing else, so it skips the machinery finish_jobs.sql runs for keys,
//! dependents, slots and its busy report. Every claim it does not end goes
//! on to finish_jobs.sql, which answers it applied, busy or lost as always.

use std::collections::{HashMap, HashSet};

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
    /// than `finishes` (false for the rest). The report lists the claims in
    /// the order of `finishes`, as finish_jobs.sql's does.
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
        // Most batches of an order's jobs have none (their jobs have keys or
        // dependents): those go on as they are, with nothing copied.
        if !(0..finishes.len()).any(|i| takes_standalone(finishes, standalone, i)) {
            return self.finish(client, finishes).await;
        }
        let (alone, mut others) = split(finishes, standalone);
        let ids: Vec<i64> = alone.iter().map(|f| f.job_id).collect();
        let tokens: Vec<i64> = alone.iter().map(|f| f.lease_token).collect();
        let rows = match client
            .query(&self.finish_standalone, &[&ids, &tokens])
            .await
        {
            Ok(rows) => rows,
            // A row held past the bound: nothing was written.
            Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Vec::new(),
            Err(error) => return Err(error),
        };
        // As a rule every claim sent ended. The statement returns one row per
        // claim it ended, and only claims it was sent (a token names one
        // claim of one job), so as many rows as claims means all of them:
        // no set of the rows is built and no claim looked up in it.
        let (applied, left): (Vec<Finish>, Vec<Finish>) = if rows.len() == alone.len() {
            (alone, Vec::new())
        } else {
            let ended: HashSet<(i64, i64)> = rows
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<_, tokio_postgres::Error>>()?;
            alone
                .into_iter()
                .partition(|f| ended.contains(&(f.job_id, f.lease_token)))
        };
        others.extend(left);
        let applied: Vec<i64> = applied.iter().map(|f| f.job_id).collect();
        let report = match self.finish(client, &others).await {
            Ok(mut report) => {
                report.applied.extend(applied);
                report
            }
            Err(error) if !applied.is_empty() => {
                tracing::warn!(%error, "writing outcomes failed after the standalone finish; the rest will be written again");
                FinishReport {
                    applied,
                    busy: others.iter().map(|f| f.job_id).collect(),
                    ..FinishReport::default()
                }
            }
            Err(error) => return Err(error),
        };
        Ok(in_order(finishes, report))
    }
}

/// `report` with each of its lists in the order of `finishes`, as
/// finish_jobs.sql's own report is. Two claims of one job in one call are
/// told apart by count: either order gives the same lists.
fn in_order(finishes: &[Finish], report: FinishReport) -> FinishReport {
    // Every outcome applied, the usual batch: the order is the batch's own.
    if report.busy.is_empty() && report.lost.is_empty() && report.applied.len() == finishes.len() {
        return FinishReport {
            applied: finishes.iter().map(|f| f.job_id).collect(),
            ..report
        };
    }
    let count = |ids: Vec<i64>| {
        ids.into_iter().fold(HashMap::new(), |mut counts, id| {
            *counts.entry(id).or_insert(0_usize) += 1;
            counts
        })
    };
    let mut lists = [
        (count(report.applied), Vec::new()),
        (count(report.busy), Vec::new()),
        (count(report.lost), Vec::new()),
    ];
    for finish in finishes {
        let list = lists
            .iter_mut()
            .find(|(counts, _)| counts.get(&finish.job_id).is_some_and(|&n| n > 0));
        if let Some((counts, ordered)) = list {
            if let Some(n) = counts.get_mut(&finish.job_id) {
                *n -= 1;
            }
            ordered.push(finish.job_id);
        }
    }
    let [(_, applied), (_, busy), (_, lost)] = lists;
    FinishReport {
        applied,
        busy,
        lost,
        ..report
    }
}

/// Whether the standalone finish may end `finishes[index]`: a `done` with no
/// local write, of a claim `standalone` marks.
fn takes_standalone(finishes: &[Finish], standalone: &[bool], index: usize) -> bool {
    standalone.get(index).copied().unwrap_or(false)
        && matches!(finishes[index].outcome, Outcome::Done { local: None })
}

/// The finishes the standalone finish may end, and the others, each in
/// their order.
fn split(finishes: &[Finish], standalone: &[bool]) -> (Vec<Finish>, Vec<Finish>) {
    let (mut alone, mut others) = (Vec::new(), Vec::new());
    for (index, finish) in finishes.iter().enumerate() {
        if takes_standalone(finishes, standalone, index) {
            alone.push(finish.clone());
        } else {
            others.push(finish.clone());
        }
    }
    (alone, others)
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

    #[test]
    fn a_report_of_every_claim_applied_lists_them_in_their_order() {
        let finishes: Vec<Finish> = [3, 2, 1].into_iter().map(|id| finish(id, done())).collect();
        let report = FinishReport {
            applied: vec![1, 2, 3],
            ..FinishReport::default()
        };
        assert_eq!(in_order(&finishes, report).applied, [3, 2, 1]);
    }

    #[test]
    fn the_report_of_both_statements_lists_the_claims_in_their_order() {
        // Job 2 twice: a stale claim (lost) beside the current one (applied).
        let finishes: Vec<Finish> = [3, 2, 1, 2, 4]
            .into_iter()
            .map(|id| finish(id, done()))
            .collect();
        let report = FinishReport {
            applied: vec![1, 2, 3],
            busy: vec![4],
            lost: vec![2],
            released: 2,
            woken_kinds: vec!["mail".to_owned()],
        };
        let ordered = in_order(&finishes, report);
        assert_eq!(ordered.applied, [3, 2, 1]);
        assert_eq!(ordered.busy, [4]);
        assert_eq!(ordered.lost, [2]);
        assert_eq!(
            (ordered.released, ordered.woken_kinds),
            (2, vec!["mail".to_owned()])
        );
    }
}
