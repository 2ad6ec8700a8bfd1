//! The signed receipt link of the emails: followed from a real email it
//! fetches the PDF; changed, re-encoded or expired, it is refused with a page
//! that says why (403, 410), before the database is asked.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use order_service::effects::email::{EmailConfig, Mailer};
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::{self, JobHandler};
use order_service::links::{ReceiptLinks, unix_now};
use reqwest::StatusCode;
use serde_json::Value;

use order_service::api::RateLimit;
use order_service::client_addr::TrustedProxies;

use crate::support::app::{
    TestApp, error_of, spawn_app, spawn_app_with, test_api_settings, test_receipt_links,
};
use crate::support::smtp::SmtpSink;
use crate::support::{count, order_json, spawn_relay, test_settings, wait_until};

/// Places an order over the API and lets a relay send its confirmation and
/// render its receipt; returns the order id and the receipt link of the
/// email's text part.
async fn order_with_emailed_link(app: &TestApp, sink: &SmtpSink) -> (i64, url::Url) {
    let placed = app.post_order(&order_json("Ada Lovelace"), None).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let order: Value = placed.json().await.expect("JSON");
    let id = order["id"].as_i64().expect("an id");

    let mailer = Mailer::new(&EmailConfig {
        smtp_url: sink.url(),
        mail_from: "Shop <orders@shop.example>".to_owned(),
        public_base_url: app.url("/"),
        receipt_links: Some(test_receipt_links()),
    })
    .expect("mailer");
    let executor: Arc<dyn JobHandler> = Arc::new(effects::workers(
        app.db.pool(4),
        Some(mailer),
        None,
        ReceiptSettings::default(),
    ));
    let relay = spawn_relay(
        &app.db,
        test_settings("links", &["confirmation_email", "receipt_pdf"]),
        executor,
    );
    let mut conn = app.db.conn();
    wait_until(
        "the email sent and the receipt rendered",
        Duration::from_secs(30),
        || count(&mut conn, "done") == 2,
    )
    .await;
    relay.stop().await;

    let mails = sink.mails();
    assert_eq!(mails.len(), 1);
    let text = mails[0].part("text/plain").expect("a text part");
    let link = text
        .split_whitespace()
        .find(|word| word.contains("/receipt.pdf"))
        .unwrap_or_else(|| panic!("no receipt link in\n{text}"));
    (id, url::Url::parse(link).expect("the link is a URL"))
}

fn param(url: &url::Url, name: &str) -> String {
    url.query_pairs()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no {name} in {url}"))
}

fn with_params(url: &url::Url, expires: &str, signature: &str) -> String {
    let mut url = url.clone();
    url.query_pairs_mut()
        .clear()
        .append_pair("expires", expires)
        .append_pair("signature", signature);
    url.to_string()
}

/// `path` fetched as a script would follow a link: JSON errors, no API key.
async fn get_json(app: &TestApp, path: &str) -> reqwest::Response {
    crate::support::app::http_client()
        .get(app.url(path))
        .send()
        .await
        .expect("GET")
}

