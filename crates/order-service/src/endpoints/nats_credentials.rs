//! A NATS endpoint's own credentials (`endpoints.nats_credentials`): what its
//! connection presents to its server, and only to its server. An endpoint
//! without them uses the relay's `NATS_CREDENTIALS`, if any.
//!
//! Kept apart from the signing secrets (`store.rs`): they are written by
//! their own functions, read only by the publishing worker, and never shown
//! back: the CLI and the dashboard say "set" or "not set". Sealed like the
//! secrets when `SECRETS_KEY` is set.

use std::fmt;

use diesel::prelude::*;
use serde::{Deserialize, Serialize};

use super::spec::{SpecError, refuse};
use crate::schema::endpoints;
use crate::sealed::{ENDPOINT_NATS_CREDENTIALS, Keyring, Unreadable};

/// How an endpoint authenticates to its NATS server, as async-nats's
/// `ConnectOptions` takes it. Stored as JSON text: `{"creds": "..."}`,
/// `{"user_password": {"user": "...", "password": "..."}}` or
/// `{"token": "..."}`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointCredentials {
    /// A `.creds` file's content: a user JWT and its nkey seed, as `nsc`
    /// writes them (the common case, for servers in operator mode).
    Creds(String),
    /// A user and password of the server's `authorization` block.
    UserPassword { user: String, password: String },
    /// A token of the server's `authorization` block.
    Token(String),
}

/// Longest credentials accepted: a `.creds` file is about 1 KB; this bounds
/// what a mistaken `--nats-credentials /some/big/file` can store.
const MAX_LEN: usize = 16 * 1024;

impl EndpointCredentials {
    /// The content of a `.creds` file given to `--nats-credentials`, checked
    /// as the client will read it (a JWT block and a seed that parses).
    pub fn creds(content: &str) -> Result<EndpointCredentials, SpecError> {
        if content.len() > MAX_LEN {
            return Err(refuse(
                "--nats-credentials",
                format!("is larger than {MAX_LEN} bytes: not a .creds file"),
            ));
        }
        async_nats::ConnectOptions::with_credentials(content).map_err(|e| {
            refuse(
                "--nats-credentials",
                format!("is not a NATS credentials file (a user JWT and its nkey seed): {e}"),
            )
        })?;
        Ok(EndpointCredentials::Creds(content.to_owned()))
    }

    /// `--nats-user` with the password read from `--nats-password-file`.
    pub fn user_password(user: &str, password: &str) -> Result<EndpointCredentials, SpecError> {
        if user.is_empty() || user.len() > 256 || user.chars().any(char::is_control) {
            return Err(refuse(
                "--nats-user",
                format!("{user:?} is not a user name (1 to 256 characters, no control ones)"),
            ));
        }
        let password = one_secret_line("--nats-password-file", password)?;
        Ok(EndpointCredentials::UserPassword {
            user: user.to_owned(),
            password,
        })
    }

    /// The token read from `--nats-token-file`.
    pub fn token(token: &str) -> Result<EndpointCredentials, SpecError> {
        Ok(EndpointCredentials::Token(one_secret_line(
            "--nats-token-file",
            token,
        )?))
    }

    /// What the column holds.
    pub fn to_column(&self) -> String {
        // Serializing strings into a map cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The column's value, or why it cannot be used (never the value itself).
    pub fn from_column(column: &str) -> Result<EndpointCredentials, String> {
        serde_json::from_str(column).map_err(|e| {
            format!(
                "the stored NATS credentials do not parse ({})",
                e.classify_name()
            )
        })
    }

    /// The client's options with these credentials.
    pub fn options(&self) -> std::io::Result<async_nats::ConnectOptions> {
        Ok(match self {
            EndpointCredentials::Creds(content) => {
                async_nats::ConnectOptions::with_credentials(content)?
            }
            EndpointCredentials::UserPassword { user, password } => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            EndpointCredentials::Token(token) => {
                async_nats::ConnectOptions::with_token(token.clone())
            }
        })
    }

    /// `creds`, `user <name>` or `token`: which kind, for logs and errors.
    pub fn kind(&self) -> String {
        match self {
            EndpointCredentials::Creds(_) => "creds".to_owned(),
            EndpointCredentials::UserPassword { user, .. } => format!("user {user:?}"),
            EndpointCredentials::Token(_) => "token".to_owned(),
        }
    }
}

/// Never the secret, in any log.
impl fmt::Debug for EndpointCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointCredentials({}, redacted)", self.kind())
    }
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "io",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "unknown shape",
            serde_json::error::Category::Eof => "cut short",
        }
    }
}

/// A password or token file: its first line, which must not be empty.
fn one_secret_line(flag: &'static str, raw: &str) -> Result<String, SpecError> {
    let line = raw.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        return Err(refuse(flag, "is empty".to_owned()));
    }
    if line.len() > MAX_LEN || line.chars().any(char::is_control) {
        return Err(refuse(
            flag,
            "does not hold one line of at most 16 KiB without control characters".to_owned(),
        ));
    }
    Ok(line.to_owned())
}

