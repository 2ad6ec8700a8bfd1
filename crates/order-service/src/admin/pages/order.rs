//! An order's page: its items and a timeline of its events and jobs, with
//! what was sent for it, what each effect's peer answered (the effect
//! ledger) and its receipt.

use axum::extract::{Extension, Path, Query, State};
use axum::response::{Html, Redirect};
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use serde::{Deserialize, Serialize};

use super::jobs::job_view;
use super::{base, opt_time, time};
use crate::admin::auth::Session;
use crate::admin::error::AdminError;
use crate::admin::queries;
use crate::admin::view::{num, order_number, path_id, render};
use crate::admin::{AdminState, Nonce};
use crate::effects::email::{EmailKind, message_id_for};
use crate::effects::webhook::idempotency_key;
use crate::orders::EffectEntry;

#[derive(Debug, Deserialize)]
pub(in crate::admin) struct FindOrder {
    #[serde(default)]
    id: String,
}

/// The overview's "open order" form: a GET with `?id=`, so it works without script.
pub(in crate::admin) async fn find_order(
    _session: Session,
    Query(query): Query<FindOrder>,
) -> Result<Redirect, AdminError> {
    let id = order_number(&query.id)
        .ok_or_else(|| AdminError::BadRequest(format!("{:?} is not an order number", query.id)))?;
    Ok(Redirect::to(&format!("/admin/orders/{id}")))
}

#[derive(Debug, Serialize)]
struct Event {
    at: String,
    sort: DateTime<Utc>,
    what: String,
    job: Option<i64>,
    tone: &'static str,
}

pub(in crate::admin) async fn order(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Path(raw_id): Path<String>,
) -> Result<Html<String>, AdminError> {
    let id = path_id(&raw_id, "order")?;
    let timeout = state.settings.statement_timeout;
    let hide = state.settings.hide_payload;
    let timeline = state
        .db
        .run(move |conn| Ok(queries::timeline(conn, timeout, id, hide)?))
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("there is no order {id}")))?;
    let order = &timeline.order;
    let money = |minor: i64| order.currency.format(minor);
    let items: Vec<Value> = order
        .items
        .iter()
        .map(|i| {
            context! {
                sku => i.sku.clone(),
                name => i.name.clone(),
                quantity => i.quantity,
                unit_price => money(i.unit_price_cents),
                line_total => money(i.line_total_cents()),
            }
        })
        .collect();

    let mut events = vec![Event {
        at: time(order.created_at),
        sort: order.created_at,
        what: format!("Order placed by {}", order.customer_name),
        job: None,
        tone: "info",
    }];
    for event in &timeline.events {
        // order.placed is the line above; later transitions are their own lines.
        if event.seq > 1 {
            events.push(Event {
                at: time(event.created_at),
                sort: event.created_at,
                what: format!("{} (event {})", event.event_type, event.seq),
                job: None,
                tone: match event.event_type.as_str() {
                    "order.cancelled" | "order.expired" => "muted",
                    _ => "info",
                },
            });
        }
    }
    let mut sent = Vec::new();
    let kind_of = |id: i64| {
        timeline
            .jobs
            .iter()
            .find(|j| j.id == id)
            .map_or("job", |j| j.kind.as_str())
    };
    for job in &timeline.jobs {
        events.push(Event {
            at: time(job.created_at),
            sort: job.created_at,
            what: format!("{} enqueued", job.kind),
            job: Some(job.id),
            tone: "info",
        });
        if let Some(at) = job.locked_at {
            events.push(Event {
                at: time(at),
                sort: at,
                what: format!(
                    "{} attempt {} of {} claimed by {}",
                    job.kind,
                    job.attempts,
                    job.max_attempts,
                    job.locked_by.as_deref().unwrap_or("a relay")
                ),
                job: Some(job.id),
                tone: "info",
            });
        }
        if let Some(at) = job.finished_at {
            let (what, tone) = match job.status.as_str() {
                "done" => (format!("{} done", job.kind), "ok"),
                "failed" => (
                    format!(
                        "{} failed for good: {}",
                        job.kind,
                        job.last_error.as_deref().unwrap_or("no error recorded")
                    ),
                    "bad",
                ),
                "cancelled" => (format!("{} cancelled by an operator", job.kind), "muted"),
                other => (format!("{} {other}", job.kind), "info"),
            };
            events.push(Event {
                at: time(at),
                sort: at,
                what,
                job: Some(job.id),
                tone,
            });
        } else if let Some(waiting) = timeline
            .waiting
            .iter()
            .find(|w| w.id == job.id && job.status == "pending")
        {
            // Enqueued and not claimable yet: its parents are unfinished.
            let parents: Vec<String> = waiting
                .waiting_on
                .iter()
                .map(|p| format!("{} #{p}", kind_of(*p)))
                .collect();
            events.push(Event {
                at: time(job.created_at),
                sort: job.created_at,
                what: format!("{} waiting for {}", job.kind, parents.join(", ")),
                job: Some(job.id),
                tone: "warn",
            });
        } else if job.status == "pending" && job.attempts > 0 {
            events.push(Event {
                at: time(job.run_after),
                sort: job.run_after,
                what: format!(
                    "{} retry due (after attempt {}: {})",
                    job.kind,
                    job.attempts,
                    job.last_error.as_deref().unwrap_or("no error recorded")
                ),
                job: Some(job.id),
                tone: "warn",
            });
        }
        if job.status == "done" {
            match job.kind.as_str() {
                "confirmation_email" | "order_email" => sent.push(context! {
                    kind => "Email",
                    job => job.id,
                    header => "Message-ID",
                    value => sent_message_id(
                        job.id,
                        &timeline.effects,
                        state.settings.mail_domain.as_deref(),
                    ),
                    at => opt_time(job.finished_at),
                }),
                "order_webhook" => sent.push(context! {
                    kind => "Webhook",
                    job => job.id,
                    header => "Idempotency-Key",
                    value => idempotency_key(job.id),
                    at => opt_time(job.finished_at),
                }),
                _ => {}
            }
        }
    }
    events.sort_by_key(|e| e.sort);
    let effects: Vec<Value> = timeline.effects.iter().map(effect_view).collect();
    let jobs: Vec<Value> = timeline.jobs.iter().map(|j| job_view(j, hide)).collect();
    let receipt = timeline.receipt.as_ref().map(|r| {
        context! {
            url => format!("/orders/{id}/receipt.pdf"),
            at => time(r.created_at),
            bytes => num(r.bytes),
        }
    });
    render(
        "order.html",
        context! {
                   order => context! {
                       id => order.id.get(),
                       customer_name => order.customer_name.clone(),
                       customer_email => if hide { "(hidden)".to_owned() } else { order.customer_email.clone() },
                       total => money(order.total_cents),
                status => order.status.as_str(),
                       created_at => time(order.created_at),
                       // Only while placed: the column is cleared as the order leaves it.
                       expires_at => order.expires_at.map(time),
                   },
                   items => items,
                   events => Value::from(minijinja::value::Serde(&events)),
                   jobs => jobs,
                   sent => sent,
                   effects => effects,
                   receipt => receipt,
        ..base(Some(&session), &nonce, "jobs", &format!("Order {id}")),
               },
    )
}

