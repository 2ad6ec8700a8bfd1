//! Retry and cancel: one job, or every job the filter matches, after a preview.
//!
//! Every action is a POST with the session's form token, refused for read-only
//! sessions, and written to `admin_audit` with who, what and how many. A bulk
//! action runs in batches of `ACTION_BATCH`, each its own short transaction
//! that locks its rows with SKIP LOCKED, so it never waits on a relay and never
//! holds a lock for long; it considers only jobs up to the newest id the
//! preview saw, so it changes the jobs the operator was shown, not ones that
//! failed a second later.

use axum::Form;
use axum::extract::{Extension, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use minijinja::context;
use serde::Deserialize;

use super::auth::Session;
use super::bulk::{self, Action, PREVIEW_LIMIT};
use super::error::AdminError;
use super::filter::FilterForm;
use super::pages::base;
use super::queries;
use super::view::{num, render};
use super::{AdminState, Nonce, csrf};
use crate::job_list::JobFilter;
use crate::outbox;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ActionForm {
    csrf: Option<String>,
    action: String,
    /// One job, from a row's button.
    id: Option<i64>,
    #[serde(flatten)]
    filter: FilterForm,
    /// The newest id the preview considered.
    max_id: Option<i64>,
    /// "yes" when the operator confirmed acting with no filter at all.
    all: Option<String>,
}

fn authorize(session: &Session, form: &ActionForm) -> Result<Action, AdminError> {
    csrf::check(&session.csrf, form.csrf.as_deref())?;
    if !session.can_act() {
        return Err(AdminError::ReadOnly);
    }
    Action::parse(&form.action)
        .ok_or_else(|| AdminError::BadRequest(format!("unknown action {:?}", form.action)))
}

fn verb(action: Action) -> &'static str {
    match action {
        Action::Retry => "retry",
        Action::Cancel => "cancel",
    }
}

/// "This will retry 1,204 jobs": the count, the filter in words, and a form
/// that carries the filter and the newest id on to `act`.
pub(super) async fn preview(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Form(form): Form<ActionForm>,
) -> Result<Html<String>, AdminError> {
    let action = authorize(&session, &form)?;
    let filter = form.filter.parse()?;
    let timeout = state.settings.statement_timeout;
    let lookup = filter.clone();
    let (count, max_id) = state
        .db
        .run(move |conn| Ok(bulk::preview(conn, timeout, action, &lookup)?))
        .await?;
    let applies_to = action.statuses().join(" or ");
    render(
        "preview.html",
        context! {
                   action => action.as_str(),
                   verb => verb(action),
                   count => if count > PREVIEW_LIMIT { format!("more than {}", num(PREVIEW_LIMIT)) } else { num(count) },
                   nothing => count == 0,
                   one => count == 1,
                   applies_to => applies_to,
                   description => filter.describe(),
                   needs_all => filter.is_empty(),
                   form => minijinja::Value::from(minijinja::value::Serde(filter.form())),
                   max_id => max_id,
                   back => format!("/admin/jobs?{}", filter.query()),
        ..base(Some(&session), &nonce, "jobs", "Confirm"),
               },
    )
}

pub(super) async fn act(
    State(state): State<AdminState>,
    session: Session,
    Form(form): Form<ActionForm>,
) -> Result<Response, AdminError> {
    let action = authorize(&session, &form)?;
    let timeout = state.settings.statement_timeout;
    let actor = session.actor.clone();
    if let Some(id) = form.id {
        let back = form.filter.parse().map(|f| f.query()).unwrap_or_default();
        let changed = state
            .db
            .run(move |conn| {
                let outcome = one_job(conn, action, id)?;
                if let Ok(changed) = outcome {
                    let target = serde_json::json!({ "ids": [id] });
                    queries::insert_audit(conn, &actor, action.as_str(), &target, changed)?;
                }
                Ok(outcome)
            })
            .await??;
        tracing::info!(actor = %session.actor, action = action.as_str(), job = id, "dashboard action");
        return Ok(Redirect::to(&jobs_url(&back, action, changed)).into_response());
    }

    let filter: JobFilter = form.filter.parse()?;
    if filter.is_empty() && form.all.as_deref() != Some("yes") {
        return Err(AdminError::BadRequest(
            "this would act on every job; tick \"every job\" on the preview to confirm".into(),
        ));
    }
    let max_id = form.max_id.ok_or_else(|| {
        AdminError::BadRequest("the preview's max_id is missing; preview again".into())
    })?;
    // Only the fields the operator set: the audit line says what was asked.
    let mut set_fields = serde_json::to_value(filter.form()).unwrap_or_default();
    if let Some(fields) = set_fields.as_object_mut() {
        fields.retain(|_, v| v.as_str().is_some_and(|s| !s.is_empty()));
    }
    let target = serde_json::json!({
        "filter": set_fields,
        "max_id": max_id,
        "statuses": action.statuses(),
    });
    let run_filter = filter.clone();
    let result = state
        .db
        .run(move |conn| {
            let outcome = bulk::run_bulk(conn, timeout, action, &run_filter, max_id);
            let changed = match &outcome {
                Ok(n) | Err((n, _)) => *n,
            };
            // Audited even when a batch failed: the batches before it committed.
            queries::insert_audit(conn, &actor, action.as_str(), &target, changed)?;
            Ok(outcome.map_err(|(n, e)| (n, e.to_string())))
        })
        .await?;
    match result {
        Ok(changed) => {
            tracing::info!(
                actor = %session.actor,
                action = action.as_str(),
                changed,
                filter = %filter.describe(),
                "dashboard bulk action"
            );
            Ok(Redirect::to(&jobs_url(&filter.query(), action, changed)).into_response())
        }
        Err((changed, error)) => {
            tracing::warn!(actor = %session.actor, action = action.as_str(), changed, error, "dashboard bulk action stopped");
            Err(AdminError::Unavailable {
                cause: format!("stopped after {changed} jobs: {error}"),
            })
        }
    }
}

/// One job: refused unless it is in a status the action applies to.
fn one_job(
    conn: &mut diesel::PgConnection,
    action: Action,
    id: i64,
) -> Result<Result<i64, AdminError>, crate::api::ApiError> {
    Ok(match action {
        Action::Retry => {
            let report = outbox::retry_failed_jobs(conn, &outbox::RetrySelection::Ids(vec![id]))?;
            match report.refused.first() {
                Some(refusal) => Err(AdminError::BadRequest(refusal.to_string())),
                None => Ok(report.retried.len() as i64),
            }
        }
        Action::Cancel => {
            let report = outbox::cancel_jobs(conn, &[id])?;
            match report.refused.first() {
                Some(refusal) => Err(AdminError::BadRequest(refusal.to_string())),
                None => Ok(report.cancelled.len() as i64),
            }
        }
    })
}

fn jobs_url(query: &str, action: Action, changed: i64) -> String {
    let done = format!("done={}:{changed}", action.as_str());
    if query.is_empty() {
        format!("/admin/jobs?{done}")
    } else {
        format!("/admin/jobs?{query}&{done}")
    }
}
