//! Secrets sealed at rest (`SECRETS_KEY`): what `endpoints` and `sources`
//! hold is sealed, every delivery and inbound message still verifies with
//! the plaintext secret, rows written before the key keep working until
//! `secrets seal` converts them, and a value out of its place or without
//! its key is a clear failure, never a silent one.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use diesel::prelude::*;
use diesel::sql_types::Text;
use order_service::api::ApiSettings;
use order_service::at_rest;
use order_service::effects::nats::NatsConnections;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::webhook::{DeliveryOptions, WebhookSender};
use order_service::effects::{self, JobHandler};
use order_service::endpoints::{EndpointCredentials, EndpointId, nats_credentials, target, upkeep};
use order_service::inbox::verify::stripe_signature;
use order_service::schema::{inbox_messages, jobs_all};
use order_service::sealed::{Keyring, SecretsKey};
use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::endpoint_delivery::{done_webhooks, place, reference_verify};
use crate::inbox::{STRIPE_SECRET, stripe_event};
use crate::support::app::{TestApp, spawn_app_with, test_api_settings};
use crate::support::http::{Answer, HttpSink};
use crate::support::{RunningRelay, TestDb, init_tracing, spawn_relay, test_settings, wait_until};

/// A fresh `SECRETS_KEY`, base64 as `openssl rand -base64 32` prints it.
fn new_key() -> String {
    STANDARD.encode(Sha256::digest(fastrand::u64(..).to_le_bytes()))
}

fn keyring(current: &str, previous: Option<&str>) -> Keyring {
    let previous = previous.map(|p| SecretsKey::parse(p).expect("a key"));
    Keyring::new(Some(SecretsKey::parse(current).expect("a key")), previous).expect("keys")
}

/// `outbox-relay ARGS` against `url`, with exactly these keys in its
/// environment.
fn cli(url: &str, key: Option<&str>, previous: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    command
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("SECRETS_KEY")
        .env_remove("SECRETS_KEY_PREVIOUS");
    for (name, value) in [("SECRETS_KEY", key), ("SECRETS_KEY_PREVIOUS", previous)] {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    command.output().expect("run outbox-relay")
}

#[track_caller]
fn succeeded(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The `secret` a `--json` add or rotation printed.
#[track_caller]
fn printed_secret(output: &Output) -> String {
    let json: Value = serde_json::from_str(&succeeded(output)).expect("JSON");
    json["secret"].as_str().expect("a secret").to_owned()
}

/// Adds `erp` (to `sink`) and the Stripe source `stripe` with the CLI.
fn add_with_cli(url: &str, key: Option<&str>, sink: &HttpSink) -> String {
    let endpoint = cli(
        url,
        key,
        None,
        &[
            "endpoints",
            "add",
            "--name",
            "erp",
            "--url",
            sink.url().as_str(),
            "--allow-http",
            "--json",
        ],
    );
    let source = cli(
        url,
        key,
        None,
        &[
            "sources",
            "add",
            "--name",
            "stripe",
            "--kind",
            "stripe",
            "--secret",
            STRIPE_SECRET,
            "--json",
        ],
    );
    assert_eq!(printed_secret(&source), STRIPE_SECRET);
    printed_secret(&endpoint)
}

#[derive(QueryableByName, Debug)]
struct StoredValue {
    #[diesel(sql_type = Text)]
    place: String,
    #[diesel(sql_type = Text)]
    value: String,
}

/// Every secret column of every row, as stored.
fn stored(conn: &mut PgConnection) -> Vec<StoredValue> {
    diesel::sql_query(
        "SELECT 'endpoints.secret ' || name AS place, secret AS value FROM endpoints \
         UNION ALL SELECT 'endpoints.previous_secret ' || name, previous_secret FROM endpoints \
           WHERE previous_secret IS NOT NULL \
         UNION ALL SELECT 'endpoints.nats_credentials ' || name, nats_credentials FROM endpoints \
           WHERE nats_credentials IS NOT NULL \
         UNION ALL SELECT 'sources.secret ' || name, secret FROM sources \
         UNION ALL SELECT 'sources.previous_secret ' || name, previous_secret FROM sources \
           WHERE previous_secret IS NOT NULL \
         ORDER BY 1",
    )
    .load(conn)
    .expect("stored secrets")
}

/// Each stored value is sealed under `key_id`, and no plaintext shows: not
/// the secret, not its `whsec_` tail, not its base64 at any alignment.
#[track_caller]
fn assert_all_sealed(conn: &mut PgConnection, key_id: &str, expected: usize, plaintexts: &[&str]) {
    let values = stored(conn);
    assert_eq!(values.len(), expected, "{values:?}");
    let mut needles: Vec<String> = Vec::new();
    for plain in plaintexts {
        needles.push((*plain).to_owned());
        if let Some(tail) = plain.strip_prefix("whsec_") {
            needles.push(tail.to_owned());
        }
        for skip in 0..3 {
            let encoded = STANDARD.encode(&plain.as_bytes()[skip..]);
            needles.push(encoded[4..encoded.len() - 4].to_owned());
        }
    }
    for StoredValue { place, value } in &values {
        assert!(
            value.starts_with(&format!("enc:v1:{key_id}:")),
            "{place}: {value}"
        );
        for needle in &needles {
            assert!(
                !value.contains(needle.as_str()),
                "{place} shows {needle:?}: {value}"
            );
        }
    }
}

fn key_id(key: &str) -> String {
    SecretsKey::parse(key).expect("a key").id().to_owned()
}

/// A relay delivering `order_webhook` jobs, opening secrets with `keys`.
fn delivery_relay(db: &TestDb, keys: Keyring) -> RunningRelay {
    let sender = WebhookSender::for_endpoints(&DeliveryOptions {
        timeout: Duration::from_secs(30),
        allow_private: true,
        proxy: None,
    })
    .expect("a sender");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers_with_nats(
        db.pool(8),
        None,
        Some(sender),
        ReceiptSettings::default(),
        NatsConnections::default(),
        keys,
    ));
    let worker = format!("sealed-relay-{}", fastrand::u32(..));
    spawn_relay(db, test_settings(&worker, &["order_webhook"]), effects)
}

/// Places an order and waits until `total` deliveries are done.
async fn deliver_one_more(db: &TestDb, keys: Keyring, total: i64) {
    let mut conn = db.conn();
    place(&mut conn);
    let relay = delivery_relay(db, keys);
    wait_until("the delivery is done", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == total
    })
    .await;
    relay.stop().await;
}

