//! The operator dashboard under `/admin`: server-rendered pages to watch the
//! queue and repair it from a browser (a phone included), mounted by `serve`
//! when `ADMIN_TOKEN` is set.
//!
//! - `settings`: tokens and roles, read-only mode, payload hiding, cookie rules;
//! - `auth`: the login form's checks, the session cookie, the client's address;
//! - `session`: the server's session key and the sessions table (logout revokes);
//! - `limiter`: the failed-login limit, per client address;
//! - `csrf`: the form token every POST carries;
//! - `pages`: overview, jobs, an order's timeline, the inbox, the audit log, login;
//! - `actions`: retry and cancel, one job or every match, preview first, audited;
//! - `endpoint_actions`: enable, disable and recover an endpoint (recover
//!   previewed first), audited, through the same store functions as the CLI;
//! - `inbox_actions`: apply or dismiss a held inbox message, audited, through
//!   the same functions as the CLI;
//! - `queries` and `sql/`: every statement, each under a statement timeout;
//! - `filter`, `chart`, `view`, `error`: the jobs filter, the SVG chart,
//!   templates, and the one error type.
//!
//! Every response carries a Content-Security-Policy that allows only the
//! dashboard's own stylesheet and scripts that carry the response's nonce
//! (the overview's auto-refresh is the only one), and forbids framing.

mod actions;
mod auth;
mod bulk;
mod chart;
mod csrf;
mod endpoint_actions;
mod error;
mod filter;
mod inbox_actions;
mod limiter;
mod pages;
mod queries;
mod session;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::config::dashboard::AdminSettings;

use crate::api::Db;

#[derive(Debug, Clone)]
pub(crate) struct AdminState {
    db: Db,
    settings: Arc<AdminSettings>,
    limiter: Arc<limiter::LoginLimiter>,
    /// The session key, read from the database (made there by the first
    /// replica) on the first request that needs it; a failed read is tried
    /// again on the next one.
    key: Arc<tokio::sync::OnceCell<session::SessionKey>>,
}

impl AdminState {
    async fn session_key(&self) -> Result<&session::SessionKey, error::AdminError> {
        self.key
            .get_or_try_init(|| async {
                let bytes = self
                    .db
                    .run(|conn| {
                        session::load_or_create_key(conn).map_err(|e| {
                            crate::api::ApiError::Internal(e.context("the dashboard's session key"))
                        })
                    })
                    .await?;
                session::SessionKey::new(&bytes).map_err(error::AdminError::Internal)
            })
            .await
    }
}

/// The script nonce of one response.
#[derive(Debug, Clone)]
pub(crate) struct Nonce(pub String);

/// The `/admin` routes, ready to merge beside the API's (`server`); no routes at all
/// when the settings carry no token, so `/admin` falls through to the API's 404.
pub(crate) fn routes(db: Db, settings: Option<&AdminSettings>) -> Router {
    let Some(settings) = settings.filter(|s| !s.tokens.is_empty()) else {
        return Router::new();
    };
    let state = AdminState {
        db,
        settings: Arc::new(settings.clone()),
        limiter: Arc::new(limiter::LoginLimiter::default()),
        key: Arc::new(tokio::sync::OnceCell::new()),
    };
    let admin = Router::new()
        .route("/", get(pages::overview))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/preview", post(actions::preview))
        .route("/jobs/act", post(actions::act))
        .route("/jobs/{id}", get(pages::job))
        .route("/orders", get(pages::find_order))
        .route("/orders/{id}", get(pages::order))
        .route("/endpoints", get(pages::endpoints))
        .route("/endpoints/{id}", get(pages::endpoint))
        .route("/endpoints/{id}/enable", post(endpoint_actions::enable))
        .route("/endpoints/{id}/disable", post(endpoint_actions::disable))
        .route(
            "/endpoints/{id}/recover/preview",
            post(endpoint_actions::recover_preview),
        )
        .route("/endpoints/{id}/recover", post(endpoint_actions::recover))
        .route("/inbox", get(pages::inbox))
        .route("/inbox/{id}/apply", post(inbox_actions::apply))
        .route("/inbox/{id}/dismiss", post(inbox_actions::dismiss))
        .route("/audit", get(pages::audit))
        .route("/static/admin.css", get(stylesheet))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state);
    Router::new().nest("/admin", admin).route(
        "/admin/",
        get(|| async { axum::response::Redirect::permanent("/admin") }),
    )
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        view::STYLESHEET,
    )
        .into_response()
}

/// A fresh nonce per response, from the operating system's CSPRNG: a script
/// runs only if its tag carries it, so injected markup cannot run script even
/// if some value escaped escaping.
fn fresh_nonce() -> String {
    let mut bytes = [0_u8; 16];
    match getrandom::fill(&mut bytes) {
        Ok(()) => hex::encode(bytes),
        // No randomness: a nonce nobody can match, so no script runs at all
        // (auto-refresh stops; everything else works without script).
        Err(_) => String::new(),
    }
}

/// The headers every dashboard response carries.
async fn security_headers(mut request: Request, next: Next) -> Response {
    let nonce = fresh_nonce();
    request.extensions_mut().insert(Nonce(nonce.clone()));
    let mut response = next.run(request).await;
    let script = if nonce.is_empty() {
        "'none'".to_owned()
    } else {
        format!("'nonce-{nonce}'")
    };
    let csp = format!(
        "default-src 'none'; script-src {script}; style-src 'self'; img-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, value);
    }
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        // Pages show customer data and live numbers: never from a cache.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
