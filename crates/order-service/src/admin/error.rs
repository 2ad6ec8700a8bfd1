//! The dashboard's one error type. `view` turns it into a response: an HTML
//! page (or a redirect to the login form), never the API's JSON.

use std::time::Duration;

use axum::http::StatusCode;

use crate::api::ApiError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error("log in to see this page")]
    LoginRequired,
    #[error(
        "this form has expired or did not come from the dashboard; reload the page and try again"
    )]
    CsrfRejected,
    #[error("this session is read-only: it can look but not retry or cancel")]
    ReadOnly,
    #[error("too many failed logins; try again in {} seconds", .0.as_secs().max(1))]
    TooManyLogins(Duration),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the database did not answer in time; try again, or narrow the filter")]
    Unavailable { cause: String },
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl AdminError {
    pub fn status(&self) -> StatusCode {
        match self {
            AdminError::LoginRequired => StatusCode::UNAUTHORIZED,
            AdminError::CsrfRejected | AdminError::ReadOnly => StatusCode::FORBIDDEN,
            AdminError::TooManyLogins(_) => StatusCode::TOO_MANY_REQUESTS,
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<ApiError> for AdminError {
    fn from(error: ApiError) -> Self {
        match error {
            ApiError::DatabaseUnavailable { cause } => AdminError::Unavailable { cause },
            ApiError::Timeout(limit) => AdminError::Unavailable {
                cause: format!("timed out after {limit:?}"),
            },
            other => AdminError::Internal(anyhow::anyhow!(other.detail())),
        }
    }
}

impl From<diesel::result::Error> for AdminError {
    fn from(error: diesel::result::Error) -> Self {
        AdminError::from(ApiError::from(error))
    }
}
