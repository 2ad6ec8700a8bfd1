//! Rules of the protocol broken on purpose, each twice: as a rewrite of the
//! SQL text the model-based test runs (the files stay the one source of the
//! statements), and as the same change to the model. The tests hold that the
//! walks against the broken SQL part from the model, and that the broken
//! model breaks the guarantee the rule is there for.

use super::properties::{
    CONCURRENCY_LIMITS, DEPENDENCIES, EVERY_JOB_ENDS, EXACTLY_ONCE, FENCING, ORDERING_KEYS,
    RECEIVED_ONCE,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The finish writes whatever token it is given.
    NoFinishFence,
    /// The claim takes a job blocked behind an earlier job of its key.
    NoHeadCheck,
    /// A parent's failure releases its `hold` dependents.
    HoldReleasedOnFailure,
    /// The dedupe has no unique key: a repeat is recorded (and applied) again.
    NoDedupeKey,
    /// The claim does not count the slot it takes in its concurrency key.
    UncountedClaim,
    /// A job that ends `done` does not advance its ordering key.
    NoAdvance,
    /// The standalone finish takes any job, keyed or with dependents: it
    /// ends it without advancing its key, releasing its dependents or
    /// giving its slot back.
    UnguardedStandaloneFinish,
}

/// One textual change to a statement: every occurrence of `from` becomes `to`.
#[derive(Debug)]
pub struct Rewrite {
    /// The statement's file: a name of `HOT_STATEMENT_FILES`, or the dedupe's.
    pub file: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

/// The dedupe's statement file (`inbox/sql/`).
pub const RECORD_MESSAGE_FILE: &str = "record_message.sql";

impl Mutation {
    pub const ALL: [Mutation; 7] = [
        Mutation::NoFinishFence,
        Mutation::NoHeadCheck,
        Mutation::HoldReleasedOnFailure,
        Mutation::NoDedupeKey,
        Mutation::UncountedClaim,
        Mutation::NoAdvance,
        Mutation::UnguardedStandaloneFinish,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Mutation::NoFinishFence => "the finish statement without its lease_token fence",
            Mutation::NoHeadCheck => "the claim without the ordering key's head check",
            Mutation::HoldReleasedOnFailure => "dependents of policy hold released on failure",
            Mutation::NoDedupeKey => "the dedupe without its unique key",
            Mutation::UncountedClaim => "the claim not counting its concurrency slot",
            Mutation::NoAdvance => "a done job not advancing its ordering key",
            Mutation::UnguardedStandaloneFinish => {
                "the standalone finish without its checks for keys and dependents"
            }
        }
    }

