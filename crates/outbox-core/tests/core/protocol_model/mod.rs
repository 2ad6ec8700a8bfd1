//! The queue's protocol, model-checked (`model.rs`, `properties.rs`), and
//! the real SQL held to the model step by step (`sql.rs`, `walk.rs`), with
//! rules broken on purpose to show that both notice (`mutations.rs`).
//!
//! `cargo test protocol_model` runs it all. `PROTOCOL_MODEL_SEED=N` replays
//! the SQL walk of seed N alone (printed by a failing run), and
//! `PROTOCOL_MODEL_WALKS=N` sets how many walks a run takes.

mod model;
mod mutations;
mod properties;
mod runner;
mod sql;
mod transitions;
mod walk;

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use stateright::{Checker as _, HasDiscoveries, Model as _};

use model::{Policy, Protocol};
use mutations::{Mutation, rewrite, statement_files};
use sql::Sql;

/// Steps of one SQL walk; walks of a run and, for a mutation, walks tried
/// before it must have been caught.
const WALK_LENGTH: usize = 40;
const WALKS: u64 = 100;
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

/// The seeds a run walks: `PROTOCOL_MODEL_SEED` alone, or `count` from a
/// base drawn for this run (printed, so any walk can be replayed).
fn seeds(count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("PROTOCOL_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let count = std::env::var("PROTOCOL_MODEL_WALKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(count);
    let base = fastrand::u64(..u64::MAX / 2);
    eprintln!("protocol model walks: seeds {base}..{}", base + count);
    (base..base + count).collect()
}

/// The dependency policy of a walk's dependent, from its seed.
fn policy_of(seed: u64) -> Policy {
    if seed.is_multiple_of(2) {
        Policy::Hold
    } else {
        Policy::Run
    }
}

#[test]
fn protocol_model_the_sql_follows_the_model_step_by_step() {
    let started = Instant::now();
    let mut sql = Sql::new(None);
    let mut total = 0;
    let mut states = HashSet::new();
    for seed in seeds(WALKS) {
        let model = Protocol::new(policy_of(seed));
        match walk::walk(&model, &mut sql, seed, WALK_LENGTH) {
            Ok((steps, seen)) => {
                total += steps;
                states.extend(seen.into_iter().map(|s| (model.policy, s)));
            }
            Err(failure) => panic!(
                "the SQL parted from the model on seed {seed} (PROTOCOL_MODEL_SEED={seed} replays it):\n{failure}"
            ),
        }
    }
    eprintln!(
        "protocol model walks: {total} steps against PostgreSQL through {} distinct model states, \
         every row as the model says, in {:.1?}",
        states.len(),
        started.elapsed()
    );
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
        let caught = (1..=MUTATION_WALKS).find_map(|seed| {
            walk::walk(&model, &mut sql, seed, WALK_LENGTH)
                .err()
                .map(|failure| (seed, failure))
        });
        let Some((seed, failure)) = caught else {
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
