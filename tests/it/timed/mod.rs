//! Tests that time our code against a bound with the machine to themselves
//! ([`seats::quiet`](crate::support::seats::quiet)): slow HTTP effects' pace
//! at the relay's defaults; an inbound flood that must stall no route. (A fast endpoint beside a slow one is asserted
//! as the mechanism, in `endpoint_fairness`, and timed by `bench
//! --endpoints`.)
//!
//! They sit together in a module whose name sorts near the end, because the
//! test harness starts tests in the order of their names and a quiet test
//! first waits for every other seated test to end, with no new one let in.
//! In the middle of a run that wait drained the machine for 5 to 7 s for each
//! of them (`TEST_TIMELINE`); near the end, the run is emptying anyway. (The dashboard's timing on
//! a million jobs stays with the dashboard's tests: its load, 30 s or more on a
//! slow machine, runs beside the first tests. Its wait for quiet was 0.5 to
//! 15.1 s in eleven runs of 2026-12-04, 11 s or more in six, waiting on whichever
//! long bench or browser test was seated then; moved to the end, its load would
//! lengthen the run.)

mod inbound_flood;
mod relay_pace;
