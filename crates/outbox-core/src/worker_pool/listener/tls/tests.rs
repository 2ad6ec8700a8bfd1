//! How the LISTEN connection reads libpq's TLS settings.

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(url: &str) -> ListenTarget {
    ListenTarget::parse(url, &no_env).expect("parses")
}

/// Any file that exists: parsing checks only that a root file is there.
const SNAKEOIL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");

#[test]
fn no_sslmode_means_prefer_without_verification_as_in_libpq() {
    let t = parse("postgres://u@db.example:5432/app");
    assert_eq!(t.mode, SslMode::Prefer);
    assert_eq!(t.attempts, Attempts::TlsThenPlain);
    assert_eq!(t.verify, Verify::Nothing);
}

#[test]
fn each_sslmode_maps_to_its_attempts_and_checks() {
    let cases = [
        ("disable", Attempts::PlainOnly, Verify::Nothing),
        ("allow", Attempts::PlainThenTls, Verify::Nothing),
        ("prefer", Attempts::TlsThenPlain, Verify::Nothing),
        ("require", Attempts::TlsOnly, Verify::Nothing),
    ];
    for (mode, attempts, verify) in cases {
        let t = parse(&format!("postgres://u@db.example/app?sslmode={mode}"));
        assert_eq!(t.mode.as_str(), mode);
        assert_eq!((t.attempts, t.verify), (attempts, verify), "{mode}");
    }
    let root = format!("sslrootcert={SNAKEOIL}");
    let t = parse(&format!(
        "postgres://db.example/app?sslmode=verify-ca&{root}"
    ));
    assert_eq!((t.attempts, t.verify), (Attempts::TlsOnly, Verify::Chain));
    let t = parse(&format!(
        "postgres://db.example/app?sslmode=verify-full&{root}"
    ));
    assert_eq!(
        (t.attempts, t.verify),
        (Attempts::TlsOnly, Verify::ChainAndName)
    );
}

#[test]
fn require_with_a_root_certificate_checks_the_chain_like_verify_ca() {
    let t = parse(&format!(
        "postgres://db.example/app?sslmode=require&sslrootcert={SNAKEOIL}"
    ));
    assert_eq!(t.verify, Verify::Chain);
    assert_eq!(t.roots, Roots::File(PathBuf::from(SNAKEOIL)));
}

