//! The front door of `/orders`: every route names what it needs
//! (`Required`), and this file checks it. A refusal is an [`ApiError`]
//! (401, 403 or 429), so it is a JSON error like any other, and nothing has
//! been written.
//!
//! `authorize`, a middleware on every `/orders` route, checks the key's form,
//! then its row (expiry, revocation), the route's scope and the per-key rate
//! limit, all before the handler runs: before the body is read and before
//! the path or the body is parsed. So a made-up key learns nothing of the
//! schema (it never sees a 400, 413, 415 or 422), cannot hold a slot with a
//! slow body, and costs one index probe, counted against its address by
//! `address_limit`. The handler gets a `Verified`.
//! The key's row is read on every request: a `keys revoke` takes effect on
//! the next request, on every replica. On `POST /orders` a key looked up a
//! moment ago is let in from a cache (`key_cache`), and the placement's own
//! statement reads its row (`Provisional`), so a placement is one round
//! trip. The look-up takes its own connection, apart from the handler's
//! work: holding one connection across the upload of a body would let slow
//! bodies take the pool. The per-key rate limit counts in this process (see
//! [`RateLimit`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use chrono::{DateTime, Utc};

use super::address_limit::Admitted;
use super::api_key_limit::RateLimiter;
use super::error::ApiError;
use super::key_cache::{CachedKey, KeyCache};
use super::state::Db;
use crate::api_keys::{self, ApiKeyState, Authenticated, PresentedKey, Scope};
use crate::orders::{Cause, Transition};

pub use super::api_key_limit::RateLimit;

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
    /// an unknown action needs a valid key, then is a 404.
    ActionScope,
    /// `GET /orders/{id}/receipt.pdf`: `orders:read`, or a signed link.
    Receipt,
}

/// Which orders a caller may read, whatever the route it came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// `orders:read` (or `orders:*`), `API_AUTH=none`, a signed link.
    All,
    /// `orders:read:own` without `orders:read`: the orders placed with it.
    Own,
    /// Neither: a key that may act on an order but not read it.
    Nothing,
}

impl Reads {
    fn of(scopes: &[String]) -> Reads {
        if Scope::Read.granted_by(scopes) {
            Reads::All
        } else if Scope::ReadOwn.granted_by(scopes) {
            Reads::Own
        } else {
            Reads::Nothing
        }
    }
}

/// Who the handler is serving: in the request's extensions of every
/// `/orders` route once [`authorize`] let it through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verified {
    /// The key's id; `None` without keys (`API_AUTH=none`, a signed link).
    pub api_key_id: Option<i64>,
    /// What the key may read: a route that answers with an order (a
    /// transition's) shows it only to a key that may read it.
    pub reads: Reads,
}

impl Verified {
    /// `API_AUTH=none`, or a signed receipt link that was verified.
    pub const ANYONE: Verified = Verified {
        api_key_id: None,
        reads: Reads::All,
    };

    /// What the placements and transitions of this caller record.
    pub fn cause(self) -> Cause {
        Cause {
            api_key_id: self.api_key_id,
            inbox_message_id: None,
        }
    }

    /// Whether this caller may read an order placed by `placed_by`. An order
    /// it may not read is a 404, as one that does not exist: a key with
    /// `orders:read:own` learns nothing of other keys' orders.
    pub fn may_read(self, placed_by: Option<i64>) -> bool {
        match self.reads {
            Reads::All => true,
            Reads::Own => self.api_key_id.is_some() && placed_by == self.api_key_id,
            Reads::Nothing => false,
        }
    }
}

/// What the key's row (`found`, `None` for no such key) says: its state and
/// scope, then the rate limit.
fn verdict(
    found: Option<Authenticated>,
    scope: Option<Scope>,
    limiter: Option<&RateLimiter>,
) -> Result<Verified, ApiError> {
    let Some(found) = found else {
        return Err(ApiError::Unauthorized("this API key is not known".into()));
    };
    match found.state {
        ApiKeyState::Active => {}
        ApiKeyState::Revoked => {
            return Err(ApiError::Unauthorized("this API key was revoked".into()));
        }
        ApiKeyState::Expired => {
            return Err(ApiError::Unauthorized("this API key has expired".into()));
        }
    }
    let reads = Reads::of(&found.scopes);
    match scope {
        None => {}
        Some(scope) if scope.granted_by(&found.scopes) => {}
        Some(Scope::Read) if reads == Reads::Own => {}
        Some(scope) => return Err(ApiError::Forbidden { scope }),
    }
    if let Some(limiter) = limiter {
        limiter.check(found.id)?;
    }
    Ok(Verified {
        api_key_id: Some(found.id),
        reads,
    })
}

/// How a receipt request got in. In the extensions of the receipt route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReceiptAccess {
    /// A key with `orders:read` or `orders:read:own` (or `API_AUTH=none`).
    Caller(Verified),
    /// No `Authorization` header, and `expires` or `signature` in the query:
    /// a link from an email, which the handler verifies (`receipt_link`).
    SignedLink,
}

