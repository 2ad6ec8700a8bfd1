//! One job's page: its row (with the actions), what it waits for, with links
//! to its parents, and the jobs that wait for it, its children.

use axum::extract::{Extension, Path, State};
use axum::response::Html;
use minijinja::{Value, context};

use super::base;
use super::jobs::job_view;
use crate::admin::auth::Session;
use crate::admin::error::AdminError;
use crate::admin::queries::{self, CHILDREN_SHOWN, Relative};
use crate::admin::view::{path_id, render};
use crate::admin::{AdminState, Nonce};

pub(in crate::admin) async fn job(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Path(raw_id): Path<String>,
) -> Result<Html<String>, AdminError> {
    let id = path_id(&raw_id, "job")?;
    let timeout = state.settings.statement_timeout;
    let hide = state.settings.hide_payload;
    let (detail, relatives) = state
        .db
        .run(move |conn| Ok(queries::job_detail(conn, timeout, id, hide)?))
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("there is no job {id}")))?;
    let unfinished = detail.unfinished_parents.clone().unwrap_or_default();
    let relative = |r: &Relative| {
        context! {
            id => r.id,
            kind => r.kind.clone(),
            status => r.status.clone(),
            order_id => r.order_id,
            waiting => r.waiting,
            went_without => unfinished.contains(&r.id),
        }
    };
    let parents: Vec<Value> = relatives
        .iter()
        .filter(|r| r.relation == "parent")
        .map(relative)
        .collect();
    let children: Vec<Value> = relatives
        .iter()
        .filter(|r| r.relation == "child")
        .map(relative)
        .collect();
    let filter = context! {
        order => detail.job.order_id.map(|o| o.get().to_string()),
    };
    render(
        "job.html",
        context! {
            job => job_view(&detail.job, hide),
            filter => filter,
            policy => detail.dependency_policy.clone(),
            waiting_on => detail.waiting_on.clone(),
            parents => parents,
            children_capped => i64::try_from(children.len()).unwrap_or(i64::MAX) >= CHILDREN_SHOWN,
            children => children,
            ..base(Some(&session), &nonce, "jobs", &format!("Job {id}")),
        },
    )
}
