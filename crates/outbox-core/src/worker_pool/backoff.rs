//! The retry policy: exponential, jittered, capped. Pure functions of the
//! attempt number and a jitter draw, so they can be table-tested.

use std::time::Duration;

use crate::statements::Outcome;
use crate::worker::{EffectError, EffectResult};

/// Default [`BackoffPolicy::base`]: the first retry comes 0.5 to 1 s after
/// the failed first attempt.
pub(crate) const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default [`BackoffPolicy::max`]: no retry waits longer than an hour (a
/// receiver's `Retry-After` aside, up to [`MAX_RETRY_AFTER`]).
pub(crate) const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(3600);
/// A receiver's `Retry-After` wins over the backoff when larger, up to this:
/// a misbehaving receiver cannot park a job for a year.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Exponential backoff with equal jitter: how long a job waits after a failed
/// attempt (see [`BackoffPolicy::delay`]). The default doubles from 1 s up
/// to an hour. A receiver's `Retry-After` wins when it is longer, up to a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// Delay before the second attempt (the first retry), before jitter
    /// (default 1 s).
    pub base: Duration,
    /// No delay exceeds this (default an hour).
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            base: DEFAULT_BACKOFF_BASE,
            max: DEFAULT_BACKOFF_MAX,
        }
    }
}

impl BackoffPolicy {
    /// The delay after failed attempt `attempt` (1-based): `base * 2^(attempt-1)`,
    /// capped at `max`, then "equal jitter": scaled into `[d/2, d)` by `jitter`
    /// in `[0, 1)`. Half the delay is fixed, so retries keep growing; half is
    /// random, so a burst of failures does not retry in lockstep.
    pub fn delay(&self, attempt: i32, jitter: f64) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1).clamp(0, 62)).unwrap_or(0);
        let ceiling = self
            .base
            .checked_mul(2_u32.saturating_pow(exponent.min(31)))
            .unwrap_or(self.max)
            .min(self.max);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        ceiling / 2 + (ceiling / 2).mul_f64(jitter)
    }

    /// A delay for `attempt` with a fresh jitter draw.
    pub fn jittered_delay(&self, attempt: i32) -> Duration {
        self.delay(attempt, fastrand::f64())
    }
}

/// Turns an effect's result into the job's next state.
///
/// Success is [`Outcome::Done`], carrying the effect's local write. A
/// [`EffectError::Permanent`] is [`Outcome::Failed`] at once. A
/// [`EffectError::Retryable`] is [`Outcome::Failed`] on the last attempt
/// (`attempt >= max_attempts`), otherwise [`Outcome::Retry`] after the
/// policy's delay for `attempt` (with `jitter` in `[0, 1)`), or after the
/// receiver's `retry_after` when that is longer, capped at
/// [`MAX_RETRY_AFTER`]. The error text says which attempt failed and why.
pub(crate) fn decide(
    result: EffectResult,
    attempt: i32,
    max_attempts: i32,
    policy: &BackoffPolicy,
    jitter: f64,
) -> Outcome {
    match result {
        Ok(local) => Outcome::Done { local },
        Err(EffectError::Permanent { message }) => Outcome::Failed {
            error: format!("permanent error on attempt {attempt}: {message}"),
        },
        Err(EffectError::Retryable { message, .. }) if attempt >= max_attempts => Outcome::Failed {
            error: format!(
                "attempt {attempt} of {max_attempts} failed, no attempts left: {message}"
            ),
        },
        Err(EffectError::Retryable {
            message,
            retry_after,
        }) => {
            let backoff = policy.delay(attempt, jitter);
            let asked = retry_after.unwrap_or_default().min(MAX_RETRY_AFTER);
            Outcome::Retry {
                delay: backoff.max(asked),
                error: format!("attempt {attempt} of {max_attempts} failed, will retry: {message}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn delays_double_per_attempt_until_the_cap() {
        let policy = BackoffPolicy {
            base: S(1),
            max: S(60),
        };
        // (attempt, jitter, expected)
        let table = [
            (1, 0.0, Duration::from_millis(500)),
            (1, 0.999_999, Duration::from_millis(999)),
            (2, 0.0, S(1)),
            (3, 0.0, S(2)),
            (4, 0.5, S(6)),
            (6, 0.0, S(16)),
            (7, 0.0, S(30)),
            (7, 1.0, S(60)),
            (8, 0.0, S(30)),
            (100, 1.0, S(60)),
            (i32::MAX, 1.0, S(60)),
            (0, 0.0, Duration::from_millis(500)),
            (-5, 0.0, Duration::from_millis(500)),
        ];
        for (attempt, jitter, expected) in table {
            let got = policy.delay(attempt, jitter);
            let diff = got.abs_diff(expected);
            assert!(
                diff < Duration::from_millis(2),
                "attempt {attempt} jitter {jitter}: {got:?} != {expected:?}"
            );
        }
    }

    #[test]
    fn jitter_keeps_successive_delays_growing_and_capped() {
        let policy = BackoffPolicy {
            base: S(1),
            max: S(3600),
        };
        let mut previous = Duration::ZERO;
        for attempt in 1..=30 {
            let d = policy.jittered_delay(attempt);
            assert!(
                d >= previous || d >= policy.max / 2,
                "attempt {attempt}: {d:?} < {previous:?}"
            );
            assert!(d <= policy.max, "attempt {attempt}: {d:?} over the cap");
            previous = d;
        }
    }

    #[test]
    fn bad_jitter_values_do_not_escape_the_bounds() {
        let policy = BackoffPolicy {
            base: S(10),
            max: S(100),
        };
        for jitter in [f64::NAN, f64::INFINITY, -1.0, 7.0] {
            let d = policy.delay(2, jitter);
            assert!(d >= S(10) && d <= S(20), "{jitter}: {d:?}");
        }
    }

    #[test]
    fn outcomes_follow_the_error_class_and_the_attempts_left() {
        let policy = BackoffPolicy {
            base: S(1),
            max: S(60),
        };
        assert_eq!(
            decide(Ok(None), 1, 3, &policy, 0.0),
            Outcome::Done { local: None }
        );
        assert!(matches!(
            decide(Err(EffectError::permanent("550 no such user")), 1, 3, &policy, 0.0),
            Outcome::Failed { error } if error.contains("550 no such user")
        ));
        assert!(matches!(
            decide(Err(EffectError::retryable("timeout")), 2, 3, &policy, 0.0),
            Outcome::Retry { delay, .. } if delay == S(1)
        ));
        assert!(matches!(
            decide(Err(EffectError::retryable("timeout")), 3, 3, &policy, 0.0),
            Outcome::Failed { error } if error.contains("no attempts left")
        ));
        let later = EffectError::Retryable {
            message: "429".into(),
            retry_after: Some(S(120)),
        };
        assert!(
            matches!(decide(Err(later), 1, 3, &policy, 0.0), Outcome::Retry { delay, .. } if delay == S(120))
        );
        let sooner = EffectError::Retryable {
            message: "429".into(),
            retry_after: Some(Duration::from_millis(1)),
        };
        assert!(
            matches!(decide(Err(sooner), 4, 9, &policy, 0.0), Outcome::Retry { delay, .. } if delay == S(4))
        );
        let absurd = EffectError::Retryable {
            message: "429".into(),
            retry_after: Some(S(10_000_000)),
        };
        assert!(
            matches!(decide(Err(absurd), 1, 3, &policy, 0.0), Outcome::Retry { delay, .. } if delay == MAX_RETRY_AFTER)
        );
    }
}
