//! What the dashboard is configured with: its tokens and their roles, the
//! read-only switch, whether payloads are shown, the cookie's `Secure` rule
//! and how long a session lasts.

use std::time::Duration;

use crate::client_addr::TrustedProxies;

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
    pub(crate) secret: String,
    /// SHA-256 of the secret, inside every session MAC (never in a cookie or
    /// the database): rotating the token ends its sessions.
    pub(crate) fingerprint: [u8; 32],
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

/// When the session cookie carries `Secure`. Decided by configuration only:
/// a request's `Host` or `X-Forwarded-Proto` is the client's to write, so it
/// never decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CookieSecure {
    /// Always, except when the service's public URL (`PUBLIC_BASE_URL`) is
    /// plain http on a loopback host (the local demo on http://127.0.0.1): a
    /// browser would drop a `Secure` cookie there and the login could never
    /// stick.
    #[default]
    Auto,
    /// Always, whatever the public URL.
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

/// Whether `url` is plain http to a loopback host (`localhost`, 127.0.0.0/8,
/// `[::1]`).
pub fn is_loopback_http(url: &url::Url) -> bool {
    if url.scheme() != "http" {
        return false;
    }
    match url.host() {
        Some(url::Host::Domain(name)) => {
            name.eq_ignore_ascii_case("localhost")
                || name.to_ascii_lowercase().ends_with(".localhost")
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

pub const DEFAULT_ADMIN_STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_SESSION_LENGTH: Duration = Duration::from_secs(12 * 3600);
/// A session unused for this long is refused (`ADMIN_SESSION_IDLE`).
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);

/// The dashboard's settings. `serve` mounts `/admin` only when there are tokens.
#[derive(Debug, Clone)]
pub struct AdminSettings {
    pub tokens: Vec<AdminToken>,
    /// Every token acts as read-only (`--admin-read-only`).
    pub read_only: bool,
    /// Job payloads hold customer data (names, addresses): hide them.
    pub hide_payload: bool,
    pub cookie_secure: CookieSecure,
    /// The service's public URL (`PUBLIC_BASE_URL`): with
    /// [`CookieSecure::Auto`], the cookie is `Secure` unless it is plain http
    /// on loopback.
    pub public_base_url: url::Url,
    /// The right-hand side of the confirmation email's `Message-ID` (the
    /// domain of `MAIL_FROM`), shown on an order's timeline.
    pub mail_domain: Option<String>,
    /// `statement_timeout` of every dashboard query and action batch.
    pub statement_timeout: Duration,
    /// The absolute lifetime of a session, from its login.
    pub session_length: Duration,
    /// A session unused for longer is refused (`ADMIN_SESSION_IDLE`).
    pub session_idle: Duration,
    /// The proxies whose `X-Forwarded-For` names the client that the
    /// failed-login limit counts (`TRUSTED_PROXIES`); empty: the peer.
    pub trusted_proxies: TrustedProxies,
}

impl AdminSettings {
    pub fn new(tokens: Vec<AdminToken>) -> AdminSettings {
        AdminSettings {
            tokens,
            read_only: false,
            hide_payload: false,
            cookie_secure: CookieSecure::Auto,
            public_base_url: url::Url::parse(super::DEFAULT_PUBLIC_BASE_URL)
                .expect("the default public URL parses"),
            mail_domain: None,
            statement_timeout: DEFAULT_ADMIN_STATEMENT_TIMEOUT,
            session_length: DEFAULT_SESSION_LENGTH,
            session_idle: DEFAULT_SESSION_IDLE,
            trusted_proxies: Default::default(),
        }
    }

    /// Whether the session cookie carries `Secure` (and then the `__Host-`
    /// prefix): from configuration only, never from a request.
    pub fn secure_cookie(&self) -> bool {
        match self.cookie_secure {
            CookieSecure::Always => true,
            CookieSecure::Auto => !is_loopback_http(&self.public_base_url),
        }
    }

    /// The role a token acts with, `--admin-read-only` applied.
    pub(crate) fn effective_role(&self, token: &AdminToken) -> Role {
        if self.read_only {
            Role::ReadOnly
        } else {
            token.role
        }
    }
}

/// The shortest token accepted: 32 characters, as `openssl rand -hex 16`
/// prints, so a login form is not worth guessing at.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 32;

/// Parses `ADMIN_TOKEN` and `ADMIN_READONLY_TOKEN`.
///
/// `ADMIN_TOKEN` is a comma-separated list; each entry is `op:SECRET` (an
/// operator), `ro:SECRET` (read-only), or a bare `SECRET` (an operator, so a
/// plain `ADMIN_TOKEN=s3cret` keeps working). `ADMIN_READONLY_TOKEN` is a
/// comma-separated list of read-only secrets. A secret may not contain a comma,
/// may not be used twice, and has at least [`MIN_ADMIN_TOKEN_CHARS`]
/// characters. Errors name the variable and the entry, never the secret.
pub fn parse_admin_tokens(
    tokens: Option<&str>,
    read_only_tokens: Option<&str>,
) -> Result<Vec<AdminToken>, String> {
    let mut entries: Vec<(Role, String, &str)> = Vec::new();
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
        entries.push((role, secret.to_owned(), "ADMIN_TOKEN"));
    }
    for secret in read_only_tokens.unwrap_or_default().split(',') {
        let secret = secret.trim();
        if !secret.is_empty() {
            entries.push((Role::ReadOnly, secret.to_owned(), "ADMIN_READONLY_TOKEN"));
        }
    }
    let mut tokens: Vec<AdminToken> = Vec::with_capacity(entries.len());
    for (i, (role, secret, variable)) in entries.into_iter().enumerate() {
        if secret.is_empty() {
            return Err(format!(
                "{variable}: token {} has a role but no secret",
                i + 1
            ));
        }
        let chars = secret.chars().count();
        if chars < MIN_ADMIN_TOKEN_CHARS {
            return Err(format!(
                "{variable}: token {} is {chars} characters; at least \
                 {MIN_ADMIN_TOKEN_CHARS} are needed (e.g. `openssl rand -hex 16`)",
                i + 1
            ));
        }
        if tokens.iter().any(|t| t.secret == secret) {
            return Err(format!(
                "{variable}: token {} repeats an earlier one (each secret names one role)",
                i + 1
            ));
        }
        let fingerprint = <sha2::Sha256 as sha2::Digest>::digest(secret.as_bytes()).into();
        tokens.push(AdminToken {
            label: format!("{}#{}", role.as_str(), i + 1),
            role,
            secret,
            fingerprint,
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "one-token-0123456789abcdef-012345";
    const TWO: &str = "two-token-0123456789abcdef-012345";
    const THREE: &str = "three-token-0123456789abcdef-0123";
    const FOUR: &str = "four-token-0123456789abcdef-01234";

    #[test]
    fn a_plain_token_is_an_operator_and_lists_give_roles() {
        let tokens = parse_admin_tokens(Some(ONE), None).expect("valid");
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].role, Role::Operator);
        assert_eq!(tokens[0].label, "operator#1");

        let listed = format!("op:{ONE}, ro:{TWO},{THREE}");
        let tokens = parse_admin_tokens(Some(&listed), Some(FOUR)).expect("valid");
        let roles: Vec<(&str, Role)> = tokens.iter().map(|t| (t.secret.as_str(), t.role)).collect();
        assert_eq!(
            roles,
            [
                (ONE, Role::Operator),
                (TWO, Role::ReadOnly),
                (THREE, Role::Operator),
                (FOUR, Role::ReadOnly)
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
        assert!(parse_admin_tokens(Some(ONE), Some(ONE)).is_err());
        assert!(!format!("{:?}", parse_admin_tokens(Some(ONE), None)).contains(ONE));
    }

    #[test]
    fn short_tokens_are_refused_naming_the_variable_not_the_token() {
        let error = parse_admin_tokens(Some("op:change-me"), None).expect_err("short");
        assert!(
            error.starts_with("ADMIN_TOKEN: token 1 is 9 characters"),
            "{error}"
        );
        assert!(!error.contains("change-me"), "{error}");
        let error = parse_admin_tokens(Some(ONE), Some("hunter2")).expect_err("short");
        assert!(
            error.starts_with("ADMIN_READONLY_TOKEN: token 2 is 7"),
            "{error}"
        );
        let exactly = "x".repeat(MIN_ADMIN_TOKEN_CHARS);
        assert!(parse_admin_tokens(Some(&exactly), None).is_ok());
    }
}
