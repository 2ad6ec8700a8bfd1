//! The pages: login, overview, jobs, one job (its parents and children), an
//! order's timeline, the endpoints and
//! their attempts, the inbox, the audit log.
//!
//! Each page has a file of its own; this one holds what they share (the
//! layout's context, how times and ages read) and the audit log.

mod endpoints;
mod inbox;
mod job;
mod jobs;
mod login;
mod order;
mod overview;

use std::time::Duration;

use axum::extract::{Extension, State};
use axum::response::Html;
use chrono::{DateTime, Utc};
use minijinja::{Value, context};

use super::auth::Session;
use super::error::AdminError;
use super::queries;
use super::view::{num, render};
use super::{AdminState, Nonce};

pub(super) use endpoints::{endpoint, endpoints};
pub(super) use inbox::inbox;
pub(super) use job::job;
pub(super) use jobs::jobs;
pub(super) use login::{login, login_form, logout};
pub(super) use order::{find_order, order};
pub(super) use overview::overview;

/// What every page's layout needs.
pub(super) fn base(session: Option<&Session>, nonce: &Nonce, nav: &str, title: &str) -> Value {
    context! {
        title => title,
        nav => nav,
        nonce => nonce.0.clone(),
        refresh => false,
        session => session.map(|s| context! {
            actor => s.actor.clone(),
            role => s.role.as_str(),
            csrf => s.csrf.clone(),
            can_act => s.can_act(),
        }),
    }
}

pub(super) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn opt_time(t: Option<DateTime<Utc>>) -> String {
    t.map(time).unwrap_or_default()
}

/// `3m 12s`: seconds rounded, for ages.
pub(super) fn age(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "0s".to_owned();
    }
    humantime::format_duration(Duration::from_secs(seconds.floor() as u64)).to_string()
}

fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ago", age((now - t).num_milliseconds() as f64 / 1000.0))
}

// ---- audit ----

pub(super) async fn audit(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
) -> Result<Html<String>, AdminError> {
    let timeout = state.settings.statement_timeout;
    let entries = state
        .db
        .run(move |conn| Ok(queries::list_audit(conn, timeout, 200)?))
        .await?;
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            context! {
                id => e.id,
                at => time(e.at),
                actor => e.actor.clone(),
                action => e.action.clone(),
                target => e.target.clone(),
                affected => num(e.affected),
            }
        })
        .collect();
    render(
        "audit.html",
        context! { entries => entries, ..base(Some(&session), &nonce, "audit", "Audit log") },
    )
}
