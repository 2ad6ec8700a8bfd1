//! An endpoint's stream, checked when the endpoint is added: it exists (or
//! is created), it captures every subject under the endpoint's prefix, and
//! its duplicate window is long enough.

use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode};

use super::MIN_DUPLICATE_WINDOW;
use crate::effects::error_chain;

/// Whether the subject filter `filter` (`orders.>`, `orders.*.*`, `>`)
/// matches every subject `subject` stands for (a plain subject, or a
/// pattern ending in `>` such as `orders.>`).
pub fn captures(filter: &str, subject: &str) -> bool {
    let filter: Vec<&str> = filter.split('.').collect();
    let subject: Vec<&str> = subject.split('.').collect();
    for (i, token) in filter.iter().enumerate() {
        if *token == ">" {
            // `>` needs at least one token after what matched so far.
            return subject.len() > i;
        }
        match subject.get(i) {
            None | Some(&">") => return false,
            Some(s) if *token == "*" || token == s => {}
            Some(_) => return false,
        }
    }
    filter.len() == subject.len()
}

/// Why a stream cannot take an endpoint's events.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("no stream named {stream} on {url} (add --create-stream to create it)")]
    Missing { stream: String, url: String },
    #[error(
        "stream {stream} captures {subjects}, not every subject under {prefix}.> \
         (add {prefix}.> to its subjects, or choose another --subject-prefix)"
    )]
    DoesNotCapture {
        stream: String,
        subjects: String,
        prefix: String,
    },
    #[error(
        "stream {stream}'s duplicate window is {window}, shorter than {minimum}: a publish \
         retried after a timeout must still be recognised by its Nats-Msg-Id, even if \
         the stream's retention has removed the first copy (raise duplicate_window)"
    )]
    WindowTooShort {
        stream: String,
        window: String,
        minimum: String,
    },
    #[error("JetStream on {url} did not answer about stream {stream}: {detail}")]
    Unavailable {
        stream: String,
        url: String,
        detail: String,
    },
    #[error("cannot create stream {stream}: {detail}")]
    Create { stream: String, detail: String },
}

/// What was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamChecked {
    pub created: bool,
    pub duplicate_window: Duration,
}

/// Checks that stream `stream` exists on the server `client` talks to
/// (creating it with `create`, capturing `<prefix>.>` with the default
/// duplicate window), captures `<prefix>.>`, and keeps duplicates for at
/// least [`MIN_DUPLICATE_WINDOW`].
pub async fn check_stream(
    client: async_nats::Client,
    url: &str,
    stream: &str,
    prefix: &str,
    create: bool,
) -> Result<StreamChecked, StreamError> {
    let context = jetstream::new(client);
    let pattern = format!("{prefix}.>");
    let (config, created) = match context.get_stream(stream).await {
        Ok(found) => (found.cached_info().config.clone(), false),
        Err(error) => {
            let missing = matches!(
                error.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(e)
                    if e.error_code() == ErrorCode::STREAM_NOT_FOUND
            );
            if !missing {
                return Err(StreamError::Unavailable {
                    stream: stream.to_owned(),
                    url: url.to_owned(),
                    detail: error_chain(&error),
                });
            }
            if !create {
                return Err(StreamError::Missing {
                    stream: stream.to_owned(),
                    url: url.to_owned(),
                });
            }
            let made = context
                .create_stream(jetstream::stream::Config {
                    name: stream.to_owned(),
                    subjects: vec![pattern.clone()],
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await
                .map_err(|e| StreamError::Create {
                    stream: stream.to_owned(),
                    detail: error_chain(&e),
                })?;
            (made.cached_info().config.clone(), true)
        }
    };
    if !config.subjects.iter().any(|s| captures(s, &pattern)) {
        return Err(StreamError::DoesNotCapture {
            stream: stream.to_owned(),
            subjects: config.subjects.join(", "),
            prefix: prefix.to_owned(),
        });
    }
    if config.duplicate_window < MIN_DUPLICATE_WINDOW {
        return Err(StreamError::WindowTooShort {
            stream: stream.to_owned(),
            window: humantime::format_duration(config.duplicate_window).to_string(),
            minimum: humantime::format_duration(MIN_DUPLICATE_WINDOW).to_string(),
        });
    }
    Ok(StreamChecked {
        created,
        duplicate_window: config.duplicate_window,
    })
}

#[cfg(test)]
mod tests {
    use super::captures;

    #[test]
    fn a_filter_captures_a_prefix_only_when_it_matches_every_subject_under_it() {
        for filter in ["orders.>", ">", "*.>"] {
            assert!(captures(filter, "orders.>"), "{filter}");
        }
        for filter in [
            "orders.*",
            "orders.*.*",
            "orders",
            "order.>",
            "orders.paid.>",
        ] {
            assert!(!captures(filter, "orders.>"), "{filter}");
        }
        assert!(captures("orders.*.*", "orders.paid.42"));
        assert!(captures("orders.>", "orders.paid.42"));
        assert!(!captures("orders.>", "orders"));
        assert!(!captures("orders.*", "orders.paid.42"));
    }
}
