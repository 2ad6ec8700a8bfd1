//! Apply and dismiss a held inbox message: the functions behind
//! `outbox-relay inbox apply|dismiss`, called from a form. Every action is a
//! POST with the session's form token, refused for read-only sessions, and
//! audited (`inbox.apply`, `inbox.dismiss`) in the transaction that acts.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::auth::Session;
use super::error::AdminError;
use super::view::path_id;
use super::{AdminState, csrf};
use crate::inbox::held::{DecideError, apply_held, dismiss_held};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct InboxForm {
    csrf: Option<String>,
}

fn refusal(error: DecideError) -> AdminError {
    match error {
        DecideError::NotFound(_) => AdminError::NotFound(error.to_string()),
        DecideError::Database(e) => AdminError::from(e),
        other => AdminError::BadRequest(format!("{other}")),
    }
}

pub(super) async fn apply(
    State(state): State<AdminState>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<InboxForm>,
) -> Result<Response, AdminError> {
    decide(state, session, &raw_id, form, true).await
}

pub(super) async fn dismiss(
    State(state): State<AdminState>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<InboxForm>,
) -> Result<Response, AdminError> {
    decide(state, session, &raw_id, form, false).await
}

async fn decide(
    state: AdminState,
    session: Session,
    raw_id: &str,
    form: InboxForm,
    apply: bool,
) -> Result<Response, AdminError> {
    csrf::check(&session.csrf, form.csrf.as_deref())?;
    if !session.can_act() {
        return Err(AdminError::ReadOnly);
    }
    let id = path_id(raw_id, "inbox message")?;
    let actor = session.actor.clone();
    state
        .db
        .run(move |conn| {
            Ok(if apply {
                // NOTIFY in the transaction: the dashboard has no waker.
                let enqueuer = crate::orders::order_enqueuer();
                apply_held(
                    conn,
                    &enqueuer,
                    id,
                    &actor,
                    crate::outbox::DEFAULT_MAX_ATTEMPTS,
                )
                .map(drop)
            } else {
                dismiss_held(conn, id, &actor)
            })
        })
        .await?
        .map_err(refusal)?;
    let action = if apply { "apply" } else { "dismiss" };
    tracing::info!(actor = %session.actor, action, inbox_message_id = id, "dashboard action");
    Ok(Redirect::to(&format!("/admin/inbox?status=held&done={action}:{id}")).into_response())
}