/// Sets (or, with `None`, clears) the endpoint's credentials, sealed when
/// `secrets` has a key; false when no NATS endpoint has that id.
pub fn set(
    conn: &mut PgConnection,
    endpoint_id: i64,
    credentials: Option<&EndpointCredentials>,
    secrets: &Keyring,
) -> Result<bool, super::StoreError> {
    let stored = credentials
        .map(|c| secrets.seal(ENDPOINT_NATS_CREDENTIALS.at(endpoint_id), &c.to_column()))
        .transpose()?;
    let updated = diesel::update(
        endpoints::table
            .find(endpoint_id)
            .filter(endpoints::stream.is_not_null()),
    )
    .set((
        endpoints::nats_credentials.eq(stored),
        endpoints::updated_at.eq(diesel::dsl::now),
    ))
    .execute(conn)?;
    Ok(updated == 1)
}

/// Why an endpoint's stored credentials cannot be used. Never carries them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// Sealed, and this process lacks the key (or the value is damaged).
    #[error(transparent)]
    Sealed(#[from] Unreadable),
    #[error("{0}")]
    Unparsable(String),
}

impl Unusable {
    /// Whether configuring the right `SECRETS_KEY` would make them usable.
    pub fn is_missing_key(&self) -> bool {
        matches!(self, Unusable::Sealed(e) if e.is_missing_key())
    }
}

/// The endpoint's credentials, for its connection: `Ok(None)` when it has
/// none (or no longer exists), `Err` with why when they cannot be read.
pub fn load(
    conn: &mut PgConnection,
    endpoint_id: i64,
    secrets: &Keyring,
) -> QueryResult<Result<Option<EndpointCredentials>, Unusable>> {
    let row: Option<(String, Option<String>)> = endpoints::table
        .find(endpoint_id)
        .select((endpoints::name, endpoints::nats_credentials))
        .first(conn)
        .optional()?;
    let Some((name, Some(stored))) = row else {
        return Ok(Ok(None));
    };
    Ok(secrets
        .open(ENDPOINT_NATS_CREDENTIALS.at(endpoint_id), &stored)
        .map_err(|e| {
            Unusable::from(e.about(format_args!("endpoint {name:?}"), ENDPOINT_NATS_CREDENTIALS))
        })
        .and_then(|column| EndpointCredentials::from_column(&column).map_err(Unusable::Unparsable))
        .map(Some))
}

/// Whether the endpoint has credentials of its own.
pub fn is_set(conn: &mut PgConnection, endpoint_id: i64) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(
        endpoints::table
            .find(endpoint_id)
            .filter(endpoints::nats_credentials.is_not_null()),
    ))
    .get_result(conn)
}

/// The ids of the endpoints that have credentials of their own.
pub fn which_set(conn: &mut PgConnection) -> QueryResult<Vec<i64>> {
    endpoints::table
        .filter(endpoints::nats_credentials.is_not_null())
        .select(endpoints::id)
        .load(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.creds` file as `nsc` writes it, around a seed made here (the JWT
    /// is not checked by the client; the server checks it).
    fn creds_file() -> String {
        let seed = nkeys::KeyPair::new_user().seed().expect("a seed");
        format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.sig\n\
             ------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        )
    }

    #[test]
    fn a_creds_file_is_checked_and_survives_the_column() {
        let creds = EndpointCredentials::creds(&creds_file()).expect("a .creds file");
        let back = EndpointCredentials::from_column(&creds.to_column()).expect("parses");
        assert_eq!(back, creds);
        let error =
            EndpointCredentials::creds("user: relay\npassword: x\n").expect_err("not creds");
        assert_eq!(error.flag, "--nats-credentials");
    }

    #[test]
    fn passwords_and_tokens_are_one_line_and_never_in_debug() {
        let credentials =
            EndpointCredentials::user_password("relay", "s3cret\n").expect("user and password");
        assert_eq!(
            credentials,
            EndpointCredentials::UserPassword {
                user: "relay".into(),
                password: "s3cret".into()
            }
        );
        assert!(!format!("{credentials:?}").contains("s3cret"));
        let token = EndpointCredentials::token("t0ken\n").expect("a token");
        assert!(!format!("{token:?}").contains("t0ken"));
        assert_eq!(
            EndpointCredentials::token("\n").expect_err("empty").flag,
            "--nats-token-file"
        );
        assert_eq!(
            EndpointCredentials::user_password("", "x")
                .expect_err("no user")
                .flag,
            "--nats-user"
        );
    }

    #[test]
    fn a_column_that_does_not_parse_says_so_without_its_content() {
        let error =
            EndpointCredentials::from_column("{\"password\": \"s3cret\"}").expect_err("bad");
        assert!(!error.contains("s3cret"), "{error}");
    }
}
