//! The guarantees of docs/guarantees.md, by name, as properties of the model.
//!
//! Safety is checked in every reachable state. Liveness ("Every job ends")
//! is checked as: from every reachable state, a state where every job has
//! ended can be reached without a crash or a pause, by a fair schedule
//! (`settles`). stateright's `eventually` is not used for it: it reports only
//! paths that stop in a state without successors, and this model's graph has
//! cycles (a lease running out and the heartbeat renewing it; a claim handed
//! back), so a run that cycles forever would never be reported. Reaching an
//! ended state from everywhere is what strong fairness needs: a schedule that
//! keeps giving every enabled action its turn takes such a path eventually.

use stateright::Property;

use super::model::{
    Action, CHILD, HEAD, JOBS, LIMIT, LIMITED, Mode, ORDERED, Outcome, Policy, Protocol, Receiver,
    State, Status,
};

pub const EXACTLY_ONCE: &str = "Exactly-once outcomes";
pub const FENCING: &str = "Fencing";
pub const ORDERING_KEYS: &str = "Ordering keys";
pub const DEPENDENCIES: &str = "Dependencies";
pub const CONCURRENCY_LIMITS: &str = "Concurrency limits";
pub const RECEIVED_ONCE: &str = "Received once";
pub const EVERY_JOB_ENDS: &str = "Every job ends";

pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(EXACTLY_ONCE, |_, s| exactly_once(s)),
        Property::always(FENCING, |_, s: &State| !s.stale_write),
        Property::always(ORDERING_KEYS, |_, s| in_key_order(s)),
        Property::always(DEPENDENCIES, parents_first),
        Property::always(CONCURRENCY_LIMITS, |_, s| within_limit(s)),
        Property::always(RECEIVED_ONCE, |_, s: &State| s.applied <= 1),
        Property::always(EVERY_JOB_ENDS, settles),
        // Not guarantees: that the model reaches the states the guarantees
        // are about, so no property holds only because nothing happens.
        Property::sometimes("a stale claim beside the current one", |_, s: &State| {
            (0..JOBS).any(|job| {
                s.relays.iter().any(|r| r.holds[job].stale)
                    && s.relays.iter().any(|r| r.holds[job].current)
            })
        }),
        Property::sometimes("a copy waits for the first", |_, s: &State| {
            s.receivers.contains(&Receiver::Waiting)
        }),
        Property::sometimes("every job done", |_, s: &State| {
            s.jobs.iter().all(|j| j.status == Status::Done)
        }),
        Property::sometimes("a failed head holds its key", |_, s: &State| {
            s.jobs
                .iter()
                .any(|j| j.status == Status::Failed && j.started)
                && s.jobs
                    .iter()
                    .any(|j| j.status == Status::Pending && j.blocked)
        }),
    ]
}

/// Every job's effect is recorded at most once, and only under its current claim.
fn exactly_once(s: &State) -> bool {
    s.jobs.iter().all(|j| j.outcomes <= 1 && !j.stale_outcome)
}

/// A job of the ordering key started only once every earlier job of the key was done.
fn in_key_order(s: &State) -> bool {
    (0..JOBS).all(|job| {
        let j = &s.jobs[job];
        !(ORDERED[job] && j.started)
            || (0..JOBS).all(|other| {
                let o = &s.jobs[other];
                !ORDERED[other]
                    || o.status == Status::Absent
                    || o.seq >= j.seq
                    || o.status == Status::Done
            })
    })
}

/// The dependent started only once its parent ended as its policy requires.
fn parents_first(m: &Protocol, s: &State) -> bool {
    let parent = s.jobs[HEAD].status;
    !s.jobs[CHILD].started
        || parent == Status::Done
        || (m.policy == Policy::Run && parent == Status::Failed)
}

/// At most `LIMIT` jobs of the concurrency key are processing, and the key's
/// `in_flight` counts exactly those.
fn within_limit(s: &State) -> bool {
    let processing = (0..JOBS)
        .filter(|&job| LIMITED[job] && s.jobs[job].status == Status::Processing)
        .count();
    processing <= usize::from(LIMIT) && usize::from(s.in_flight) == processing
}

/// Every job that exists has ended: done, failed, or held by a failed job
/// until an operator acts (behind a failed or held earlier job of its key,
/// or waiting for a parent that failed under `hold` or is held itself).
pub fn ended(m: &Protocol, s: &State) -> bool {
    (0..JOBS).all(|job| match s.jobs[job].status {
        Status::Absent | Status::Done | Status::Failed => true,
        Status::Processing => false,
        Status::Pending => held(m, s, job),
    })
}

fn held(m: &Protocol, s: &State, job: usize) -> bool {
    let j = &s.jobs[job];
    let stopped = |other: usize| match s.jobs[other].status {
        Status::Failed => true,
        Status::Pending => held(m, s, other),
        _ => false,
    };
    let behind_key = ORDERED[job]
        && j.blocked
        && (0..JOBS).any(|o| ORDERED[o] && s.jobs[o].seq < j.seq && stopped(o));
    let behind_parent = job == CHILD
        && j.waiting
        && match s.jobs[HEAD].status {
            Status::Failed => m.policy == Policy::Hold,
            Status::Pending => held(m, s, HEAD),
            _ => false,
        };
    j.status == Status::Pending && (behind_key || behind_parent)
}

/// Whether a fair schedule without crashes or pauses ends every job from `s`.
pub fn settles(m: &Protocol, s: &State) -> bool {
    let mut s = s.clone();
    for _ in 0..64 {
        if ended(m, &s) {
            return true;
        }
        let Some(action) = fair_step(m, &s) else {
            return false;
        };
        match m.step(&s, action) {
            Some(next) => s = next,
            None => return false,
        }
    }
    false
}

/// The next action of a fair schedule: paused relays wake, claims held by a
/// relay that is up finish `done`, a claim nobody runs any more runs out and
/// is reaped, backoffs end, and claimable jobs are claimed.
pub fn fair_step(m: &Protocol, s: &State) -> Option<Action> {
    let up: Vec<usize> = (0..s.relays.len())
        .filter(|&r| s.relays[r].mode == Mode::Up)
        .collect();
    if let Some(r) = (0..s.relays.len()).find(|&r| s.relays[r].mode == Mode::Paused) {
        return Some(Action::Wake(r));
    }
    for &relay in &up {
        if let Some(job) = (0..JOBS).find(|&job| s.relays[relay].holds[job].current) {
            return Some(Action::Finish {
                relay,
                job,
                stale: false,
                outcome: Outcome::Done,
            });
        }
    }
    for job in 0..JOBS {
        let j = &s.jobs[job];
        if j.status == Status::Processing {
            if j.lease_live {
                return Some(Action::LeaseRunsOut(job));
            }
            if let Some(&relay) = up.iter().find(|&&r| m.reapable(s, r, job)) {
                return Some(Action::Reap(relay));
            }
        }
        if j.status == Status::Pending && !j.due {
            return Some(Action::BackoffEnds(job));
        }
    }
    let relay = *up.first()?;
    (0..JOBS)
        .find(|&job| m.claimable(s, job))
        .map(|job| Action::Claim(relay, job))
}
