//! Reconciliation from the outside: `inbox reconcile` and `sources
//! set-api-key` through the real binary, the API key sealed at rest, and
//! the relays' periodic job (`INBOX_RECONCILE_EVERY`).

use std::process::{Command, Output};
use std::time::Duration;

use diesel::prelude::*;
use order_service::at_rest;
use order_service::inbox::reconcile::Reconciler;
use order_service::inbox::reconcile::stripe_events::StripeEvents;
use order_service::inbox::source::{self, SourceKind, SourceMode};
use order_service::schema::sources;
use order_service::sealed::{Keyring, SecretsKey};
use outbox_dev_tools::demo::sinks::stripe_events::{StripeEventLog, payment_succeeded};
use serde_json::Value;

use crate::inbox::{STRIPE_SECRET, TOTAL, now, order_status, place};
use crate::inbox_reconcile::{API_KEY, log_and_source, quick, reconciler, via_of};
use crate::support::app::{TestApp, spawn_app};
use crate::support::process::{BinProcess, Launch};
use crate::support::wait_until;

/// `outbox-relay <args>` against the app's database and `base`.
pub(crate) fn cli(app: &TestApp, base: &url::Url, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .env("DATABASE_URL", &app.db.url)
        .env("STRIPE_API_BASE", base.as_str())
        .env_remove("SECRETS_KEY")
        .output()
        .expect("run outbox-relay")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_prints_its_counts_and_names_what_it_cannot_reconcile() {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    source::add(
        &mut app.db.conn(),
        "keyless",
        SourceKind::Stripe,
        SourceMode::Any,
        STRIPE_SECRET,
        &Keyring::none(),
    )
    .expect("add source");
    let order = place(&app).await;
    log.add(payment_succeeded(
        "evt_1",
        now() - 3 * 86_400,
        order,
        TOTAL,
        "eur",
        "pi_1",
    ));

    let output = cli(
        &app,
        &log.base_url(),
        &[
            "inbox",
            "reconcile",
            "--source",
            "stripe",
            "--since",
            "4d",
            "--json",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let printed: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(printed["fetched"], 1);
    assert_eq!(printed["recovered"], 1);
    assert_eq!(printed["already"], 0);
    assert_eq!(printed["pages"], 1);
    assert_eq!(order_status(&app, order), "paid");
    let listed = cli(&app, &log.base_url(), &["inbox", "list"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("reconcile"),
        "inbox list shows how it came"
    );

    for (source, expected) in [
        ("keyless", "source \"keyless\" has no API key"),
        ("nope", "there is no source named \"nope\""),
    ] {
        let output = cli(
            &app,
            &log.base_url(),
            &["inbox", "reconcile", "--source", source],
        );
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }

    let plain_http = url::Url::parse("http://stripe.example.com:8080").expect("URL");
    assert!(StripeEvents::new(&plain_http, quick()).is_err());
    let output = cli(&app, &plain_http, &["inbox", "reconcile"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("STRIPE_API_BASE") && stderr.contains("only on a loopback address"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_periodic_job_recovers_a_missed_payment() {
    let app = spawn_app().await;
    let log = log_and_source(&app).await;
    let order = place(&app).await;
    log.add(payment_succeeded(
        "evt_missed",
        now(),
        order,
        TOTAL,
        "eur",
        "pi_1",
    ));
    let mut zero = Launch::relay("reconcile-zero", &app.db.url)
        .env("INBOX_RECONCILE_EVERY", "0s")
        .spawn();
    let status = zero.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(2), "a zero interval is refused");
    assert!(
        zero.stderr().contains("INBOX_RECONCILE_EVERY"),
        "{}",
        zero.stderr()
    );

    let (mut relay, _) = BinProcess::start_relay(
        Launch::relay("reconciler", &app.db.url)
            .env("RELAY_KINDS", "inbox_reconcile")
            .env("INBOX_RECONCILE_EVERY", "1s")
            .env("STRIPE_API_BASE", log.base_url().as_str()),
    )
    .await;

    wait_until(
        "the periodic job paid the order",
        Duration::from_secs(30),
        || order_status(&app, order) == "paid",
    )
    .await;
    assert_eq!(via_of(&app, "evt_missed").0, "reconcile");
    relay.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_given_in_a_file_sealed_like_every_secret_and_opened_to_reconcile() {
    let app = spawn_app().await;
    let log = StripeEventLog::start(API_KEY).await.expect("the event log");
    for (name, kind, secret) in [
        ("stripe", SourceKind::Stripe, STRIPE_SECRET),
        (
            "billing",
            SourceKind::Standard,
            crate::inbox::STANDARD_SECRET,
        ),
    ] {
        source::add(
            &mut app.db.conn(),
            name,
            kind,
            SourceMode::Any,
            secret,
            &Keyring::none(),
        )
        .expect("add source");
    }
    let dir = std::env::temp_dir().join(format!("reconcile-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key_file = dir.join("stripe-events.key");
    std::fs::write(&key_file, format!("{API_KEY}\n")).expect("write the key");
    let key_path = key_file.to_string_lossy().into_owned();

    let standard = cli(
        &app,
        &log.base_url(),
        &[
            "sources",
            "set-api-key",
            "billing",
            "--api-key-file",
            &key_path,
        ],
    );
    assert_eq!(standard.status.code(), Some(2), "{standard:?}");
    assert!(
        String::from_utf8_lossy(&standard.stderr).contains("only a stripe source has an API key"),
        "{standard:?}"
    );
    let given = cli(
        &app,
        &log.base_url(),
        &[
            "sources",
            "set-api-key",
            "stripe",
            "--api-key-file",
            &key_path,
        ],
    );
    assert!(given.status.success(), "{given:?}");
    assert!(!String::from_utf8_lossy(&given.stdout).contains(API_KEY));

    // A source added with its key at once; a standard one cannot have one.
    let added = cli(
        &app,
        &log.base_url(),
        &[
            "sources",
            "add",
            "--name",
            "stripe-eu",
            "--kind",
            "stripe",
            "--api-key-file",
            &key_path,
        ],
    );
    assert!(added.status.success(), "{added:?}");
    let refused = cli(
        &app,
        &log.base_url(),
        &[
            "sources",
            "add",
            "--name",
            "hooks",
            "--kind",
            "standard",
            "--api-key-file",
            &key_path,
        ],
    );
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let listed = cli(&app, &log.base_url(), &["sources", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let reconciled: Vec<(&str, bool)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| (s["name"].as_str().unwrap_or(""), s["reconciled"] == true))
        .collect();
    assert_eq!(
        reconciled,
        [("billing", false), ("stripe", true), ("stripe-eu", true)]
    );

    // Five secrets in plaintext: three signing secrets and two API keys.
    let keys = Keyring::with_key(SecretsKey::generate().expect("a key"));
    let mut conn = app.db.conn();
    assert_eq!(at_rest::census(&mut conn).expect("census").plaintext, 5);
    let sealed = at_rest::seal_all(&mut conn, &keys).expect("seal");
    assert_eq!(sealed.sealed, 5, "{sealed:?}");
    let stored: Option<String> = sources::table
        .filter(sources::name.eq("stripe"))
        .select(sources::api_key)
        .first(&mut conn)
        .expect("the source");
    let stored = stored.expect("an API key");
    assert!(
        stored.starts_with("enc:v1:") && !stored.contains(API_KEY),
        "{stored}"
    );

    let order = place(&app).await;
    log.add(payment_succeeded(
        "evt_1",
        now(),
        order,
        TOTAL,
        "eur",
        "pi_1",
    ));
    let error = reconciler(&app, &log, quick())
        .source("stripe", None)
        .await
        .expect_err("sealed, and no key to open it");
    assert!(
        error
            .to_string()
            .starts_with("the provider API key of source \"stripe\" cannot be read"),
        "{error}"
    );
    assert!(
        log.requests().is_empty(),
        "nothing was asked without the key"
    );
    let last_error: Option<String> = order_service::schema::source_reconciliations::table
        .select(order_service::schema::source_reconciliations::last_error)
        .first(&mut app.db.conn())
        .expect("the failure is recorded");
    assert!(
        last_error.is_some_and(|e| e.contains("cannot be read")),
        "the dashboard shows why"
    );
    let with_key = Reconciler {
        keys,
        ..reconciler(&app, &log, quick())
    };
    let report = with_key.source("stripe", None).await.expect("reconciled");
    assert_eq!(report.recovered, 1);
    assert_eq!(order_status(&app, order), "paid");
    let _ = std::fs::remove_dir_all(&dir);
}
