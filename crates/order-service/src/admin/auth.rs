//! Who is asking: the login form's token check, the session cookie, and
//! where the session is found (signing and storage are in `session`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::AdminState;
use super::error::AdminError;
use super::session;
use crate::config::dashboard::{AdminSettings, AdminToken, Role};

/// The session cookie's name over plain http on loopback (the local demo).
pub(super) const COOKIE_NAME: &str = "outbox_admin";
/// Its name when `Secure`: a browser accepts a `__Host-` cookie only with
/// `Secure`, `Path=/` and no `Domain`, so a sibling subdomain or a plain-http
/// page cannot plant or shadow it.
pub(super) const SECURE_COOKIE_NAME: &str = "__Host-outbox_admin";

/// The name the session cookie has under these settings.
pub(super) fn cookie_name(settings: &AdminSettings) -> &'static str {
    if settings.secure_cookie() {
        SECURE_COOKIE_NAME
    } else {
        COOKIE_NAME
    }
}

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
    let Some(value) = cookie(headers, cookie_name(&state.settings)) else {
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
    let idle = state.settings.session_idle;
    let live = state
        .db
        .run(move |conn| Ok(session::is_live(conn, &id, idle)?))
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

/// `Set-Cookie` for a new session, or (with `None`) one that ends it. Its
/// `Secure` flag and name come from the settings only: a request's `Host` or
/// `X-Forwarded-Proto` is the client's to write.
pub(super) fn set_cookie(settings: &AdminSettings, value: Option<&str>) -> String {
    let (name, attributes) = if settings.secure_cookie() {
        (
            SECURE_COOKIE_NAME,
            "Path=/; HttpOnly; SameSite=Strict; Secure",
        )
    } else {
        (COOKIE_NAME, "Path=/admin; HttpOnly; SameSite=Strict")
    };
    match value {
        Some(value) => format!(
            "{name}={value}; {attributes}; Max-Age={}",
            settings.session_length.as_secs()
        ),
        None => format!("{name}=; {attributes}; Max-Age=0"),
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
    fn logins_match_tokens() {
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
    }

    #[test]
    fn the_public_url_decides_secure_and_the_prefix() {
        let mut settings = AdminSettings::new(
            parse_admin_tokens(Some("op:alpha-token-0123456789abcdef-0123"), None).expect("tokens"),
        );
        for (url, secure) in [
            ("http://127.0.0.1:8080", false),
            ("http://localhost:8080", false),
            ("http://[::1]:8080", false),
            ("https://127.0.0.1:8443", true),
            ("http://shop.example.com", true),
            ("https://shop.example.com", true),
        ] {
            settings.public_base_url = url::Url::parse(url).expect("URL");
            let cookie = set_cookie(&settings, Some("v"));
            assert_eq!(cookie.contains("; Secure"), secure, "{url}: {cookie}");
            assert_eq!(cookie.starts_with("__Host-"), secure, "{url}: {cookie}");
            if secure {
                assert!(cookie.contains("Path=/;") && !cookie.contains("Domain"));
            }
        }
        settings.public_base_url = url::Url::parse("http://127.0.0.1:8080").expect("URL");
        settings.cookie_secure = crate::config::dashboard::CookieSecure::Always;
        assert!(set_cookie(&settings, None).starts_with("__Host-outbox_admin=; Path=/;"));
    }
}
