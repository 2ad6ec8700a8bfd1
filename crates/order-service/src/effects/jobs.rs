//! The job types that are not an order's (those are in
//! [`crate::orders::jobs`]); their kinds are [`EffectKind`]'s.

use outbox_core::worker::JobArgs;
use serde::{Deserialize, Serialize};

pub use crate::endpoints::notice::EndpointNotice;
pub use crate::kinds::EffectKind;

/// Succeeds at once, whatever it carries (benchmarks, smoke tests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Noop(pub serde_json::Value);

impl JobArgs for Noop {
    const KIND: &'static str = EffectKind::Noop.as_str();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_kinds_are_the_placements_jobs() {
        assert_eq!(
            EffectKind::ORDER.map(EffectKind::as_str),
            crate::orders::ORDER_JOB_KINDS
        );
    }
}
