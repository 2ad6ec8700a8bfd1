//! One NATS connection per server URL and credentials for the whole relay,
//! shared by every publish to every endpoint on that server with those
//! credentials, made on first use and reconnecting on its own, with backoff,
//! for as long as the relay runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::jetstream;

use super::PUBLISH_TIMEOUT;
use crate::endpoints::EndpointCredentials;

/// Longest wait for the TCP connection and the server's greeting.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest pause between two reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

/// A credentials file (`NATS_CREDENTIALS`): a user JWT and its nkey seed, as
/// `nsc` writes them. Checked at start, read again by every connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NatsCredentials(PathBuf);

impl NatsCredentials {
    /// The file at `path`, refused (naming the variable) when it cannot be
    /// read or holds no credentials.
    pub async fn load(path: &Path) -> Result<NatsCredentials, String> {
        async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| format!("NATS_CREDENTIALS {}: {e}", path.display()))?;
        Ok(NatsCredentials(path.to_owned()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// What connecting for `endpoints add` ran into.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the NATS server at {url} refused the credentials{from}: {detail}")]
    Refused {
        url: String,
        from: String,
        detail: String,
    },
    #[error("cannot connect to the NATS server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the NATS server at {url} is refused: {detail}")]
    Forbidden { url: String, detail: String },
    #[error("{0}")]
    Credentials(String),
}

/// How a connection to a NATS server may be made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Transport {
    /// The endpoint was added with `--allow-http`: a server without TLS is
    /// accepted. Otherwise TLS is required, and a plaintext server refused.
    pub plaintext: bool,
    /// `WEBHOOK_ALLOW_PRIVATE`: the server may be on a loopback, private or
    /// link-local address.
    pub allow_private: bool,
}

impl Transport {
    /// Refuses `url` whose host is, or resolves to, an address this
    /// transport must not reach. The client resolves the name again when it
    /// connects, and on each reconnection: a name an attacker controls can
    /// still change between the two (see docs/security.md).
    async fn check(&self, url: &str) -> Result<(), ConnectError> {
        if self.allow_private {
            return Ok(());
        }
        let parsed = url::Url::parse(url).map_err(|e| ConnectError::Unreachable {
            url: url.to_owned(),
            detail: format!("not a URL: {e}"),
        })?;
        let host = parsed.host_str().unwrap_or_default();
        crate::effects::webhook::guard::check_host(host, parsed.port().unwrap_or(4222))
            .await
            .map_err(|detail| ConnectError::Forbidden {
                url: url.to_owned(),
                detail,
            })
    }
}

/// What a connection presents to its server: an endpoint's own credentials,
/// or else the relay's `NATS_CREDENTIALS`, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    None,
    /// `NATS_CREDENTIALS`, the fallback of every endpoint without its own.
    File(NatsCredentials),
    /// The endpoint's own (`--nats-credentials` and the like).
    Endpoint(EndpointCredentials),
}

impl Auth {
    /// The endpoint's own credentials if it has them, else `fallback`'s.
    pub fn of(own: Option<&EndpointCredentials>, fallback: Option<&NatsCredentials>) -> Auth {
        match (own, fallback) {
            (Some(own), _) => Auth::Endpoint(own.clone()),
            (None, Some(file)) => Auth::File(file.clone()),
            (None, None) => Auth::None,
        }
    }

    /// Where the credentials came from, for a refusal: " from ...".
    fn source(&self) -> String {
        match self {
            Auth::None => {
                " (no credentials given: neither the endpoint's nor NATS_CREDENTIALS)".to_owned()
            }
            Auth::File(file) => format!(" from NATS_CREDENTIALS {}", file.path().display()),
            Auth::Endpoint(own) => format!(" of the endpoint ({})", own.kind()),
        }
    }
}