    /// The guarantee (property) the broken model must break.
    pub fn breaks(self) -> &'static str {
        match self {
            Mutation::NoFinishFence => FENCING,
            Mutation::NoHeadCheck => ORDERING_KEYS,
            Mutation::HoldReleasedOnFailure => DEPENDENCIES,
            Mutation::NoDedupeKey => RECEIVED_ONCE,
            Mutation::UncountedClaim => CONCURRENCY_LIMITS,
            Mutation::NoAdvance | Mutation::UnguardedStandaloneFinish => EVERY_JOB_ENDS,
        }
    }

    /// Other guarantees the broken model may also break on the way.
    pub fn also_breaks(self) -> &'static [&'static str] {
        match self {
            Mutation::NoFinishFence => &[EXACTLY_ONCE],
            _ => &[],
        }
    }

    pub fn rewrites(self) -> &'static [Rewrite] {
        match self {
            Mutation::NoFinishFence => &[
                Rewrite {
                    file: "finish_jobs.sql",
                    from: "ON o.id = k.id AND o.lease_token = k.lease_token",
                    to: "ON o.id = k.id",
                },
                Rewrite {
                    file: "finish_jobs.sql",
                    from: "AND j.lease_token = l.lease_token",
                    to: "",
                },
                Rewrite {
                    file: "finish_standalone_jobs.sql",
                    from: "AND j.lease_token = ANY ($2)",
                    to: "",
                },
            ],
            Mutation::NoHeadCheck => &[
                Rewrite {
                    file: "claim_jobs.sql",
                    from: "AND NOT j.blocked",
                    to: "",
                },
                Rewrite {
                    file: "claim_jobs.sql",
                    from: "AND NOT blocked",
                    to: "",
                },
            ],
            Mutation::HoldReleasedOnFailure => &[
                Rewrite {
                    file: "finish_jobs.sql",
                    from: "OR (c.dependency_policy = 'run' AND c.waiting_on && e.failed)",
                    to: "OR c.waiting_on && e.failed",
                },
                Rewrite {
                    file: "finish_jobs.sql",
                    from: "AND (n.dependency_policy = 'hold' OR p <> ALL (e.failed))",
                    to: "AND p <> ALL (e.failed)",
                },
                Rewrite {
                    file: "update_reaped_jobs.sql",
                    from: "AND c.dependency_policy = 'run'",
                    to: "",
                },
            ],
            Mutation::NoDedupeKey => &[Rewrite {
                file: RECORD_MESSAGE_FILE,
                from: "ON CONFLICT (source, message_id) DO NOTHING",
                to: "",
            }],
            Mutation::UncountedClaim => &[Rewrite {
                file: "claim_jobs.sql",
                from: "SET in_flight = k.in_flight + t.n,",
                to: "SET in_flight = k.in_flight,",
            }],
            Mutation::NoAdvance => &[Rewrite {
                file: "finish_jobs.sql",
                from: "SET blocked = n.blocked AND n.id <> ALL (ARRAY(SELECT id FROM key_next WHERE id IS NOT NULL)),",
                to: "SET blocked = n.blocked,",
            }],
            Mutation::UnguardedStandaloneFinish => &[
                Rewrite {
                    file: "finish_standalone_jobs.sql",
                    from: "AND j.ordering_key IS NULL",
                    to: "",
                },
                Rewrite {
                    file: "finish_standalone_jobs.sql",
                    from: "AND j.concurrency_key IS NULL",
                    to: "",
                },
                Rewrite {
                    file: "finish_standalone_jobs.sql",
                    from: "AND j.has_dependents = false",
                    to: "",
                },
            ],
        }
    }

    /// Statements run on the test's database before the walk: the schema's
    /// part of the mutation.
    pub fn setup(self) -> &'static [&'static str] {
        match self {
            // The schema refuses a blocked job in `processing` on its own (a
            // second line of defence, which catches this mutation as an
            // error of the claim); without it, the walk shows the model
            // noticing the claim it does not allow.
            Mutation::NoHeadCheck => {
                &["ALTER TABLE jobs DROP CONSTRAINT jobs_blocked_is_a_waiting_keyed_job"]
            }
            Mutation::NoDedupeKey => {
                &["ALTER TABLE inbox_messages DROP CONSTRAINT inbox_messages_unique"]
            }
            _ => &[],
        }
    }
}

/// `text` of statement `file`, with `mutation`'s rewrites of it applied.
/// Panics when a rewrite no longer matches the text: a mutation that does
/// not apply would prove nothing.
pub fn rewrite(mutation: Option<Mutation>, file: &str, text: &str) -> String {
    let mut text = text.to_owned();
    let Some(mutation) = mutation else {
        return text;
    };
    for rewrite in mutation.rewrites().iter().filter(|r| r.file == file) {
        assert!(
            text.contains(rewrite.from),
            "mutation {mutation:?} ({}) no longer applies: {file} has no `{}`; \
             update the rewrite to the statement's new text",
            mutation.describe(),
            rewrite.from
        );
        text = text.replace(rewrite.from, rewrite.to);
    }
    text
}

/// The text of every statement a rewrite may name.
pub fn statement_files() -> Vec<(&'static str, &'static str)> {
    let mut files = outbox_core::statements::HOT_STATEMENT_FILES.to_vec();
    files.push((RECORD_MESSAGE_FILE, outbox_core::dedupe::RECORD_MESSAGE_SQL));
    files
}
