//! `endpoints add`: every flag checked, a NATS endpoint's server and stream
//! checked too, then the endpoint and its own credentials written together.

use clap::Args;
use diesel::Connection as _;

use super::{CredentialArgs, events_of, new_secret, print_secret, usage};
use crate::at_rest;
use crate::cli::secrets::refused_without_key;
use crate::cli::with_conn;
use crate::config::{ConfigError, DatabaseArgs, SecretsKeyArgs, read_secret_file};
use crate::effects::nats::connection::Auth;
use crate::effects::nats::{self, NatsCredentials};
use crate::endpoints::store::{self, NewEndpoint};
use crate::endpoints::{
    DEFAULT_MAX_IN_FLIGHT, EndpointCredentials, EndpointName, EndpointUrl, EventTypes, NatsTarget,
    RateLimit, SigningSecret, SpecError, StreamName, SubjectPrefix, nats_credentials, spec,
};

#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// A unique name (letters, digits, '_', '.', '-').
    #[arg(long)]
    name: String,
    /// Where deliveries go: https://… (http://… only with --allow-http), or a NATS
    /// server, nats://host:port (with --stream and --subject-prefix).
    #[arg(long)]
    url: String,
    /// Event types to deliver, comma-separated (order.placed, order.paid, order.shipped,
    /// order.delivered, order.cancelled, order.refunded, endpoint.disabled); every one when left out.
    #[arg(long, value_name = "TYPE,TYPE")]
    events: Option<String>,
    /// Deliveries per second at most, across every relay: 10/s, 300/m, 1000/h.
    #[arg(long, value_name = "N/UNIT")]
    rate_limit: Option<String>,
    /// Deliveries in flight to this endpoint at once, across every relay.
    #[arg(long, value_name = "N")]
    max_in_flight: Option<String>,
    /// The signing secret: whsec_ and the base64 of 24 to 64 bytes. Made for
    /// you when left out. Shows in `ps` and shell history: prefer --secret-file.
    #[arg(long, conflicts_with = "secret_file")]
    secret: Option<String>,
    /// A file holding the signing secret (one trailing newline is ignored),
    /// or - for standard input.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// Allow a plain http:// URL, or a nats:// server without TLS (events,
    /// signatures and NATS credentials travel in the clear).
    #[arg(long)]
    allow_http: bool,
    /// Allow a NATS server on a loopback, private or link-local address.
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    allow_private: bool,
    /// Print {"id","name","secret"} as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// NATS endpoints: the JetStream stream that captures <subject-prefix>.>
    /// (checked now: it must exist, or be created with --create-stream).
    #[arg(long)]
    stream: Option<String>,
    /// NATS endpoints: events are published to <prefix>.<event>.<order id>
    /// (orders.paid.42).
    #[arg(long, value_name = "PREFIX")]
    subject_prefix: Option<String>,
    /// NATS endpoints: create the stream (capturing <prefix>.>, a 2 minute
    /// duplicate window) when it does not exist.
    #[arg(long)]
    create_stream: bool,
    /// The most endpoints there may be; adding one more is refused.
    #[arg(long, env = "ENDPOINTS_MAX", default_value_t = crate::endpoints::store::DEFAULT_MAX_ENDPOINTS)]
    max_endpoints: u32,
    #[command(flatten)]
    credentials: CredentialArgs,
    /// The relay's credentials file (`NATS_CREDENTIALS`): used for the check
    /// when the endpoint has none of its own, never stored.
    #[arg(long = "relay-nats-credentials", env = "NATS_CREDENTIALS", hide = true)]
    relay_credentials: Option<std::path::PathBuf>,
    #[command(flatten)]
    secrets: SecretsKeyArgs,
}

/// Every flag of `add`, checked; the first bad one is the error. `secret`
/// is the one given (`--secret`, or read from `--secret-file`) and its flag.
fn parse_new(
    args: &AddArgs,
    secret: Option<(&str, &'static str)>,
) -> Result<NewEndpoint, SpecError> {
    let url = EndpointUrl::parse(&args.url, args.allow_http)?;
    Ok(NewEndpoint {
        name: EndpointName::parse(&args.name)?,
        nats: parse_nats(args, &url)?,
        url,
        event_types: match &args.events {
            Some(raw) => EventTypes::parse(raw)?,
            None => EventTypes::ALL,
        },
        rate_limit: args
            .rate_limit
            .as_deref()
            .map(str::parse::<RateLimit>)
            .transpose()?,
        max_in_flight: match &args.max_in_flight {
            Some(raw) => spec::parse_max_in_flight(raw)?,
            None => DEFAULT_MAX_IN_FLIGHT,
        },
        secret: match secret {
            Some((raw, flag)) => SigningSecret::parse(raw, flag)?,
            None => new_secret()?,
        },
    })
}

/// `--stream` and `--subject-prefix`: both for a `nats://` URL, neither
/// (nor `--create-stream`) for any other.
fn parse_nats(args: &AddArgs, url: &EndpointUrl) -> Result<Option<NatsTarget>, SpecError> {
    if !url.is_nats() {
        let given = [
            ("--stream", args.stream.is_some()),
            ("--subject-prefix", args.subject_prefix.is_some()),
            ("--create-stream", args.create_stream),
        ];
        return match given.into_iter().find(|(_, given)| *given) {
            Some((flag, _)) => Err(SpecError {
                flag,
                message: format!("is for nats:// endpoints only, not {}", url.as_str()),
            }),
            None => Ok(None),
        };
    }
    let needed = |flag: &'static str| SpecError {
        flag,
        message: "a nats:// endpoint needs --stream and --subject-prefix".to_owned(),
    };
    let stream = args.stream.as_deref().ok_or_else(|| needed("--stream"))?;
    let prefix = args
        .subject_prefix
        .as_deref()
        .ok_or_else(|| needed("--subject-prefix"))?;
    Ok(Some(NatsTarget {
        stream: StreamName::parse(stream)?,
        subject_prefix: SubjectPrefix::parse(prefix)?,
    }))
}

