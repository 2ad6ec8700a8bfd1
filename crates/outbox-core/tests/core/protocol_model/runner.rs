//! One walk's model and database side by side: each step taken in both,
//! the statement's answer held to what the model expects, and the rows
//! compared with the model's state after every step.

use outbox_core::statements::JobLease;

use super::model::{
    Action, HEAD, JOB_NAMES, JOBS, Mode, Protocol, RECEIVERS, RELAYS, Receiver, State, Status,
};
use super::sql::{Sql, finish_of, kind, worker_id};
use super::walk::Step;

/// Why a run stopped.
#[derive(Debug)]
pub enum Stop {
    /// The step is not enabled in the model (a shrunk trace that no longer makes sense).
    Invalid,
    /// The SQL parted from the model.
    Diverged(String),
}

/// The model and the database side by side, with what the walk learnt of
/// the SQL: ids, and the tokens each relay holds.
pub struct Runner<'a> {
    model: &'a Protocol,
    sql: &'a mut Sql,
    pub state: State,
    ids: [Option<i64>; JOBS],
    /// The token and relay of each job's latest claim.
    latest: [Option<(i64, usize)>; JOBS],
    /// Per relay and job: the current claim's token, and a stale one.
    tokens: [[(Option<i64>, Option<i64>); JOBS]; RELAYS],
    /// What each receiver's open transaction found: first or repeat.
    first: [Option<bool>; RECEIVERS],
    pub log: Vec<String>,
}

