//! The jobs page: a filtered listing, a page at a time, and how one job's
//! row reads (the order page shows its jobs the same way).

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use minijinja::{Value, context};
use serde::Deserialize;

use super::{base, opt_time, time};
use crate::admin::auth::Session;
use crate::admin::error::AdminError;
use crate::admin::filter::FilterForm;
use crate::admin::queries::{self, AdminJob};
use crate::admin::view::{num, render};
use crate::admin::{AdminState, Nonce};
use crate::effects::EffectKind;
use crate::outbox::JobStatus;

/// Jobs per page.
const PAGE_SIZE: i64 = 50;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::admin) struct JobsQuery {
    #[serde(flatten)]
    filter: FilterForm,
    before: Option<i64>,
    /// A notice after an action, e.g. `retry:12`.
    done: Option<String>,
}

/// A job's row, as the templates show it.
pub(super) fn job_view(job: &AdminJob, hide_payload: bool) -> Value {
    let payload = job.payload.as_deref().map(|p| {
        serde_json::from_str::<serde_json::Value>(p)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| p.to_owned())
    });
    context! {
        id => job.id,
        order_id => job.order_id.map(crate::orders::OrderId::get),
        kind => job.kind.clone(),
        status => job.status.clone(),
        attempts => job.attempts,
        max_attempts => job.max_attempts,
        run_after => time(job.run_after),
        locked_by => job.locked_by.clone(),
        locked_at => opt_time(job.locked_at),
        lease_expires_at => opt_time(job.lease_expires_at),
        created_at => time(job.created_at),
        finished_at => opt_time(job.finished_at),
        last_error => job.last_error.clone(),
        blocked => job.blocked,
        ordering_key => job.ordering_key.clone(),
        payload => payload,
        payload_hidden => hide_payload,
        can_retry => job.status == JobStatus::Failed.as_str(),
        can_cancel => job.status == JobStatus::Pending.as_str() || job.status == JobStatus::Failed.as_str(),
    }
}

fn notice(done: Option<&str>) -> Option<String> {
    let (action, n) = done?.split_once(':')?;
    let n: i64 = n.parse().ok()?;
    let verb = match action {
        "retry" => "Retried",
        "cancel" => "Cancelled",
        _ => return None,
    };
    Some(format!(
        "{verb} {} {}.",
        num(n),
        if n == 1 { "job" } else { "jobs" }
    ))
}

pub(in crate::admin) async fn jobs(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Query(query): Query<JobsQuery>,
) -> Result<Response, AdminError> {
    let filter = match query.filter.parse() {
        Ok(filter) => filter,
        Err(error) => {
            let page = render(
                "jobs.html",
                jobs_context(
                    &session,
                    &nonce,
                    &query.filter,
                    Some(error.to_string()),
                    None,
                    None,
                    "",
                ),
            )?;
            return Ok((StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let timeout = state.settings.statement_timeout;
    let hide = state.settings.hide_payload;
    let before = query.before.filter(|b| *b > 0);
    let lookup = filter.clone();
    let page = state
        .db
        .run(move |conn| {
            Ok(queries::list_jobs(
                conn, timeout, &lookup, before, PAGE_SIZE, hide,
            )?)
        })
        .await?;
    let rows: Vec<Value> = page.jobs.iter().map(|j| job_view(j, hide)).collect();
    let query_string = filter.query();
    let next = page.next_before.map(|b| {
        if query_string.is_empty() {
            format!("/admin/jobs?before={b}")
        } else {
            format!("/admin/jobs?{query_string}&before={b}")
        }
    });
    let listing = context! {
        rows => rows,
        next => next,
        window_exhausted => page.window_exhausted,
        searched_from => num(page.searched.0),
        searched_to => num(page.searched.1),
        first_page => before.is_none(),
        filtered => !filter.is_empty(),
        notice => notice(query.done.as_deref()),
    };
    let page = render(
        "jobs.html",
        jobs_context(
            &session,
            &nonce,
            &filter.form(),
            None,
            Some(listing),
            Some(&filter),
            &query_string,
        ),
    )?;
    Ok(page.into_response())
}

fn jobs_context(
    session: &Session,
    nonce: &Nonce,
    form: &FilterForm,
    error: Option<String>,
    listing: Option<Value>,
    filter: Option<&crate::job_list::JobFilter>,
    query_string: &str,
) -> Value {
    context! {
           form => Value::from(minijinja::value::Serde(form)),
           error => error,
           listing => listing,
           statuses => JobStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
           kinds => EffectKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
           description => filter.map(|f| f.describe()),
           query => query_string,
    ..base(Some(session), nonce, "jobs", "Jobs"),
       }
}