/// Checks, before anything is written, that the NATS server answers, takes
/// the credentials, and has a stream fit for the endpoint (creating it with
/// `--create-stream`). Every refusal names the endpoint and its URL.
async fn check_nats(
    args: &AddArgs,
    url: &str,
    target: &NatsTarget,
    own: Option<&EndpointCredentials>,
) -> anyhow::Result<()> {
    let refused = |what: String| -> anyhow::Error {
        ConfigError(format!("endpoint {:?} (--url {url}): {what}", args.name)).into()
    };
    let auth = relay_auth(own, args.relay_credentials.as_deref()).await?;
    let transport = nats::connection::Transport {
        plaintext: args.allow_http,
        allow_private: args.allow_private,
    };
    let client = nats::connection::connect_once(url, &auth, transport)
        .await
        .map_err(|e| refused(e.to_string()))?;
    let checked = nats::stream::check_stream(
        client,
        url,
        target.stream.as_str(),
        target.subject_prefix.as_str(),
        args.create_stream,
    )
    .await
    .map_err(|e| {
        let flag = match e {
            nats::stream::StreamError::DoesNotCapture { .. } => "--subject-prefix",
            _ => "--stream",
        };
        refused(format!("{flag}: {e}"))
    })?;
    if !args.json {
        println!(
            "stream {} {} (duplicate window {}); events go to {}.<event>.<order id>",
            target.stream.as_str(),
            if checked.created { "created" } else { "found" },
            humantime::format_duration(checked.duplicate_window),
            target.subject_prefix
        );
    }
    Ok(())
}

/// What a relay would present: the endpoint's own credentials, else
/// `NATS_CREDENTIALS` (read now, so that a bad file is refused by name).
async fn relay_auth(
    own: Option<&EndpointCredentials>,
    relay: Option<&std::path::Path>,
) -> anyhow::Result<Auth> {
    let fallback = match (own, relay) {
        (None, Some(path)) => Some(NatsCredentials::load(path).await.map_err(ConfigError)?),
        _ => None,
    };
    Ok(Auth::of(own, fallback.as_ref()))
}

pub(super) async fn add(args: AddArgs) -> anyhow::Result<()> {
    let given = match (&args.secret, &args.secret_file) {
        (Some(raw), _) => Some((raw.clone(), "--secret")),
        (None, Some(path)) => Some((read_secret_file("--secret-file", path)?, "--secret-file")),
        (None, None) => None,
    };
    let new = parse_new(
        &args,
        given.as_ref().map(|(raw, flag)| (raw.as_str(), *flag)),
    )
    .map_err(usage)?;
    let keys = args.secrets.keyring()?;
    let own = args.credentials.read().map_err(usage)?;
    match (&new.nats, args.credentials.given()) {
        (Some(target), _) => check_nats(&args, new.url.as_str(), target, own.as_ref()).await?,
        (None, Some(flag)) => {
            return Err(usage(SpecError {
                flag,
                message: format!("is for nats:// endpoints only, not {}", new.url.as_str()),
            }));
        }
        (None, None) => {}
    }
    let secret = new.secret.clone();
    let max = args.max_endpoints;
    let endpoint = with_conn(&args.db, move |conn| {
        // One transaction: an endpoint never exists without the credentials
        // it was added with (a relay could otherwise connect with the
        // fallback meanwhile).
        at_rest::require_key_where_sealed(conn, &keys).map_err(refused_without_key)?;
        conn.transaction(|conn| {
            let endpoint = store::add_within(conn, &new, max, &keys)?;
            if own.is_some() {
                nats_credentials::set(conn, endpoint.id, own.as_ref(), &keys)?;
            }
            Ok::<_, store::StoreError>(endpoint)
        })
        .map_err(anyhow::Error::from)
    })
    .await?;
    if !args.json {
        println!(
            "added endpoint {} (id {}): {} for {}",
            endpoint.name,
            endpoint.id,
            endpoint.url,
            events_of(&endpoint)
        );
    }
    // A secret the operator chose is theirs already: printed only when made here.
    if given.is_none() || args.json {
        print_secret(&endpoint, &secret, args.json)?;
    }
    Ok(())
}
