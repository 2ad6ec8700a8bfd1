//! The jobs page's filter: parsed from the query string (or a form's fields)
//! into a [`JobFilter`], and printed back into links and hidden fields.

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::AdminError;
use super::view::order_number;
use crate::job_list::JobFilter;
use crate::outbox::JobStatus;

/// The fields as a browser sends them: every one optional, empty means unset.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub(super) struct FilterForm {
    pub status: String,
    pub kind: String,
    pub order: String,
    pub error: String,
    /// `datetime-local` values (`2026-12-01T03:00`), read as UTC.
    pub from: String,
    pub to: String,
}

fn non_empty(raw: &str) -> Option<&str> {
    let raw = raw.trim();
    (!raw.is_empty()).then_some(raw)
}

fn parse_time(field: &str, raw: &str) -> Result<DateTime<Utc>, AdminError> {
    let parsed = DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M").map(|t| t.and_utc()))
        .or_else(|_| NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S").map(|t| t.and_utc()));
    parsed.map_err(|_| {
        AdminError::BadRequest(format!(
            "{field}: {raw:?} is not a time (expected 2026-12-01T03:00, UTC)"
        ))
    })
}

impl FilterForm {
    pub fn parse(&self) -> Result<JobFilter, AdminError> {
        let status = non_empty(&self.status)
            .map(|s| s.parse::<JobStatus>().map_err(AdminError::BadRequest))
            .transpose()?;
        let order_id = non_empty(&self.order)
            .map(|s| {
                order_number(s).ok_or_else(|| {
                    AdminError::BadRequest(format!("order: {s:?} is not an order number"))
                })
            })
            .transpose()?;
        let kind = non_empty(&self.kind).map(|k| k.chars().take(100).collect());
        let error = non_empty(&self.error).map(|e| e.chars().take(200).collect());
        let from = non_empty(&self.from)
            .map(|t| parse_time("from", t))
            .transpose()?;
        let to = non_empty(&self.to)
            .map(|t| parse_time("to", t))
            .transpose()?;
        Ok(JobFilter {
            status,
            kind,
            order_id,
            error,
            from,
            to,
        })
    }
}

impl JobFilter {
    pub(super) fn is_empty(&self) -> bool {
        *self == JobFilter::default()
    }

    /// The form fields that reproduce this filter.
    pub(super) fn form(&self) -> FilterForm {
        let time = |t: &Option<DateTime<Utc>>| {
            t.map(|t| t.format("%Y-%m-%dT%H:%M").to_string())
                .unwrap_or_default()
        };
        FilterForm {
            status: self
                .status
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
            kind: self.kind.clone().unwrap_or_default(),
            order: self.order_id.map(|id| id.to_string()).unwrap_or_default(),
            error: self.error.clone().unwrap_or_default(),
            from: time(&self.from),
            to: time(&self.to),
        }
    }

    /// The filter as a query string (no leading `?`), for links.
    pub(super) fn query(&self) -> String {
        let form = self.form();
        let pairs = [
            ("status", &form.status),
            ("kind", &form.kind),
            ("order", &form.order),
            ("error", &form.error),
            ("from", &form.from),
            ("to", &form.to),
        ];
        pairs
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// What the filter says, in words, for previews and the audit log.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.status {
            parts.push(format!("status {s}"));
        }
        if let Some(k) = &self.kind {
            parts.push(format!("kind {k}"));
        }
        if let Some(o) = self.order_id {
            parts.push(format!("order {o}"));
        }
        if let Some(e) = &self.error {
            parts.push(format!("error containing {e:?}"));
        }
        if let Some(t) = self.from {
            parts.push(format!("created from {}", t.format("%Y-%m-%d %H:%M UTC")));
        }
        if let Some(t) = self.to {
            parts.push(format!("created before {}", t.format("%Y-%m-%d %H:%M UTC")));
        }
        if parts.is_empty() {
            "no filter".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

fn encode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_parse_and_print_back() {
        let form = FilterForm {
            status: "failed".into(),
            kind: " order_webhook ".into(),
            order: "#42".into(),
            error: "50%_off".into(),
            from: "2026-12-01T03:00".into(),
            to: String::new(),
        };
        let filter = form.parse().expect("valid");
        assert_eq!(filter.order_id, Some(42));
        assert_eq!(filter.error_pattern().as_deref(), Some("%50\\%\\_off%"));
        assert!(filter.narrowed_by_index());
        assert_eq!(filter.form().parse().expect("round trip"), filter);
        assert!(
            filter
                .query()
                .starts_with("status=failed&kind=order%5Fwebhook&order=42")
        );
        assert!(FilterForm::default().parse().expect("empty").is_empty());
    }

    #[test]
    fn bad_fields_are_refused_with_their_name() {
        let bad = |form: FilterForm| form.parse().expect_err("refused").to_string();
        assert!(
            bad(FilterForm {
                status: "lost".into(),
                ..Default::default()
            })
            .contains("lost")
        );
        assert!(
            bad(FilterForm {
                order: "x".into(),
                ..Default::default()
            })
            .starts_with("order")
        );
        assert!(
            bad(FilterForm {
                from: "soon".into(),
                ..Default::default()
            })
            .starts_with("from")
        );
    }
}