/// As a customer's browser opens an email's link: with no API key.
async fn get_html(_app: &TestApp, url: &str) -> reqwest::Response {
    crate::support::app::http_client()
        .get(url)
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .send()
        .await
        .expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_in_a_real_email_fetches_the_receipt_and_a_changed_one_is_refused() {
    let app = spawn_app().await;
    let sink = SmtpSink::start().await;
    let (id, link) = order_with_emailed_link(&app, &sink).await;
    let (expires, signature) = (param(&link, "expires"), param(&link, "signature"));
    let ttl = test_receipt_links().ttl().as_secs();
    let expires_at: u64 = expires.parse().expect("unix seconds");
    assert!(
        expires_at.abs_diff(unix_now() + ttl) < 120,
        "expires {expires_at}: 30 days from now"
    );

    // As written into the email, followed by a browser.
    let followed = get_html(&app, link.as_str()).await;
    assert_eq!(followed.status(), StatusCode::OK);
    assert_eq!(followed.headers()["content-type"], "application/pdf");
    assert_eq!(followed.headers()["cache-control"], "no-store");
    let pdf = followed.bytes().await.expect("body");
    assert!(pdf.starts_with(b"%PDF-"), "a PDF");

    // One character of the signature changed.
    let mut flipped = signature.clone().into_bytes();
    flipped[3] = if flipped[3] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).expect("ASCII");
    // The same bytes, in standard base64 with padding and in hex.
    let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&signature)
        .expect("base64url");
    let padded = base64::engine::general_purpose::STANDARD.encode(&tag);
    let hexed = hex::encode(&tag);
    let refused = [
        (
            "a changed signature",
            with_params(&link, &expires, &flipped),
        ),
        (
            "a later expiry",
            with_params(&link, &(expires_at + 86_400).to_string(), &signature),
        ),
        ("standard base64", with_params(&link, &expires, &padded)),
        ("hex", with_params(&link, &expires, &hexed)),
        (
            "no signature",
            format!("{}?expires={expires}", app.url(link.path())),
        ),
        (
            "another order",
            format!(
                "{}?{}",
                app.url(&format!("/orders/{}/receipt.pdf", id + 1)),
                link.query().unwrap_or_default()
            ),
        ),
    ];
    for (what, url) in &refused {
        let response = get_html(&app, url).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{what}: {url}");
        assert!(
            response.headers()["content-type"]
                .to_str()
                .expect("ASCII")
                .starts_with("text/html"),
            "{what}"
        );
        assert_eq!(response.headers()["cache-control"], "no-store", "{what}");
        let page = response.text().await.expect("page");
        assert!(
            page.contains("This receipt link is not valid"),
            "{what}: {page}"
        );
        assert!(page.len() < 2_000, "a small page: {page}");
        for leak in ["panicked", "Error(", "diesel", "HMAC", LINK_KEY_PREFIX] {
            assert!(!page.contains(leak), "{what}: {leak} in {page}");
        }
    }
    // The same refusal for an API client, as the API's JSON error.
    let json = get_json(&app, &refused[0].1[app.url("").len()..]).await;
    let error = error_of(json, StatusCode::FORBIDDEN).await;
    assert_eq!(error["code"], "invalid_link");
    app.stop().await;
}

