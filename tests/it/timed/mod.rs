//! Tests that time our code against a bound with the machine to themselves
//! ([`seats::quiet`](crate::support::seats::quiet)): slow HTTP effects' pace
//! at the relay's defaults; an inbound flood that must stall no route. (A fast endpoint beside a slow one is asserted
//! as the mechanism, in `endpoint_fairness`, and timed by `bench
//! --endpoints`.)
//!
//! They sit together in a module whose name sorts near the end, because the
//! test harness starts tests in the order of their names and a quiet test
//! first waits for every other seated test to end, with no new one let in.
//! In the middle of a run that wait drains the machine for seconds for each
//! of them (`TEST_TIMELINE` shows it); near the end, the run is emptying
//! anyway. (The dashboard's timing on a million jobs stays with the
//! dashboard's tests: its load, 30 s or more on a slow machine, runs beside
//! the first tests, and moved to the end it would lengthen the run, however
//! long its wait for quiet behind a seated bench or browser test.)

mod inbound_flood;
mod relay_pace;
