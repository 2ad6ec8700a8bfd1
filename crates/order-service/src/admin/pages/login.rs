//! How an operator logs in to the dashboard and out of it.

use axum::Form;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::{Value, context};
use serde::Deserialize;

use super::base;
use crate::admin::auth::{self, ClientAddr, Session};
use crate::admin::error::AdminError;
use crate::admin::session as sessions;
use crate::admin::view::render;
use crate::admin::{AdminState, Nonce};

pub(in crate::admin) async fn login_form(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    if auth::current_session(&state, &headers).await?.is_some() {
        return Ok(Redirect::to("/admin").into_response());
    }
    let page = render(
        "login.html",
        context! { error => Value::from(()), ..base(None, &nonce, "login", "Log in") },
    )?;
    Ok(page.into_response())
}

#[derive(Debug, Deserialize)]
pub(in crate::admin) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// A cross-site login form could log a victim into the attacker's session; a
/// browser always sends `Origin` on a form POST, so one from another origin
/// (or `null`) is refused. Clients that send no `Origin` (curl) are let through.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    origin_host.is_some_and(|h| !host.is_empty() && h.eq_ignore_ascii_case(host))
}

pub(in crate::admin) async fn login(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, AdminError> {
    if !same_origin(&headers) {
        return Err(AdminError::CsrfRejected);
    }
    if let Some(wait) = state.limiter.blocked_for(client) {
        tracing::warn!(%client, "dashboard login refused: too many failures from this client");
        return Err(AdminError::TooManyLogins(wait));
    }
    let Some((index, token)) = auth::find_token(&state.settings, form.token.trim()) else {
        state.limiter.record_failure(client);
        tracing::warn!(%client, "dashboard login failed: unknown token");
        let page = render(
            "login.html",
            context! {
                           error => "That token is not valid.",
            ..base(None, &nonce, "login", "Log in"),
                       },
        )?;
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    let key = state.session_key().await?;
    let (id, value) = sessions::issue(key, &state.settings, index, crate::links::unix_now())
        .map_err(AdminError::Internal)?;
    let (actor, length) = (token.label.clone(), state.settings.session_length);
    state
        .db
        .run(move |conn| Ok(sessions::insert(conn, &id, &actor, length)?))
        .await?;
    tracing::info!(actor = %token.label, %client, "dashboard login");
    let cookie = auth::set_cookie(&state.settings, Some(&value));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/admin")).into_response())
}

#[derive(Debug, Deserialize)]
pub(in crate::admin) struct CsrfOnly {
    csrf: Option<String>,
}

pub(in crate::admin) async fn logout(
    State(state): State<AdminState>,
    session: Session,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, AdminError> {
    crate::admin::csrf::check(&session.csrf, form.csrf.as_deref())?;
    // Ended on the server, not only in this browser: a copy of the cookie
    // is refused from now on, by every replica.
    let id = session.id.clone();
    state
        .db
        .run(move |conn| Ok(sessions::revoke(conn, &id)?))
        .await?;
    tracing::info!(actor = %session.actor, "dashboard logout");
    let cookie = auth::set_cookie(&state.settings, None);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/admin/login")).into_response())
}
