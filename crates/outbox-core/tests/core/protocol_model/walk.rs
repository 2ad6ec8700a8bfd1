//! Walks of the model run against the SQL (`runner.rs` takes each step in
//! both and compares), replays of a trace, and the shrinking of a failing
//! one. A claim is the one step where the SQL chooses (which jobs, up to its
//! limit); the model then takes the same claims, each of which it must allow.

use std::collections::HashSet;
use std::fmt;

use super::model::{Action, JOB_NAMES, JOBS, Job, Protocol, RELAYS, Relay, State};
use super::runner::{Runner, Stop};
use super::sql::Sql;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Act(Action),
    /// A relay's claim statement with this limit.
    Claim {
        relay: usize,
        limit: i64,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |job: usize| JOB_NAMES[job];
        match *self {
            Step::Claim { relay, limit } => write!(f, "relay {relay} claims (limit {limit})"),
            Step::Act(action) => match action {
                Action::Enqueue => write!(f, "the application enqueues head and child"),
                Action::Deliver(r) => write!(f, "receiver {r} records the message"),
                Action::Commit(r) => write!(f, "receiver {r} applies and commits"),
                Action::Rollback(r) => write!(f, "receiver {r} dies before its commit"),
                Action::Claim(relay, job) => write!(f, "relay {relay} claims {}", name(job)),
                Action::Heartbeat(relay) => write!(f, "relay {relay} heartbeats"),
                Action::LeaseRunsOut(job) => write!(f, "the lease of {} runs out", name(job)),
                Action::BackoffEnds(job) => write!(f, "the backoff of {} ends", name(job)),
                Action::Reap(relay) => write!(f, "relay {relay} reaps"),
                Action::Finish {
                    relay,
                    job,
                    stale,
                    outcome,
                } => write!(
                    f,
                    "relay {relay} finishes {} {outcome:?} with its {} token",
                    name(job),
                    if stale { "stale" } else { "current" }
                ),
                Action::HandBack { relay, job, stale } => write!(
                    f,
                    "relay {relay} hands {} back with its {} token",
                    name(job),
                    if stale { "stale" } else { "current" }
                ),
                Action::Crash(relay) => write!(f, "relay {relay} crashes"),
                Action::Pause(relay) => write!(f, "relay {relay} pauses"),
                Action::Wake(relay) => write!(f, "relay {relay} wakes"),
            },
        }
    }
}

/// A failing trace: its steps, what each did, and where the SQL parted from
/// the model.
pub struct Failure {
    pub steps: Vec<Step>,
    pub log: Vec<String>,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, line) in self.log.iter().enumerate() {
            writeln!(f, "  {:>2}. {line}", n + 1)?;
        }
        write!(f, "  the rows part from the model: {}", self.message)
    }
}

/// What the walks of a run have been through: the model states, and the
/// states of the jobs and relays alone, which a walk steers by.
#[derive(Default)]
pub struct Seen {
    pub states: HashSet<State>,
    queue: HashSet<([Job; JOBS], [Relay; RELAYS], u8)>,
}

impl Seen {
    fn add(&mut self, state: &State) {
        self.queue.insert(Seen::queue_of(state));
        self.states.insert(state.clone());
    }

    fn queue_of(state: &State) -> ([Job; JOBS], [Relay; RELAYS], u8) {
        (state.jobs, state.relays, state.in_flight)
    }
}

/// A random walk of up to `length` steps from `seed`: the number of steps,
/// or `Err` at the first step where the SQL parts from the model.
///
/// The walk prefers steps that bring the jobs and relays to a state no walk
/// of its run has seen yet (`seen`, which it adds to). A uniform choice spends
/// most of its steps going round near the start (a lease running out and
/// renewed, a claim handed back, the message delivered again) and seldom
/// gets as deep as a stale claim beside a current one. So a walk depends on
/// the walks before it in its run, and a run is replayed whole, from its
/// first seed.
pub fn walk(
    model: &Protocol,
    sql: &mut Sql,
    seed: u64,
    length: usize,
    seen: &mut Seen,
) -> Result<usize, Failure> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut runner = Runner::new(model, sql);
    let mut steps = Vec::new();
    seen.add(&runner.state);
    for _ in 0..length {
        let choices = runner.choices(&mut rng);
        let new: Vec<Step> = choices
            .iter()
            .copied()
            .filter(|&step| {
                runner
                    .predict(step)
                    .is_some_and(|s| !seen.queue.contains(&Seen::queue_of(&s)))
            })
            .collect();
        let pool = if new.is_empty() { &choices } else { &new };
        if pool.is_empty() {
            break;
        }
        let step = pool[rng.usize(..pool.len())];
        steps.push(step);
        if let Err(stop) = runner.run(step) {
            let message = match stop {
                Stop::Diverged(message) => message,
                Stop::Invalid => "the walk chose a step the model does not allow".into(),
            };
            let log = std::mem::take(&mut runner.log);
            return Err(Failure {
                steps,
                log,
                message,
            });
        }
        seen.add(&runner.state);
    }
    Ok(steps.len())
}

/// Runs `steps` from the start, skipping those the model does not allow
/// where they come (a wake whose pause was removed): `Err` with the steps run
/// up to the one where the SQL parts from the model, `Ok` when they agree
/// throughout.
pub fn replay(model: &Protocol, sql: &mut Sql, steps: &[Step]) -> Result<(), Failure> {
    let mut runner = Runner::new(model, sql);
    let mut run = Vec::new();
    for &step in steps {
        match runner.run(step) {
            Ok(()) => run.push(step),
            Err(Stop::Invalid) => {}
            Err(Stop::Diverged(message)) => {
                run.push(step);
                let log = std::mem::take(&mut runner.log);
                return Err(Failure {
                    steps: run,
                    log,
                    message,
                });
            }
        }
    }
    Ok(())
}

/// The shortest trace found by removing steps from `failure` while it still
/// fails: chunks first, then single steps, until no removal keeps it failing.
pub fn shrink(model: &Protocol, sql: &mut Sql, failure: Failure) -> Failure {
    let mut best = failure;
    let mut chunk = best.steps.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        let mut changed = false;
        while i < best.steps.len() {
            let mut candidate = best.steps.clone();
            candidate.drain(i..(i + chunk).min(candidate.len()));
            match replay(model, sql, &candidate) {
                Err(shorter) if shorter.steps.len() < best.steps.len() => {
                    best = shorter;
                    changed = true;
                }
                _ => i += chunk,
            }
        }
        if chunk == 1 && !changed {
            return best;
        }
        chunk = (chunk / 2).max(1);
    }
}
