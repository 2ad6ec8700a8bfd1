//! Configuration errors of the real binary: clear, named, non-zero, no panic.

use std::process::{Command, Output};

fn relay_with(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    cmd.arg("relay").args(args);
    for var in [
        "DATABASE_URL",
        "SMTP_URL",
        "MAIL_FROM",
        "WEBHOOK_URL",
        "WEBHOOK_SECRET",
        "RELAY_LEASE",
        "RELAY_KINDS",
        "RELAY_CONCURRENCY",
        "METRICS_ADDR",
        "RECEIPT_FONT_PATH",
        "LINK_SIGNING_KEY",
        "RECEIPT_LINK_TTL",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run outbox-relay")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const DB: (&str, &str) = ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/nowhere");

#[test]
fn a_bad_duration_in_the_environment_names_the_variable_and_the_value() {
    let out = relay_with(&[DB, ("RELAY_LEASE", "soon")], &["--kinds", "noop"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("soon") && err.contains("--lease") && err.contains("RELAY_LEASE"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_bad_flag_value_names_the_flag_and_the_value() {
    let out = relay_with(&[DB], &["--kinds", "noop", "--concurrency", "lots"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lots") && err.contains("--concurrency"),
        "{err}"
    );
}

#[test]
fn an_unknown_kind_is_refused_by_name() {
    let out = relay_with(&[DB], &["--kinds", "noop,fax"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("fax"), "{err}");
}

#[test]
fn an_unparsable_database_url_is_refused() {
    let out = relay_with(
        &[("DATABASE_URL", "mysql://localhost/x")],
        &["--kinds", "noop"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("DATABASE_URL") && err.contains("mysql"),
        "{err}"
    );
}

#[test]
fn a_malformed_host_list_or_an_unknown_target_session_attrs_is_refused_naming_the_bad_part() {
    for (url, bad) in [
        (
            "postgres://u:s3cret@127.0.0.1:5433,127.0.0.1:54x4/db",
            "54x4",
        ),
        ("postgres://u@h1,,h3/db", "host 2"),
        (
            "postgres://u@h1,h2/db?target_session_attrs=writable",
            "target_session_attrs=\"writable\"",
        ),
    ] {
        let out = relay_with(&[("DATABASE_URL", url)], &["--kinds", "noop"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("DATABASE_URL") && err.contains(bad),
            "{bad}: {err}"
        );
        assert!(!err.contains("s3cret"), "the password is not shown: {err}");
    }
}

/// WEBHOOK_URL is optional (deliveries go to the endpoint rows; see
/// endpoint_delivery), but given, it is the endpoint `default`, which needs a
/// secret.
#[test]
fn a_relay_given_webhook_url_without_webhook_secret_refuses_to_start() {
    for kinds in ["order_webhook", "receipt_pdf"] {
        let out = relay_with(
            &[DB, ("WEBHOOK_URL", "http://127.0.0.1:9/hook")],
            &["--kinds", kinds],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{kinds}: {err}");
        assert!(
            err.contains("WEBHOOK_SECRET is not set, but WEBHOOK_URL is"),
            "{kinds}: {err}"
        );
    }
}

#[test]
fn a_relay_handling_email_without_smtp_url_refuses_to_start() {
    let out = relay_with(
        &[
            DB,
            ("WEBHOOK_URL", "http://127.0.0.1:9/hook"),
            ("WEBHOOK_SECRET", "s"),
        ],
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SMTP_URL is not set"), "{err}");
}

#[test]
fn a_receipt_font_path_that_cannot_be_read_stops_the_relay_naming_the_variable() {
    let out = relay_with(
        &[DB, ("RECEIPT_FONT_PATH", "/nonexistent/NotoSansCJK.ttc")],
        &["--kinds", "receipt_pdf"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("RECEIPT_FONT_PATH: cannot read /nonexistent/NotoSansCJK.ttc"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_whsec_webhook_secret_that_is_not_base64_stops_the_relay_without_printing_it() {
    let out = relay_with(
        &[
            DB,
            ("WEBHOOK_URL", "http://127.0.0.1:9/hook"),
            ("WEBHOOK_SECRET", "whsec_hunter2!!"),
        ],
        &["--kinds", "order_webhook"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("WEBHOOK_SECRET: secret 1 of 1"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

const MAIL: [(&str, &str); 2] = [
    ("SMTP_URL", "smtp://127.0.0.1:9"),
    ("MAIL_FROM", "Shop <orders@shop.example>"),
];

#[test]
fn a_relay_that_sends_emails_needs_a_link_signing_key_of_32_bytes() {
    let out = relay_with(&[DB, MAIL[0], MAIL[1]], &["--kinds", "confirmation_email"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("LINK_SIGNING_KEY is not set"), "{err}");

    for key in ["", "short-hunter2"] {
        let out = relay_with(
            &[DB, MAIL[0], MAIL[1], ("LINK_SIGNING_KEY", key)],
            &["--kinds", "confirmation_email"],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{key:?}: {err}");
        assert!(err.contains("LINK_SIGNING_KEY is "), "{err}");
        assert!(err.contains("at least 32"), "{err}");
        assert!(
            !err.contains("hunter2") && !err.contains("panicked"),
            "{err}"
        );
    }
    // A relay that sends no email does not need one.
    let out = relay_with(&[DB, ("RELAY_LEASE", "soon")], &["--kinds", "noop"]);
    assert!(
        !stderr(&out).contains("LINK_SIGNING_KEY"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn serve_refuses_a_missing_or_short_link_signing_key_naming_it() {
    for key in [None, Some(""), Some("0123456789abcdef0123456789abcde")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
        cmd.arg("serve")
            .env("DATABASE_URL", DB.1)
            .env("API_ADDR", "127.0.0.1:0")
            .env_remove("LINK_SIGNING_KEY")
            .env_remove("ADMIN_TOKEN");
        if let Some(key) = key {
            cmd.env("LINK_SIGNING_KEY", key);
        }
        let out = cmd.output().expect("run outbox-relay serve");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{key:?}: {err}");
        assert!(err.contains("LINK_SIGNING_KEY"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn serve_refuses_a_fanout_inline_that_is_not_a_count_naming_it() {
    for bad in ["-1", "many", "100001"] {
        let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .arg("serve")
            .env("DATABASE_URL", DB.1)
            .env("API_ADDR", "127.0.0.1:0")
            .env("FANOUT_INLINE", bad)
            .output()
            .expect("run outbox-relay serve");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("FANOUT_INLINE") && err.contains(bad),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_bad_order_payment_window_stops_serve_and_relay_naming_the_variable_and_the_value() {
    for value in ["0", "-5m", "soon", "500ms"] {
        let relay = relay_with(&[DB, ("ORDER_PAYMENT_WINDOW", value)], &["--kinds", "noop"]);
        let mut serve = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
        serve
            .arg("serve")
            .env("DATABASE_URL", DB.1)
            .env("API_ADDR", "127.0.0.1:0")
            .env("ORDER_PAYMENT_WINDOW", value)
            .env_remove("ADMIN_TOKEN");
        let serve = serve.output().expect("run outbox-relay serve");
        for (command, out) in [("relay", relay), ("serve", serve)] {
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{command} {value:?}: {err}");
            assert!(
                err.contains("ORDER_PAYMENT_WINDOW") && err.contains(value),
                "{command} {value:?}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}
