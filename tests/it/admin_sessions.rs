//! The dashboard's sessions and logins, in a real headless Chromium where a
//! browser is what matters: the session key is the server's (kept in the
//! database, so replicas and restarts share it, and not derived from a
//! token), logging out ends the session on the server, and failed logins are
//! throttled per client address behind a trusted proxy. Plain HTTP where the
//! browser adds nothing.

use std::net::SocketAddr;
use std::time::Duration;

use diesel::prelude::*;
use order_service::api::{self, ApiSettings};
use order_service::client_addr::TrustedProxies;
use order_service::server::Application;
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

use crate::admin::{
    OPERATOR, admin_settings, form, http_login, log_in, raw_client, wait_for_text, wait_for_url,
};
use crate::support::app::spawn_app_with;
use crate::support::browser::Browser;

/// Another `serve` on the same database (a replica, or the same one after a
/// restart), on a port of its own.
struct Replica {
    addr: SocketAddr,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Replica {
    async fn start(database_url: &str, settings: ApiSettings) -> Replica {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        let app = Application::build(api::connect(database_url, &settings), settings, listener)
            .expect("build the API");
        let addr = app.local_addr();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        Replica {
            addr,
            shutdown,
            handle,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("stops within 30s")
            .expect("no panic")
            .expect("Ok");
    }
}

/// GET `url` with only `cookie`; the status (a redirect to the login form
/// means the session was not honoured).
async fn status_with_cookie(url: &str, cookie: &str) -> StatusCode {
    raw_client()
        .get(url)
        .header("cookie", cookie)
        .send()
        .await
        .expect("GET")
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_signed_by_the_databases_key_and_end_on_the_server_at_logout_in_a_real_browser()
 {
    let app = spawn_app_with(admin_settings()).await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.viewport(false).await;
    log_in(&browser, &app, OPERATOR).await;
    let value = browser
        .cookie("outbox_admin")
        .await
        .expect("a session cookie");
    let cookie = format!("outbox_admin={value}");
    assert!(!value.contains(OPERATOR), "the token is not in the cookie");

    // The key is random, kept in the database; not the token.
    let keys: Vec<Vec<u8>> = diesel::sql_query("SELECT secret FROM admin_secrets")
        .load::<SecretRow>(&mut app.db.conn())
        .expect("admin_secrets")
        .into_iter()
        .map(|r| r.secret)
        .collect();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].len() >= 32);
    assert!(
        !keys[0]
            .windows(OPERATOR.len())
            .any(|w| w == OPERATOR.as_bytes())
    );

    // A replica on the same database honours the session (cookies are per
    // host, not per port, so the browser sends it there too).
    let replica = Replica::start(&app.db.url, admin_settings()).await;
    browser.goto(&replica.url("/admin")).await;
    wait_for_text(&browser, "Queue health").await;
    // So does the first server after a restart.
    let db = app.stop_keeping_db().await;
    let restarted = Replica::start(&db.url, admin_settings()).await;
    browser.goto(&restarted.url("/admin")).await;
    wait_for_text(&browser, "Queue health").await;
    // A server with the same tokens on another database has another key:
    // the cookie means nothing there, though the token is the same.
    let stranger = spawn_app_with(admin_settings()).await;
    browser.goto(&stranger.url("/admin")).await;
    wait_for_url(&browser, "/admin/login").await;
    assert_eq!(
        status_with_cookie(&stranger.url("/admin"), &cookie).await,
        StatusCode::SEE_OTHER
    );

    // Log out in the browser (on the restarted server): the copy of the
    // cookie taken before is refused everywhere from now on.
    browser.goto(&restarted.url("/admin")).await;
    wait_for_text(&browser, "Queue health").await;
    assert_eq!(
        status_with_cookie(&replica.url("/admin"), &cookie).await,
        StatusCode::OK
    );
    browser.click(".logout button").await;
    wait_for_url(&browser, "/admin/login").await;
    for server in [&restarted, &replica] {
        assert_eq!(
            status_with_cookie(&server.url("/admin"), &cookie).await,
            StatusCode::SEE_OTHER,
            "{}",
            server.addr
        );
    }
    let revoked: i64 =
        diesel::sql_query("SELECT count(*) AS n FROM admin_sessions WHERE revoked_at IS NOT NULL")
            .get_result::<CountRow>(&mut db.conn())
            .expect("count")
            .n;
    assert_eq!(revoked, 1);
    // Putting the old cookie back into the browser does not log it in.
    browser.goto(&replica.url("/admin/login")).await;
    browser
        .execute(&format!(
            "document.cookie = 'outbox_admin={value}; path=/admin';"
        ))
        .await;
    browser.goto(&replica.url("/admin")).await;
    wait_for_url(&browser, "/admin/login").await;

    browser.quit().await;
    stranger.stop().await;
    restarted.stop().await;
    replica.stop().await;
    drop(db);
}

#[derive(QueryableByName)]
struct SecretRow {
    #[diesel(sql_type = diesel::sql_types::Bytea)]
    secret: Vec<u8>,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn behind_a_proxy() -> ApiSettings {
    let mut settings = admin_settings();
    if let Some(admin) = settings.admin.as_mut() {
        admin.trusted_proxies = TrustedProxies::parse("127.0.0.1/32").expect("valid");
    }
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guesser_behind_the_proxy_is_throttled_while_another_client_logs_in_in_a_real_browser() {
    let app = spawn_app_with(behind_a_proxy()).await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.viewport(false).await;

    // The guesser's requests come through our proxy, which names it.
    browser
        .extra_headers(serde_json::json!({"X-Forwarded-For": "198.51.100.7"}))
        .await;
    for _ in 0..10 {
        // A fresh form each time, so the wait below sees this attempt's answer.
        browser.goto(&app.url("/admin/login")).await;
        browser
            .type_into("#token", "a-wrong-guess-of-thirty-two-chars!")
            .await;
        browser.click("main button[type=submit]").await;
        wait_for_text(&browser, "That token is not valid.").await;
    }
    browser.goto(&app.url("/admin/login")).await;
    browser.type_into("#token", OPERATOR).await;
    browser.click("main button[type=submit]").await;
    let refused = wait_for_text(&browser, "too many failed logins").await;
    assert!(refused.contains("429"), "{refused}");

    // Another client behind the same proxy logs in as usual.
    browser
        .extra_headers(serde_json::json!({"X-Forwarded-For": "203.0.113.9"}))
        .await;
    log_in(&browser, &app, OPERATOR).await;

    browser.quit().await;
    app.stop().await;
}

async fn failed_login(app_url: &str, forwarded_for: &str) -> StatusCode {
    raw_client()
        .post(format!("{app_url}/admin/login"))
        .header("x-forwarded-for", forwarded_for)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "a-wrong-guess-of-thirty-two-chars!")]))
        .send()
        .await
        .expect("POST")
        .status()
}