async fn post_stripe(app: &TestApp, secret: &str, event_id: &str) -> reqwest::Response {
    let body = stripe_event(event_id, "customer.created", serde_json::json!({}));
    app.client
        .post(app.url("/inbound/stripe"))
        .header("content-type", "application/json")
        .header(
            "stripe-signature",
            stripe_signature(secret, chrono::Utc::now().timestamp(), &body),
        )
        .body(body)
        .send()
        .await
        .expect("POST /inbound/stripe")
}

async fn app_with(keys: Keyring) -> TestApp {
    spawn_app_with(ApiSettings {
        secrets: keys,
        ..test_api_settings()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_nothing_readable_is_stored_and_every_signature_still_verifies() {
    init_tracing();
    let key = new_key();
    let keys = keyring(&key, None);
    let app = app_with(keys.clone()).await;
    let erp = HttpSink::start([], Answer::status(204)).await;
    let secret = add_with_cli(&app.db.url, Some(&key), &erp);
    let mut conn = app.db.conn();
    assert_all_sealed(&mut conn, &key_id(&key), 2, &[&secret, STRIPE_SECRET]);

    deliver_one_more(&app.db, keys.clone(), 1).await;
    reference_verify(&erp.requests()[0], &secret).expect("signed with the plaintext secret");
    let answer = post_stripe(&app, STRIPE_SECRET, "evt_sealed_1").await;
    assert_eq!(answer.status(), StatusCode::OK);

    // Rotations keep the old secret beside the new one: sealed as well.
    let rotated = cli(
        &app.db.url,
        Some(&key),
        None,
        &[
            "endpoints",
            "rotate-secret",
            "erp",
            "--keep-old",
            "1h",
            "--json",
        ],
    );
    let new_secret = printed_secret(&rotated);
    let new_stripe = "whsec_rotated_stripe_secret_0001";
    succeeded(&cli(
        &app.db.url,
        Some(&key),
        None,
        &[
            "sources",
            "rotate-secret",
            "stripe",
            "--secret",
            new_stripe,
            "--keep-old",
            "1h",
        ],
    ));
    crate::inbox::after_source_change().await;
    assert_all_sealed(
        &mut conn,
        &key_id(&key),
        4,
        &[&secret, &new_secret, STRIPE_SECRET, new_stripe],
    );
    deliver_one_more(&app.db, keys, 2).await;
    let request = &erp.requests()[1];
    reference_verify(request, &new_secret).expect("the new secret verifies");
    reference_verify(request, &secret).expect("the old one still does");
    for (signer, event) in [
        (STRIPE_SECRET, "evt_sealed_2"),
        (new_stripe, "evt_sealed_3"),
    ] {
        let answer = post_stripe(&app, signer, event).await;
        assert_eq!(answer.status(), StatusCode::OK, "{event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_rows_keep_working_with_a_key_and_secrets_seal_converts_them_once() {
    init_tracing();
    let key = new_key();
    let keys = keyring(&key, None);
    let app = app_with(keys.clone()).await;
    let erp = HttpSink::start([], Answer::status(204)).await;
    let secret = add_with_cli(&app.db.url, None, &erp);
    let mut conn = app.db.conn();
    // A NATS endpoint with credentials of its own, written before the key.
    let nats_id: i64 = diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, stream, subject_prefix, allow_http) \
         VALUES ('events', 'nats://127.0.0.1:4222', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', \
                 'ORDERS', 'orders', true) RETURNING id",
    )
    .get_result::<Id>(&mut conn)
    .expect("a NATS endpoint")
    .id;
    let token = EndpointCredentials::token("t0ken-of-events").expect("a token");
    nats_credentials::set(&mut conn, nats_id, Some(&token), &Keyring::none()).expect("set");
    let values = stored(&mut conn);
    assert_eq!(values.len(), 4, "{values:?}");
    assert!(
        values.iter().all(|v| !v.value.starts_with("enc:")),
        "{values:?}"
    );

    // Read as they are, with the key configured.
    deliver_one_more(&app.db, keys.clone(), 1).await;
    reference_verify(&erp.requests()[0], &secret).expect("plaintext row signs");
    let answer = post_stripe(&app, STRIPE_SECRET, "evt_plain_1").await;
    assert_eq!(answer.status(), StatusCode::OK);
    let census = at_rest::census(&mut conn).expect("census");
    assert_eq!(census.plaintext, 4);
    let warnings = census.warnings(&keys);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("outbox-relay secrets seal"),
        "{warnings:?}"
    );

    let sealed = succeeded(&cli(&app.db.url, Some(&key), None, &["secrets", "seal"]));
    assert!(
        sealed.starts_with("sealed 4 plaintext secrets and moved 0"),
        "{sealed}"
    );
    let plaintexts = [
        secret.as_str(),
        STRIPE_SECRET,
        "t0ken-of-events",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ];
    assert_all_sealed(&mut conn, &key_id(&key), 4, &plaintexts);
    let again = succeeded(&cli(
        &app.db.url,
        Some(&key),
        None,
        &["secrets", "seal", "--json"],
    ));
    let again: Value = serde_json::from_str(&again).expect("JSON");
    assert_eq!(
        (&again["sealed"], &again["resealed"], &again["unchanged"]),
        (&Value::from(0), &Value::from(0), &Value::from(4)),
        "a second run changes nothing: {again}"
    );
    assert!(
        at_rest::census(&mut conn)
            .expect("census")
            .warnings(&keys)
            .is_empty()
    );

    deliver_one_more(&app.db, keys.clone(), 2).await;
    reference_verify(&erp.requests()[1], &secret).expect("sealed row signs");
    let answer = post_stripe(&app, STRIPE_SECRET, "evt_plain_2").await;
    assert_eq!(answer.status(), StatusCode::OK);
    let opened = nats_credentials::load(&mut conn, nats_id, &keys).expect("read");
    assert_eq!(opened, Ok(Some(token.clone())));

    // A new key: the old one as previous, one run moves every value.
    let new = new_key();
    let moved = succeeded(&cli(
        &app.db.url,
        Some(&new),
        Some(&key),
        &["secrets", "seal"],
    ));
    assert!(
        moved.contains("moved 4 from SECRETS_KEY_PREVIOUS"),
        "{moved}"
    );
    assert_all_sealed(&mut conn, &key_id(&new), 4, &plaintexts);
    let only_new = keyring(&new, None);
    assert_eq!(
        nats_credentials::load(&mut conn, nats_id, &only_new).expect("read"),
        Ok(Some(token))
    );
    deliver_one_more(&app.db, only_new, 3).await;
    reference_verify(&erp.requests()[2], &secret).expect("resealed row signs");
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// The delivery target of the endpoint `name`, as the relay reads it.
fn endpoint_target(conn: &mut PgConnection, name: &str) -> target::Target {
    let id = diesel::sql_query("SELECT id FROM endpoints WHERE name = $1")
        .bind::<Text, _>(name)
        .get_result::<Id>(conn)
        .unwrap_or_else(|e| panic!("endpoint {name}: {e}"))
        .id;
    target::load(conn, Some(EndpointId::new(id)))
        .expect("read")
        .unwrap_or_else(|| panic!("endpoint {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_secret_copied_to_another_row_or_column_does_not_open() {
    init_tracing();
    let key = new_key();
    let keys = keyring(&key, None);
    let db = TestDb::new();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let crm = HttpSink::start([], Answer::status(204)).await;
    for (name, sink) in [("erp", &erp), ("crm", &crm)] {
        succeeded(&cli(
            &db.url,
            Some(&key),
            None,
            &[
                "endpoints",
                "add",
                "--name",
                name,
                "--url",
                sink.url().as_str(),
                "--allow-http",
            ],
        ));
    }
    let mut conn = db.conn();
    diesel::sql_query(
        "UPDATE endpoints SET secret = (SELECT secret FROM endpoints WHERE name = 'erp') \
         WHERE name = 'crm'",
    )
    .execute(&mut conn)
    .expect("copy erp's secret over crm's");
    let target = endpoint_target(&mut conn, "crm");
    let error = target.signing_secrets(&keys).expect_err("does not open");
    assert!(!error.is_missing_key());
    let shown = error.to_string();
    assert!(
        shown.starts_with("the signing secret of endpoint \"crm\" cannot be read")
            && shown.contains("copied from another row or column"),
        "{shown}"
    );

    // The delivery to crm fails for good, saying why; erp's goes out.
    place(&mut conn);
    let relay = delivery_relay(&db, keys.clone());
    wait_until("both deliveries end", Duration::from_secs(30), || {
        jobs_all::table
            .filter(jobs_all::kind.eq("order_webhook"))
            .filter(jobs_all::status.eq_any(["done", "failed"]))
            .count()
            .get_result::<i64>(&mut conn)
            .expect("count")
            == 2
    })
    .await;
    relay.stop().await;
    let failed: Vec<Option<String>> = jobs_all::table
        .filter(jobs_all::status.eq("failed"))
        .select(jobs_all::last_error)
        .load(&mut conn)
        .expect("failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let last_error = failed[0].as_deref().unwrap_or_default();
    assert!(last_error.contains("endpoint \"crm\""), "{last_error}");
    assert!(
        crm.requests().is_empty(),
        "nothing was sent with a moved secret"
    );
    assert_eq!(erp.requests().len(), 1);

    // Its own previous_secret column does not open it either.
    diesel::sql_query(
        "UPDATE endpoints SET previous_secret = (SELECT secret FROM endpoints WHERE name = 'erp'), \
                              previous_secret_expires_at = now() + interval '1 hour' \
         WHERE name = 'erp'",
    )
    .execute(&mut conn)
    .expect("copy into previous_secret");
    let target = endpoint_target(&mut conn, "erp");
    let shown = target
        .signing_secrets(&keys)
        .expect_err("moved")
        .to_string();
    assert!(
        shown.starts_with("the previous signing secret of endpoint \"erp\""),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_key_a_sealed_secret_fails_deliveries_and_messages_clearly() {
    init_tracing();
    let key = new_key();
    let app = app_with(Keyring::none()).await;
    let erp = HttpSink::start([], Answer::status(204)).await;
    add_with_cli(&app.db.url, Some(&key), &erp);
    let mut conn = app.db.conn();

    place(&mut conn);
    let relay = delivery_relay(&app.db, Keyring::none());
    let last_error = |conn: &mut PgConnection| {
        jobs_all::table
            .filter(jobs_all::kind.eq("order_webhook"))
            .select(jobs_all::last_error)
            .first::<Option<String>>(conn)
            .expect("the delivery")
    };
    wait_until(
        "the delivery's first attempt fails",
        Duration::from_secs(30),
        || last_error(&mut conn).is_some(),
    )
    .await;
    relay.stop().await;
    let shown = last_error(&mut conn).unwrap_or_default();
    assert!(
        shown.contains("the signing secret of endpoint \"erp\" cannot be read")
            && shown.contains(&format!("sealed under key {}", key_id(&key)))
            && shown.contains("SECRETS_KEY is not set"),
        "{shown}"
    );
    let status: String = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select(jobs_all::status)
        .first(&mut conn)
        .expect("status");
    assert_eq!(status, "pending", "retried once the key is set");
    assert!(erp.requests().is_empty());

    // An inbound message: 503, nothing said of keys, nothing stored.
    let answer = post_stripe(&app, STRIPE_SECRET, "evt_no_key").await;
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = answer.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let text = body.to_string();
    assert!(
        !text.contains("SECRETS_KEY") && !text.contains(&key_id(&key)),
        "{text}"
    );
    let stored: i64 = inbox_messages::table
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(stored, 0);

    // An operator command without the key would write plaintext: refused.
    let refused = cli(
        &app.db.url,
        None,
        None,
        &["sources", "add", "--name", "billing", "--kind", "standard"],
    );
    assert_eq!(refused.status.code(), Some(2));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("holds sealed secrets") && said.contains("SECRETS_KEY"),
        "{said}"
    );
}

#[test]
fn the_upkeep_clears_a_sources_expired_previous_secret() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let key = new_key();
    succeeded(&cli(
        &db.url,
        Some(&key),
        None,
        &[
            "sources",
            "add",
            "--name",
            "stripe",
            "--kind",
            "stripe",
            "--secret",
            STRIPE_SECRET,
        ],
    ));
    succeeded(&cli(
        &db.url,
        Some(&key),
        None,
        &["sources", "rotate-secret", "stripe", "--keep-old", "1h"],
    ));
    diesel::sql_query(
        "UPDATE sources SET previous_secret_expires_at = now() - interval '1 second'",
    )
    .execute(&mut conn)
    .expect("expire the window");
    let upkept = upkeep::run_once(&mut conn, &upkeep::Retention::default()).expect("upkeep");
    assert_eq!(upkept.secrets_cleared, 1);
    let left = stored(&mut conn);
    assert_eq!(left.len(), 1, "only the current secret is left: {left:?}");
}

#[test]
fn the_default_endpoint_is_sealed_and_rewritten_only_when_its_secret_or_key_changes() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let url = url::Url::parse("https://hooks.example.com/orders").expect("a URL");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let default_secret = |conn: &mut PgConnection| {
        diesel::sql_query("SELECT 'default' AS place, secret AS value FROM endpoints")
            .get_result::<StoredValue>(conn)
            .expect("default")
            .value
    };
    // Written before the key: plaintext, as always.
    let id = target::upsert_default(&mut conn, &url, secret, &Keyring::none()).expect("default");
    assert_eq!(default_secret(&mut conn), secret);

    // The first start with a key seals it; the next ones leave it alone.
    let key = new_key();
    let keys = keyring(&key, None);
    target::upsert_default(&mut conn, &url, secret, &keys).expect("default");
    let sealed = default_secret(&mut conn);
    assert_all_sealed(&mut conn, &key_id(&key), 1, &[secret]);
    target::upsert_default(&mut conn, &url, secret, &keys).expect("default");
    assert_eq!(
        default_secret(&mut conn),
        sealed,
        "nothing to change, nothing written"
    );
    let target = target::load(&mut conn, None)
        .expect("read")
        .expect("default");
    assert_eq!(target.id.get(), id);
    assert_eq!(target.signing_secrets(&keys).expect("opens"), secret);

    // A new WEBHOOK_SECRET, and a new key, are each written at once.
    let rotated = "whsec_c2VjcmV0LWtleS1ieXRlcy1mb3ItdGVzdHM=";
    target::upsert_default(&mut conn, &url, rotated, &keys).expect("default");
    let target = target::load(&mut conn, None)
        .expect("read")
        .expect("default");
    assert_eq!(target.signing_secrets(&keys).expect("opens"), rotated);
    let new = new_key();
    let moved = keyring(&new, Some(&key));
    target::upsert_default(&mut conn, &url, rotated, &moved).expect("default");
    assert_all_sealed(&mut conn, &key_id(&new), 1, &[rotated, secret]);

    // NATS credentials written with a key are sealed the same way.
    let nats_id: i64 = diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, stream, subject_prefix, allow_http) \
         VALUES ('events', 'nats://127.0.0.1:4222', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', \
                 'ORDERS', 'orders', true) RETURNING id",
    )
    .get_result::<Id>(&mut conn)
    .expect("a NATS endpoint")
    .id;
    let token = EndpointCredentials::token("t0ken-of-events").expect("a token");
    nats_credentials::set(&mut conn, nats_id, Some(&token), &moved).expect("set");
    let stored: StoredValue = diesel::sql_query(
        "SELECT 'nats' AS place, nats_credentials AS value FROM endpoints WHERE name = 'events'",
    )
    .get_result(&mut conn)
    .expect("credentials");
    assert!(
        stored
            .value
            .starts_with(&format!("enc:v1:{}:", key_id(&new))),
        "{stored:?}"
    );
    assert!(!stored.value.contains("t0ken"), "{stored:?}");
    assert_eq!(
        nats_credentials::load(&mut conn, nats_id, &Keyring::none())
            .expect("read")
            .map_err(|e| e.is_missing_key()),
        Err(true),
        "without the key: an error that says the key is missing"
    );
}
