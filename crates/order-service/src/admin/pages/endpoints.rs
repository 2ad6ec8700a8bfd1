//! The endpoints: each with its state, `failing_since`, and its recent
//! success rate and p95 latency from `delivery_attempts` (as
//! `endpoints list` shows them: `endpoints::attempts::stats`); and one endpoint's
//! attempt log, newest first, a page at a time (keyset on `(started_at, id)`),
//! under its enable, disable and recover forms (`endpoint_actions` acts).

use std::collections::HashMap;

use axum::extract::{Extension, Path, Query, State};
use axum::response::Html;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, SmallInt, Text, Timestamptz};
use minijinja::{Value, context};
use serde::Deserialize;

use super::{base, opt_time, time};
use crate::admin::auth::Session;
use crate::admin::endpoint_actions::endpoint_id;
use crate::admin::error::AdminError;
use crate::admin::queries::read;
use crate::admin::view::{num, render};
use crate::admin::{AdminState, Nonce};
use crate::endpoints::Endpoint;
use crate::endpoints::attempts::{self, AttemptStats};

/// Attempts per page of an endpoint's log.
const PAGE: i64 = 50;

#[derive(Debug, QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    origin: String,
    #[diesel(sql_type = Bool)]
    enabled: bool,
    #[diesel(sql_type = Nullable<Text>)]
    disabled_reason: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    failing_since: Option<DateTime<Utc>>,
    #[diesel(sql_type = Integer)]
    max_in_flight: i32,
    #[diesel(sql_type = Nullable<Double>)]
    rate_limit: Option<f64>,
}

const LIST: &str = "\
SELECT id, name, substring(url FROM '^[a-z]+://[^/?#]*') AS origin, enabled,
       disabled_reason, failing_since, max_in_flight, rate_limit
FROM endpoints
ORDER BY name";

/// A notice after an action: `enable:<id>`, `disable:<id>`, `recover:<n>`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::admin) struct Done {
    done: Option<String>,
}

/// What an action's notice says, `name` being the endpoint's.
fn notice(done: Option<&str>, name: impl Fn(i64) -> Option<String>) -> Option<String> {
    let (action, n) = done?.split_once(':')?;
    let n: i64 = n.parse().ok()?;
    match action {
        "enable" => Some(format!(
            "Enabled {}: the deliveries that waited go out now, each order's in order.",
            name(n)?
        )),
        "disable" => Some(format!(
            "Disabled {}: its deliveries wait, in order, until it is enabled.",
            name(n)?
        )),
        "recover" => Some(match n {
            0 => "Nothing to re-queue: no failed delivery in that window any more.".to_owned(),
            1 => "Re-queued 1 failed delivery.".to_owned(),
            n => format!("Re-queued {} failed deliveries, oldest first.", num(n)),
        }),
        _ => None,
    }
}

/// `enabled`, `failing`, or `disabled (reason)`.
fn state_label(enabled: bool, reason: Option<&str>, failing: bool) -> String {
    match (enabled, reason) {
        (true, _) if failing => "failing".to_owned(),
        (true, _) => "enabled".to_owned(),
        (false, Some(reason)) => format!("disabled ({reason})"),
        (false, None) => "disabled".to_owned(),
    }
}

fn row_view(r: &Row, stats: &AttemptStats) -> Value {
    context! {
        id => r.id,
        name => r.name.clone(),
        origin => r.origin.clone(),
        enabled => r.enabled,
        state => state_label(r.enabled, r.disabled_reason.as_deref(), r.failing_since.is_some()),
        failing_since => opt_time(r.failing_since),
        limits => format!(
            "{} in flight{}",
            r.max_in_flight,
            r.rate_limit.map(|l| format!(", {l}/s")).unwrap_or_default()
        ),
        attempts => stats.attempts,
        success => stats
            .success_rate
            .map(|rate| format!("{:.1}%", 100.0 * rate))
            .unwrap_or_default(),
        p95 => stats.p95_ms.map(|ms| format!("{ms:.0} ms")).unwrap_or_default(),
    }
}

pub(in crate::admin) async fn endpoints(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Query(done): Query<Done>,
) -> Result<Html<String>, AdminError> {
    let timeout = state.settings.statement_timeout;
    let (rows, stats): (Vec<Row>, HashMap<i64, AttemptStats>) = state
        .db
        .run(move |conn| {
            Ok(read(conn, timeout, |conn| {
                Ok((diesel::sql_query(LIST).load(conn)?, attempts::stats(conn)?))
            })?)
        })
        .await?;
    let notice = notice(done.done.as_deref(), |id| {
        rows.iter().find(|r| r.id == id).map(|r| r.name.clone())
    });
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| row_view(r, stats.get(&r.id).unwrap_or(&AttemptStats::default())))
        .collect();
    render(
        "endpoints.html",
        context! {
            endpoints => rows,
            notice => notice,
            ..base(Some(&session), &nonce, "endpoints", "Endpoints")
        },
    )
}

