//! Enable, disable and recover an endpoint: the store functions behind
//! `outbox-relay endpoints enable|disable|recover`, called from a form.
//!
//! Every action is a POST with the session's form token, refused for
//! read-only sessions, and written to `admin_audit` in the transaction that
//! acts, so an action and its audit line commit together or not at all.
//!
//! Recovery takes two steps: a preview that counts the endpoint's failed
//! deliveries since the time the operator gave, then a confirmation that puts
//! back the deliveries of that same window, which ends at the preview's time
//! ([`recover::Window`]): what is re-queued is what the operator was shown,
//! less any that someone else retried or cancelled in between.

use axum::Form;
use axum::extract::{Extension, Path, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use chrono::{DateTime, NaiveDateTime, SecondsFormat, SubsecRound as _, Utc};
use diesel::prelude::*;
use minijinja::context;
use serde::Deserialize;

use super::auth::Session;
use super::error::AdminError;
use super::pages::{base, time};
use super::queries::{insert_audit, set_local_timeouts};
use super::view::{num, path_id, render};
use super::{AdminState, Nonce, csrf};
use crate::config::parse_duration;
use crate::endpoints::StoreError;
use crate::endpoints::recover::{self, Window};
use crate::endpoints::store;
use crate::schema::endpoints;

/// The audit log's names for the actions.
const ENABLE: &str = "endpoint.enable";
const DISABLE: &str = "endpoint.disable";
const RECOVER: &str = "endpoint.recover";

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct EndpointForm {
    csrf: Option<String>,
    /// The preview: what the operator typed (`6h`, or a UTC time). The
    /// confirmation: the window's start as the preview fixed it (RFC 3339).
    since: Option<String>,
    /// The confirmation: the preview's time (RFC 3339), the window's end.
    until: Option<String>,
    /// The confirmation: how many the preview counted (audited beside what
    /// was done).
    previewed: Option<i64>,
    /// `list` when the button was on the endpoints list: go back there.
    back: Option<String>,
}

fn authorize(session: &Session, form: &EndpointForm) -> Result<(), AdminError> {
    csrf::check(&session.csrf, form.csrf.as_deref())?;
    if !session.can_act() {
        return Err(AdminError::ReadOnly);
    }
    Ok(())
}

/// The id in `/admin/endpoints/{id}/…`; anything else is a page not found.
pub(super) fn endpoint_id(raw: &str) -> Result<i64, AdminError> {
    path_id(raw, "endpoint")
}

fn name_of(conn: &mut PgConnection, id: i64) -> Result<String, AdminError> {
    endpoints::table
        .find(id)
        .select(endpoints::name)
        .first(conn)
        .optional()?
        .ok_or_else(|| AdminError::NotFound(format!("there is no endpoint {id}")))
}

fn store_error(error: StoreError) -> AdminError {
    match error {
        StoreError::NotFound(name) => {
            AdminError::NotFound(format!("there is no endpoint named {name:?}"))
        }
        StoreError::Database(error) => AdminError::from(error),
        other => AdminError::Internal(anyhow::Error::new(other)),
    }
}

pub(super) async fn enable(
    State(state): State<AdminState>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<EndpointForm>,
) -> Result<Response, AdminError> {
    set_enabled(state, session, &raw_id, form, true).await
}

pub(super) async fn disable(
    State(state): State<AdminState>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<EndpointForm>,
) -> Result<Response, AdminError> {
    set_enabled(state, session, &raw_id, form, false).await
}

/// `endpoints enable|disable NAME`: enabling releases what waited, in order.
async fn set_enabled(
    state: AdminState,
    session: Session,
    raw_id: &str,
    form: EndpointForm,
    enabled: bool,
) -> Result<Response, AdminError> {
    authorize(&session, &form)?;
    let id = endpoint_id(raw_id)?;
    let timeout = state.settings.statement_timeout;
    let actor = session.actor.clone();
    let action = if enabled { ENABLE } else { DISABLE };
    let endpoint = state
        .db
        .run(move |conn| {
            Ok(conn.transaction(|conn| {
                set_local_timeouts(conn, timeout)?;
                let name = name_of(conn, id)?;
                let endpoint = store::set_enabled(conn, &name, enabled).map_err(store_error)?;
                let target = serde_json::json!({ "endpoint": name, "id": id });
                insert_audit(conn, &actor, action, &target, 0)?;
                Ok::<_, AdminError>(endpoint)
            }))
        })
        .await??;
    tracing::info!(actor = %session.actor, action, endpoint = %endpoint.name, "dashboard action");
    let done = if enabled { "enable" } else { "disable" };
    Ok(Redirect::to(&after(id, &format!("{done}:{id}"), form.back.as_deref())).into_response())
}

/// Where an action lands: the list or the endpoint's page, with its notice.
fn after(id: i64, done: &str, back: Option<&str>) -> String {
    match back {
        Some("list") => format!("/admin/endpoints?done={done}"),
        _ => format!("/admin/endpoints/{id}?done={done}"),
    }
}

/// "N failed deliveries since T will be re-queued": the count, and a form
/// that carries the window on to [`recover`].
pub(super) async fn recover_preview(
    State(state): State<AdminState>,
    Extension(nonce): Extension<Nonce>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<EndpointForm>,
) -> Result<Html<String>, AdminError> {
    authorize(&session, &form)?;
    let id = endpoint_id(&raw_id)?;
    // Microseconds, as PostgreSQL keeps them: the confirmation's window ends
    // exactly where the count's did.
    let now = Utc::now().trunc_subsecs(6);
    let since = parse_since(form.since.as_deref().unwrap_or_default(), now)?;
    let window = Window {
        since,
        until: Some(now),
    };
    let timeout = state.settings.statement_timeout;
    let (name, count) = state
        .db
        .run(move |conn| {
            Ok(conn.build_transaction().read_only().run(|conn| {
                set_local_timeouts(conn, timeout)?;
                let name = name_of(conn, id)?;
                let count = recover::preview(conn, &name, window).map_err(store_error)?;
                Ok::<_, AdminError>((name, count))
            }))
        })
        .await??;
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let title = format!("Recover {name}");
    render(
        "endpoint_recover.html",
        context! {
            endpoint => context! { id => id, name => name },
            count => num(count),
            previewed => count,
            nothing => count == 0,
            one => count == 1,
            since => time(since),
            until => time(now),
            since_value => rfc3339(since),
            until_value => rfc3339(now),
            ..base(Some(&session), &nonce, "endpoints", &title)
        },
    )
}

/// `endpoints recover NAME --since T`, over the preview's window.
pub(super) async fn recover(
    State(state): State<AdminState>,
    session: Session,
    Path(raw_id): Path<String>,
    Form(form): Form<EndpointForm>,
) -> Result<Response, AdminError> {
    authorize(&session, &form)?;
    let id = endpoint_id(&raw_id)?;
    let missing = || AdminError::BadRequest("this form lacks its preview; preview again".into());
    let since = parse_rfc3339("since", form.since.as_deref().ok_or_else(missing)?)?;
    let until = parse_rfc3339("until", form.until.as_deref().ok_or_else(missing)?)?;
    let previewed = form.previewed.ok_or_else(missing)?;
    let window = Window {
        since,
        until: Some(until),
    };
    let timeout = state.settings.statement_timeout;
    let actor = session.actor.clone();
    let (name, ids) = state
        .db
        .run(move |conn| {
            Ok(conn.transaction(|conn| {
                set_local_timeouts(conn, timeout)?;
                let name = name_of(conn, id)?;
                let ids = recover::recover(conn, &name, window).map_err(store_error)?;
                let target = serde_json::json!({
                    "endpoint": name,
                    "id": id,
                    "since": rfc3339(since),
                    "until": rfc3339(until),
                    "previewed": previewed,
                });
                let affected = i64::try_from(ids.len()).unwrap_or(i64::MAX);
                insert_audit(conn, &actor, RECOVER, &target, affected)?;
                Ok::<_, AdminError>((name, ids))
            }))
        })
        .await??;
    tracing::info!(
        actor = %session.actor,
        action = RECOVER,
        endpoint = %name,
        previewed,
        requeued = ids.len(),
        "dashboard action"
    );
    Ok(Redirect::to(&after(id, &format!("recover:{}", ids.len()), None)).into_response())
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_rfc3339(field: &str, raw: &str) -> Result<DateTime<Utc>, AdminError> {
    DateTime::parse_from_rfc3339(raw.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            AdminError::BadRequest(format!("{field} {raw:?} is not an RFC 3339 time: {e}"))
        })
}

/// Formats a time the recover form takes, besides a duration (`6h`, `2d`).
const UTC_FORMATS: [&str; 4] = [
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%dT%H:%M:%S",
];

/// What the operator typed as "since": a duration back from `now` (as the
/// CLI's `--since`), or a UTC time.
fn parse_since(raw: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, AdminError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(AdminError::BadRequest(
            "say since when: a duration such as 6h or 2d, or a UTC time such as \
             2026-12-05 14:00"
                .into(),
        ));
    }
    let since = if let Ok(age) = parse_duration(raw) {
        chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| now.checked_sub_signed(age))
            .ok_or_else(|| AdminError::BadRequest(format!("since {raw:?}: too far back")))?
    } else if let Some(at) = UTC_FORMATS
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
    {
        at.and_utc()
    } else if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        at.with_timezone(&Utc)
    } else {
        return Err(AdminError::BadRequest(format!(
            "since {raw:?} is neither a duration (6h, 2d, 90m) nor a UTC time \
             (2026-12-05 14:00)"
        )));
    };
    if since > now {
        return Err(AdminError::BadRequest(format!(
            "since {raw:?} is in the future ({}); nothing has failed since then yet",
            time(since)
        )));
    }
    Ok(since)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-05T18:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("a time")
    }

    #[test]
    fn since_takes_a_duration_back_from_now_or_a_utc_time() {
        let at = |s: &str| rfc3339(parse_since(s, now()).expect(s));
        assert_eq!(at("6h"), "2026-12-05T12:00:00.000000Z");
        assert_eq!(at(" 2d "), "2026-12-03T18:00:00.000000Z");
        assert_eq!(at("2026-12-05 14:00"), "2026-12-05T14:00:00.000000Z");
        assert_eq!(at("2026-12-05T14:00:30"), "2026-12-05T14:00:30.000000Z");
        assert_eq!(
            at("2026-12-05T15:00:00+01:00"),
            "2026-12-05T14:00:00.000000Z"
        );
    }

    #[test]
    fn a_since_that_is_empty_unreadable_or_in_the_future_is_refused_naming_it() {
        for (raw, says) in [
            ("", "say since when"),
            ("ten", "\"ten\" is neither a duration"),
            ("2026-13-01 00:00", "\"2026-13-01 00:00\" is neither"),
            ("2026-12-06 00:00", "is in the future"),
        ] {
            match parse_since(raw, now()) {
                Err(AdminError::BadRequest(message)) => {
                    assert!(message.contains(says), "{raw:?}: {message}")
                }
                other => panic!("{raw:?}: {other:?}"),
            }
        }
    }
}