/// The start of the tests' key, which no page may show: derived from the key,
/// so the check follows it if the key changes.
const LINK_KEY_PREFIX: &str = match crate::support::app::LINK_SIGNING_KEY.split_at_checked(17) {
    Some((prefix, _)) => prefix,
    None => crate::support::app::LINK_SIGNING_KEY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_link_is_gone_with_a_page_saying_so() {
    let app = spawn_app().await;
    // Signed with the server's key 31 days ago: genuine, but past its 30 days.
    let links = test_receipt_links();
    let old = links.sign(1, unix_now() - 31 * 24 * 3600);
    let path = format!("/orders/1/receipt.pdf?{}", old.query());

    let page = get_html(&app, &app.url(&path)).await;
    assert_eq!(page.status(), StatusCode::GONE);
    assert_eq!(page.headers()["cache-control"], "no-store");
    let page = page.text().await.expect("page");
    assert!(page.contains("This receipt link has expired"), "{page}");
    assert!(page.contains("Ask the shop for a new one"), "{page}");

    let error = error_of(get_json(&app, &path).await, StatusCode::GONE).await;
    assert_eq!(error["code"], "link_expired");
    // Expired and signed with another key: refused as not genuine, so an
    // expired answer is only ever about a link the server made.
    let other = ReceiptLinks::new(&[1; 32], links.ttl()).expect("key");
    let forged = other.sign(1, unix_now() - 31 * 24 * 3600);
    let response = get_json(&app, &format!("/orders/1/receipt.pdf?{}", forged.query())).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    app.stop().await;
}

/// A key other than the tests' current one, as an older key in a rotation.
const OLD_LINK_KEY: &[u8] = b"an-older-link-key-of-32-bytes-or-more";

/// The receipt of order 1 (which does not exist) fetched with `link`: a link
/// that holds gets as far as the database (404); one that does not is 403.
async fn fetch(app: &TestApp, query: &str) -> (StatusCode, String) {
    let response = get_json(app, &format!("/orders/1/receipt.pdf?{query}")).await;
    let status = response.status();
    let body: Value = response.json().await.expect("a JSON error");
    (
        status,
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_of_a_previous_key_work_only_while_it_is_listed() {
    let old = ReceiptLinks::new(OLD_LINK_KEY, test_receipt_links().ttl()).expect("key");
    let link = old.sign(1, unix_now());
    assert_eq!(link.kid, order_service::links::key_id(OLD_LINK_KEY));
    assert!(link.query().contains(&format!("kid={}", link.kid)));

    // Rotated: the current key signs, the old one is still listed.
    let mut settings = test_api_settings();
    settings.receipt_links = Some(
        test_receipt_links()
            .with_previous([OLD_LINK_KEY])
            .expect("previous"),
    );
    let rotating = spawn_app_with(settings).await;
    let (status, code) = fetch(&rotating, &link.query()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::NOT_FOUND, "order_not_found")
    );
    // The old key's link with its kid removed is checked with the current
    // key (as a link from before key ids), and fails.
    let no_kid = format!("expires={}&signature={}", link.expires, link.signature);
    let (status, code) = fetch(&rotating, &no_kid).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::FORBIDDEN, "invalid_link")
    );
    rotating.stop().await;

    // The old key dropped from the list: its links stop working.
    let rotated = spawn_app().await;
    let (status, code) = fetch(&rotated, &link.query()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::FORBIDDEN, "invalid_link")
    );
    // Links signed by the current key before links carried a kid still work,
    // and so do new ones.
    let current = test_receipt_links().sign(1, unix_now());
    let without_kid = format!(
        "expires={}&signature={}",
        current.expires, current.signature
    );
    assert_eq!(fetch(&rotated, &without_kid).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        fetch(&rotated, &current.query()).await.0,
        StatusCode::NOT_FOUND
    );
    // A kid naming the current key's id but with another key's signature.
    let wrong = format!(
        "expires={}&kid={}&signature={}",
        link.expires, current.kid, link.signature
    );
    assert_eq!(fetch(&rotated, &wrong).await.0, StatusCode::FORBIDDEN);
    rotated.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_past_the_links_lifetime_is_refused_though_the_signature_holds() {
    let app = spawn_app().await;
    // The server's own key, but a signer whose TTL is a year.
    let key = crate::support::app::LINK_SIGNING_KEY.as_bytes();
    let year = ReceiptLinks::new(key, Duration::from_secs(365 * 24 * 3600)).expect("key");
    let far = year.sign(1, unix_now());
    let (status, code) = fetch(&app, &far.query()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::FORBIDDEN, "invalid_link")
    );
    let without_kid = format!("expires={}&signature={}", far.expires, far.signature);
    assert_eq!(fetch(&app, &without_kid).await.0, StatusCode::FORBIDDEN);
    // A minute of clock skew past the TTL is tolerated.
    let ttl = test_receipt_links().ttl();
    let skewed = ReceiptLinks::new(key, ttl + Duration::from_secs(60)).expect("key");
    let near = skewed.sign(1, unix_now());
    assert_eq!(fetch(&app, &near.query()).await.0, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_requests_are_limited_per_client_address() {
    let mut settings = test_api_settings();
    settings.address_limit = Some("3/m".parse::<RateLimit>().expect("valid"));
    settings.trusted_proxies = TrustedProxies::parse("127.0.0.1/32").expect("valid");
    let app = spawn_app_with(settings).await;
    let link = test_receipt_links().sign(1, unix_now());
    let get = |from: &'static str| {
        crate::support::app::http_client()
            .get(app.url(&format!("/orders/1/receipt.pdf?{}", link.query())))
            .header("x-forwarded-for", from)
            .send()
    };
    // Genuine links spend the budget too: a link is a key anyone holds.
    for _ in 0..3 {
        assert_eq!(
            get("203.0.113.9").await.expect("GET").status(),
            StatusCode::NOT_FOUND
        );
    }
    let refused = get("203.0.113.9").await.expect("GET");
    assert!(refused.headers().contains_key("retry-after"));
    let error = error_of(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["code"], "rate_limited");
    // Another address has its own budget; loopback is never limited.
    assert_eq!(
        get("203.0.113.10").await.expect("GET").status(),
        StatusCode::NOT_FOUND
    );
    for _ in 0..5 {
        let direct = crate::support::app::http_client()
            .get(app.url(&format!("/orders/1/receipt.pdf?{}", link.query())))
            .send()
            .await
            .expect("GET");
        assert_eq!(direct.status(), StatusCode::NOT_FOUND);
    }
    app.stop().await;
}