async fn options(
    auth: &Auth,
    transport: Transport,
) -> Result<async_nats::ConnectOptions, ConnectError> {
    let options = match auth {
        Auth::File(credentials) => {
            async_nats::ConnectOptions::with_credentials_file(credentials.path())
                .await
                .map_err(|e| {
                    ConnectError::Credentials(format!(
                        "NATS_CREDENTIALS {}: {e}",
                        credentials.path().display()
                    ))
                })?
        }
        Auth::Endpoint(own) => own.options().map_err(|e| {
            ConnectError::Credentials(format!(
                "the endpoint's NATS credentials ({}) cannot be used: {e}",
                own.kind()
            ))
        })?,
        Auth::None => async_nats::ConnectOptions::new(),
    };
    Ok(options
        // A server's INFO lists the other servers of its cluster, and the
        // client would connect to them when this one goes away: addresses
        // the endpoint's URL never named, and that no check here has seen.
        .ignore_discovered_servers()
        .require_tls(!transport.plaintext)
        .name(concat!("outbox-relay/", env!("CARGO_PKG_VERSION")))
        .connection_timeout(CONNECT_TIMEOUT)
        .request_timeout(Some(PUBLISH_TIMEOUT)))
}

/// One connection attempt, for `endpoints add`: a server that is down or
/// refuses the credentials is an error now, not a background retry.
pub async fn connect_once(
    url: &str,
    auth: &Auth,
    transport: Transport,
) -> Result<async_nats::Client, ConnectError> {
    transport.check(url).await?;
    let options = options(auth, transport).await?;
    options.connect(url).await.map_err(|e| {
        let detail = tls_hint(super::super::error_chain(&e), transport);
        match e.kind() {
            async_nats::ConnectErrorKind::AuthorizationViolation
            | async_nats::ConnectErrorKind::Authentication => ConnectError::Refused {
                url: url.to_owned(),
                from: auth.source(),
                detail,
            },
            _ => ConnectError::Unreachable {
                url: url.to_owned(),
                detail,
            },
        }
    })
}

/// A failed connection's error, with what to do when TLS was the trouble.
fn tls_hint(detail: String, transport: Transport) -> String {
    let lower = detail.to_ascii_lowercase();
    // rustls meeting a server that answers in plaintext reports a corrupt
    // message of an invalid content type.
    let tls_trouble = ["tls", "handshake", "certificate", "corrupt message"]
        .iter()
        .any(|needle| lower.contains(needle));
    if !transport.plaintext && tls_trouble {
        format!(
            "{detail} (TLS is required: a nats:// server without TLS needs the endpoint \
             added with --allow-http, which sends events and credentials in the clear)"
        )
    } else {
        detail
    }
}

/// A relay's connection to one server, and what the server last complained
/// about (an authorization or permission error arrives on its own, not as
/// the answer to a publish).
#[derive(Debug, Clone)]
pub struct Connection {
    pub url: String,
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    last_server_error: Arc<std::sync::Mutex<Option<(Instant, String)>>>,
}

impl Connection {
    /// `connected`, `connecting` or `disconnected`.
    pub fn state(&self) -> &'static str {
        match self.client.connection_state() {
            State::Connected => "connected",
            State::Pending => "connecting",
            State::Disconnected => "disconnected",
        }
    }

    /// Whether the connection is up, waiting up to `grace` for it (a
    /// connection made a moment ago is still greeting the server).
    pub async fn connected_within(&self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        while self.client.connection_state() != State::Connected {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// The server's complaint of the last `within`, if any.
    pub fn recent_server_error(&self, within: Duration) -> Option<String> {
        let last = self.last_server_error.lock().ok()?;
        last.as_ref()
            .filter(|(at, _)| at.elapsed() <= within)
            .map(|(_, error)| error.clone())
    }
}

/// A pooled connection's identity: two endpoints share a connection only
/// when they name the same server, the same transport and the same
/// credentials, so that one endpoint's credentials never carry another's
/// publishes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    url: String,
    plaintext: bool,
    auth: Auth,
}

/// The relay's connections, by server and credentials. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct NatsConnections {
    credentials: Option<NatsCredentials>,
    allow_private: bool,
    /// Shared, not copied, by each publish: a copy of a connection (its URL,
    /// client and JetStream context) was made and dropped per job.
    by_url: Arc<tokio::sync::Mutex<HashMap<Key, Arc<Connection>>>>,
}

impl NatsConnections {
    /// Connections with `credentials` (`NATS_CREDENTIALS`), to servers on
    /// public addresses only unless `allow_private` (`WEBHOOK_ALLOW_PRIVATE`).
    pub fn new(credentials: Option<NatsCredentials>, allow_private: bool) -> NatsConnections {
        NatsConnections {
            credentials,
            allow_private,
            by_url: Arc::default(),
        }
    }

