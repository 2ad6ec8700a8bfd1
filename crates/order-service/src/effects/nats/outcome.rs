//! What a publish's answer means: done (new, a duplicate, or already on its
//! subject), worth a retry, or not. Every error names its class and the
//! endpoint, so `last_error` says both.

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

use super::connection::Connection;
use super::stream::captures;
use super::{PUBLISH_TIMEOUT, Publication};
use crate::effects::{EffectError, error_chain};

/// A publish that is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The stream stored it now.
    New,
    /// The stream had it already, from an earlier attempt inside its
    /// duplicate window (a `duplicate` PubAck).
    Duplicate,
    /// The subject already holds its message, from an attempt before the
    /// duplicate window ("wrong last sequence" to `Nats-Expected-Last-Subject-Sequence: 0`).
    AlreadyPublished,
}

impl Published {
    pub fn as_str(self) -> &'static str {
        match self {
            Published::New => "published",
            Published::Duplicate => "duplicate",
            Published::AlreadyPublished => "already_published",
        }
    }
}

/// How bad a failed publish is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Retryable,
    Permanent,
}

impl ErrorClass {
    pub fn of(error: &EffectError) -> ErrorClass {
        match error {
            EffectError::Permanent { .. } => ErrorClass::Permanent,
            _ => ErrorClass::Retryable,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Retryable => "retryable",
            ErrorClass::Permanent => "permanent",
        }
    }
}

/// `retryable: NATS endpoint "events" (stream ORDERS): ...`.
pub fn failure(class: ErrorClass, endpoint: &str, stream: &str, what: &str) -> EffectError {
    let message = format!(
        "{}: NATS endpoint {endpoint:?} (stream {stream}): {what}",
        class.as_str()
    );
    match class {
        ErrorClass::Retryable => EffectError::retryable(message),
        ErrorClass::Permanent => EffectError::permanent(message),
    }
}

/// The outcome of a refused or unanswered publish of `publication` to
/// `endpoint` over `connection`. "No responders" is looked into, so that
/// `last_error` says whether the stream is missing or just not answering
/// (its leader being elected, say); both are retried.
pub async fn classify(
    error: PublishError,
    connection: &Connection,
    endpoint: &str,
    publication: &Publication<'_>,
) -> Result<Published, EffectError> {
    let stream = publication.stream;
    let subject = &publication.subject;
    let fail = |class: ErrorClass, what: String| -> Result<Published, EffectError> {
        Err(failure(class, endpoint, stream, &what))
    };
    match error.kind() {
        PublishErrorKind::WrongLastSequence => Ok(Published::AlreadyPublished),
        PublishErrorKind::TimedOut => {
            if let Some(complaint) = connection
                .recent_server_error(PUBLISH_TIMEOUT + Duration::from_secs(1))
                .filter(|c| c.to_lowercase().contains("permissions violation"))
                .filter(|c| c.contains(subject.as_str()))
            {
                return fail(
                    ErrorClass::Permanent,
                    format!("the server refused to let these credentials publish: {complaint}"),
                );
            }
            fail(
                ErrorClass::Retryable,
                format!(
                    "no PubAck for {subject} within {} (connection {}); retried with the same \
                     Nats-Msg-Id {}, not assumed lost",
                    humantime::format_duration(PUBLISH_TIMEOUT),
                    connection.state(),
                    publication.message_id
                ),
            )
        }
        PublishErrorKind::BrokenPipe => fail(
            ErrorClass::Retryable,
            format!(
                "the connection to {} was lost before the PubAck for {subject}",
                connection.url
            ),
        ),
        PublishErrorKind::MaxPayloadExceeded => fail(
            ErrorClass::Permanent,
            format!(
                "the message for {subject} is larger than the server's max_payload: {}",
                error_chain(&error)
            ),
        ),
        PublishErrorKind::StreamNotFound => fail(
            ErrorClass::Retryable,
            no_responders(connection, subject, stream).await,
        ),
        _ => {
            let code = std::error::Error::source(&error)
                .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
                .map(async_nats::jetstream::Error::error_code);
            let detail = error_chain(&error);
            match code {
                Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => fail(
                    ErrorClass::Permanent,
                    format!(
                        "the message for {subject} ({} bytes) is larger than the stream's \
                         max_msg_size: {detail}",
                        publication.body.len()
                    ),
                ),
                Some(ErrorCode::STREAM_NOT_MATCH) => fail(
                    ErrorClass::Permanent,
                    format!("{subject} is captured by another stream than {stream}: {detail}"),
                ),
                Some(ErrorCode::STREAM_NOT_FOUND) => {
                    fail(ErrorClass::Retryable, stream_missing(subject, stream))
                }
                // JetStream or the stream unavailable for now (10008, a 503),
                // and whatever else the server may say: another attempt.
                _ => fail(
                    ErrorClass::Retryable,
                    format!("publishing {subject} failed: {detail}"),
                ),
            }
        }
    }
}

/// A stream deleted under a running relay loses nothing: its publishes
/// retry (and hold their orders' later events) until it is back.
fn stream_missing(subject: &str, stream: &str) -> String {
    format!(
        "the stream {stream} does not exist (deleted?); the publish of {subject} is retried \
         until the stream is created again"
    )
}

/// Why nobody answered a publish to `subject`: the stream gone or no
/// longer capturing it, or there but not answering. All are retried: an
/// operator's change to the stream must not lose the events meanwhile.
async fn no_responders(connection: &Connection, subject: &str, stream: &str) -> String {
    match connection.jetstream.get_stream(stream).await {
        Ok(found) => {
            let subjects = &found.cached_info().config.subjects;
            if subjects.iter().any(|filter| captures(filter, subject)) {
                format!(
                    "no responders for {subject} although the stream exists (a leader \
                     election, or the stream restarting)"
                )
            } else {
                format!(
                    "the stream no longer captures {subject} (its subjects: {}); the publish \
                     is retried until it does",
                    subjects.join(", ")
                )
            }
        }
        Err(error) => {
            let code = match error.kind() {
                async_nats::jetstream::context::GetStreamErrorKind::JetStream(e) => {
                    Some(e.error_code())
                }
                _ => None,
            };
            if code == Some(ErrorCode::STREAM_NOT_FOUND) {
                stream_missing(subject, stream)
            } else {
                format!(
                    "no responders for {subject}, and JetStream did not say why: {}",
                    error_chain(&error)
                )
            }
        }
    }
}
