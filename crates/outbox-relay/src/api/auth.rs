//! The front door of `/orders`: every route names what it needs
//! (`Required`), and this file checks it. A refusal is an [`ApiError`]
//! (401, 403 or 429), so it is a JSON error like any other, and nothing has
//! been written.
//!
//! The check has two halves. `authorize`, a middleware on every `/orders`
//! route, refuses a request whose `Authorization` header holds no
//! well-formed key, before the handler runs, and hands the handler a
//! `Caller`. The handler's database work runs through
//! `AppState::run_as`, which first calls `Caller::verify`: the key's
//! row, its expiry and revocation, the route's scope, the rate limit. So
//! the look-up shares the request's one connection and blocking task
//! instead of taking its own: a look-up through a second checkout measured
//! 0.73x of the placement rate of `API_AUTH=none` in `bench`. The key is read on every request, never cached: a `keys revoke`
//! takes effect on the next request, on every replica. The per-key rate
//! limit counts in this process (see [`RateLimit`]).

use std::collections::HashMap;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use diesel::PgConnection;

use super::error::ApiError;
use super::key_limit::RateLimiter;
use crate::api_keys::{self, KeyState, PresentedKey, Scope};
use crate::orders::Transition;

pub use super::key_limit::RateLimit;

/// Whether `/orders` asks for a key (`API_AUTH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ApiAuth {
    /// Every `/orders` request needs `Authorization: Bearer <key>` with the
    /// route's scope.
    #[default]
    Keys,
    /// No checks at all: local development only.
    None,
}

/// The longest `Authorization` header read. A key is 53 characters; the
/// bound keeps a huge header from reaching the parser or a log line.
const MAX_AUTHORIZATION_BYTES: usize = 256;

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Required {
    Scope(Scope),
    /// `POST /orders/{id}/{action}`: the action's scope (`orders:pay`, …);
    /// an unknown action needs a well-formed key, then is a 404.
    ActionScope,
    /// `GET /orders/{id}/receipt.pdf`: `orders:read`, or a signed link.
    Receipt,
}

/// Who the handler is serving, as far as the middleware could tell without
/// the database. In the request's extensions of every `/orders` route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A well-formed key, and the scope the route needs of it (`None`: any
    /// valid key, for an unknown action that is then a 404). Not looked up
    /// yet: see [`Caller::verify`].
    Key {
        key: PresentedKey,
        scope: Option<Scope>,
    },
    /// `API_AUTH=none`, or a signed receipt link that was verified.
    Anyone,
}

/// A caller that passed [`Caller::verify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verified {
    /// The scope of the request's Idempotency-Key; `None` without keys.
    pub api_key_id: Option<i64>,
}

impl Caller {
    /// The key's row, its state and scope, then the rate limit: the first
    /// statement of the request's database work, before anything is written.
    pub fn verify(
        self,
        conn: &mut PgConnection,
        limiter: Option<&RateLimiter>,
    ) -> Result<Verified, ApiError> {
        let Caller::Key { key, scope } = self else {
            return Ok(Verified { api_key_id: None });
        };
        let Some(found) = api_keys::authenticate(conn, &key)? else {
            return Err(ApiError::Unauthorized("this API key is not known".into()));
        };
        match found.state {
            KeyState::Active => {}
            KeyState::Revoked => {
                return Err(ApiError::Unauthorized("this API key was revoked".into()));
            }
            KeyState::Expired => {
                return Err(ApiError::Unauthorized("this API key has expired".into()));
            }
        }
        if let Some(scope) = scope
            && !scope.granted_by(&found.scopes)
        {
            return Err(ApiError::Forbidden { scope });
        }
        if let Some(limiter) = limiter {
            limiter.check(found.id)?;
        }
        Ok(Verified {
            api_key_id: Some(found.id),
        })
    }
}

/// How a receipt request got in. In the extensions of the receipt route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReceiptAccess {
    /// A key with `orders:read` (or `API_AUTH=none`).
    Caller(Caller),
    /// No `Authorization` header, and `expires` or `signature` in the query:
    /// a link from an email, which the handler verifies (`receipt_link`).
    SignedLink,
}

/// What the middleware of one route holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    pub auth: ApiAuth,
    pub required: Required,
}

