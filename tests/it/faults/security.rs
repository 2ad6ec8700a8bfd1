//! Security basics: the webhook signature checked by an HMAC the crate did not
//! compute, and no secret in the logs of a full run at debug level.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use diesel::Connection as _;
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use super::{Sinks, WEBHOOK_SECRET, load_jobs, place_orders, wait_all_terminal};
use crate::support::app::{create_api_key, http_client_with_key};
use crate::support::http::Answer;
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, order_json};
use order_service::api_keys::Scope;

const MINUTE: Duration = Duration::from_secs(60);

/// HMAC-SHA256 by RFC 2104, over plain SHA-256: independent of the `hmac`
/// crate the relay signs with.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0_u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// `openssl dgst -sha256 -hmac KEY` over `message`, as a receiver's shell
/// script would check it; `None` where openssl is not installed.
fn openssl_hmac(key: &str, message: &[u8]) -> Option<String> {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(message).ok()?;
    let output = child.wait_with_output().ok()?;
    // "SHA2-256(stdin)= 5bdc..." (OpenSSL 3) or "(stdin)= 5bdc..." (1.1).
    let text = String::from_utf8(output.stdout).ok()?;
    output
        .status
        .success()
        .then(|| text.split_whitespace().last().map(str::to_owned))
        .flatten()
}

#[test]
fn the_hand_rolled_hmac_matches_rfc_4231() {
    // RFC 4231, test cases 2 and 6 (a key longer than the block).
    assert_eq!(
        hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    assert_eq!(
        hex::encode(hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First"
        )),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_can_verify_the_webhook_signature_with_the_documented_recipe() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sinks = Sinks::start([], Answer::status(200)).await;
    place_orders(&mut conn, 3, 8);
    let (mut relay, _) = BinProcess::start_relay(sinks.relay("signer", &db.url)).await;
    wait_all_terminal(&mut conn, MINUTE).await;
    relay.terminate().await;

    let requests = sinks.http.requests();
    assert_eq!(requests.len(), 3);
    let mut checked_with_openssl = 0;
    for request in &requests {
        let signature = request.header("x-signature").expect("X-Signature");
        let expected = hex::encode(hmac_sha256(WEBHOOK_SECRET.as_bytes(), &request.body));
        assert_eq!(signature, format!("sha256={expected}"));
        if let Some(by_openssl) = openssl_hmac(WEBHOOK_SECRET, &request.body) {
            assert_eq!(by_openssl, expected);
            checked_with_openssl += 1;
        }
        // One byte changed, or another key: the signature no longer matches.
        let mut tampered = request.body.to_vec();
        tampered[0] ^= 1;
        assert_ne!(
            hex::encode(hmac_sha256(WEBHOOK_SECRET.as_bytes(), &tampered)),
            expected
        );
        assert_ne!(
            hex::encode(hmac_sha256(b"another key", &request.body)),
            expected
        );
    }
    eprintln!("signatures checked with openssl: {checked_with_openssl} of 3");
    sinks.check(&mut conn);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_appears_in_the_debug_logs_of_a_full_run() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let tag = format!("{:08x}", fastrand::u32(..));
    let webhook_secret = format!("whsec-LOGCHECK-{tag}");
    let smtp_password = format!("smtpPw{tag}Zq");
    let url_token = format!("tok-URLCHECK-{tag}");
    let db_password = format!("dbPw{tag}Xy");

    // A password in DATABASE_URL, where the server lets us log in with one
    // (it trusts local connections here, so any password will do).
    let mut database_url = url::Url::parse(&db.url).expect("URL");
    let mut secrets = vec![
        webhook_secret.clone(),
        smtp_password.clone(),
        url_token.clone(),
        // lettre's AUTH PLAIN payload, and the password alone, base64-encoded.
        base64::engine::general_purpose::STANDARD.encode(format!("\0mailer\0{smtp_password}")),
        base64::engine::general_purpose::STANDARD.encode(&smtp_password),
        // Both processes get the tests' receipt link key (Launch::serve, ::relay).
        crate::support::app::LINK_SIGNING_KEY.to_owned(),
    ];
    if database_url.password().is_none() {
        let _ = database_url.set_password(Some(&db_password));
        if diesel::PgConnection::establish(database_url.as_str()).is_ok() {
            secrets.push(db_password.clone());
        } else {
            let _ = database_url.set_password(None);
            eprintln!("the server refuses a made-up password: DATABASE_URL is checked without one");
        }
    }
    let database_url = database_url.to_string();
    // The API key the client sends: never logged either.
    let api_key = create_api_key(&db.url, "secrets", &[Scope::All]);
    secrets.push(api_key.clone());

    let sinks = Sinks::start(
        [Answer::status(500).body("receiver trouble")],
        Answer::status(200),
    )
    .await;
    sinks
        .smtp
        .answer_auth_with("235 2.7.0 Authentication successful");
    sinks.smtp.answer_data_with(["451 4.3.0 try again later"]);
    let mut webhook_url = sinks.http.url();
    webhook_url.set_path(&format!("/hooks/{url_token}"));
    webhook_url.set_query(Some(&format!("token={url_token}")));

    let debug = |launch: Launch| launch.env("RUST_LOG", "debug");
    let (mut api, base) =
        BinProcess::start_api(debug(Launch::serve("secrets-api", &database_url))).await;
    let (mut relay, _) = BinProcess::start_relay(debug(
        Launch::relay("secrets-relay", &database_url)
            .env(
                "SMTP_URL",
                format!(
                    "smtp://mailer:{smtp_password}@127.0.0.1:{}",
                    sinks.smtp.port()
                ),
            )
            .env("WEBHOOK_URL", webhook_url.as_str())
            .env("WEBHOOK_SECRET", &webhook_secret),
    ))
    .await;

    let client = http_client_with_key(&api_key);
    for (body, expected) in [
        (order_json("Ada"), StatusCode::CREATED),
        (order_json("Grace"), StatusCode::CREATED),
        (
            serde_json::json!({"customer_name": 3}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let response = client
            .post(format!("{base}/orders"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("JSON"))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), expected);
    }
    wait_all_terminal(&mut conn, MINUTE).await;
    api.terminate().await;
    relay.terminate().await;

    // The run did what it should, with its errors and retries, at debug level.
    let jobs = load_jobs(&mut conn);
    assert!(jobs.iter().all(|j| j.status == "done"), "{jobs:?}");
    assert!(
        jobs.iter().any(|j| j.attempts > 1),
        "a retry happened: {jobs:?}"
    );
    assert!(
        sinks
            .http
            .requests()
            .iter()
            .all(|r| r.path.contains(&url_token))
    );
    for process in [&api, &relay] {
        let log = process.output();
        assert!(log.contains("DEBUG"), "{} logged at debug", process.name());
        for secret in &secrets {
            let hits: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(secret.as_str()))
                .collect();
            assert!(
                hits.is_empty(),
                "{} logged {secret:?}: {hits:#?}",
                process.name()
            );
        }
    }
    for job in &jobs {
        for secret in &secrets {
            let error = job.last_error.as_deref().unwrap_or_default();
            assert!(!error.contains(secret.as_str()), "{error}");
        }
    }
    sinks.check(&mut conn);
    eprintln!(
        "checked {} secrets against {} + {} log lines",
        secrets.len(),
        api.output().lines().count(),
        relay.output().lines().count()
    );
}
