//! The pages: login, overview, jobs, an order's timeline, the audit log.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Form;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use serde::{Deserialize, Serialize};

use super::auth::{self, Session};
use super::chart::throughput_svg;
use super::error::AdminError;
use super::filter::FilterForm;
use super::queries::{self, AdminJob};
use super::view::{num, render};
use super::{AdminState, Nonce};
use crate::effects::EffectKind;
use crate::effects::webhook::idempotency_key;
use crate::outbox::JobStatus;

/// Jobs per page.
const PAGE_SIZE: i64 = 50;
/// How often the overview reloads itself (when script runs).
const REFRESH_SECONDS: u64 = 15;

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

// ---- login ----

pub(super) async fn login_form(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    let signed_in = auth::cookie(&headers, auth::COOKIE_NAME)
        .and_then(|v| auth::verify_session(&state.settings, v))
        .is_some();
    if signed_in {
        return Ok(Redirect::to("/admin").into_response());
    }
    let page = render(
        "login.html",
        context! { error => Value::from(()), ..base(None, &nonce, "login", "Log in") },
    )?;
    Ok(page.into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
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

pub(super) async fn login(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, AdminError> {
    if !same_origin(&headers) {
        return Err(AdminError::CsrfRejected);
    }
    if let Some(wait) = state.limiter.blocked_for() {
        return Err(AdminError::TooManyLogins(wait));
    }
    let Some((index, token)) = auth::find_token(&state.settings, form.token.trim()) else {
        state.limiter.record_failure();
        tracing::warn!("dashboard login failed: unknown token");
        let page = render(
            "login.html",
            context! {
                           error => "That token is not valid.",
            ..base(None, &nonce, "login", "Log in"),
                       },
        )?;
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    let value = auth::issue_session(&state.settings, index)
        .ok_or_else(|| AdminError::Internal(anyhow::anyhow!("token {index} vanished")))?;
    tracing::info!(actor = %token.label, "dashboard login");
    let cookie = auth::set_cookie(&state.settings, &headers, Some(&value));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/admin")).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct CsrfOnly {
    csrf: Option<String>,
}

pub(super) async fn logout(
    State(state): State<AdminState>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, AdminError> {
    super::csrf::check(&session, form.csrf.as_deref())?;
    let cookie = auth::set_cookie(&state.settings, &headers, None);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/admin/login")).into_response())
}

// ---- overview ----

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

pub(super) async fn overview(
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

// ---- jobs ----

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct JobsQuery {
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
        order_id => job.order_id,
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

pub(super) async fn jobs(
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
    filter: Option<&super::filter::Filter>,
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

// ---- one order ----

#[derive(Debug, Deserialize)]
pub(super) struct FindOrder {
    #[serde(default)]
    id: String,
}

/// The overview's "open order" form: a GET with `?id=`, so it works without script.
pub(super) async fn find_order(
    _session: Session,
    Query(query): Query<FindOrder>,
) -> Result<Redirect, AdminError> {
    let id: i64 = query
        .id
        .trim()
        .trim_start_matches('#')
        .parse()
        .ok()
        .filter(|id| *id > 0)
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

pub(super) async fn order(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Path(raw_id): Path<String>,
) -> Result<Html<String>, AdminError> {
    let id: i64 = raw_id
        .parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| AdminError::NotFound(format!("there is no order {raw_id:?}")))?;
    let timeout = state.settings.statement_timeout;
    let hide = state.settings.hide_payload;
    let timeline = state
        .db
        .run(move |conn| Ok(queries::timeline(conn, timeout, id, hide)?))
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("there is no order {id}")))?;
    let order = &timeline.order;
    let money = |minor: i64| match crate::orders::Currency::parse(&order.currency) {
        Some(c) => c.format(minor),
        None => format!("{minor} (minor units of {})", order.currency),
    };
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
                tone: if event.event_type == "order.cancelled" {
                    "muted"
                } else {
                    "info"
                },
            });
        }
    }
    let mut sent = Vec::new();
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
                "confirmation_email" => sent.push(context! {
                    kind => "Email",
                    job => job.id,
                    header => "Message-ID",
                    value => match &state.settings.mail_domain {
                        Some(domain) => crate::effects::email::message_id_for(job.id, domain),
                        None => format!("<job-{}.confirmation@…> (set MAIL_FROM to show the domain)", job.id),
                    },
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
                       id => order.id,
                       customer_name => order.customer_name.clone(),
                       customer_email => if hide { "(hidden)".to_owned() } else { order.customer_email.clone() },
                       total => money(order.total_cents),
                status => order.status.clone(),
                       created_at => time(order.created_at),
                   },
                   items => items,
                   events => Value::from(minijinja::value::Serde(&events)),
                   jobs => jobs,
                   sent => sent,
                   receipt => receipt,
        ..base(Some(&session), &nonce, "jobs", &format!("Order {id}")),
               },
    )
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