/// One entry of the effect ledger as the page shows it: the job, and the
/// answer's fields that are recorded, each with its ledger name.
fn effect_view(entry: &crate::orders::EffectEntry) -> Value {
    let mut answer: Vec<(&str, String)> = Vec::new();
    let mut field = |name, value: Option<String>| {
        if let Some(value) = value {
            answer.push((name, value));
        }
    };
    field("message_id", entry.message_id.clone());
    field("smtp_reply", entry.smtp_reply.clone());
    field("endpoint", entry.endpoint.clone());
    field("webhook_id", entry.webhook_id.clone());
    field("status_code", entry.status_code.map(|c| c.to_string()));
    field("answer_sha256", entry.answer_sha256.clone());
    field("stream", entry.stream.clone());
    field("stream_seq", entry.stream_seq.map(|s| s.to_string()));
    field("duplicate", entry.duplicate.map(|d| d.to_string()));
    field("pdf_sha256", entry.pdf_sha256.clone());
    context! {
        job => entry.job_id,
        kind => entry.kind.clone(),
        status => entry.status.clone(),
        attempts => entry.attempts,
        lease_token => entry.lease_token,
        answer => answer.into_iter().map(|(name, value)| context! { name => name, value => value }).collect::<Vec<_>>(),
        at => opt_time(entry.recorded_at),
    }
}

/// The `Message-ID` email job `job_id` sent, as its effect ledger recorded
/// it. A job done before the ledger existed sent the confirmation's form,
/// the only one there was then.
fn sent_message_id(job_id: i64, effects: &[EffectEntry], domain: Option<&str>) -> String {
    let recorded = effects
        .iter()
        .find(|e| e.job_id == job_id)
        .and_then(|e| e.message_id.clone());
    match (recorded, domain) {
        (Some(recorded), _) => recorded,
        (None, Some(domain)) => message_id_for(job_id, EmailKind::Confirmation, domain),
        (None, None) => {
            format!("<job-{job_id}.confirmation@…> (set MAIL_FROM to show the domain)")
        }
    }
}