#[tokio::test]
async fn without_a_trusted_proxy_a_forged_forwarding_header_does_not_dodge_the_limit() {
    let app = spawn_app_with(admin_settings()).await;
    let base = app.url("");
    let mut seen = Vec::new();
    for i in 0..11 {
        seen.push(
            failed_login(&base, &format!("198.51.100.{i}"))
                .await
                .as_u16(),
        );
    }
    assert_eq!(seen.iter().filter(|s| **s == 401).count(), 10, "{seen:?}");
    assert_eq!(seen[10], 429, "{seen:?}");
    app.stop().await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_only_the_rightmost_untrusted_hop_counts() {
    let app = spawn_app_with(behind_a_proxy()).await;
    let base = app.url("");
    // The guesser writes a new address on the left each time; our proxy
    // appends the address it really saw on the right.
    for i in 0..10 {
        let forged = format!("192.0.2.{i}, 198.51.100.7");
        assert_eq!(failed_login(&base, &forged).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        failed_login(&base, "192.0.2.99, 198.51.100.7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Everyone else, and the proxy's own address, still log in.
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;
    assert!(cookie.starts_with("outbox_admin="));
    let other = client
        .post(app.url("/admin/login"))
        .header("x-forwarded-for", "203.0.113.9")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", OPERATOR)]))
        .send()
        .await
        .expect("POST");
    assert_eq!(other.status(), StatusCode::SEE_OTHER);
    app.stop().await;
}

#[test]
fn serve_refuses_short_admin_tokens_and_bad_trusted_proxies_naming_the_variable() {
    let run = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
        cmd.arg("serve")
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/nowhere")
            .env("API_ADDR", "127.0.0.1:0")
            .env("LINK_SIGNING_KEY", crate::support::app::LINK_SIGNING_KEY)
            .env_remove("ADMIN_READONLY_TOKEN")
            .env_remove("TRUSTED_PROXIES")
            .envs(env.iter().copied());
        let out = cmd.output().expect("run outbox-relay serve");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[("ADMIN_TOKEN", "op:change-me")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("ADMIN_TOKEN: token 1 is 9 characters"),
        "{err}"
    );
    assert!(
        !err.contains("change-me") && !err.contains("panicked"),
        "{err}"
    );
    let (code, err) = run(&[
        ("ADMIN_TOKEN", OPERATOR),
        ("ADMIN_READONLY_TOKEN", "viewer"),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("ADMIN_READONLY_TOKEN: token 2 is 6"), "{err}");
    let (code, err) = run(&[
        ("ADMIN_TOKEN", OPERATOR),
        ("TRUSTED_PROXIES", "10.0.0.0/8, proxy"),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("TRUSTED_PROXIES") && err.contains("\"proxy\""),
        "{err}"
    );
}

/// `POST /admin/login` with `headers`; the `Set-Cookie` it answers with.
async fn login_cookie(app_url: &str, headers: &[(&str, &str)]) -> String {
    let mut request = raw_client()
        .post(format!("{app_url}/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", OPERATOR)]));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("POST /admin/login");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_owned()
}

fn with_public_url(url: &str) -> ApiSettings {
    let mut settings = admin_settings();
    if let Some(admin) = settings.admin.as_mut() {
        admin.public_base_url = url::Url::parse(url).expect("URL");
    }
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookies_secure_flag_comes_from_the_public_url_not_the_requests_host() {
    // The demo's public URL (plain http on loopback): no `Secure`, whatever a
    // client writes in Host or X-Forwarded-Proto.
    let demo = spawn_app_with(admin_settings()).await;
    for headers in [
        vec![],
        vec![("host", "shop.example.com")],
        vec![("x-forwarded-proto", "https")],
        vec![("host", "shop.example.com"), ("x-forwarded-proto", "https")],
    ] {
        let cookie = login_cookie(&demo.url(""), &headers).await;
        assert!(cookie.starts_with("outbox_admin="), "{headers:?}: {cookie}");
        assert!(!cookie.contains("Secure"), "{headers:?}: {cookie}");
        assert!(cookie.contains("Path=/admin"), "{cookie}");
    }
    demo.stop().await;

    // A public https URL: `Secure` and the `__Host-` prefix, even for a
    // request that says it is plain http to loopback.
    let public = spawn_app_with(with_public_url("https://shop.example.com")).await;
    for headers in [
        vec![],
        vec![("host", "127.0.0.1:8080")],
        vec![("host", "localhost"), ("x-forwarded-proto", "http")],
    ] {
        let cookie = login_cookie(&public.url(""), &headers).await;
        assert!(
            cookie.starts_with("__Host-outbox_admin="),
            "{headers:?}: {cookie}"
        );
        let attributes: Vec<&str> = cookie.split(';').map(str::trim).collect();
        assert!(attributes.contains(&"Secure"), "{cookie}");
        assert!(attributes.contains(&"Path=/"), "{cookie}");
        assert!(
            !attributes.iter().any(|a| a.starts_with("Domain")),
            "{cookie}"
        );
        // The prefixed cookie is the one the dashboard honours; the old
        // name with the same value is not.
        let pair = cookie.split(';').next().expect("name=value");
        assert_eq!(
            status_with_cookie(&public.url("/admin"), pair).await,
            StatusCode::OK
        );
        let unprefixed = pair.trim_start_matches("__Host-");
        assert_eq!(
            status_with_cookie(&public.url("/admin"), unprefixed).await,
            StatusCode::SEE_OTHER
        );
    }
    public.stop().await;

    // Plain http on a public host is still `Secure`: only loopback is exempt.
    let plain = spawn_app_with(with_public_url("http://shop.example.com")).await;
    let cookie = login_cookie(&plain.url(""), &[]).await;
    assert!(cookie.starts_with("__Host-outbox_admin="), "{cookie}");
    assert!(cookie.contains("; Secure"), "{cookie}");
    plain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_idle_past_its_timeout_is_refused_and_sent_to_the_login() {
    let app = spawn_app_with(admin_settings()).await;
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;
    let (other, _) = http_login(&client, &app, OPERATOR).await;
    assert_eq!(
        status_with_cookie(&app.url("/admin"), &cookie).await,
        StatusCode::OK
    );

    // One session was last used 31 minutes ago (the default idle timeout
    // is 30), the other 29: only the first is refused.
    let mut conn = app.db.conn();
    let ids: Vec<IdRow> =
        diesel::sql_query("SELECT id FROM admin_sessions ORDER BY created_at, id")
            .load(&mut conn)
            .expect("sessions");
    assert_eq!(ids.len(), 2);
    let value = cookie.split_once('=').expect("name=value").1;
    let (idle, recent) = if value.starts_with(&ids[0].id) {
        (&ids[0].id, &ids[1].id)
    } else {
        (&ids[1].id, &ids[0].id)
    };
    for (id, minutes) in [(idle, 31), (recent, 29)] {
        diesel::sql_query(
            "UPDATE admin_sessions SET last_used_at = now() - make_interval(mins => $2) \
             WHERE id = $1",
        )
        .bind::<diesel::sql_types::Text, _>(id)
        .bind::<diesel::sql_types::Integer, _>(minutes)
        .execute(&mut conn)
        .expect("age the session");
    }
    let refused = raw_client()
        .get(app.url("/admin/jobs"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(refused.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        refused
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/admin/login")
    );
    assert_eq!(
        status_with_cookie(&app.url("/admin"), &other).await,
        StatusCode::OK
    );
    // Using it moved its last use to now (it was older than a minute).
    let fresh: BoolRow = diesel::sql_query(
        "SELECT last_used_at > now() - interval '1 minute' AS b FROM admin_sessions WHERE id = $1",
    )
    .bind::<diesel::sql_types::Text, _>(recent)
    .get_result(&mut conn)
    .expect("last_used_at");
    assert!(fresh.b, "a use moves last_used_at forward");
    // It stays refused: a refused request does not revive it.
    assert_eq!(
        status_with_cookie(&app.url("/admin"), &cookie).await,
        StatusCode::SEE_OTHER
    );
    app.stop().await;
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
}

#[derive(QueryableByName)]
struct BoolRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    b: bool,
}

#[test]
fn serve_refuses_a_bad_admin_session_idle_naming_the_variable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("serve")
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/nowhere")
        .env("API_ADDR", "127.0.0.1:0")
        .env("LINK_SIGNING_KEY", crate::support::app::LINK_SIGNING_KEY)
        .env("ADMIN_TOKEN", OPERATOR)
        .env("ADMIN_SESSION_IDLE", "soon")
        .output()
        .expect("run outbox-relay serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ADMIN_SESSION_IDLE") && err.contains("soon"),
        "{err}"
    );
}
