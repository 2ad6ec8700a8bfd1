//! The deadline of one effect: `RELAY_JOB_TIMEOUT`, with per-kind overrides.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Five minutes: longer than any sane network exchange or document render,
/// short enough that a hung effect does not hold its slot for hours.
pub(crate) const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(300);

/// How long an effect may run before it is cancelled and the attempt recorded
/// as a retryable failure. Written `5m` or `5m,resize_image=30s,send_invoice=1m`:
/// a default, then `kind=duration` overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTimeouts {
    /// The deadline of a kind with no override (default five minutes).
    /// Must be positive.
    pub default: Duration,
    /// Deadlines by job kind, overriding `default`. Each must be positive.
    pub per_kind: BTreeMap<String, Duration>,
}

impl Default for JobTimeouts {
    fn default() -> Self {
        JobTimeouts {
            default: DEFAULT_JOB_TIMEOUT,
            per_kind: BTreeMap::new(),
        }
    }
}

impl JobTimeouts {
    /// `timeout` for every kind, with no override.
    pub fn uniform(timeout: Duration) -> Self {
        JobTimeouts {
            default: timeout,
            per_kind: BTreeMap::new(),
        }
    }

    /// The deadline of a job of `kind`.
    pub fn for_kind(&self, kind: &str) -> Duration {
        self.per_kind.get(kind).copied().unwrap_or(self.default)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.default.is_zero() {
            return Err("the job timeout must be positive".into());
        }
        if let Some((kind, _)) = self.per_kind.iter().find(|(_, d)| d.is_zero()) {
            return Err(format!("the job timeout of {kind} must be positive"));
        }
        Ok(())
    }
}

impl FromStr for JobTimeouts {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let mut timeouts = JobTimeouts::default();
        let mut default_seen = false;
        for part in raw.split(',').map(str::trim) {
            if part.is_empty() {
                return Err("empty entry (expected 5m or 5m,resize_image=30s)".to_owned());
            }
            let (kind, value) = match part.split_once('=') {
                Some((kind, value)) => (Some(kind.trim()), value.trim()),
                None => (None, part),
            };
            let duration = humantime::parse_duration(value)
                .map_err(|e| format!("{value:?}: {e} (expected a duration such as 30s or 5m)"))?;
            if duration.is_zero() {
                return Err(format!("{part:?}: a timeout must be more than zero"));
            }
            match kind {
                None if default_seen => {
                    return Err(format!("{part:?}: a second default (write kind=duration)"));
                }
                None => {
                    timeouts.default = duration;
                    default_seen = true;
                }
                Some("") => return Err(format!("{part:?}: no kind before '='")),
                Some(kind) => {
                    if timeouts
                        .per_kind
                        .insert(kind.to_owned(), duration)
                        .is_some()
                    {
                        return Err(format!("{kind} is given twice"));
                    }
                }
            }
        }
        Ok(timeouts)
    }
}

impl fmt::Display for JobTimeouts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.default))?;
        for (kind, d) in &self.per_kind {
            write!(f, ",{kind}={}", humantime::format_duration(*d))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_and_per_kind_overrides_parse_and_apply() {
        let t: JobTimeouts = "2m, resize_image=30s,send_invoice=45s"
            .parse()
            .expect("parses");
        assert_eq!(t.for_kind("resize_image"), Duration::from_secs(30));
        assert_eq!(t.for_kind("send_invoice"), Duration::from_secs(45));
        assert_eq!(t.for_kind("welcome_message"), Duration::from_secs(120));
        assert_eq!(t.to_string(), "2m,resize_image=30s,send_invoice=45s");

        let only_overrides: JobTimeouts = "noop=1s".parse().expect("parses");
        assert_eq!(only_overrides.for_kind("other"), DEFAULT_JOB_TIMEOUT);
    }

    #[test]
    fn bad_values_are_refused_with_the_value_named() {
        for (raw, says) in [
            ("", "empty entry"),
            ("5 parsecs", "5 parsecs"),
            ("0s", "more than zero"),
            ("1m,2m", "second default"),
            ("=5s", "no kind"),
            ("noop=1s,noop=2s", "twice"),
        ] {
            let error = raw.parse::<JobTimeouts>().expect_err(raw);
            assert!(error.contains(says), "{raw:?}: {error}");
        }
    }
}
