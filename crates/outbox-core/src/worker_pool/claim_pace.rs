//! Where a worker pool's next claim starts and how many claims it keeps in flight:
//! the two decisions the producer asks of the queue's last answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::statements::ClaimPosition;

/// How many claims a worker pool keeps in flight: one while claims come back short
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

/// How many claims a worker pool keeps under way at most: enough that claims of
/// `batch_size` together ask for every slot.
pub(super) fn most_claims(batch_size: usize, concurrency: usize) -> usize {
    concurrency.div_ceil(batch_size.max(1)).max(1)
}

/// Most jobs a claim grows to, however many slots a worker pool has.
pub(super) const MAX_CLAIM_SIZE: usize = 256;

/// Effects this short count as fast, however quick the claims are. A job
/// claimed ahead of them waits about (claim size / slots) effects for its
/// slot: at most four of these, 20 ms, since a claim grows to four times the
/// slots at most. Claiming only into free slots instead leaves each slot
/// waiting a claim's round trip (and its jobs' reads) between two effects of
/// a millisecond or two, a NATS publish's PubAck: with claims ahead, the
/// publish drain's claims grew from about 22 jobs to the largest, and the
/// jobs' reads are made as the claim returns, one per claim
/// ([`JobHandler::claimed`](crate::worker::JobHandler::claimed)).
pub(super) const SHORT_EFFECT: Duration = Duration::from_millis(5);

/// Whether effects that take `effect` on average are fast enough to claim
/// ahead of, with claims that take `claim`.
pub(super) fn effects_fast(effect: Duration, claim: Duration) -> bool {
    effect <= claim.max(SHORT_EFFECT)
}

/// How many jobs the next claim asks for: `RELAY_BATCH_SIZE` to start with,
/// doubled after each claim that came back full with all it asked for, up to
/// [`ClaimSize::most`] (four times the concurrency, at most
/// [`MAX_CLAIM_SIZE`], never under the batch size). A short claim (the queue
/// is shallow) puts it back to the batch size at once, so an idle worker pool
/// claims a job the moment a NOTIFY announces it; a claim that found less
/// room than its size (effects hold the slots and the jobs claimed ahead
/// wait for them) halves it, and effects slower on average than a claim's
/// round trip and than [`SHORT_EFFECT`] put it back to the batch size:
/// claiming ahead of slow effects would only leave jobs waiting in this
/// worker pool that another could run.
///
/// Above the batch size a claim takes jobs ahead of the slots: they wait, in
/// claim order, for a slot to run in, and `RELAY_CONCURRENCY` still bounds
/// the effects in flight. On a deep queue of fast effects that is what lets
/// 64 slots drain as fast as 1024: each claim statement and outcome write
/// costs the database about the same for 16 jobs as for 256.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClaimSize {
    now: usize,
    base: usize,
    most: usize,
}

impl Default for ClaimSize {
    fn default() -> Self {
        ClaimSize::new(1, 1)
    }
}

impl ClaimSize {
    pub(super) fn new(batch_size: usize, concurrency: usize) -> Self {
        let base = batch_size.max(1);
        ClaimSize {
            now: base,
            base,
            most: Self::most(batch_size, concurrency),
        }
    }

    /// The largest claim of a worker pool at `batch_size` and `concurrency`.
    pub(super) fn most(batch_size: usize, concurrency: usize) -> usize {
        concurrency
            .saturating_mul(4)
            .min(MAX_CLAIM_SIZE)
            .max(batch_size.max(1))
    }

    /// How many jobs a worker pool may hold claimed ahead of its slots: room for
    /// every claim it may have in flight ([`most_claims`]) to be one of the
    /// largest. With room for only one, a worker pool at the defaults (64 / 16)
    /// kept one claim of 256 under way at a time, not four: the figures are
    /// in docs/performance.md ("Room ahead for every claim under way").
    pub(super) fn ahead_room(batch_size: usize, concurrency: usize) -> usize {
        Self::most(batch_size, concurrency).saturating_mul(most_claims(batch_size, concurrency))
    }

    pub(super) fn get(&self) -> usize {
        self.now
    }

    /// Whether claims now take jobs ahead of the slots.
    pub(super) fn ahead(&self) -> bool {
        self.now > self.base
    }

    /// A claim made at size `size` found room for `wanted` jobs and got
    /// `got`; `effects_fast`: effects take no longer than claims, on average.
    pub(super) fn claimed(&mut self, got: usize, wanted: usize, size: usize, effects_fast: bool) {
        self.now = if got < wanted || !effects_fast {
            self.base
        } else if wanted >= size {
            (self.now.max(size) * 2).min(self.most)
        } else {
            (self.now / 2).max(self.base)
        };
    }
}

