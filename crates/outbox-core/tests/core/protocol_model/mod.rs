//! The queue's protocol, model-checked (`model.rs`, `properties.rs`), and
//! the real SQL held to the model step by step (`sql.rs`, `walk.rs`), with
//! rules broken on purpose to show that both notice (`mutations.rs`).
//!
//! `cargo test protocol_model` runs it all. A run of SQL walks prints its
//! first seed; `PROTOCOL_MODEL_SEED=N` replays that run (a walk depends on
//! the walks before it: see `walk::walk`), and `PROTOCOL_MODEL_WALKS=N` sets
//! how many walks it takes.

mod model;
mod mutations;
mod properties;
mod runner;
mod sql;
mod transitions;
mod walk;

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use stateright::{Checker as _, HasDiscoveries, Model as _};

use model::{Policy, Protocol, State};
use mutations::{Mutation, rewrite, statement_files};
use sql::Sql;

/// Steps of one SQL walk; walks of a run and, for a mutation, walks tried
/// before it must have been caught.
const WALK_LENGTH: usize = 25;
const WALKS: u64 = 160;
const MUTATION_WALKS: u64 = 400;

#[test]
fn protocol_model_every_guarantee_holds_in_every_reachable_state() {
    for policy in [Policy::Hold, Policy::Run] {
        let started = Instant::now();
        let checker = Protocol::new(policy)
            .checker()
            .threads(2)
            .spawn_bfs()
            .join();
        eprintln!(
            "protocol model, policy {policy:?}: {} states explored ({} unique, depth {}) in {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        checker.assert_properties();
        assert!(
            checker.unique_state_count() >= 100_000,
            "the bounds make a model too small to mean much"
        );
    }
}

#[test]
fn protocol_model_each_broken_rule_breaks_its_guarantee() {
    for mutation in Mutation::ALL {
        let mut model = Protocol::new(Policy::Hold);
        model.mutation = Some(mutation);
        let expected = mutation.breaks();
        let (actions, found) = shortest_counterexample(&model, expected).unwrap_or_else(|| {
            panic!(
                "{mutation:?} ({}) breaks no {expected:?}",
                mutation.describe()
            )
        });
        eprintln!(
            "the model with {}: shortest counterexample to {expected:?}, {} steps: {actions:?}",
            mutation.describe(),
            actions.len()
        );
        for name in found {
            assert!(
                name == expected || mutation.also_breaks().contains(&name),
                "{mutation:?} also broke {name:?} first"
            );
        }
    }
}

/// The shortest path to a state that breaks `property`, and every guarantee
/// broken at that depth. Deepening one level at a time: stateright records
/// the last of a property's counterexamples its breadth-first search pops,
/// so only a search bounded at the first depth that has one returns a
/// shortest path.
fn shortest_counterexample(
    model: &Protocol,
    property: &'static str,
) -> Option<(Vec<model::Action>, Vec<&'static str>)> {
    (1..=48).find_map(|depth| {
        let checker = model
            .clone()
            .checker()
            .threads(1)
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        let path = checker.discovery(property)?;
        let broken = checker
            .model()
            .properties()
            .into_iter()
            .filter(|p| p.expectation.discovery_is_failure() && checker.discovery(p.name).is_some())
            .map(|p| p.name)
            .collect();
        Some((path.into_actions(), broken))
    })
}

/// The first seed of a run: `PROTOCOL_MODEL_SEED` (printed by every run,
/// so a failing one can be replayed), or drawn anew.
fn first_seed() -> u64 {
    std::env::var("PROTOCOL_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..u64::MAX / 2))
}

/// The dependency policy of a walk's dependent, from its seed.
fn policy_of(seed: u64) -> Policy {
    if seed.is_multiple_of(2) {
        Policy::Hold
    } else {
        Policy::Run
    }
}

/// The steps of a run's walks, and the model states they passed through.
type Walked = (usize, Vec<(Policy, State)>);

/// Walks `count` seeds from `first` against `sql`, each walk's dependent
/// under the policy of its seed: the steps walked and the model states
/// passed, or the first walk where the SQL parted from the model.
fn walks(
    sql: &mut Sql,
    first: u64,
    count: u64,
    only: Option<Policy>,
) -> Result<Walked, (u64, walk::Failure)> {
    let mut seen: HashMap<Policy, walk::Seen> = HashMap::new();
    let mut total = 0;
    for seed in first..first + count {
        let policy = only.unwrap_or_else(|| policy_of(seed));
        let model = Protocol::new(policy);
        let seen = seen.entry(policy).or_default();
        total += walk::walk(&model, sql, seed, WALK_LENGTH, seen).map_err(|f| (seed, f))?;
    }
    let states = seen
        .into_iter()
        .flat_map(|(policy, seen)| seen.states.into_iter().map(move |s| (policy, s)))
        .collect();
    Ok((total, states))
}

#[test]
fn protocol_model_the_sql_follows_the_model_step_by_step() {
    let started = Instant::now();
    let mut sql = Sql::new(None);
    let first = first_seed();
    let count = std::env::var("PROTOCOL_MODEL_WALKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(WALKS);
    eprintln!("protocol model walks: PROTOCOL_MODEL_SEED={first}, {count} walks");
    let (total, states) = walks(&mut sql, first, count, None).unwrap_or_else(|(seed, failure)| {
        panic!(
            "the SQL parted from the model in the walk of seed {seed} \
             (PROTOCOL_MODEL_SEED={first} replays the run):\n{failure}"
        )
    });
    eprintln!(
        "protocol model walks: {total} steps against PostgreSQL through {} distinct model states, \
         every row as the model says, in {:.1?}",
        states.len(),
        started.elapsed()
    );
    // What the walks got to: the model's own examples (its `sometimes`
    // properties), counted over the states they passed through.
    let hold = Protocol::new(Policy::Hold);
    let run = Protocol::new(Policy::Run);
    for property in hold.properties() {
        if property.expectation != stateright::Expectation::Sometimes {
            continue;
        }
        let reached = states
            .iter()
            .filter(|(policy, state)| {
                let model = if *policy == Policy::Hold { &hold } else { &run };
                (property.condition)(model, state)
            })
            .count();
        eprintln!(
            "protocol model walks: {reached} states with {:?}",
            property.name
        );
    }
    assert!(total >= 1_000, "only {total} steps were walked");
}

#[test]
fn protocol_model_every_mutation_applies_to_todays_statements() {
    let files = statement_files();
    for mutation in Mutation::ALL {
        for change in mutation.rewrites() {
            let Some((_, text)) = files.iter().find(|(file, _)| *file == change.file) else {
                panic!(
                    "{mutation:?} rewrites {}, which is no statement the test runs",
                    change.file
                );
            };
            // Panics when the text no longer has what the rewrite replaces.
            let rewritten = rewrite(Some(mutation), change.file, text);
            assert_ne!(
                &rewritten, text,
                "{mutation:?} leaves {} as it was",
                change.file
            );
        }
    }
}

#[test]
fn protocol_model_every_mutation_of_the_sql_is_caught_with_a_short_trace() {
    for mutation in Mutation::ALL {
        let started = Instant::now();
        let mut sql = Sql::new(Some(mutation));
        let model = Protocol::new(Policy::Hold);
        let Err((seed, failure)) = walks(&mut sql, 1, MUTATION_WALKS, Some(model.policy)) else {
            panic!(
                "{MUTATION_WALKS} walks against the SQL with {} all followed the model",
                mutation.describe()
            );
        };
        let walked = failure.steps.len();
        let shortest = walk::shrink(&model, &mut sql, failure);
        eprintln!(
            "the SQL with {}: caught on seed {seed} at step {walked}, shrunk to {} steps in {:.1?}:\n{shortest}\n",
            mutation.describe(),
            shortest.steps.len(),
            started.elapsed()
        );
    }
}