#[derive(Debug, QueryableByName)]
struct Attempt {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
    #[diesel(sql_type = Timestamptz)]
    started_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    duration_ms: i32,
    #[diesel(sql_type = Nullable<SmallInt>)]
    status_code: Option<i16>,
    #[diesel(sql_type = Text)]
    outcome: String,
    #[diesel(sql_type = Nullable<Text>)]
    excerpt: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    stream_sequence: Option<i64>,
}

// Keyset: the page after attempt $2 (NULL: the newest), by the index's order.
const ATTEMPTS: &str = "\
SELECT id, job_id, attempt, started_at, duration_ms, status_code, outcome, excerpt,
       stream_sequence
FROM delivery_attempts
WHERE endpoint_id = $1
  AND ($2::bigint IS NULL
       OR (started_at, id) < (SELECT started_at, id FROM delivery_attempts WHERE id = $2))
ORDER BY started_at DESC, id DESC
LIMIT $3";

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(in crate::admin) struct Cursor {
    before: Option<i64>,
    /// A notice after an action (see [`notice`]).
    done: Option<String>,
}

pub(in crate::admin) async fn endpoint(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Path(raw_id): Path<String>,
    Query(cursor): Query<Cursor>,
) -> Result<Html<String>, AdminError> {
    let id = endpoint_id(&raw_id)?;
    let timeout = state.settings.statement_timeout;
    let before = cursor.before;
    let (endpoint, own_credentials, mut attempts) = state
        .db
        .run(move |conn| {
            Ok(read(conn, timeout, |conn| {
                let endpoint: Option<Endpoint> = crate::schema::endpoints::table
                    .find(id)
                    .select(Endpoint::as_select())
                    .first(conn)
                    .optional()?;
                let own_credentials = crate::endpoints::nats_credentials::is_set(conn, id)?;
                let attempts: Vec<Attempt> = diesel::sql_query(ATTEMPTS)
                    .bind::<BigInt, _>(id)
                    .bind::<Nullable<BigInt>, _>(before)
                    .bind::<BigInt, _>(PAGE + 1)
                    .load(conn)?;
                Ok((endpoint, own_credentials, attempts))
            })?)
        })
        .await?;
    let endpoint =
        endpoint.ok_or_else(|| AdminError::NotFound(format!("there is no endpoint {id}")))?;
    let more = attempts.len() > PAGE as usize;
    attempts.truncate(PAGE as usize);
    let next = more.then(|| attempts.last().map(|a| a.id)).flatten();
    let rows: Vec<Value> = attempts
        .iter()
        .map(|a| {
            context! {
                at => time(a.started_at),
                job => a.job_id,
                attempt => a.attempt,
                duration => format!("{} ms", a.duration_ms),
                status => match (a.status_code, a.stream_sequence) {
                    (Some(code), _) => code.to_string(),
                    (None, Some(sequence)) => format!("PubAck {sequence}"),
                    (None, None) => "no answer".to_owned(),
                },
                outcome => a.outcome.clone(),
                excerpt => a.excerpt.clone().unwrap_or_default(),
            }
        })
        .collect();
    let name = endpoint.name.clone();
    let notice = notice(cursor.done.as_deref(), |_| Some(name.clone()));
    render(
        "endpoint.html",
        context! {
            endpoint => context! {
                id => id,
                name => endpoint.name.clone(),
                origin => origin(&endpoint.url),
                enabled => endpoint.enabled,
                state => state_label(
                    endpoint.enabled,
                    endpoint.disabled_reason.as_deref(),
                    endpoint.failing_since.is_some(),
                ),
                failing_since => opt_time(endpoint.failing_since),
                // Whether it has credentials of its own, never what they are.
                nats_credentials => endpoint.url.starts_with("nats://").then_some(
                    if own_credentials { "set" } else { "not set (NATS_CREDENTIALS, if any)" }
                ),
            },
            attempts => rows,
            next => next,
            first_page => before.is_none(),
            notice => notice,
            ..base(Some(&session), &nonce, "endpoints", &format!("Endpoint {}", endpoint.name))
        },
    )
}

/// Scheme, host and port: the path and query of a receiver's URL often
/// carry a token, and the dashboard shows them to every viewer.
fn origin(url: &str) -> String {
    let url = crate::endpoints::spec::without_userinfo(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::new();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    format!("{scheme}://{}", &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::origin;

    #[test]
    fn the_origin_shown_drops_userinfo_path_and_query() {
        assert_eq!(
            origin("https://ops:hunter2@hooks.example.com:8443/in/tok?k=v"),
            "https://hooks.example.com:8443"
        );
        assert_eq!(origin("http://user@127.0.0.1:9/x"), "http://127.0.0.1:9");
    }
}
