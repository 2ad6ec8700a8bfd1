//! The inbox: messages received on `/inbound/{source}`, newest first, a page
//! at a time (keyset on the id), filtered by status and source. A held
//! message shows its reason with its order beside it (status and total), and
//! the apply and dismiss buttons (`inbox_actions` acts).

use axum::extract::{Extension, Query, State};
use axum::response::Html;
use diesel::prelude::*;
use minijinja::{Value, context};
use serde::Deserialize;

use super::{base, opt_time, time};
use crate::admin::auth::Session;
use crate::admin::error::AdminError;
use crate::admin::queries::read;
use crate::admin::view::render;
use crate::admin::{AdminState, Nonce};
use crate::inbox::MessageStatus;
use crate::inbox::list::{Filter, InboxMessage, list_messages};
use crate::inbox::reconcile::state::{self as reconcile_state, SourceReconciliation};
use crate::schema::orders;

/// Messages per page.
const PAGE: i64 = 50;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::admin) struct InboxQuery {
    status: Option<String>,
    source: Option<String>,
    before: Option<i64>,
    /// A notice after an action: `apply:<id>`, `dismiss:<id>`.
    done: Option<String>,
}

fn notice(done: Option<&str>) -> Option<String> {
    let (action, id) = done?.split_once(':')?;
    let id: i64 = id.parse().ok()?;
    match action {
        "apply" => Some(format!(
            "Applied message {id}: its order moved, and its event and jobs are queued."
        )),
        "dismiss" => Some(format!("Dismissed message {id}: its order is unchanged.")),
        _ => None,
    }
}

pub(in crate::admin) async fn inbox(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Query(query): Query<InboxQuery>,
) -> Result<Html<String>, AdminError> {
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        Some(raw) => Some(
            raw.parse::<MessageStatus>()
                .map_err(AdminError::BadRequest)?,
        ),
        None => None,
    };
    let source = query.source.clone().filter(|s| !s.trim().is_empty());
    let filter = Filter {
        status,
        source: source.clone(),
        before: query.before,
        limit: PAGE + 1,
    };
    let timeout = state.settings.statement_timeout;
    let (mut messages, orders, reconciled) = state
        .db
        .run(move |conn| {
            Ok(read(conn, timeout, |conn| {
                let messages = list_messages(conn, &filter)?;
                let reconciled = reconcile_state::list(conn)?;
                let ids: Vec<i64> = messages.iter().filter_map(|m| m.order_id).collect();
                let orders: Vec<(i64, String, i64, String)> = orders::table
                    .filter(orders::id.eq_any(ids))
                    .select((
                        orders::id,
                        orders::status,
                        orders::total_cents,
                        orders::currency,
                    ))
                    .load(conn)?;
                Ok((messages, orders, reconciled))
            })?)
        })
        .await?;
    let more = messages.len() as i64 > PAGE;
    messages.truncate(PAGE as usize);
    let next = more.then(|| messages.last().map(|m| m.id)).flatten();
    let rows: Vec<Value> = messages
        .iter()
        .map(|m: &InboxMessage| {
            let order = m.order_id.and_then(|id| orders.iter().find(|o| o.0 == id));
            context! {
                id => m.id,
                source => m.source.clone(),
                message_id => crate::text::one_line(&m.message_id, 40),
                kind => m.message_type.clone().unwrap_or_default(),
                order_id => m.order_id,
                order => order.map(|(_, status, total, currency)| context! {
                    status => status.clone(),
                    total => crate::orders::Currency::parse(currency.trim())
                        .map_or_else(|| format!("{total} {currency}"), |c| c.format(*total)),
                }),
                status => m.status.clone().unwrap_or_default(),
                held => m.status.as_deref() == Some("held"),
                reason => m.reason.as_deref().map(|r| crate::text::one_line(r, 300)),
                received_at => time(m.received_at),
                decided_at => opt_time(m.decided_at),
                via => m.via.clone(),
            }
        })
        .collect();
    let reconciled: Vec<Value> = reconciled.iter().map(reconciliation).collect();
    let statuses: Vec<&str> = MessageStatus::ALL.iter().map(|s| s.as_str()).collect();
    render(
        "inbox.html",
        context! {
            messages => rows,
            reconciled => reconciled,
            statuses => statuses,
            status => status.map(|s| s.as_str()),
            source => source,
            next => next,
            notice => notice(query.done.as_deref()),
            ..base(Some(&session), &nonce, "inbox", "Inbox")
        },
    )
}

/// A stripe source's reconciliation: its last run, what it recovered, and
/// the error it stopped on.
fn reconciliation(r: &SourceReconciliation) -> Value {
    context! {
        source => r.source.clone(),
        has_api_key => r.has_api_key,
        started_at => opt_time(r.started_at),
        finished_at => opt_time(r.finished_at),
        watermark => opt_time(r.watermark),
        fetched => r.fetched,
        recovered => r.recovered,
        already => r.already,
        last_error => r.last_error.as_deref().map(|e| crate::text::one_line(e, 300)),
        last_error_at => opt_time(r.last_error_at),
    }
}
