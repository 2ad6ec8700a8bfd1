//! Secrets in plaintext: a process without `SECRETS_KEY` never writes one
//! over sealed ones (`WEBHOOK_URL` included).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use diesel::prelude::*;
use diesel::sql_types::Text;
use sha2::{Digest as _, Sha256};

use crate::support::TestDb;
use crate::support::process::Launch;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const HOOK_URL: &str = "https://hooks.example.com/orders";

fn new_key() -> String {
    STANDARD.encode(Sha256::digest(fastrand::u64(..).to_le_bytes()))
}

#[derive(QueryableByName, Debug, PartialEq, Eq)]
struct Stored {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    secret: String,
}

/// Every endpoint's and source's name and stored secret, in name order.
fn stored(db: &TestDb) -> Vec<Stored> {
    diesel::sql_query(
        "SELECT name, secret FROM endpoints UNION ALL SELECT name, secret FROM sources \
         ORDER BY name",
    )
    .load(&mut db.conn())
    .expect("stored secrets")
}

/// `outbox-relay ARGS` against `db` with `env`, run to its end: its exit
/// code and everything it printed.
async fn run(name: &str, db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut launch = Launch::new(name, args).env("DATABASE_URL", &db.url);
    for (key, value) in env {
        launch = launch.env(key, *value);
    }
    let mut process = launch.spawn();
    let status = process.wait_exit(Duration::from_secs(60)).await;
    (status.code().unwrap_or(-1), process.output())
}

/// `serve` and `relay` (webhook deliveries only) against `db` with `env`.
fn services(db: &TestDb, env: &[(&str, &str)]) -> [Launch; 2] {
    [
        Launch::serve("serve", &db.url),
        Launch::relay("relay", &db.url).env("RELAY_KINDS", "order_webhook"),
    ]
    .map(|mut launch| {
        for (key, value) in env {
            launch = launch.env(key, *value);
        }
        launch
    })
}

/// Waits for a service to exit on its own; its exit code and output.
async fn exit_of(launch: Launch) -> (i32, String) {
    let mut process = launch.spawn();
    let status = process.wait_exit(Duration::from_secs(60)).await;
    (status.code().unwrap_or(-1), process.output())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_url_without_secrets_key_never_rewrites_a_sealed_default_in_plaintext() {
    let db = TestDb::new();
    let key = new_key();
    let webhook = [
        ("WEBHOOK_URL", HOOK_URL),
        ("WEBHOOK_SECRET", SECRET),
        ("WEBHOOK_ALLOW_PRIVATE", "true"),
    ];
    let with_key: Vec<(&str, &str)> = webhook
        .iter()
        .copied()
        .chain([("SECRETS_KEY", key.as_str())])
        .collect();
    let (code, said) = run("migrate-sealed", &db, &["migrate"], &with_key).await;
    assert_eq!(code, 0, "{said}");
    let sealed = stored(&db);
    assert_eq!(sealed.len(), 1, "{sealed:?}");
    assert!(sealed[0].secret.starts_with("enc:v1:"), "{sealed:?}");

    // The same WEBHOOK_URL and WEBHOOK_SECRET, and a new secret, without
    // the key: each process refuses, naming the variables, and the stored
    // secret stays sealed, as it was.
    let rotated = [
        ("WEBHOOK_URL", HOOK_URL),
        (
            "WEBHOOK_SECRET",
            "whsec_c2VjcmV0LWtleS1ieXRlcy1mb3ItdGVzdHM=",
        ),
    ];
    let refused = |what: &str, (code, said): (i32, String)| {
        assert_eq!(code, 2, "{what}: {said}");
        assert!(
            said.contains("WEBHOOK_URL and WEBHOOK_SECRET would write the secret of the endpoint")
                && said.contains("SECRETS_KEY is not set"),
            "{what}: {said}"
        );
        assert!(!said.contains(SECRET), "{what} shows the secret: {said}");
        assert_eq!(
            stored(&db),
            sealed,
            "{what}: the stored secret is untouched"
        );
    };
    for env in [&webhook[..], &rotated[..]] {
        let [serve, relay] = services(&db, env);
        refused(
            "migrate",
            run("migrate-no-key", &db, &["migrate"], env).await,
        );
        refused("serve", exit_of(serve).await);
        refused("relay", exit_of(relay).await);
    }

    // Where nothing is sealed, a process without a key writes `default` as
    // it always did.
    let plain = TestDb::new();
    let (code, said) = run("migrate-plain", &plain, &["migrate"], &webhook).await;
    assert_eq!(code, 0, "{said}");
    assert_eq!(stored(&plain)[0].secret, SECRET);
}