/// Checks the request's key for form against its route's [`Required`],
/// then runs it.
/// Every answer of an `/orders` route carries `Cache-Control: no-store`:
/// they carry customers' names, addresses and payment references.
pub(crate) async fn authorize(
    State(gate): State<Gate>,
    mut request: Request,
    next: Next,
) -> Response {
    let mut response = match admit(&gate, &mut request).await {
        Ok(()) => next.run(request).await,
        Err(error) => axum::response::IntoResponse::into_response(error),
    };
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

async fn admit(gate: &Gate, request: &mut Request) -> Result<(), ApiError> {
    if gate.required == Required::Receipt
        && !request.headers().contains_key(header::AUTHORIZATION)
        && has_link_parameters(request.uri().query())
    {
        request.extensions_mut().insert(ReceiptAccess::SignedLink);
        return Ok(());
    }
    let caller = match gate.auth {
        ApiAuth::None => Caller::Anyone,
        ApiAuth::Keys => {
            let key = presented_key(request.headers())?;
            let scope = match gate.required {
                Required::Scope(scope) => Some(scope),
                Required::Receipt => Some(Scope::Read),
                Required::ActionScope => action_of(request).await.and_then(Scope::of_action),
            };
            Caller::Key { key, scope }
        }
    };
    request.extensions_mut().insert(caller);
    if gate.required == Required::Receipt {
        request
            .extensions_mut()
            .insert(ReceiptAccess::Caller(caller));
    }
    Ok(())
}

/// The `{action}` of `/orders/{id}/{action}`, percent-decoded by the same
/// extractor as the handler's, so `/orders/1/p%61y` needs `orders:pay` too.
async fn action_of(request: &mut Request) -> Option<&'static str> {
    use axum::extract::FromRequestParts as _;
    let (mut parts, body) = std::mem::take(request).into_parts();
    let params = Path::<HashMap<String, String>>::from_request_parts(&mut parts, &()).await;
    *request = Request::from_parts(parts, body);
    let action = params.ok()?.0.remove("action")?;
    Transition::ACTIONS.iter().copied().find(|a| *a == action)
}

/// The key of `Authorization: Bearer <key>`, checked for form and checksum
/// before any database query.
fn presented_key(headers: &HeaderMap) -> Result<PresentedKey, ApiError> {
    let unauthorized = |why: &str| ApiError::Unauthorized(why.to_owned());
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(unauthorized(
            "this route needs an API key: Authorization: Bearer ork_…",
        ));
    };
    if values.next().is_some() {
        return Err(unauthorized("send one Authorization header, not several"));
    }
    if value.len() > MAX_AUTHORIZATION_BYTES {
        return Err(unauthorized("the Authorization header is too long"));
    }
    let value = value
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not ASCII"))?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthorized(
            "use the Bearer scheme: Authorization: Bearer ork_…",
        ));
    }
    PresentedKey::parse(token.trim()).map_err(|e| ApiError::Unauthorized(e.to_string()))
}

/// Whether a query string carries `expires` or `signature`: a signed link.
fn has_link_parameters(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes())
            .any(|(name, _)| name == "expires" || name == "signature")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(value).expect("valid"),
        );
        headers
    }

    #[test]
    fn headers_that_hold_no_key_are_refused_before_the_database() {
        for value in [
            b"Bearer".as_slice(),
            b"Basic dXNlcjpwYXNz",
            b"Bearer ork_short",
            b"Bearer \xff\xfe",
            &[b'a'; 4096],
        ] {
            let error = presented_key(&headers(value)).expect_err("refused");
            assert!(matches!(error, ApiError::Unauthorized(_)), "{error:?}");
        }
        assert!(matches!(
            presented_key(&HeaderMap::new()),
            Err(ApiError::Unauthorized(_))
        ));
    }

    #[test]
    fn a_well_formed_key_is_read_whatever_the_scheme_case() {
        let key = crate::api_keys::NewSecret::generate().expect("valid");
        let value = format!("bearer  {}", key.expose());
        let presented = presented_key(&headers(value.as_bytes())).expect("valid");
        assert_eq!(presented.sha256(), key.sha256());
    }

    #[test]
    fn a_link_is_recognised_by_either_parameter() {
        assert!(has_link_parameters(Some("expires=1&signature=abc")));
        assert!(has_link_parameters(Some("signature=abc")));
        assert!(!has_link_parameters(Some("download=1")));
        assert!(!has_link_parameters(None));
    }
}