/// A moving average of durations (each new one weighs an eighth), kept by
/// many tasks without a lock: two updates at once may lose one, which only
/// weighs the average a little differently.
#[derive(Debug, Default)]
pub(super) struct MovingAverage(AtomicU64);

impl MovingAverage {
    pub(super) fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.0.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        };
        self.0.store(new, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// Where this worker pool's claims start (see `claim_jobs.sql`). While the worker pool
/// drains a backlog, each claim starts where the previous one ended, so it
/// never walks again the index entries of the jobs it already took: under a
/// pinned MVCC horizon those are dead entries nothing can remove, and walking
/// them would make every claim cost O(jobs churned since the pin). A claim
/// from the front picks up what a
/// slow transaction committed behind the cursor: after any short claim (so an
/// idle worker pool always looks at the whole queue), after every NOTIFY, and at
/// least every second.
#[derive(Debug, Default)]
pub(super) struct Cursor {
    after: Option<ClaimPosition>,
    last_front: Option<Instant>,
}

/// How often a worker pool draining a backlog claims from the front anyway.
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
    fn claims_grow_on_a_deep_queue_of_fast_effects_and_shrink_when_short_or_starved() {
        let mut size = ClaimSize::new(16, 64);
        assert_eq!(size.get(), 16, "a relay starts at the batch size");
        assert!(!size.ahead());
        for expected in [32, 64, 128, 256, 256] {
            let now = size.get();
            size.claimed(now, now, now, true);
            assert_eq!(size.get(), expected);
        }
        assert!(size.ahead());
        size.claimed(200, 200, 256, true);
        assert_eq!(size.get(), 128, "room for 200 of 256: effects back up");
        size.claimed(3, 128, 128, true);
        assert_eq!(size.get(), 16, "a short claim: the queue is shallow");
        size.claimed(5, 5, 16, true);
        assert_eq!(
            size.get(),
            16,
            "five free slots of 16: never below the batch"
        );
        size.claimed(16, 16, 16, true);
        size.claimed(32, 32, 32, true);
        assert_eq!(size.get(), 64);
        size.claimed(64, 64, 64, false);
        assert_eq!(size.get(), 16, "effects slower than claims: no jobs ahead");
        assert_eq!(ClaimSize::most(16, 1024), 256);
        assert_eq!(ClaimSize::most(16, 2), 16, "never under the batch size");
        assert_eq!(ClaimSize::most(1, 16), 64);
    }

    #[test]
    fn every_claim_a_relay_may_have_under_way_can_be_a_full_claim_ahead() {
        // The defaults: four claims under way, each growing to 256.
        assert_eq!(most_claims(16, 64), 4);
        assert_eq!(ClaimSize::ahead_room(16, 64), 4 * 256);
        // A claim never grows past the batch size here, so nothing is
        // claimed ahead; the room is there but unused.
        assert_eq!(ClaimSize::ahead_room(256, 1024), 4 * 256);
        // One slot: one claim, growing to four jobs.
        assert_eq!(ClaimSize::ahead_room(1, 1), 4);
        // A batch larger than the slots: one claim, of the batch size.
        assert_eq!(most_claims(32, 8), 1);
        assert_eq!(ClaimSize::ahead_room(32, 8), 32);
    }

    #[test]
    fn effects_of_a_few_milliseconds_are_claimed_ahead_of_and_slower_ones_are_not() {
        let ms = Duration::from_millis;
        assert!(effects_fast(ms(1), Duration::from_micros(300)));
        assert!(effects_fast(SHORT_EFFECT, ms(1)));
        assert!(!effects_fast(ms(6), ms(1)), "slower than both");
        assert!(
            effects_fast(ms(40), ms(50)),
            "no slower than a claim on a slow server"
        );
        // A job claimed ahead waits for at most four effects of this length.
        assert_eq!(ClaimSize::most(16, 64) / 64, 4);
    }

    #[test]
    fn a_moving_average_follows_what_it_is_told() {
        let average = MovingAverage::default();
        assert_eq!(average.get(), Duration::ZERO);
        average.record(Duration::from_millis(8));
        assert_eq!(average.get(), Duration::from_millis(8), "the first sets it");
        for _ in 0..100 {
            average.record(Duration::from_millis(1));
        }
        assert!(
            average.get() < Duration::from_micros(1100),
            "{:?}",
            average.get()
        );
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
