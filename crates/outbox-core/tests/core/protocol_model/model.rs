//! The queue's protocol as a state machine: its states are what the tables
//! hold (plus what each relay and receiver believes), its actions are the
//! statements that change them, and the properties (`properties.rs`) are the
//! guarantees of docs/guarantees.md, by name.
//!
//! The system is small on purpose, and checked exhaustively:
//! - three jobs: `HEAD` (ordering key) and `CHILD` (concurrency key; waits
//!   for `HEAD` under the model's dependency policy), enqueued together by
//!   one application transaction; and `NEXT` (the same ordering key and the
//!   same concurrency key, whose limit is 1), enqueued by the transaction that
//!   applies message `M`, received through the dedupe;
//! - two relays that claim, heartbeat, finish (with the token they hold,
//!   current or stale), hand back and reap; one of them may crash once, and
//!   one may pause (a zombie) and wake;
//! - two receivers of `M`, which the sender delivers up to three times.
//!
//! Time is two actions: a lease running out, and a backoff ending.

use super::mutations::Mutation;

pub const JOBS: usize = 3;
pub const RELAYS: usize = 2;
pub const RECEIVERS: usize = 2;
/// The job with the ordering key, enqueued with `CHILD`.
pub const HEAD: usize = 0;
/// The dependent of `HEAD`, in the concurrency key.
pub const CHILD: usize = 1;
/// The job the message's application enqueues: ordering key and concurrency key.
pub const NEXT: usize = 2;
pub const JOB_NAMES: [&str; JOBS] = ["head", "child", "next"];
/// Jobs in the ordering key and in the concurrency key.
pub const ORDERED: [bool; JOBS] = [true, false, true];
pub const LIMITED: [bool; JOBS] = [false, true, true];
/// The concurrency key's `max_in_flight`.
pub const LIMIT: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Absent,
    Pending,
    Processing,
    Done,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Absent => "absent",
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Done => "done",
            Status::Failed => "failed",
        }
    }
    pub fn unfinished(self) -> bool {
        matches!(self, Status::Pending | Status::Processing | Status::Failed)
    }
}

/// What the dependent does when its parent fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    Hold,
    Run,
}

/// One job's row, as far as the protocol reads it, and the model's ghosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Job {
    pub status: Status,
    pub attempts: u8,
    /// `processing` only: `lease_expires_at` still ahead.
    pub lease_live: bool,
    /// `pending` only: `run_after` has passed.
    pub due: bool,
    /// Behind an unfinished earlier job of its ordering key.
    pub blocked: bool,
    /// `CHILD` only: `waiting_on` still names `HEAD`.
    pub waiting: bool,
    /// `CHILD` only: `unfinished_parents` names `HEAD` (policy `run`).
    pub unfinished_parent: bool,
    /// Place in enqueue order (the id order); earlier jobs of a key come first.
    pub seq: u8,
    /// Ghost: claimed at least once.
    pub started: bool,
    /// Ghost: `done` outcomes recorded (the effect's write in that transaction).
    pub outcomes: u8,
    /// Ghost: an outcome was recorded under a claim that was not the current one.
    pub stale_outcome: bool,
}

impl Job {
    pub const ABSENT: Job = Job {
        status: Status::Absent,
        attempts: 0,
        lease_live: false,
        due: false,
        blocked: false,
        waiting: false,
        unfinished_parent: false,
        seq: 0,
        started: false,
        outcomes: 0,
        stale_outcome: false,
    };
}

/// What a relay holds of one job: the current claim, and or a stale one
/// (a claim since reaped, its effect perhaps still running).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hold {
    pub current: bool,
    pub stale: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Up,
    /// Stopped (a long GC pause, a partition): it acts again once woken.
    Paused,
    /// Gone, with every claim it held.
    Crashed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Relay {
    pub mode: Mode,
    pub holds: [Hold; JOBS],
}

/// A receiver of message `M` and its open transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Receiver {
    Idle,
    /// Recorded (`first`) or found a repeat; not committed yet.
    Open {
        first: bool,
    },
    /// Its insert waits on the other receiver's uncommitted record of `M`.
    Waiting,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub jobs: [Job; JOBS],
    pub relays: [Relay; RELAYS],
    pub receivers: [Receiver; RECEIVERS],
    /// The concurrency key's `in_flight`.
    pub in_flight: u8,
    /// The application's transaction (`HEAD`, `CHILD`) committed.
    pub enqueued: bool,
    pub next_seq: u8,
    /// `M` is recorded by a committed transaction.
    pub recorded: bool,
    /// Ghost: applications of `M` (each enqueues `NEXT`).
    pub applied: u8,
    pub deliveries_left: u8,
    pub crashes_left: u8,
    pub pauses_left: u8,
    /// Ghost: a write under a stale token changed a row.
    pub stale_write: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Done,
    Retry,
    Fail,
}