#[test]
fn the_tls_parameters_are_taken_out_and_the_rest_kept_for_tokio_postgres() {
    let t = parse(&format!(
        "postgres://u:pw@db.example:6543/app?application_name=relay&sslmode=verify-full\
         &sslrootcert={SNAKEOIL}&sslcert=/nope.crt&sslkey=/nope.key&connect_timeout=5"
    ));
    let config = t.config(tokio_postgres::config::SslMode::Require);
    assert_eq!(config.get_application_name(), Some("relay"));
    assert_eq!(
        config.get_connect_timeout(),
        Some(&std::time::Duration::from_secs(5))
    );
    assert_eq!(config.get_ports(), &[6543]);
    assert_eq!(config.get_dbname(), Some("app"));
    assert_eq!(
        config.get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    // A client certificate whose file does not exist is not sent (libpq).
    assert!(t.client_cert.is_none());
}

#[test]
fn disable_checks_nothing_even_with_a_root_certificate_at_hand() {
    let t = parse(&format!(
        "postgres://db.example/app?sslmode=disable&sslrootcert={SNAKEOIL}"
    ));
    assert_eq!(
        (t.attempts, t.verify),
        (Attempts::PlainOnly, Verify::Nothing)
    );
    // The root file (not a certificate here) is not even read.
    t.connector().expect("a connector");
}

#[test]
fn the_last_of_a_repeated_parameter_wins() {
    let t = parse("postgres://db.example/app?sslmode=disable&sslmode=require");
    assert_eq!(t.mode, SslMode::Require);
}

#[test]
fn pgsslmode_and_pgsslrootcert_apply_when_the_url_says_nothing() {
    let env = |k: &str| match k {
        "PGSSLMODE" => Some("verify-ca".to_owned()),
        "PGSSLROOTCERT" => Some(SNAKEOIL.to_owned()),
        _ => None,
    };
    let t = ListenTarget::parse("postgres://db.example/app", &env).expect("parses");
    assert_eq!((t.mode, t.verify), (SslMode::VerifyCa, Verify::Chain));
    let t = ListenTarget::parse("postgres://db.example/app?sslmode=disable", &env).expect("parses");
    assert_eq!(t.mode, SslMode::Disable, "the URL wins over PGSSLMODE");
}

#[test]
fn verify_modes_without_a_root_certificate_are_refused_with_the_reason() {
    let error = ListenTarget::parse("postgres://db.example/app?sslmode=verify-full", &no_env)
        .expect_err("no root certificate");
    assert!(
        format!("{error:#}").contains("needs a root certificate"),
        "{error:#}"
    );
    let error = ListenTarget::parse(
        "postgres://db.example/app?sslmode=verify-ca&sslrootcert=/no/such/root.crt",
        &no_env,
    )
    .expect_err("missing file");
    assert!(
        format!("{error:#}").contains("/no/such/root.crt does not exist"),
        "{error:#}"
    );
}

#[test]
fn a_missing_root_file_is_ignored_by_the_modes_that_do_not_need_one() {
    let t = parse("postgres://db.example/app?sslmode=require&sslrootcert=/no/such/root.crt");
    assert_eq!((t.roots, t.verify), (Roots::None, Verify::Nothing));
}

#[test]
fn an_unknown_sslmode_is_an_error_naming_it() {
    let error = ListenTarget::parse("postgres://db.example/app?sslmode=verify", &no_env)
        .expect_err("unknown mode");
    assert!(format!("{error}").contains("\"verify\""), "{error}");
}

#[test]
fn system_roots_go_with_verify_full_only() {
    let t = parse("postgres://db.example/app?sslmode=verify-full&sslrootcert=system");
    assert_eq!((t.roots, t.verify), (Roots::System, Verify::ChainAndName));
    assert!(
        ListenTarget::parse(
            "postgres://db.example/app?sslmode=require&sslrootcert=system",
            &no_env
        )
        .is_err()
    );
}

#[test]
fn a_unix_socket_never_uses_tls() {
    let t = parse("postgres://u@%2Fvar%2Frun%2Fpostgresql/app?sslmode=require");
    assert_eq!(t.attempts, Attempts::PlainOnly);
}

#[test]
fn a_key_value_string_is_passed_through() {
    let t = parse("host=db.example dbname=app sslmode=require");
    assert_eq!(t.mode, SslMode::Require);
    assert_eq!(
        t.config(tokio_postgres::config::SslMode::Require)
            .get_dbname(),
        Some("app")
    );
}

#[test]
fn a_connector_builds_without_a_root_certificate() {
    parse("postgres://db.example/app?sslmode=require")
        .connector()
        .expect("a connector");
}

#[test]
fn a_query_value_keeps_its_encoding() {
    let t = parse("postgres://db.example/app?sslmode=require&options=-c%20lock_timeout%3D5s");
    assert_eq!(
        t.config(tokio_postgres::config::SslMode::Require)
            .get_options(),
        Some("-c lock_timeout=5s")
    );
}

#[test]
fn a_multi_host_url_keeps_every_host_and_asks_for_a_writable_one() {
    use tokio_postgres::config::{Host, TargetSessionAttrs};
    let t = parse(
        "postgres://u:pw@10.0.0.1:5433,db2.example:5434/app?target_session_attrs=primary&sslmode=require&application_name=relay",
    );
    assert_eq!(t.mode, SslMode::Require);
    let config = t.config(tokio_postgres::config::SslMode::Require);
    assert_eq!(
        config.get_hosts(),
        &[
            Host::Tcp("10.0.0.1".to_owned()),
            Host::Tcp("db2.example".to_owned())
        ]
    );
    assert_eq!(config.get_ports(), &[5433, 5434]);
    assert_eq!(config.get_application_name(), Some("relay"));
    // LISTEN needs the primary whatever the URL asks of the pool (`primary`
    // is libpq's, unknown to tokio-postgres, and taken out).
    assert_eq!(
        config.get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
    let single = parse("postgres://db.example/app");
    assert_eq!(
        single
            .config(tokio_postgres::config::SslMode::Disable)
            .get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
}