/// What the middleware of one route holds.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    pub auth: ApiAuth,
    pub required: Required,
    pub db: Db,
    pub limiter: Option<Arc<RateLimiter>>,
    /// `POST /orders`' keys let in a moment ago; `None` on other routes.
    pub cache: Option<Arc<KeyCache>>,
}

/// The key's row, its state and scope, then the rate limit, on the API's own
/// connections or else the pool; and when the key expires.
async fn look_up(
    db: &Db,
    key: PresentedKey,
    scope: Option<Scope>,
    limiter: Option<Arc<RateLimiter>>,
) -> Result<(Verified, Option<DateTime<Utc>>), ApiError> {
    let found = db
        .direct(async |connection| connection.authenticate(&key).await)
        .await;
    match found {
        Some(found) => {
            let found = found?;
            let expires_at = found.as_ref().and_then(|found| found.expires_at);
            Ok((verdict(found, scope, limiter.as_deref())?, expires_at))
        }
        None => {
            db.read(move |conn| {
                let found = api_keys::authenticate(conn, &key)?;
                let expires_at = found.as_ref().and_then(|found| found.expires_at);
                Ok((verdict(found, scope, limiter.as_deref())?, expires_at))
            })
            .await
        }
    }
}

/// A key let in from the cache of `POST /orders` (`key_cache`), in the
/// request's extensions: its row has not been read for this request. The
/// placement's statement reads it; a request that ends any other way calls
/// [`Provisional::confirm`] before it answers.
#[derive(Debug, Clone)]
pub(crate) struct Provisional {
    key: PresentedKey,
    cache: Arc<KeyCache>,
}

impl Provisional {
    /// Reads the key's row as a key not in the cache is read, and forgets
    /// the key when the row refuses it: the refusal is the error. The rate
    /// limit is not counted again.
    pub async fn confirm(&self, db: &Db) -> Result<(), ApiError> {
        let checked = look_up(db, self.key, Some(Scope::Place), None).await;
        if checked.is_err() {
            self.cache.remove(&self.key.sha256());
        }
        checked.map(|_| ())
    }
}

/// Checks the request's key against its route's [`Required`], then runs it.
/// Every answer of an `/orders` route carries `Cache-Control: no-store`:
/// they carry customers' names, addresses and payment references. Each
/// answer says how the request got in ([`Admitted`]), for the per-address
/// limit.
pub(crate) async fn authorize(
    State(gate): State<Gate>,
    mut request: Request,
    next: Next,
) -> Response {
    let mut response = match admit(&gate, &mut request).await {
        Ok(admitted) => {
            let mut response = next.run(request).await;
            // A 401 from the handler is a key let in from the cache whose
            // row then refused it: it spends its address's budget, as the
            // same refusal at the door does.
            if response.status() != StatusCode::UNAUTHORIZED {
                response.extensions_mut().insert(admitted);
            }
            response
        }
        Err(error) => {
            // Refused after the key was found: the key's own traffic.
            let found = matches!(
                error,
                ApiError::Forbidden { .. } | ApiError::RateLimited { .. }
            );
            let mut response = error.into_response();
            if found {
                response.extensions_mut().insert(Admitted::Key);
            }
            response
        }
    };
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

async fn admit(gate: &Gate, request: &mut Request) -> Result<Admitted, ApiError> {
    if gate.required == Required::Receipt
        && !request.headers().contains_key(header::AUTHORIZATION)
        && has_link_parameters(request.uri().query())
    {
        request.extensions_mut().insert(ReceiptAccess::SignedLink);
        return Ok(Admitted::Anonymous);
    }
    let (verified, admitted) = match gate.auth {
        ApiAuth::None => (Verified::ANYONE, Admitted::Open),
        ApiAuth::Keys => {
            let key = presented_key(request.headers())?;
            let scope = match gate.required {
                Required::Scope(scope) => Some(scope),
                Required::Receipt => Some(Scope::Read),
                Required::ActionScope => action_of(request).await.and_then(Scope::of_action),
            };
            let limiter = gate.limiter.as_deref();
            let cached = gate
                .cache
                .as_ref()
                .and_then(|cache| Some((cache, cache.get(&key.sha256())?)));
            let verified = match cached {
                Some((cache, found)) => {
                    if let Some(limiter) = limiter {
                        limiter.check(found.id)?;
                    }
                    request.extensions_mut().insert(Provisional {
                        key,
                        cache: Arc::clone(cache),
                    });
                    Verified {
                        api_key_id: Some(found.id),
                        reads: found.reads,
                    }
                }
                None => {
                    let (verified, expires_at) =
                        look_up(&gate.db, key, scope, gate.limiter.clone()).await?;
                    if let (Some(cache), Some(id)) = (&gate.cache, verified.api_key_id) {
                        let found = CachedKey {
                            id,
                            reads: verified.reads,
                        };
                        cache.insert(key.sha256(), found, expires_at);
                    }
                    verified
                }
            };
            (verified, Admitted::Key)
        }
    };
    request.extensions_mut().insert(verified);
    if gate.required == Required::Receipt {
        request
            .extensions_mut()
            .insert(ReceiptAccess::Caller(verified));
    }
    Ok(admitted)
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
/// before the database is asked.
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
