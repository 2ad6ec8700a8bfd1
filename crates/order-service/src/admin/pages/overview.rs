//! What the overview shows: jobs by kind and status, throughput, the relays
//! seen lately, the queue's health.

use std::collections::BTreeMap;

use axum::extract::{Extension, State};
use axum::response::Html;
use chrono::Utc;
use minijinja::{Value, context};
use serde::Serialize;

use super::{age, ago, base, opt_time, time};
use crate::admin::auth::Session;
use crate::admin::chart::throughput_svg;
use crate::admin::error::AdminError;
use crate::admin::queries;
use crate::admin::view::{num, render};
use crate::admin::{AdminState, Nonce};

/// How often the overview reloads itself (when script runs).
const REFRESH_SECONDS: u64 = 15;

#[derive(Debug, Default, Serialize)]
struct KindRow {
    kind: String,
    pending: i64,
    /// Pending, but waiting behind an earlier job of its ordering key.
    blocked: i64,
    processing: i64,
    failed: i64,
    done_1h: i64,
    cancelled_1h: i64,
}

pub(in crate::admin) async fn overview(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
) -> Result<Html<String>, AdminError> {
    let timeout = state.settings.statement_timeout;
    let data = state
        .db
        .run(move |conn| Ok(queries::overview(conn, timeout)?))
        .await?;
    let now = Utc::now();
    let mut kinds: BTreeMap<String, KindRow> = BTreeMap::new();
    for c in &data.counts {
        let row = kinds.entry(c.kind.clone()).or_insert_with(|| KindRow {
            kind: c.kind.clone(),
            ..KindRow::default()
        });
        match c.status.as_str() {
            "pending" => row.pending = c.n,
            "blocked" => row.blocked = c.n,
            "processing" => row.processing = c.n,
            "failed" => row.failed = c.n,
            "done_1h" => row.done_1h = c.n,
            "cancelled_1h" => row.cancelled_1h = c.n,
            _ => {}
        }
    }
    let total = kinds.values().fold(KindRow::default(), |mut t, k| {
        t.pending += k.pending;
        t.blocked += k.blocked;
        t.processing += k.processing;
        t.failed += k.failed;
        t.done_1h += k.done_1h;
        t.cancelled_1h += k.cancelled_1h;
        t
    });
    let relays: Vec<Value> = data
        .relays
        .iter()
        .map(|r| {
            context! {
                worker => r.worker.clone(),
                in_flight => r.in_flight,
                done_5m => r.done_5m,
                last_seen => r.last_seen.map(|t| ago(t, now)).unwrap_or_default(),
                last_seen_at => opt_time(r.last_seen),
            }
        })
        .collect();
    let health = &data.health;
    render(
        "overview.html",
        context! {
                   refresh => REFRESH_SECONDS,
                   kinds => Value::from(minijinja::value::Serde(kinds.into_values().collect::<Vec<_>>())),
                   total => Value::from(minijinja::value::Serde(&total)),
                   oldest_due => health.oldest_due_pending_seconds.map(age),
                   expired_leases => health.expired_leases,
                   estimated_rows => (health.estimated_rows >= 0).then(|| num(health.estimated_rows)),
                   chart => Value::from_safe_string(throughput_svg(&data.minutes, now)),
                   relays => relays,
                   now => time(now),
        ..base(Some(&session), &nonce, "overview", "Overview"),
               },
    )
}
