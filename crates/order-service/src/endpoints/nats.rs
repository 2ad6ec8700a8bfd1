//! What a NATS endpoint adds to an endpoint: the JetStream stream its events
//! go to and the subject prefix they are published under, parsed at the edge.

use std::fmt;

use super::spec::{SpecError, refuse};

/// `--subject-prefix`: one or more plain tokens joined by dots (`orders`,
/// `shop.eu.orders`). Wildcards and spaces would make the subjects of
/// different events collide or not be subjects at all; `$` starts the
/// server's own subjects (`$JS.API...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectPrefix(String);

impl SubjectPrefix {
    pub fn parse(raw: &str) -> Result<SubjectPrefix, SpecError> {
        let bad = |why: &str| refuse("--subject-prefix", format!("{raw:?} {why}"));
        if raw.is_empty() {
            return Err(bad("is empty"));
        }
        if raw.len() > 200 {
            return Err(bad("is longer than 200 characters"));
        }
        if raw.chars().any(char::is_whitespace) {
            return Err(bad("contains whitespace, which NATS subjects cannot"));
        }
        if raw.contains(['*', '>']) {
            return Err(bad(
                "contains a wildcard (* or >): each event needs a subject of its own",
            ));
        }
        if raw.starts_with('$') {
            return Err(bad("starts with $, which marks the server's own subjects"));
        }
        let tokens_ok = raw.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        });
        if !tokens_ok {
            return Err(bad(
                "is not dot-separated tokens of letters, digits, '_' and '-' (no empty token)",
            ));
        }
        Ok(SubjectPrefix(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SubjectPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `--stream`: a JetStream stream name (no spaces, dots, wildcards or path
/// separators, which the server refuses or which break its API subjects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamName(String);

impl StreamName {
    pub fn parse(raw: &str) -> Result<StreamName, SpecError> {
        let valid = !raw.is_empty()
            && raw.len() <= 64
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        if valid {
            Ok(StreamName(raw.to_owned()))
        } else {
            Err(refuse(
                "--stream",
                format!("{raw:?} is not a stream name (1 to 64 letters, digits, '_' or '-')"),
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a NATS endpoint's events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsTarget {
    pub stream: StreamName,
    pub subject_prefix: SubjectPrefix,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_plain_tokens_without_wildcards_or_spaces() {
        for good in ["orders", "shop.eu.orders", "o_1-x"] {
            assert!(SubjectPrefix::parse(good).is_ok(), "{good}");
        }
        for (bad, said) in [
            ("", "empty"),
            ("my orders", "whitespace"),
            ("orders.*", "wildcard"),
            ("orders.>", "wildcard"),
            ("orders..paid", "no empty token"),
            (".orders", "no empty token"),
            ("$JS.orders", "starts with $"),
        ] {
            let error = SubjectPrefix::parse(bad).expect_err(bad);
            assert_eq!(error.flag, "--subject-prefix");
            assert!(error.message.contains(said), "{bad}: {error}");
        }
    }

    #[test]
    fn stream_names_have_no_dots_spaces_or_wildcards() {
        assert!(StreamName::parse("ORDERS_v2-eu").is_ok());
        for bad in ["", "OR DERS", "ORDERS.x", "ORD*", "a/b"] {
            assert_eq!(StreamName::parse(bad).expect_err(bad).flag, "--stream");
        }
    }
}