    /// The connection to `url` with the endpoint's own credentials `own`
    /// (else `NATS_CREDENTIALS`), made on first use. A server that is down
    /// does not fail this: the connection keeps trying in the background and
    /// publishes meanwhile time out, to be retried.
    pub async fn get(
        &self,
        url: &str,
        plaintext: bool,
        own: Option<&EndpointCredentials>,
    ) -> Result<Arc<Connection>, ConnectError> {
        let transport = Transport {
            plaintext,
            allow_private: self.allow_private,
        };
        let auth = Auth::of(own, self.credentials.as_ref());
        let key = Key {
            url: url.to_owned(),
            plaintext,
            auth,
        };
        let mut by_url = self.by_url.lock().await;
        if let Some(connection) = by_url.get(&key) {
            return Ok(Arc::clone(connection));
        }
        transport.check(url).await?;
        let last_server_error: Arc<std::sync::Mutex<Option<(Instant, String)>>> = Arc::default();
        let errors = last_server_error.clone();
        let logged_url = url.to_owned();
        let client = options(&key.auth, transport)
            .await?
            .retry_on_initial_connect()
            .max_reconnects(None)
            .reconnect_delay_callback(reconnect_delay)
            .event_callback(move |event| {
                let (errors, url) = (errors.clone(), logged_url.clone());
                async move { on_event(&url, &errors, event) }
            })
            .connect(url)
            .await
            .map_err(|e| ConnectError::Unreachable {
                url: url.to_owned(),
                detail: super::super::error_chain(&e),
            })?;
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(PUBLISH_TIMEOUT);
        let connection = Arc::new(Connection {
            url: url.to_owned(),
            client,
            jetstream,
            last_server_error,
        });
        by_url.insert(key, Arc::clone(&connection));
        Ok(connection)
    }

    /// Each server this relay has a connection to, and its state.
    pub async fn states(&self) -> Vec<(String, &'static str)> {
        let by_url = self.by_url.lock().await;
        let mut states: Vec<(String, &'static str)> = by_url
            .values()
            .map(|c| (c.url.clone(), c.state()))
            .collect();
        states.sort();
        states
    }
}

/// None before the first attempt, then 100 ms, doubling, at most
/// [`MAX_RECONNECT_DELAY`], with jitter so that a fleet of relays does not
/// reconnect in step. The client counts from 1 and asks before every
/// attempt, the first connection's included: a pause there would hold a
/// just-started relay's first publishes for up to 200 ms with nothing
/// having failed yet.
fn reconnect_delay(attempts: usize) -> Duration {
    let Some(failed) = attempts.checked_sub(2) else {
        return Duration::ZERO;
    };
    let exponent = u32::try_from(failed.min(10)).unwrap_or(10);
    let base = Duration::from_millis(100)
        .saturating_mul(2u32.saturating_pow(exponent))
        .min(MAX_RECONNECT_DELAY);
    base.mul_f64(0.5 + fastrand::f64() / 2.0)
}

fn on_event(
    url: &str,
    errors: &std::sync::Mutex<Option<(Instant, String)>>,
    event: async_nats::Event,
) {
    match event {
        async_nats::Event::Connected => tracing::info!(url, "connected to NATS"),
        async_nats::Event::Disconnected => {
            tracing::warn!(url, "lost the connection to NATS; reconnecting");
        }
        async_nats::Event::ServerError(error) => {
            tracing::warn!(url, error = %error, "the NATS server reported an error");
            if let Ok(mut last) = errors.lock() {
                *last = Some((Instant::now(), error.to_string()));
            }
        }
        // A connection that cannot be made (credentials refused, say)
        // says why here only: a publish waiting for it repeats the reason.
        async_nats::Event::ClientError(error) => {
            tracing::warn!(url, error = %error, "cannot connect to NATS; retrying");
            if let Ok(mut last) = errors.lock() {
                *last = Some((Instant::now(), error.to_string()));
            }
        }
        other => tracing::debug!(url, event = %other, "NATS connection event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnection_backs_off_up_to_a_cap() {
        assert_eq!(reconnect_delay(1), Duration::ZERO, "the first attempt");
        assert!(reconnect_delay(2) <= Duration::from_millis(100));
        assert!(reconnect_delay(5) >= Duration::from_millis(400));
        for attempts in [10, 100, usize::MAX] {
            assert!(reconnect_delay(attempts) <= MAX_RECONNECT_DELAY);
        }
    }
}
