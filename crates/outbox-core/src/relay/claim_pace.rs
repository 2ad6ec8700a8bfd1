//! Where a relay's next claim starts and how many claims it keeps in flight:
//! the two decisions the producer asks of the queue's last answers.

use std::time::{Duration, Instant};

use crate::driver::ClaimPosition;

/// How many claims a relay keeps in flight: one while claims come back short
/// (the queue is shallow), one more after each full claim, up to what the
/// slots allow (`concurrency / batch_size`).
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlightTarget {
    now: usize,
    most: usize,
}

impl Default for InFlightTarget {
    fn default() -> Self {
        InFlightTarget::new(1)
    }
}

impl InFlightTarget {
    pub(super) fn new(most: usize) -> Self {
        InFlightTarget {
            now: 1,
            most: most.max(1),
        }
    }

    pub(super) fn get(&self) -> usize {
        self.now
    }

    /// A claim came back with `got` of the `wanted` jobs.
    pub(super) fn claimed(&mut self, got: usize, wanted: usize) {
        self.now = if got >= wanted {
            (self.now + 1).min(self.most)
        } else {
            1
        };
    }
}

/// Where this relay's claims start (see `claim_jobs.sql`). While the relay
/// drains a backlog, each claim starts where the previous one ended, so it
/// never walks again the index entries of the jobs it already took: under a
/// pinned MVCC horizon those are dead entries nothing can remove, and walking
/// them made every claim cost O(jobs churned since the pin) (measured: 20
/// buffers a claim became 1,030). A claim from the front picks up what a
/// slow transaction committed behind the cursor: after any short claim (so an
/// idle relay always looks at the whole queue), after every NOTIFY, and at
/// least every second.
#[derive(Debug, Default)]
pub(super) struct Cursor {
    after: Option<ClaimPosition>,
    last_front: Option<Instant>,
}

/// How often a relay draining a backlog claims from the front anyway.
pub(super) const FRONT_CLAIM_EVERY: Duration = Duration::from_secs(1);

impl Cursor {
    /// Where the next claim starts; `None` for the front.
    pub(super) fn start(&mut self, now: Instant) -> Option<ClaimPosition> {
        let stale = self
            .last_front
            .is_none_or(|at| now.duration_since(at) >= FRONT_CLAIM_EVERY);
        if stale || self.after.is_none() {
            self.last_front = Some(now);
            self.after = None;
            return None;
        }
        self.after
    }

    /// Sends the next claim to the front: a NOTIFY said a job committed, and
    /// its run_after (its transaction's start) may sort before jobs already
    /// claimed from later-started, earlier-committed transactions. Without
    /// this, under a steady stream of enqueues most new jobs would wait for
    /// the claim from the front a second later.
    pub(super) fn restart(&mut self) {
        self.after = None;
        self.last_front = None;
    }

    /// Records a claim that started at `from` and got `got` of `wanted` jobs
    /// ending at `end`. A short claim sends the next one to the front.
    pub(super) fn claimed(
        &mut self,
        from: Option<ClaimPosition>,
        end: Option<ClaimPosition>,
        got: usize,
        wanted: usize,
    ) {
        if got < wanted {
            self.after = None;
            self.last_front = None;
            return;
        }
        // A claim that started at the front, or a cursor claim while no
        // claim from the front is under way, moves the cursor.
        if from.is_none() || self.after.is_some() {
            self.after = self.after.max(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(id: i64) -> ClaimPosition {
        ClaimPosition {
            run_after: Utc
                .timestamp_opt(1_700_000_000, 0)
                .single()
                .unwrap_or_default(),
            id,
        }
    }

    #[test]
    fn full_claims_add_claims_in_flight_up_to_the_slots_and_a_short_one_goes_back_to_one() {
        let mut target = InFlightTarget::new(4);
        assert_eq!(target.get(), 1, "a relay starts with one claim in flight");
        for expected in [2, 3, 4, 4] {
            target.claimed(16, 16);
            assert_eq!(target.get(), expected);
        }
        target.claimed(3, 16);
        assert_eq!(target.get(), 1, "a short claim: the queue is shallow");
        let mut one = InFlightTarget::new(1);
        one.claimed(16, 16);
        assert_eq!(one.get(), 1, "never more than the slots allow");
    }

    #[test]
    fn a_relay_draining_a_backlog_claims_on_from_where_its_last_full_claim_ended() {
        let mut cursor = Cursor::default();
        let t0 = Instant::now();
        assert_eq!(
            cursor.start(t0),
            None,
            "the first claim starts at the front"
        );
        cursor.claimed(None, Some(at(16)), 16, 16);
        let from = cursor.start(t0);
        assert_eq!(from, Some(at(16)));
        cursor.claimed(from, Some(at(32)), 16, 16);
        assert_eq!(cursor.start(t0 + Duration::from_millis(10)), Some(at(32)));
    }

    #[test]
    fn a_notify_sends_the_next_claim_to_the_front() {
        let mut cursor = Cursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.claimed(None, Some(at(16)), 16, 16);
        cursor.restart();
        assert_eq!(cursor.start(t0), None);
    }

    #[test]
    fn a_short_claim_sends_the_next_one_to_the_front() {
        let mut cursor = Cursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.claimed(None, Some(at(16)), 16, 16);
        let from = cursor.start(t0);
        cursor.claimed(from, Some(at(20)), 4, 16);
        assert_eq!(cursor.start(t0), None);
    }

    #[test]
    fn a_backlog_drained_for_a_second_is_claimed_from_the_front_once() {
        let mut cursor = Cursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.claimed(None, Some(at(16)), 16, 16);
        let later = t0 + FRONT_CLAIM_EVERY;
        assert_eq!(cursor.start(later), None, "a second later: the front");
        cursor.claimed(None, Some(at(48)), 16, 16);
        assert_eq!(cursor.start(later), Some(at(48)));
    }

    #[test]
    fn claims_in_flight_together_leave_the_cursor_at_the_furthest_end() {
        let mut cursor = Cursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.claimed(None, Some(at(16)), 16, 16);
        let a = cursor.start(t0);
        let b = cursor.start(t0);
        cursor.claimed(b, Some(at(48)), 16, 16);
        cursor.claimed(a, Some(at(32)), 16, 16);
        assert_eq!(cursor.start(t0), Some(at(48)));
    }
}
