//! What the dashboard is configured with: its tokens and their roles, the
//! read-only switch, whether payloads are shown, and the cookie's `Secure` rule.

use std::time::Duration;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Sees every page and may retry and cancel jobs.
    Operator,
    /// Sees every page; every action is refused.
    ReadOnly,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::ReadOnly => "read-only",
        }
    }
}

/// One accepted token. `Debug` never prints the secret.
#[derive(Clone)]
pub struct AdminToken {
    /// Who acted, in the audit log: the role and the token's position in the
    /// settings (`operator#1`). The secret itself is never stored or logged.
    pub label: String,
    pub role: Role,
    pub(super) secret: String,
    /// HMAC-SHA256 keyed by the secret: signs this token's sessions and form
    /// tokens (cloned per use; keying once means no fallible step per request).
    pub(super) mac: hmac::Hmac<sha2::Sha256>,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("label", &self.label)
            .field("role", &self.role)
            .field("secret", &"***")
            .finish()
    }
}

/// When the session cookie carries `Secure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CookieSecure {
    /// Always, except for a plain-http request to a loopback host (the local
    /// demo on http://127.0.0.1): a browser would drop a `Secure` cookie there
    /// and the login could never stick. Behind a TLS-terminating proxy that
    /// sends `X-Forwarded-Proto: https`, always.
    #[default]
    Auto,
    /// Always, whatever the request looks like.
    Always,
}

impl std::str::FromStr for CookieSecure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(CookieSecure::Auto),
            "always" => Ok(CookieSecure::Always),
            other => Err(format!("unknown value {other:?} (expected auto or always)")),
        }
    }
}

pub const DEFAULT_ADMIN_STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_SESSION_LENGTH: Duration = Duration::from_secs(12 * 3600);

/// The dashboard's settings. `serve` mounts `/admin` only when there are tokens.
#[derive(Debug, Clone)]
pub struct AdminSettings {
    pub tokens: Vec<AdminToken>,
    /// Every token acts as read-only (`--admin-read-only`).
    pub read_only: bool,
    /// Job payloads hold customer data (names, addresses): hide them.
    pub hide_payload: bool,
    pub cookie_secure: CookieSecure,
    /// The right-hand side of the confirmation email's `Message-ID` (the
    /// domain of `MAIL_FROM`), shown on an order's timeline.
    pub mail_domain: Option<String>,
    /// `statement_timeout` of every dashboard query and action batch.
    pub statement_timeout: Duration,
    pub session_length: Duration,
}

impl AdminSettings {
    pub fn new(tokens: Vec<AdminToken>) -> AdminSettings {
        AdminSettings {
            tokens,
            read_only: false,
            hide_payload: false,
            cookie_secure: CookieSecure::Auto,
            mail_domain: None,
            statement_timeout: DEFAULT_ADMIN_STATEMENT_TIMEOUT,
            session_length: DEFAULT_SESSION_LENGTH,
        }
    }

    /// The role a token acts with, `--admin-read-only` applied.
    pub(super) fn effective_role(&self, token: &AdminToken) -> Role {
        if self.read_only {
            Role::ReadOnly
        } else {
            token.role
        }
    }
}

/// Parses `ADMIN_TOKEN` and `ADMIN_READONLY_TOKEN`.
///
/// `ADMIN_TOKEN` is a comma-separated list; each entry is `op:SECRET` (an
/// operator), `ro:SECRET` (read-only), or a bare `SECRET` (an operator, so a
/// plain `ADMIN_TOKEN=s3cret` keeps working). `ADMIN_READONLY_TOKEN` is a
/// comma-separated list of read-only secrets. A secret may not contain a comma
/// and may not be used twice.
pub fn parse_admin_tokens(
    tokens: Option<&str>,
    read_only_tokens: Option<&str>,
) -> Result<Vec<AdminToken>, String> {
    let mut entries: Vec<(Role, String)> = Vec::new();
    for entry in tokens.unwrap_or_default().split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let (role, secret) = match entry.split_once(':') {
            Some(("op" | "operator", secret)) => (Role::Operator, secret),
            Some(("ro" | "read-only" | "readonly", secret)) => (Role::ReadOnly, secret),
            _ => (Role::Operator, entry),
        };
        entries.push((role, secret.to_owned()));
    }
    for secret in read_only_tokens.unwrap_or_default().split(',') {
        let secret = secret.trim();
        if !secret.is_empty() {
            entries.push((Role::ReadOnly, secret.to_owned()));
        }
    }
    let mut tokens: Vec<AdminToken> = Vec::with_capacity(entries.len());
    for (i, (role, secret)) in entries.into_iter().enumerate() {
        if secret.is_empty() {
            return Err(format!("token {} has a role but no secret", i + 1));
        }
        if tokens.iter().any(|t| t.secret == secret) {
            return Err(format!(
                "token {} repeats an earlier one (each secret names one role)",
                i + 1
            ));
        }
        let mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(secret.as_bytes())
            .map_err(|_| format!("token {} cannot key HMAC-SHA256", i + 1))?;
        tokens.push(AdminToken {
            label: format!("{}#{}", role.as_str(), i + 1),
            role,
            secret,
            mac,
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_token_is_an_operator_and_lists_give_roles() {
        let tokens = parse_admin_tokens(Some("s3cret"), None).expect("valid");
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].role, Role::Operator);
        assert_eq!(tokens[0].label, "operator#1");

        let tokens = parse_admin_tokens(Some("op:one, ro:two,three"), Some("four")).expect("valid");
        let roles: Vec<(&str, Role)> = tokens.iter().map(|t| (t.secret.as_str(), t.role)).collect();
        assert_eq!(
            roles,
            [
                ("one", Role::Operator),
                ("two", Role::ReadOnly),
                ("three", Role::Operator),
                ("four", Role::ReadOnly)
            ]
        );
        assert_eq!(tokens[1].label, "read-only#2");
    }

    #[test]
    fn empty_repeated_and_roleless_entries_are_refused_or_skipped() {
        assert!(
            parse_admin_tokens(Some(""), None)
                .expect("valid")
                .is_empty()
        );
        assert!(parse_admin_tokens(Some("op:"), None).is_err());
        assert!(parse_admin_tokens(Some("a"), Some("a")).is_err());
        assert!(!format!("{:?}", parse_admin_tokens(Some("hunter2"), None)).contains("hunter2"));
    }
}
