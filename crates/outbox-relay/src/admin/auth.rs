//! Who is asking: the login form's token check, the session cookie, and
//! where the session is found (signing and storage are in `session`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::AdminState;
use super::error::AdminError;
use super::session;
use crate::config::dashboard::{AdminSettings, AdminToken, CookieSecure, Role};

pub(super) const COOKIE_NAME: &str = "outbox_admin";

/// A logged-in operator.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The row in `admin_sessions`; logging out revokes it.
    pub id: String,
    /// Who acts, for the audit log (`operator#1`).
    pub actor: String,
    pub role: Role,
    /// The form token every POST must carry (see `csrf`).
    pub csrf: String,
}

impl Session {
    pub fn can_act(&self) -> bool {
        self.role == Role::Operator
    }
}

/// The token a login form's secret matches, comparing against every token
/// (no early exit), so the time taken says nothing about which one matched.
pub(super) fn find_token<'a>(
    settings: &'a AdminSettings,
    given: &str,
) -> Option<(usize, &'a AdminToken)> {
    let mut found = None;
    for (i, token) in settings.tokens.iter().enumerate() {
        if super::csrf::constant_time_eq(token.secret.as_bytes(), given.as_bytes())
            && found.is_none()
        {
            found = Some((i, token));
        }
    }
    found
}

/// The session a request's cookie stands for: genuine (signed with the
/// server's key for a configured token), unexpired, and still live in the
/// database (not logged out). `None` without one.
pub(super) async fn current_session(
    state: &AdminState,
    headers: &HeaderMap,
) -> Result<Option<Session>, AdminError> {
    let Some(value) = cookie(headers, COOKIE_NAME) else {
        return Ok(None);
    };
    let key = state.session_key().await?;
    let Some(signed) = session::verify(key, &state.settings, value, crate::links::unix_now())
    else {
        return Ok(None);
    };
    let Some(token) = state.settings.tokens.get(signed.token_index) else {
        return Ok(None);
    };
    let id = signed.id.clone();
    let live = state
        .db
        .run(move |conn| Ok(session::is_live(conn, &id)?))
        .await?;
    if !live {
        return Ok(None);
    }
    Ok(Some(Session {
        id: signed.id,
        actor: token.label.clone(),
        role: state.settings.effective_role(token),
        csrf: super::csrf::token_for(key, value),
    }))
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether the cookie gets `Secure` (see [`CookieSecure::Auto`]).
fn secure(settings: &AdminSettings, headers: &HeaderMap) -> bool {
    if settings.cookie_secure == CookieSecure::Always {
        return true;
    }
    let forwarded_https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    if forwarded_https {
        return true;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    !is_loopback_host(host)
}

fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Set-Cookie` for a new session, or (with `None`) one that ends it.
pub(super) fn set_cookie(
    settings: &AdminSettings,
    headers: &HeaderMap,
    value: Option<&str>,
) -> String {
    let secure = if secure(settings, headers) {
        "; Secure"
    } else {
        ""
    };
    match value {
        Some(value) => format!(
            "{COOKIE_NAME}={value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            settings.session_length.as_secs()
        ),
        None => {
            format!("{COOKIE_NAME}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
        }
    }
}

/// The address a login attempt is counted against: the peer's, or behind a
/// trusted proxy the client's (`TRUSTED_PROXIES`, see `client_addr`).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientAddr(pub IpAddr);

impl FromRequestParts<AdminState> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        // Set by the accept loop; a router served some other way has none,
        // and then every client shares one count, as before.
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        Ok(ClientAddr(
            state.settings.trusted_proxies.client(peer, &parts.headers),
        ))
    }
}

impl FromRequestParts<AdminState> for Session {
    type Rejection = AdminError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        current_session(state, &parts.headers)
            .await?
            .ok_or(AdminError::LoginRequired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dashboard::parse_admin_tokens;

    #[test]
    fn logins_match_tokens_and_loopback_http_gets_no_secure_flag() {
        let settings = AdminSettings::new(
            parse_admin_tokens(
                Some("op:alpha-token-0123456789abcdef-0123,ro:beta-token-0123456789abcdef-01234"),
                None,
            )
            .expect("tokens"),
        );
        let found = find_token(&settings, "beta-token-0123456789abcdef-01234");
        assert_eq!(found.map(|(i, _)| i), Some(1));
        assert!(find_token(&settings, "beta-token-0123456789abcdef-0123").is_none());
        assert!(is_loopback_host("127.0.0.1:8080"));
        assert!(is_loopback_host("[::1]:80"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("ops.example.com"));
    }
}
