//! What each of the model's actions does to its state: the rules of the
//! statements (`sql/*.sql` of the core), as the model states them.

use super::model::{
    Action, CHILD, HEAD, Hold, JOBS, Job, LIMITED, Mode, NEXT, ORDERED, Outcome, Policy, Protocol,
    Receiver, Relay, State, Status,
};
use super::mutations::Mutation;

impl Protocol {
    /// `s` after `action`; `None` when the action is not enabled.
    pub fn step(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Enqueue => {
                if s.enqueued {
                    return None;
                }
                n.enqueued = true;
                self.insert(&mut n, HEAD);
                self.insert(&mut n, CHILD);
                n.jobs[CHILD].waiting = true;
            }
            Action::Deliver(r) => {
                if s.receivers[r] != Receiver::Idle || s.deliveries_left == 0 {
                    return None;
                }
                n.deliveries_left -= 1;
                let unique = !self.broken(Mutation::NoDedupeKey);
                let other_first = s.receivers[1 - r] == Receiver::Open { first: true };
                n.receivers[r] = if s.recorded && unique {
                    Receiver::Open { first: false }
                } else if other_first && unique {
                    Receiver::Waiting
                } else {
                    Receiver::Open { first: true }
                };
            }
            Action::Commit(r) | Action::Rollback(r) => {
                let Receiver::Open { first } = s.receivers[r] else {
                    return None;
                };
                n.receivers[r] = Receiver::Idle;
                let commit = matches!(action, Action::Commit(_));
                if commit && first {
                    n.recorded = true;
                    n.applied += 1;
                    if n.jobs[NEXT].status == Status::Absent {
                        self.insert(&mut n, NEXT);
                    }
                }
                if n.receivers[1 - r] == Receiver::Waiting {
                    // Its insert returns once this transaction ends.
                    n.receivers[1 - r] = Receiver::Open { first: !commit };
                }
            }
            Action::Claim(relay, job) => {
                if s.relays[relay].mode != Mode::Up || !self.claimable(s, job) {
                    return None;
                }
                let j = &mut n.jobs[job];
                j.status = Status::Processing;
                j.attempts += 1;
                j.lease_live = true;
                j.due = false;
                j.started = true;
                if LIMITED[job] && !self.broken(Mutation::UncountedClaim) {
                    n.in_flight += 1;
                }
                n.relays[relay].holds[job].current = true;
            }
            Action::Heartbeat(relay) => {
                if s.relays[relay].mode != Mode::Up {
                    return None;
                }
                for job in 0..JOBS {
                    let hold = &mut n.relays[relay].holds[job];
                    if hold.current {
                        n.jobs[job].lease_live = true;
                    }
                    hold.stale = false;
                }
            }
            Action::LeaseRunsOut(job) => {
                if s.jobs[job].status != Status::Processing || !s.jobs[job].lease_live {
                    return None;
                }
                n.jobs[job].lease_live = false;
            }
            Action::BackoffEnds(job) => {
                if s.jobs[job].status != Status::Pending || s.jobs[job].due {
                    return None;
                }
                n.jobs[job].due = true;
            }
            Action::Reap(relay) => {
                if s.relays[relay].mode != Mode::Up {
                    return None;
                }
                for job in 0..JOBS {
                    if self.reapable(s, relay, job) {
                        let outcome = if s.jobs[job].attempts >= self.max_attempts {
                            Outcome::Fail
                        } else {
                            Outcome::Retry
                        };
                        self.end_claim(&mut n, job, outcome);
                    }
                }
            }
            Action::Finish {
                relay,
                job,
                stale,
                outcome,
            } => {
                let hold = s.relays[relay].holds[job];
                if s.relays[relay].mode != Mode::Up
                    || !(if stale { hold.stale } else { hold.current })
                {
                    return None;
                }
                if stale {
                    n.relays[relay].holds[job].stale = false;
                    if self.broken(Mutation::NoFinishFence)
                        && s.jobs[job].status == Status::Processing
                    {
                        n.stale_write = true;
                        if outcome == Outcome::Done {
                            n.jobs[job].stale_outcome = true;
                        }
                        self.end_claim(&mut n, job, outcome);
                    }
                } else {
                    if outcome == Outcome::Retry && s.jobs[job].attempts >= self.max_attempts {
                        return None;
                    }
                    n.relays[relay].holds[job].current = false;
                    self.end_claim(&mut n, job, outcome);
                }
            }
            Action::HandBack { relay, job, stale } => {
                let hold = s.relays[relay].holds[job];
                if s.relays[relay].mode != Mode::Up
                    || !(if stale { hold.stale } else { hold.current })
                {
                    return None;
                }
                if stale {
                    n.relays[relay].holds[job].stale = false;
                } else {
                    n.relays[relay].holds[job].current = false;
                    let j = &mut n.jobs[job];
                    j.status = Status::Pending;
                    j.attempts -= 1;
                    j.lease_live = false;
                    j.due = true;
                    if LIMITED[job] {
                        n.in_flight = n.in_flight.saturating_sub(1);
                    }
                }
            }
            Action::Crash(relay) => {
                if s.crashes_left == 0 || s.relays[relay].mode == Mode::Crashed {
                    return None;
                }
                n.crashes_left -= 1;
                n.relays[relay] = Relay {
                    mode: Mode::Crashed,
                    holds: [Hold::default(); JOBS],
                };
            }
            Action::Pause(relay) => {
                if s.pauses_left == 0 || s.relays[relay].mode != Mode::Up {
                    return None;
                }
                n.pauses_left -= 1;
                n.relays[relay].mode = Mode::Paused;
            }
            Action::Wake(relay) => {
                if s.relays[relay].mode != Mode::Paused {
                    return None;
                }
                n.relays[relay].mode = Mode::Up;
            }
        }
        Some(n)
    }

    /// Whether `relay`'s reaper takes `job`: processing, its lease run out,
    /// and not a claim of `relay`'s own.
    pub fn reapable(&self, s: &State, relay: usize, job: usize) -> bool {
        s.jobs[job].status == Status::Processing
            && !s.jobs[job].lease_live
            && !s.relays[relay].holds[job].current
    }

    /// A new row of `job`: blocked behind its key's unfinished job, if any.
    fn insert(&self, n: &mut State, job: usize) {
        let blocked = ORDERED[job]
            && (0..JOBS)
                .any(|other| other != job && ORDERED[other] && n.jobs[other].status.unfinished());
        n.jobs[job] = Job {
            status: Status::Pending,
            due: true,
            blocked,
            seq: n.next_seq,
            ..Job::ABSENT
        };
        n.next_seq += 1;
    }

    /// The current claim of `job` ends in `outcome` (a finish under its token,
    /// or the reaper): the row changes, the slot comes back, and what waited
    /// for the job is advanced or released.
    fn end_claim(&self, n: &mut State, job: usize, outcome: Outcome) {
        for relay in &mut n.relays {
            if relay.holds[job].current {
                relay.holds[job] = Hold {
                    current: false,
                    stale: true,
                };
            }
        }
        if LIMITED[job] {
            n.in_flight = n.in_flight.saturating_sub(1);
        }
        let j = &mut n.jobs[job];
        j.lease_live = false;
        match outcome {
            Outcome::Retry => {
                j.status = Status::Pending;
                j.due = false;
            }
            Outcome::Done => {
                j.status = Status::Done;
                j.outcomes += 1;
                // The model has one finish; a standalone finish that takes a
                // keyed job is, to it, a done job that does not advance.
                let advances = !self.broken(Mutation::NoAdvance)
                    && !self.broken(Mutation::UnguardedStandaloneFinish);
                if ORDERED[job] && advances {
                    // The key's next job: the one enqueued after, blocked.
                    let seq = j.seq;
                    for (o, ordered) in n.jobs.iter_mut().zip(ORDERED) {
                        if ordered && o.status == Status::Pending && o.seq > seq {
                            o.blocked = false;
                        }
                    }
                }
                if job == HEAD {
                    n.jobs[CHILD].waiting = false;
                }
            }
            Outcome::Fail => {
                j.status = Status::Failed;
                let release =
                    self.policy == Policy::Run || self.broken(Mutation::HoldReleasedOnFailure);
                if job == HEAD && n.jobs[CHILD].waiting && release {
                    n.jobs[CHILD].waiting = false;
                    n.jobs[CHILD].unfinished_parent = self.policy == Policy::Run;
                }
            }
        }
    }
}
