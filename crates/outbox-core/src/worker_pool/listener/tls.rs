//! libpq's TLS settings (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) for
//! the LISTEN connection.
//!
//! The pool connects through libpq (Diesel), which reads these from
//! `DATABASE_URL` itself. tokio-postgres knows only `disable`, `prefer` and
//! `require`, reads no certificate files, and rejects the other parameters as
//! unknown options. So they are taken out of the URL here and given libpq's
//! meaning with rustls; otherwise the listener would either fail where the pool
//! connects (a managed server that demands TLS) or be less strict than the pool
//! (a `verify-full` user would get an unverified LISTEN connection).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use percent_encoding::percent_decode_str;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`, all six of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(raw: &str) -> anyhow::Result<SslMode> {
        Ok(match raw {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => bail!(
                "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ),
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where trusted root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Roots {
    /// No root certificate: TLS (if any) encrypts but authenticates nobody.
    None,
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's store.
    System,
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verify {
    Nothing,
    /// Signed by a trusted root, whatever host it names (`verify-ca`).
    Chain,
    /// Signed by a trusted root and naming the host connected to (`verify-full`).
    ChainAndName,
}

/// How the tokio-postgres connection is attempted, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempts {
    PlainOnly,
    /// `allow`: plain first; TLS only if the server turned plain away.
    PlainThenTls,
    /// `prefer`: TLS first; plain if the server has no TLS or the handshake fails.
    TlsThenPlain,
    TlsOnly,
}

/// The LISTEN connection as `DATABASE_URL` (and libpq's `PGSSL*` variables
/// and `~/.postgresql` files) describe it.
#[derive(Debug)]
pub(super) struct ListenTarget {
    /// `DATABASE_URL` without the TLS parameters; its `ssl_mode` is set per attempt.
    config: tokio_postgres::Config,
    pub(super) mode: SslMode,
    pub(super) roots: Roots,
    pub(super) verify: Verify,
    pub(super) attempts: Attempts,
    client_cert: Option<(PathBuf, PathBuf)>,
}

/// The URL parameters handled here rather than by tokio-postgres.
const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl ListenTarget {
    /// Reads `database_url` the way libpq does: a URL parameter wins over its
    /// `PGSSL*` variable (looked up with `env`), which wins over the default
    /// file under `$HOME/.postgresql`.
    pub(super) fn parse(
        database_url: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<ListenTarget> {
        let mut params: Vec<(String, String)> = Vec::new();
        // Split by hand, not with the `url` crate: libpq's multi-host form
        // (`postgres://u@h1:5432,h2:5433/db`) is not a URL to it.
        let stripped = match split_url_query(database_url) {
            Some((base, query)) => {
                // Raw segments are kept as written: re-encoding would turn a
                // space into `+`, which tokio-postgres reads literally.
                let mut rest = Vec::new();
                for segment in query.split('&') {
                    if segment.is_empty() {
                        continue;
                    }
                    let (key, value) = segment.split_once('=').unwrap_or((segment, ""));
                    let key = percent_decode_str(key).decode_utf8_lossy();
                    if TLS_PARAMS.contains(&key.as_ref()) {
                        let value = percent_decode_str(value).decode_utf8_lossy();
                        // Repeated: the last one counts, as in libpq.
                        params.push((key.into_owned(), value.into_owned()));
                    } else if key != "target_session_attrs" {
                        rest.push(segment.to_owned());
                    }
                }
                if rest.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", rest.join("&"))
                }
            }
            // Not a URL: a `key=value` string, left to tokio-postgres as it is.
            None => database_url.to_owned(),
        };
        let param = |key: &str, var: &str| {
            params
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| env(var).filter(|v| !v.is_empty()))
        };
        let mut config = tokio_postgres::Config::from_str(&stripped)
            .context("DATABASE_URL is not a connection string tokio-postgres can read")?;
        // LISTEN works only on the primary (a standby refuses it, and is sent
        // no NOTIFY), whatever the pool's `target_session_attrs` says: with
        // several hosts, tokio-postgres then tries each until one is writable.
        config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        let default_dir = env("HOME").map(|home| Path::new(&home).join(".postgresql"));
        let default_file = |name: &str| default_dir.as_ref().map(|dir| dir.join(name));

        let mut mode = match param("sslmode", "PGSSLMODE") {
            Some(raw) => SslMode::parse(&raw)?,
            None => match config.get_ssl_mode() {
                tokio_postgres::config::SslMode::Disable => SslMode::Disable,
                tokio_postgres::config::SslMode::Require => SslMode::Require,
                // libpq's default, and tokio-postgres's.
                _ => SslMode::Prefer,
            },
        };
        // libpq never uses TLS over a Unix socket, whatever sslmode says.
        if !config.get_hosts().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| !matches!(h, Host::Tcp(_)))
        {
            mode = SslMode::Disable;
        }

        let roots = match param("sslrootcert", "PGSSLROOTCERT") {
            Some(raw) if raw == "system" => Roots::System,
            Some(path) => Roots::File(PathBuf::from(path)),
            None => default_file("root.crt").map_or(Roots::None, Roots::File),
        };
        // A missing root file is no error unless the mode needs one (libpq).
        let roots = match roots {
            Roots::File(path) if !path.exists() => {
                if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
                    bail!(
                        "sslmode={mode} needs a root certificate, and {} does not exist (set sslrootcert)",
                        path.display()
                    );
                }
                Roots::None
            }
            other => other,
        };
        match (&roots, mode) {
            (Roots::None, SslMode::VerifyCa | SslMode::VerifyFull) => bail!(
                "sslmode={mode} needs a root certificate: set sslrootcert (no $HOME to look in for .postgresql/root.crt)"
            ),
            (Roots::System, m) if m != SslMode::VerifyFull && m != SslMode::Disable => bail!(
                "sslmode={mode} may not be used with sslrootcert=system (use verify-full), as in libpq"
            ),
            _ => {}
        }

        let verify = match mode {
            SslMode::Disable => Verify::Nothing,
            SslMode::VerifyFull => Verify::ChainAndName,
            SslMode::VerifyCa => Verify::Chain,
            // libpq: with a root certificate at hand the weaker modes check the
            // chain too ("require" then acts as "verify-ca").
            _ if matches!(roots, Roots::File(_)) => Verify::Chain,
            _ => Verify::Nothing,
        };
        let attempts = match mode {
            SslMode::Disable => Attempts::PlainOnly,
            SslMode::Allow => Attempts::PlainThenTls,
            SslMode::Prefer => Attempts::TlsThenPlain,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Attempts::TlsOnly,
        };

        let cert = param("sslcert", "PGSSLCERT")
            .map(PathBuf::from)
            .or_else(|| default_file("postgresql.crt"));
        let key = param("sslkey", "PGSSLKEY")
            .map(PathBuf::from)
            .or_else(|| default_file("postgresql.key"));
        // libpq sends a client certificate only when its file exists.
        let client_cert = match (cert, key) {
            (Some(cert), Some(key)) if cert.exists() => Some((cert, key)),
            (Some(cert), None) if cert.exists() => {
                bail!("sslcert={} is set but sslkey is not", cert.display())
            }
            _ => None,
        };

        Ok(ListenTarget {
            config,
            mode,
            roots,
            verify,
            attempts,
            client_cert,
        })
    }

    /// The connection settings for one attempt in tokio-postgres's `mode`.
    pub(super) fn config(&self, mode: tokio_postgres::config::SslMode) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        config.ssl_mode(mode);
        config
    }

    /// A rustls connector for this target. Certificate files are read on every
    /// call, so a reconnect picks up rotated files, as libpq would.
    pub(super) fn connector(&self) -> anyhow::Result<MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let verifier: Arc<dyn ServerCertVerifier> = match self.verify {
            Verify::Nothing => Arc::new(NameNotChecked {
                roots: None,
                algorithms,
            }),
            Verify::Chain => Arc::new(NameNotChecked {
                roots: Some(Arc::new(self.root_store()?)),
                algorithms,
            }),
            Verify::ChainAndName => WebPkiServerVerifier::builder_with_provider(
                Arc::new(self.root_store()?),
                Arc::clone(&provider),
            )
            .build()
            .context("building the certificate verifier")?,
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                    .with_context(|| format!("reading sslcert {}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("reading sslkey {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("sslcert and sslkey do not make a client certificate")?
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn root_store(&self) -> anyhow::Result<RootCertStore> {
        let mut store = RootCertStore::empty();
        match &self.roots {
            Roots::None => {}
            Roots::File(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                    .with_context(|| format!("reading sslrootcert {}", path.display()))?;
                let (added, _) = store.add_parsable_certificates(certs);
                if added == 0 {
                    bail!("sslrootcert {} holds no usable certificate", path.display());
                }
            }
            Roots::System => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    bail!(
                        "sslrootcert=system: no certificate in the system store ({:?})",
                        found.errors
                    );
                }
            }
        }
        Ok(store)
    }
}

/// A `postgres://` or `postgresql://` URL as the part before its query and
/// the query (empty when there is none); `None` for anything else.
fn split_url_query(database_url: &str) -> Option<(&str, &str)> {
    let scheme_ok = ["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| database_url.starts_with(scheme));
    if !scheme_ok {
        return None;
    }
    Some(database_url.split_once('?').unwrap_or((database_url, "")))
}

/// Whether `error` failed in TLS itself (a certificate, a handshake), rather
/// than in reaching the server or being let in: `prefer` retries those in plain.
pub(super) fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        // tokio-rustls wraps rustls errors in io::Error, whose `source()`
        // skips the wrapped error itself.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The two modes that do not check the server's name (libpq's meanings):
/// - `roots: None`, `require` without a root certificate: encrypted, not
///   authenticated. The handshake signatures are still checked, so the session
///   is with whoever holds the key of the certificate shown.
/// - `roots: Some`, `verify-ca`: the chain must end at a trusted root.
#[derive(Debug)]
struct NameNotChecked {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NameNotChecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
