//! How an attempt failed, which decides what happens to the job.

use std::time::Duration;

/// How an effect failed, which decides what happens to the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    /// Worth another attempt (network trouble, a 5xx, a full mailbox server).
    /// `retry_after` is the receiver's own wish (an HTTP `Retry-After`); the
    /// worker pool waits for the later of it and its backoff.
    #[error("{message}")]
    Retryable {
        /// What happened, for `last_error`.
        message: String,
        /// The receiver's own wish for when to try again, if it said.
        retry_after: Option<Duration>,
    },
    /// Retrying cannot help (a 4xx, a rejected recipient, a payload that does not
    /// decode, a record that no longer exists): the job goes straight to `failed`.
    #[error("{message}")]
    Permanent {
        /// What happened, for `last_error`.
        message: String,
    },
}

impl EffectError {
    /// A failure worth another attempt, with no wish of the receiver's.
    pub fn retryable(message: impl Into<String>) -> Self {
        EffectError::Retryable {
            message: message.into(),
            retry_after: None,
        }
    }
    /// A failure that retrying cannot mend.
    pub fn permanent(message: impl Into<String>) -> Self {
        EffectError::Permanent {
            message: message.into(),
        }
    }
}
