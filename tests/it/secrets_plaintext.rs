//! Secrets in plaintext: a process without `SECRETS_KEY` never writes one
//! over sealed ones (`WEBHOOK_URL` included), `serve` and `relay` say at
//! start that secrets are stored in the clear, and `SECRETS_PLAINTEXT=refuse`
//! refuses plaintext altogether: no start without a key, no start while a
//! stored secret is in plaintext, no plaintext write.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use diesel::prelude::*;
use diesel::sql_types::Text;
use sha2::{Digest as _, Sha256};

use crate::support::TestDb;
use crate::support::process::{BinProcess, Launch};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const HOOK_URL: &str = "https://hooks.example.com/orders";
const NO_KEY_WARNING: &str = "SECRETS_KEY is not set: the signing secrets, NATS credentials and \
                              API keys of endpoints and sources are stored in the clear";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_relay_say_at_start_when_secrets_are_stored_in_the_clear() {
    let db = TestDb::new();
    let key = new_key();
    for (env, warned) in [(vec![], true), (vec![("SECRETS_KEY", key.as_str())], false)] {
        for launch in services(&db, &env) {
            let mut process = launch.spawn();
            let ready = if process.name() == "serve" {
                "serving the order API on "
            } else {
                "relay started"
            };
            process.wait_for_line(ready, Duration::from_secs(60)).await;
            process.terminate().await;
            let said = process.output();
            let warnings: Vec<&str> = said
                .lines()
                .filter(|l| l.contains(NO_KEY_WARNING))
                .collect();
            if warned {
                assert_eq!(warnings.len(), 1, "{}: {said}", process.name());
                assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
                assert!(
                    warnings[0].contains("outbox-relay secrets seal")
                        && warnings[0].contains("SECRETS_PLAINTEXT=refuse"),
                    "{}",
                    warnings[0]
                );
            } else {
                assert!(warnings.is_empty(), "{}: {said}", process.name());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_secrets_plaintext_refuse_nothing_starts_or_writes_without_a_key() {
    let db = TestDb::new();
    let refuse = [("SECRETS_PLAINTEXT", "refuse")];
    let mut outcomes = Vec::new();
    for launch in services(&db, &refuse) {
        outcomes.push(("a service", exit_of(launch).await));
    }
    let writes: [&[&str]; 3] = [
        &["migrate"],
        &[
            "endpoints",
            "add",
            "--name",
            "erp",
            "--url",
            "http://127.0.0.1:9/hooks",
            "--allow-http",
        ],
        &["sources", "add", "--name", "stripe", "--kind", "stripe"],
    ];
    for args in writes {
        let env = [
            ("SECRETS_PLAINTEXT", "refuse"),
            ("WEBHOOK_ALLOW_PRIVATE", "true"),
        ];
        outcomes.push((args[0], run("refused", &db, args, &env).await));
    }
    for (what, (code, said)) in outcomes {
        assert_eq!(code, 2, "{what}: {said}");
        assert!(
            said.contains("SECRETS_PLAINTEXT=refuse, but SECRETS_KEY is not set"),
            "{what}: {said}"
        );
    }
    assert_eq!(stored(&db), vec![], "nothing written");

    // With a key, the same commands write sealed secrets.
    let key = new_key();
    let env = [
        ("SECRETS_PLAINTEXT", "refuse"),
        ("SECRETS_KEY", key.as_str()),
        ("WEBHOOK_ALLOW_PRIVATE", "true"),
    ];
    for args in &writes[1..] {
        let (code, said) = run("sealed", &db, args, &env).await;
        assert_eq!(code, 0, "{said}");
    }
    let written = stored(&db);
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(
        written.iter().all(|s| s.secret.starts_with("enc:v1:")),
        "{written:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_secrets_plaintext_refuse_a_plaintext_secret_stops_the_start_until_sealed() {
    let db = TestDb::new();
    let key = new_key();
    // Written before the setting, without a key: plaintext.
    let (code, said) = run(
        "plaintext",
        &db,
        &[
            "sources", "add", "--name", "stripe", "--kind", "stripe", "--secret", SECRET,
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{said}");
    assert_eq!(stored(&db)[0].secret, SECRET);

    let refuse = [
        ("SECRETS_PLAINTEXT", "refuse"),
        ("SECRETS_KEY", key.as_str()),
    ];
    for launch in services(&db, &refuse) {
        let (code, said) = exit_of(launch).await;
        assert_eq!(code, 2, "{said}");
        assert!(
            said.contains("SECRETS_PLAINTEXT=refuse, but 1 stored secrets are in plaintext")
                && said.contains("secrets seal"),
            "{said}"
        );
        assert!(!said.contains(SECRET), "{said}");
    }

    let (code, said) = run("seal", &db, &["secrets", "seal"], &refuse).await;
    assert_eq!(code, 0, "{said}");
    assert!(stored(&db)[0].secret.starts_with("enc:v1:"));
    let (mut api, _) = BinProcess::start_api(services(&db, &refuse)[0].clone()).await;
    api.terminate().await;
    assert!(!api.output().contains(NO_KEY_WARNING));
}
