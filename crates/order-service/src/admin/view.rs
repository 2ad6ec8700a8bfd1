//! The dashboard's templates (`templates/admin/`), compiled into the binary and
//! rendered with minijinja, which escapes every value in `.html` templates;
//! and the one place a dashboard error becomes a page.

use std::sync::OnceLock;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use minijinja::{Environment, UndefinedBehavior, Value};

use super::error::AdminError;

const TEMPLATES: &[(&str, &str)] = &[
    (
        "base.html",
        include_str!("../../../../templates/admin/base.html"),
    ),
    (
        "login.html",
        include_str!("../../../../templates/admin/login.html"),
    ),
    (
        "overview.html",
        include_str!("../../../../templates/admin/overview.html"),
    ),
    (
        "jobs.html",
        include_str!("../../../../templates/admin/jobs.html"),
    ),
    (
        "job_row.html",
        include_str!("../../../../templates/admin/job_row.html"),
    ),
    (
        "job.html",
        include_str!("../../../../templates/admin/job.html"),
    ),
    (
        "preview.html",
        include_str!("../../../../templates/admin/preview.html"),
    ),
    (
        "order.html",
        include_str!("../../../../templates/admin/order.html"),
    ),
    (
        "audit.html",
        include_str!("../../../../templates/admin/audit.html"),
    ),
    (
        "endpoints.html",
        include_str!("../../../../templates/admin/endpoints.html"),
    ),
    (
        "endpoint.html",
        include_str!("../../../../templates/admin/endpoint.html"),
    ),
    (
        "inbox.html",
        include_str!("../../../../templates/admin/inbox.html"),
    ),
    (
        "endpoint_recover.html",
        include_str!("../../../../templates/admin/endpoint_recover.html"),
    ),
    (
        "error.html",
        include_str!("../../../../templates/admin/error.html"),
    ),
];

pub(super) const STYLESHEET: &str = include_str!("../../../../templates/admin/admin.css");

fn environment() -> Result<&'static Environment<'static>, &'static minijinja::Error> {
    static ENV: OnceLock<Result<Environment<'static>, minijinja::Error>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // A misspelt variable is a bug to see in tests, not an empty cell.
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.add_filter("num", num);
        env.add_filter("excerpt", crate::text::one_line);
        env.add_filter("urlencode", urlencode);
        for (name, source) in TEMPLATES {
            env.add_template(name, source)?;
        }
        Ok(env)
    })
    .as_ref()
}

/// `1204` as `1,204`.
pub(super) fn num(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The id in a page's path (`/admin/jobs/{id}`): a positive number, or
/// else a page not found, saying there is no such `what`.
pub(super) fn path_id(raw: &str, what: &str) -> Result<i64, AdminError> {
    positive_id(raw).ok_or_else(|| AdminError::NotFound(format!("there is no {what} {raw:?}")))
}

/// An order number as an operator types it in a form: `42` or `#42`.
pub(super) fn order_number(raw: &str) -> Option<i64> {
    positive_id(raw.trim().trim_start_matches('#'))
}

fn positive_id(raw: &str) -> Option<i64> {
    raw.parse().ok().filter(|id| *id > 0)
}

/// A query-string value.
fn urlencode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

pub(super) fn render(name: &str, context: Value) -> Result<Html<String>, AdminError> {
    let env = environment().map_err(|e| AdminError::Internal(anyhow::anyhow!("{e:#}")))?;
    env.get_template(name)
        .and_then(|t| t.render(context))
        .map(Html)
        .map_err(|e| AdminError::Internal(anyhow::anyhow!("rendering {name}: {e:#}")))
}

/// An error page; plain text if even that cannot render.
pub(super) fn error_page(status: StatusCode, message: &str) -> Html<String> {
    let context = minijinja::context! {
        title => status.canonical_reason().unwrap_or("Error"),
        status => status.as_u16(),
        message => message,
        session => Value::from(()),
        nav => "",
        nonce => "",
        refresh => false,
    };
    render("error.html", context).unwrap_or_else(|_| {
        Html(format!(
            "<!doctype html><title>{}</title><p>{}</p>",
            status.as_u16(),
            html_escape(message)
        ))
    })
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The one place a dashboard error becomes a response.
impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        match &self {
            AdminError::LoginRequired => return Redirect::to("/admin/login").into_response(),
            AdminError::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "dashboard request failed")
            }
            AdminError::Unavailable { cause } => {
                tracing::warn!(error = %cause, "dashboard request failed: database unavailable")
            }
            other => tracing::info!(error = %other, "dashboard request refused"),
        }
        let status = self.status();
        let mut response = (status, error_page(status, &self.to_string())).into_response();
        if let AdminError::TooManyLogins(wait) = &self
            && let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_positive_numbers_and_order_numbers_may_start_with_a_hash() {
        assert_eq!(path_id("42", "job").ok(), Some(42));
        for bad in ["0", "-3", "x", "#42", " 42"] {
            let error = path_id(bad, "job").expect_err(bad);
            assert!(
                matches!(&error, AdminError::NotFound(m) if m.starts_with("there is no job")),
                "{bad}"
            );
        }
        assert_eq!(order_number(" #42 "), Some(42));
        assert_eq!(order_number("42"), Some(42));
        assert_eq!(order_number("#0"), None);
        assert_eq!(order_number("order 42"), None);
    }

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(1204), "1,204");
        assert_eq!(num(-1_000_000), "-1,000,000");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(urlencode("a b&c"), "a%20b%26c");
    }

    #[test]
    fn every_template_compiles() {
        assert!(environment().is_ok(), "{:?}", environment().err());
    }
}