impl<'a> Runner<'a> {
    pub fn new(model: &'a Protocol, sql: &'a mut Sql) -> Runner<'a> {
        sql.reset(model.policy);
        Runner {
            state: model.initial(),
            model,
            sql,
            ids: [None; JOBS],
            latest: [None; JOBS],
            tokens: [[(None, None); JOBS]; RELAYS],
            first: [None; RECEIVERS],
            log: Vec::new(),
        }
    }

    /// The steps a walk may take next: the model's actions, its claims of
    /// one relay made one claim statement with a limit of 1 to 3.
    pub fn choices(&self, rng: &mut fastrand::Rng) -> Vec<Step> {
        let mut actions = Vec::new();
        self.model.enabled(&self.state, &mut actions);
        let mut steps: Vec<Step> = Vec::new();
        for action in actions {
            let step = match action {
                Action::Claim(relay, _) => Step::Claim {
                    relay,
                    limit: rng.i64(1..=3),
                },
                other => Step::Act(other),
            };
            let claim_of = |s: &Step| match s {
                Step::Claim { relay, .. } => Some(*relay),
                Step::Act(_) => None,
            };
            if claim_of(&step).is_none() || !steps.iter().any(|s| claim_of(s) == claim_of(&step)) {
                steps.push(step);
            }
        }
        steps
    }

    /// Takes `step` in the model and in the database, then compares them.
    pub fn run(&mut self, step: Step) -> Result<(), Stop> {
        match self.take(step) {
            Ok(note) => self.log.push(format!("{step}{note}")),
            Err(Stop::Invalid) => return Err(Stop::Invalid),
            Err(stop) => {
                self.log.push(step.to_string());
                return Err(stop);
            }
        }
        self.sync_tokens();
        self.compare().map_err(Stop::Diverged)
    }

    /// The model's state after `step` (for a claim, after it takes the
    /// first job it may).
    pub fn predict(&self, step: Step) -> Option<State> {
        let action = match step {
            Step::Act(action) => action,
            Step::Claim { relay, .. } => Action::Claim(
                relay,
                (0..JOBS).find(|&job| self.model.claimable(&self.state, job))?,
            ),
        };
        self.model.step(&self.state, action)
    }

    fn id(&self, job: usize) -> Result<i64, Stop> {
        self.ids[job].ok_or(Stop::Diverged(format!("{} has no row", JOB_NAMES[job])))
    }

    fn take(&mut self, step: Step) -> Result<String, Stop> {
        let diverged = |message: String| Stop::Diverged(message);
        let action = match step {
            Step::Claim { relay, limit } => return self.claim(relay, limit),
            Step::Act(action) => action,
        };
        let next = self.model.step(&self.state, action).ok_or(Stop::Invalid)?;
        let mut note = String::new();
        match action {
            Action::Enqueue => {
                let ids = self.sql.enqueue().map_err(diverged)?;
                self.ids[HEAD] = ids.first().copied();
                self.ids[super::model::CHILD] = ids.get(1).copied();
            }
            Action::Deliver(r) => {
                let waits = next.receivers[r] == Receiver::Waiting;
                let answer = self.sql.record(r, waits).map_err(diverged)?;
                note = format!(": the insert {}", describe(answer));
                match (next.receivers[r], answer) {
                    (Receiver::Open { first }, Some(found)) if first == found => {}
                    (Receiver::Waiting, None) => {}
                    (expected, _) => {
                        return Err(diverged(format!(
                            "the insert {}; in the model it {}",
                            describe(answer),
                            expect(expected)
                        )));
                    }
                }
                self.first[r] = answer;
            }
            Action::Commit(r) | Action::Rollback(r) => {
                let commit = matches!(action, Action::Commit(_));
                let apply = commit && self.first[r] == Some(true);
                self.sql.end(r, commit, apply).map_err(diverged)?;
                self.first[r] = None;
                let other = 1 - r;
                if self.state.receivers[other] == Receiver::Waiting {
                    let found = self.sql.recorded(other).map_err(diverged)?;
                    note = format!(
                        "; receiver {other}'s insert returns {}",
                        describe(Some(found))
                    );
                    if next.receivers[other] != (Receiver::Open { first: found }) {
                        return Err(diverged(format!(
                            "receiver {other}'s insert {}; in the model it {}",
                            describe(Some(found)),
                            expect(next.receivers[other])
                        )));
                    }
                    self.first[other] = Some(found);
                }
            }
            Action::Claim(..) => return Err(Stop::Invalid),
            Action::Heartbeat(relay) => {
                let leases = self.leases(relay);
                let report = self.sql.heartbeat(relay, &leases).map_err(diverged)?;
                let current: Vec<JobLease> = (0..JOBS)
                    .filter_map(|job| self.lease(relay, job, false))
                    .collect();
                note = format!(
                    ": {} extended, {} lost",
                    report.extended.len(),
                    report.lost.len()
                );
                if report.extended != current || report.lost.len() + current.len() != leases.len() {
                    return Err(diverged(format!(
                        "the model extends {current:?} and loses the rest: {report:?}"
                    )));
                }
            }
            Action::LeaseRunsOut(job) => {
                self.sql.lease_runs_out(self.id(job)?).map_err(diverged)?
            }
            Action::BackoffEnds(job) => self.sql.backoff_ends(self.id(job)?).map_err(diverged)?,
            Action::Reap(relay) => {
                let spare: Vec<i64> = self.leases(relay).iter().map(|l| l.lease_token).collect();
                let report = self.sql.reap(relay, &spare).map_err(diverged)?;
                let reaped = (0..JOBS).filter(|&j| self.model.reapable(&self.state, relay, j));
                let failed = reaped
                    .clone()
                    .filter(|&j| next.jobs[j].status == Status::Failed);
                let expected = (reaped.count(), failed.count());
                note = format!(": {} requeued, {} failed", report.requeued, report.failed);
                if (report.total(), report.failed) != expected {
                    return Err(diverged(format!(
                        "the model reaps (total, failed) {expected:?}"
                    )));
                }
            }
            Action::Finish {
                relay,
                job,
                stale,
                outcome,
            } => {
                let lease = self.lease(relay, job, stale).ok_or(Stop::Invalid)?;
                let finish = finish_of(lease.job_id, lease.lease_token, outcome);
                let report = self.sql.finish(relay, finish).map_err(diverged)?;
                note = format!(" (token {}): {report:?}", lease.lease_token);
                let applied = report.applied == [lease.job_id];
                let lost = report.lost == [lease.job_id];
                if applied == stale || lost != stale {
                    return Err(diverged(format!(
                        "the finish under token {} answered {report:?}; the model {}",
                        lease.lease_token,
                        if stale { "fences it out" } else { "applies it" }
                    )));
                }
            }
            Action::HandBack { relay, job, stale } => {
                let lease = self.lease(relay, job, stale).ok_or(Stop::Invalid)?;
                let ids = self.sql.hand_back(relay, lease).map_err(diverged)?;
                note = format!(" (token {}): handed back {ids:?}", lease.lease_token);
                if ids.is_empty() != stale {
                    return Err(diverged(format!(
                        "the hand-back under token {} handed back {ids:?}; the model {}",
                        lease.lease_token,
                        if stale {
                            "fences it out"
                        } else {
                            "hands it back"
                        }
                    )));
                }
            }
            Action::Crash(_) | Action::Pause(_) | Action::Wake(_) => {}
        }
        self.state = next;
        Ok(note)
    }

    fn claim(&mut self, relay: usize, limit: i64) -> Result<String, Stop> {
        if self.state.relays[relay].mode != Mode::Up {
            return Err(Stop::Invalid);
        }
        let claimed = self.sql.claim(relay, limit).map_err(Stop::Diverged)?;
        let mut state = self.state.clone();
        let mut names = Vec::new();
        for (id, token) in claimed {
            let Some(job) = (0..JOBS).find(|&j| self.ids[j] == Some(id)) else {
                return Err(Stop::Diverged(format!(
                    "the claim took job {id}, unknown to the model"
                )));
            };
            names.push(JOB_NAMES[job]);
            if !self.model.claimable(&state, job) {
                return Err(Stop::Diverged(format!(
                    "the claim took {names:?}; the model does not allow {}: {:?}",
                    JOB_NAMES[job], state.jobs[job]
                )));
            }
            state = self
                .model
                .step(&state, Action::Claim(relay, job))
                .ok_or(Stop::Invalid)?;
            self.latest[job] = Some((token, relay));
            self.tokens[relay][job].0 = Some(token);
        }
        if names.len() < usize::try_from(limit).unwrap_or(0)
            && let Some(job) = (0..JOBS).find(|&j| self.model.claimable(&state, j))
        {
            return Err(Stop::Diverged(format!(
                "the claim took {names:?} and left {}, which the model allows",
                JOB_NAMES[job]
            )));
        }
        self.state = state;
        Ok(format!(": {names:?}"))
    }

    fn lease(&self, relay: usize, job: usize, stale: bool) -> Option<JobLease> {
        let (current, old) = self.tokens[relay][job];
        let token = if stale { old } else { current }?;
        Some(JobLease {
            job_id: self.ids[job]?,
            lease_token: token,
        })
    }

    /// Every claim `relay` holds, current ones first.
    fn leases(&self, relay: usize) -> Vec<JobLease> {
        let current = (0..JOBS).filter_map(|job| self.lease(relay, job, false));
        current
            .chain((0..JOBS).filter_map(|job| self.lease(relay, job, true)))
            .collect()
    }

    /// The tokens follow the model's holds: a current claim the model made
    /// stale keeps its token as the stale one.
    fn sync_tokens(&mut self) {
        for relay in 0..RELAYS {
            for job in 0..JOBS {
                let hold = self.state.relays[relay].holds[job];
                let (current, stale) = &mut self.tokens[relay][job];
                if !hold.current && current.is_some() {
                    let ended = current.take();
                    if hold.stale {
                        *stale = ended.or(*stale);
                    }
                }
                if !hold.stale {
                    *stale = None;
                }
            }
        }
    }

    /// The rows against the model's state: every difference, or none.
    fn compare(&mut self) -> Result<(), String> {
        let rows = self.sql.rows()?;
        let mut diffs = Vec::new();
        for (job, name) in JOB_NAMES.iter().enumerate() {
            let m = &self.state.jobs[job];
            let mine: Vec<_> = rows.iter().filter(|r| r.kind == kind(job)).collect();
            if m.status == Status::Absent {
                if !mine.is_empty() {
                    diffs.push(format!("{}: {} rows, the model has none", name, mine.len()));
                }
                continue;
            }
            let [row] = mine.as_slice() else {
                diffs.push(format!("{}: {} rows, the model has one", name, mine.len()));
                continue;
            };
            let id = *self.ids[job].get_or_insert(row.id);
            let mut check = |what: &str, model: String, sql: String| {
                if model != sql {
                    diffs.push(format!("{} {what}: model {model}, rows {sql}", name));
                }
            };
            check("id", id.to_string(), row.id.to_string());
            check("status", m.status.as_str().into(), row.status.clone());
            check("attempts", m.attempts.to_string(), row.attempts.to_string());
            check("blocked", m.blocked.to_string(), row.blocked.to_string());
            let parent: Vec<i64> = self.ids[HEAD].into_iter().collect();
            let waiting = if m.waiting {
                parent.clone()
            } else {
                Vec::new()
            };
            check(
                "waiting_on",
                format!("{waiting:?}"),
                format!("{:?}", row.waiting_on),
            );
            let unfinished = m.unfinished_parent.then_some(parent);
            check(
                "unfinished_parents",
                format!("{unfinished:?}"),
                format!("{:?}", row.unfinished_parents),
            );
            if m.status == Status::Pending {
                check("due", m.due.to_string(), row.due.to_string());
            }
            if let Some((token, relay)) = self.latest[job] {
                check(
                    "lease_token",
                    format!("{:?}", Some(token)),
                    format!("{:?}", row.lease_token),
                );
                if m.status == Status::Processing {
                    check(
                        "lease live",
                        m.lease_live.to_string(),
                        row.lease_live.to_string(),
                    );
                    check(
                        "locked_by",
                        format!("{:?}", Some(worker_id(relay))),
                        format!("{:?}", row.locked_by),
                    );
                }
            }
        }
        let in_flight = self.sql.in_flight()?;
        if in_flight != i64::from(self.state.in_flight) {
            diffs.push(format!(
                "in_flight of the concurrency key: model {}, rows {in_flight}",
                self.state.in_flight
            ));
        }
        let records = self.sql.records()?;
        if records != i64::from(self.state.recorded) {
            diffs.push(format!(
                "records of the message: model {}, rows {records}",
                u8::from(self.state.recorded)
            ));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(diffs.join("; "))
        }
    }
}

fn expect(receiver: Receiver) -> &'static str {
    match receiver {
        Receiver::Open { first } => describe(Some(first)),
        Receiver::Waiting => describe(None),
        Receiver::Idle => "is idle",
    }
}

fn describe(answer: Option<bool>) -> &'static str {
    match answer {
        Some(true) => "records it (first)",
        Some(false) => "finds it (a repeat)",
        None => "waits for the other receiver",
    }
}