/// The protocol's statements, and the events around them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The application's transaction enqueues `HEAD` and `CHILD`.
    Enqueue,
    /// A receiver opens a transaction and records `M` (the dedupe).
    Deliver(usize),
    /// It applies `M` if it recorded it (enqueues `NEXT`), and commits.
    Commit(usize),
    /// It dies before committing.
    Rollback(usize),
    /// A relay's claim takes this job.
    Claim(usize, usize),
    /// A relay's heartbeat: extends its current leases, learns its stale ones are lost.
    Heartbeat(usize),
    LeaseRunsOut(usize),
    BackoffEnds(usize),
    /// A relay's reaper, sparing its own relay's claims.
    Reap(usize),
    /// A relay writes an outcome with the token it holds (`stale` or current).
    Finish {
        relay: usize,
        job: usize,
        stale: bool,
        outcome: Outcome,
    },
    /// A relay hands a claimed, unstarted job back (shutdown).
    HandBack {
        relay: usize,
        job: usize,
        stale: bool,
    },
    Crash(usize),
    Pause(usize),
    Wake(usize),
}

/// The model: its bounds, the dependency policy, and the rule broken on
/// purpose, if any.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub policy: Policy,
    pub max_attempts: u8,
    pub deliveries: u8,
    pub mutation: Option<Mutation>,
}

impl Protocol {
    pub fn new(policy: Policy) -> Protocol {
        Protocol {
            policy,
            max_attempts: 2,
            deliveries: 3,
            mutation: None,
        }
    }

    pub fn initial(&self) -> State {
        State {
            jobs: [Job::ABSENT; JOBS],
            relays: [Relay {
                mode: Mode::Up,
                holds: [Hold::default(); JOBS],
            }; RELAYS],
            receivers: [Receiver::Idle; RECEIVERS],
            in_flight: 0,
            enqueued: false,
            next_seq: 0,
            recorded: false,
            applied: 0,
            deliveries_left: self.deliveries,
            crashes_left: 1,
            pauses_left: 1,
            stale_write: false,
        }
    }

    pub fn broken(&self, mutation: Mutation) -> bool {
        self.mutation == Some(mutation)
    }

    /// Whether `job` may be claimed now (by a relay that is up).
    pub fn claimable(&self, s: &State, job: usize) -> bool {
        let j = &s.jobs[job];
        j.status == Status::Pending
            && j.due
            && (!j.blocked || self.broken(Mutation::NoHeadCheck))
            && !j.waiting
            && (!LIMITED[job] || s.in_flight < LIMIT)
    }

    /// Every action enabled in `s`, in a fixed order.
    pub fn enabled(&self, s: &State, out: &mut Vec<Action>) {
        if !s.enqueued {
            out.push(Action::Enqueue);
        }
        for r in 0..RECEIVERS {
            match s.receivers[r] {
                Receiver::Idle if s.deliveries_left > 0 => out.push(Action::Deliver(r)),
                Receiver::Open { .. } => {
                    out.push(Action::Commit(r));
                    out.push(Action::Rollback(r));
                }
                _ => {}
            }
        }
        for job in 0..JOBS {
            match s.jobs[job].status {
                Status::Processing if s.jobs[job].lease_live => out.push(Action::LeaseRunsOut(job)),
                Status::Pending if !s.jobs[job].due => out.push(Action::BackoffEnds(job)),
                _ => {}
            }
        }
        for relay in 0..RELAYS {
            let r = &s.relays[relay];
            match r.mode {
                Mode::Up => {}
                Mode::Paused => {
                    out.push(Action::Wake(relay));
                    continue;
                }
                Mode::Crashed => continue,
            }
            for job in 0..JOBS {
                if self.claimable(s, job) {
                    out.push(Action::Claim(relay, job));
                }
            }
            if r.holds.iter().any(|h| h.current || h.stale) {
                out.push(Action::Heartbeat(relay));
            }
            out.push(Action::Reap(relay));
            for job in 0..JOBS {
                for stale in [false, true] {
                    let held = if stale {
                        r.holds[job].stale
                    } else {
                        r.holds[job].current
                    };
                    if !held {
                        continue;
                    }
                    for outcome in [Outcome::Done, Outcome::Retry, Outcome::Fail] {
                        // The relay makes its last attempt's retryable error a failure.
                        if outcome == Outcome::Retry
                            && !stale
                            && s.jobs[job].attempts >= self.max_attempts
                        {
                            continue;
                        }
                        out.push(Action::Finish {
                            relay,
                            job,
                            stale,
                            outcome,
                        });
                    }
                    out.push(Action::HandBack { relay, job, stale });
                }
            }
            if s.crashes_left > 0 {
                out.push(Action::Crash(relay));
            }
            if s.pauses_left > 0 {
                out.push(Action::Pause(relay));
            }
        }
    }
}

impl stateright::Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.enabled(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.step(state, action).filter(|next| next != state)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        super::properties::all()
    }
}
