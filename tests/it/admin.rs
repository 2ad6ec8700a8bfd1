//! The operator dashboard under `/admin`: in a real headless Chromium (log in,
//! overview, filter, preview and run a bulk retry, an order's timeline, phone
//! and desktop screenshots), its refusals over plain HTTP, and its speed on a
//! table of a million jobs.

use order_service::orders::order_enqueuer;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use order_service::api::ApiSettings;
use order_service::config::dashboard::{AdminSettings, parse_admin_tokens};
use order_service::orders::place_order;
use order_service::schema::jobs_all;
use reqwest::StatusCode;

use crate::support::app::{TestApp, spawn_app, spawn_app_with, test_api_settings};
use crate::support::browser::Browser;
use crate::support::{make_done, sample_order};

/// Tokens of 32 characters and more, as `serve` requires.
pub(crate) const OPERATOR: &str = "operator-secret-1-0123456789abcdef";
pub(crate) const VIEWER: &str = "viewer-secret-2-0123456789abcdef-x";

pub(crate) fn admin_settings() -> ApiSettings {
    let tokens = parse_admin_tokens(Some(&format!("op:{OPERATOR},ro:{VIEWER}")), None)
        .expect("valid tokens");
    let mut admin = AdminSettings::new(tokens);
    admin.mail_domain = Some("shop.example".into());
    ApiSettings {
        admin: Some(admin),
        ..test_api_settings()
    }
}

/// Where the screenshots go: `target/admin-screenshots/`.
pub(crate) fn screenshot_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/admin-screenshots")
        .join(format!("{name}.png"))
}

/// A client that shows redirects instead of following them.
pub(crate) fn raw_client() -> reqwest::Client {
    let _ = crate::support::app::http_client();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// An `application/x-www-form-urlencoded` body (reqwest is built without its
/// `form` feature).
pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// An endpoint `erp`, failing, with three attempts (two ok); returns its id.
fn seed_endpoint(conn: &mut PgConnection) -> i64 {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let id = diesel::sql_query(
        "INSERT INTO endpoints (name, url, secret, failing_since) \
         VALUES ('erp', 'https://erp.example.com/hooks/t0ken', \
                 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', now() - interval '5 minutes') \
         RETURNING id",
    )
    .get_result::<Id>(conn)
    .expect("endpoint")
    .id;
    diesel::sql_query(
        "INSERT INTO delivery_attempts \
           (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome, excerpt) \
         VALUES (1, $1, 1, now() - interval '9 minutes', 42, 200, 'ok', 'thanks'), \
                (2, $1, 1, now() - interval '8 minutes', 57, 204, 'ok', ''), \
                (3, $1, 1, now() - interval '5 minutes', 1203, 503, 'retryable', 'upstream down')",
    )
    .bind::<diesel::sql_types::BigInt, _>(id)
    .execute(conn)
    .expect("attempts");
    id
}

/// What the seeded orders look like.
struct Seeded {
    /// The order whose email and webhook went out and whose receipt exists.
    sent_order: i64,
    sent_email_job: i64,
    sent_webhook_job: i64,
    /// Failed confirmation emails.
    failed: Vec<i64>,
    /// Pending jobs of the last order.
    pending: Vec<i64>,
}

fn seed(conn: &mut PgConnection) -> Seeded {
    let mut orders = Vec::new();
    for _ in 0..6 {
        let id = place_order(conn, &order_enqueuer(), &sample_order(), None, 8)
            .expect("place order")
            .order_id();
        let ids: Vec<i64> = jobs_all::table
            .filter(jobs_all::order_id.eq(id))
            .order(jobs_all::id)
            .select(jobs_all::id)
            .load(conn)
            .expect("jobs");
        orders.push((id, ids));
    }
    let run = |conn: &mut PgConnection, sql: String| {
        diesel::sql_query(sql).execute(conn).expect("seed");
    };
    // Placed an hour ago, so claims and finishes below come after creation.
    run(
        conn,
        "UPDATE orders SET created_at = now() - interval '1 hour'".into(),
    );
    run(
        conn,
        "UPDATE jobs SET created_at = now() - interval '1 hour', \
         run_after = now() - interval '1 hour'"
            .into(),
    );
    // Order 1: everything done by relay-a a few minutes ago, receipt stored.
    let (sent_order, first) = &orders[0];
    for (i, id) in first.iter().enumerate() {
        let m = 3 + i;
        run(
            conn,
            format!(
                "UPDATE jobs SET attempts = 1, locked_by = 'relay-a', \
                 lease_token = nextval('jobs_lease_token_seq'), \
                 locked_at = now() - interval '{m} minutes' WHERE id = {id}"
            ),
        );
        make_done(
            conn,
            &format!("id = {id}"),
            &format!("now() - interval '{m} minutes' + interval '2 seconds'"),
        );
    }
    run(
        conn,
        format!("INSERT INTO receipts (order_id, pdf) VALUES ({sent_order}, '%PDF-1.7 test')"),
    );
    // Orders 2-5: the email failed for good; the receipt done at other minutes.
    let mut failed = Vec::new();
    for (n, (_, ids)) in orders[1..5].iter().enumerate() {
        run(
            conn,
            format!(
                "UPDATE jobs SET status = 'failed', attempts = 8, locked_by = 'relay-a', \
                 lease_token = nextval('jobs_lease_token_seq'), locked_at = now() - interval '{m} minutes', \
                 finished_at = now() - interval '{m} minutes', \
                 last_error = 'SMTP 451 4.3.0 mailbox temporarily unavailable (attempt 8 of 8)' \
                 WHERE id = {id}",
                m = 10 + 7 * n,
                id = ids[0]
            ),
        );
        let (m, id) = (5 + 9 * n, ids[1]);
        run(
            conn,
            format!(
                "UPDATE jobs SET attempts = 1, locked_by = 'relay-b', \
                 lease_token = nextval('jobs_lease_token_seq'), \
                 locked_at = now() - interval '{m} minutes' WHERE id = {id}"
            ),
        );
        make_done(
            conn,
            &format!("id = {id}"),
            &format!("now() - interval '{m} minutes'"),
        );
        failed.push(ids[0]);
    }
    // Order 6: its webhook is in flight on relay-b.
    let (_, last) = &orders[5];
    run(
        conn,
        format!(
            "UPDATE jobs SET status = 'processing', attempts = 1, locked_by = 'relay-b', \
             lease_token = nextval('jobs_lease_token_seq'), locked_at = now() - interval '5 seconds', \
             lease_expires_at = now() + interval '55 seconds' WHERE id = {}",
            last[2]
        ),
    );
    Seeded {
        sent_order: *sent_order,
        sent_email_job: first[0],
        sent_webhook_job: first[2],
        failed,
        pending: last[..2].to_vec(),
    }
}

fn statuses(conn: &mut PgConnection, ids: &[i64]) -> Vec<(String, i32)> {
    jobs_all::table
        .filter(jobs_all::id.eq_any(ids))
        .order(jobs_all::id)
        .select((jobs_all::status, jobs_all::attempts))
        .load(conn)
        .expect("statuses")
}

fn audit_rows(conn: &mut PgConnection) -> Vec<(String, String, i64)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        actor: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        action: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        affected: i64,
    }
    let rows: Vec<Row> =
        diesel::sql_query("SELECT actor, action, affected FROM admin_audit ORDER BY id")
            .load(conn)
            .expect("audit");
    rows.into_iter()
        .map(|r| (r.actor, r.action, r.affected))
        .collect()
}

/// Polls until the browser's URL contains `part`.
pub(crate) async fn wait_for_url(browser: &Browser, part: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = browser.current_url().await;
        if url.contains(part) {
            return url;
        }
        assert!(
            Instant::now() < deadline,
            "URL {url} never contained {part}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until the page's text contains `part`.
pub(crate) async fn wait_for_text(browser: &Browser, part: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = browser.text().await;
        if text.contains(part) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the page never said {part:?}; it says:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn log_in(browser: &Browser, app: &TestApp, token: &str) {
    browser.goto(&app.url("/admin/login")).await;
    browser.type_into("#token", token).await;
    browser.click("main button[type=submit]").await;
    wait_for_text(browser, "Queue health").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_the_dashboard_in_a_real_browser() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let seeded = seed(&mut conn);
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.viewport(false).await;

    // Not logged in: the login form, which refuses a wrong token.
    browser.goto(&app.url("/admin/jobs")).await;
    wait_for_url(&browser, "/admin/login").await;
    browser.screenshot(&screenshot_path("login-desktop")).await;
    browser.type_into("#token", "not-the-token").await;
    browser.click("main button[type=submit]").await;
    wait_for_text(&browser, "That token is not valid.").await;

    // The operator logs in and sees the overview.
    browser.type_into("#token", OPERATOR).await;
    browser.click("main button[type=submit]").await;
    let overview = wait_for_text(&browser, "Queue health").await;
    for expected in [
        "Jobs by kind and status",
        "confirmation_email",
        "relay-a",
        "relay-b",
        "Finished per minute, last hour",
        "operator#1",
    ] {
        assert!(overview.contains(expected), "{expected:?} in\n{overview}");
    }
    let chart = browser.find_all("svg.chart polyline").await;
    assert_eq!(chart.len(), 2, "a done line and a failed line");
    browser
        .screenshot(&screenshot_path("overview-desktop"))
        .await;

    // Filter failed jobs.
    browser.goto(&app.url("/admin/jobs")).await;
    browser.click("#f-status option[value=failed]").await;
    browser.type_into("#f-error", "mailbox").await;
    browser.click(".filters button[type=submit]").await;
    wait_for_url(&browser, "status=failed").await;
    let rows = browser.find_all("table.jobs tbody tr").await;
    assert_eq!(rows.len(), seeded.failed.len(), "one row per failed job");
    let listed = browser.text().await;
    assert!(listed.contains("SMTP 451"), "{listed}");
    browser.screenshot(&screenshot_path("jobs-desktop")).await;

    // Preview the bulk retry, then run it.
    browser.click(".bulk button[value=retry]").await;
    let preview = wait_for_text(&browser, "This will retry").await;
    assert!(
        preview.contains(&format!("This will retry {} jobs.", seeded.failed.len())),
        "{preview}"
    );
    browser
        .screenshot(&screenshot_path("preview-desktop"))
        .await;
    assert_eq!(
        statuses(&mut conn, &seeded.failed)[0].0,
        "failed",
        "a preview changes nothing"
    );
    browser.click("main form button[type=submit]").await;
    wait_for_text(&browser, &format!("Retried {} jobs.", seeded.failed.len())).await;
    assert!(
        statuses(&mut conn, &seeded.failed)
            .iter()
            .all(|(status, attempts)| status == "pending" && *attempts == 0),
        "{:?}",
        statuses(&mut conn, &seeded.failed)
    );
    assert_eq!(
        audit_rows(&mut conn),
        [("operator#1".to_owned(), "retry".to_owned(), 4)]
    );

    // A form whose CSRF token was removed is refused and changes nothing.
    browser
        .goto(&app.url(&format!("/admin/jobs?order={}", seeded.sent_order + 5)))
        .await;
    browser
        .execute(
            "document.querySelectorAll('input[name=csrf]').forEach(function (e) { e.remove(); });",
        )
        .await;
    browser.click("td.actions button[value=cancel]").await;
    let refused = wait_for_text(&browser, "403").await;
    assert!(
        refused.contains("did not come from the dashboard"),
        "{refused}"
    );
    assert!(
        statuses(&mut conn, &seeded.pending)
            .iter()
            .all(|(s, _)| s == "pending")
    );

    // One job cancelled from its row.
    browser
        .goto(&app.url(&format!("/admin/jobs?order={}", seeded.sent_order + 5)))
        .await;
    browser.click("td.actions button[value=cancel]").await;
    wait_for_text(&browser, "Cancelled 1 job.").await;
    let cancelled = statuses(&mut conn, &seeded.pending);
    assert_eq!(
        cancelled.iter().filter(|(s, _)| s == "cancelled").count(),
        1,
        "{cancelled:?}"
    );

    // The audit log shows both actions.
    browser.goto(&app.url("/admin/audit")).await;
    let audit = wait_for_text(&browser, "Audit log").await;
    assert!(
        audit.contains("retry") && audit.contains("cancel"),
        "{audit}"
    );
    browser.screenshot(&screenshot_path("audit-desktop")).await;

    // The endpoints, and one endpoint's attempt log.
    let endpoint = seed_endpoint(&mut conn);
    browser.goto(&app.url("/admin/endpoints")).await;
    let list = wait_for_text(&browser, "Endpoints").await;
    for expected in ["erp", "failing", "https://erp.example.com", "66.7%"] {
        assert!(list.contains(expected), "{expected:?} in\n{list}");
    }
    browser
        .screenshot(&screenshot_path("endpoints-desktop"))
        .await;
    browser
        .goto(&app.url(&format!("/admin/endpoints/{endpoint}")))
        .await;
    let log = wait_for_text(&browser, "Endpoint erp").await;
    assert!(log.contains("503") && log.contains("retryable"), "{log}");
    browser
        .screenshot(&screenshot_path("endpoint-desktop"))
        .await;

    // One order's timeline, with what was sent.
    browser
        .goto(&app.url(&format!("/admin/orders/{}", seeded.sent_order)))
        .await;
    let timeline = wait_for_text(&browser, "Timeline").await;
    for expected in [
        format!("Order #{}", seeded.sent_order),
        format!("<job-{}.confirmation@shop.example>", seeded.sent_email_job),
        order_service::effects::webhook::idempotency_key(seeded.sent_webhook_job),
        "receipt.pdf".to_owned(),
        "Green tea".to_owned(),
        "confirmation_email done".to_owned(),
    ] {
        assert!(timeline.contains(&expected), "{expected:?} in\n{timeline}");
    }
    let receipt = browser.find("a[href$='receipt.pdf']").await;
    assert_eq!(browser.element_text(&receipt).await, "receipt.pdf");
    browser.screenshot(&screenshot_path("order-desktop")).await;

    // The same pages on a phone.
    browser.viewport(true).await;
    for (name, path) in [
        ("overview", "/admin".to_owned()),
        ("jobs", "/admin/jobs".to_owned()),
        ("order", format!("/admin/orders/{}", seeded.sent_order)),
        ("endpoints", "/admin/endpoints".to_owned()),
        ("endpoint", format!("/admin/endpoints/{endpoint}")),
    ] {
        browser.goto(&app.url(&path)).await;
        browser
            .screenshot(&screenshot_path(&format!("{name}-phone")))
            .await;
    }
    let overflow = browser
        .execute("return document.documentElement.scrollWidth > window.innerWidth;")
        .await;
    assert_eq!(
        overflow,
        serde_json::json!(false),
        "no sideways scrolling on a phone"
    );

    // Log out; the read-only token sees the pages but no action.
    browser.viewport(false).await;
    browser.goto(&app.url("/admin")).await;
    browser.click(".logout button").await;
    wait_for_url(&browser, "/admin/login").await;
    log_in(&browser, &app, VIEWER).await;
    browser.goto(&app.url("/admin/jobs")).await;
    let page = wait_for_text(&browser, "read-only").await;
    assert!(
        browser.find_all("td.actions button").await.is_empty(),
        "{page}"
    );
    assert!(browser.find_all("form.bulk").await.is_empty());

    browser.quit().await;
    app.stop().await;
}

/// Logs in over HTTP; returns the session cookie (`name=value`) and the form token.
/// A form POST to the dashboard with a session cookie.
pub(crate) async fn post_form(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    cookie: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    client
        .post(app.url(path))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(fields))
        .send()
        .await
        .expect("POST")
}

pub(crate) async fn http_login(
    client: &reqwest::Client,
    app: &TestApp,
    token: &str,
) -> (String, String) {
    let response = client
        .post(app.url("/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", token)]))
        .send()
        .await
        .expect("POST /admin/login");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let set_cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_owned();
    let cookie = set_cookie.split(';').next().expect("name=value").to_owned();
    let page = client
        .get(app.url("/admin/jobs"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET /admin/jobs")
        .text()
        .await
        .expect("page");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form token on the page")
        .to_owned();
    (cookie, csrf)
}

#[tokio::test]
async fn without_admin_token_admin_is_not_found() {
    let app = spawn_app().await;
    for path in ["/admin", "/admin/login", "/admin/jobs"] {
        assert_eq!(
            app.get(path).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    app.stop().await;
}

/// Ids of the jobs a jobs page lists, from its rows' links.
fn listed_ids(page: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = page
        .split("<a class=\"id\" href=\"/admin/jobs/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn the_time_window_lists_previews_and_retries_only_the_jobs_created_within_it() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let seeded = seed(&mut conn);
    // Three orders whose email failed, placed at 10:00, 10:30 and 11:00.
    let mut orders = Vec::new();
    for (failed, at) in seeded.failed.iter().zip(["10:00", "10:30", "11:00"]) {
        let order: i64 = jobs_all::table
            .find(failed)
            .select(jobs_all::order_id.assume_not_null())
            .first(&mut conn)
            .expect("the failed job's order");
        for table in ["jobs", "jobs_done"] {
            diesel::sql_query(format!(
                "UPDATE {table} SET created_at = '2026-01-01T{at}:00Z' WHERE order_id = {order}"
            ))
            .execute(&mut conn)
            .expect("backdate");
        }
        let ids: Vec<i64> = jobs_all::table
            .filter(jobs_all::order_id.eq(order))
            .order(jobs_all::id)
            .select(jobs_all::id)
            .load(&mut conn)
            .expect("the order's jobs");
        orders.push(ids);
    }
    let client = raw_client();
    let (cookie, csrf) = http_login(&client, &app, OPERATOR).await;
    let list = |query: &'static str| {
        let (client, cookie, app) = (&client, &cookie, &app);
        async move {
            let response = client
                .get(app.url(&format!("/admin/jobs?{query}")))
                .header("cookie", cookie)
                .send()
                .await
                .expect("GET");
            assert_eq!(response.status(), StatusCode::OK, "{query}");
            listed_ids(&response.text().await.expect("page"))
        }
    };
    // `from` is inclusive, `to` exclusive.
    assert_eq!(
        list("from=2026-01-01T10:15&to=2026-01-01T11:00").await,
        orders[1],
        "10:15 to 11:00 holds the 10:30 order only"
    );
    assert_eq!(
        list("from=2026-01-01T10:00&to=2026-01-01T10:30").await,
        orders[0],
        "10:00 to 10:30 holds the 10:00 order only"
    );
    assert_eq!(
        list("from=2026-01-01T10:30:00Z&to=2026-01-01T11:00:01Z").await,
        [orders[1].as_slice(), &orders[2]].concat(),
    );

    // A bulk retry of failed jobs in the window counts and retries only the
    // 10:30 order's email.
    let window = [
        ("action", "retry"),
        ("status", "failed"),
        ("from", "2026-01-01T10:15"),
        ("to", "2026-01-01T11:00"),
        ("csrf", csrf.as_str()),
    ];
    let preview = post_form(&client, &app, "/admin/jobs/preview", &cookie, &window).await;
    assert_eq!(preview.status(), StatusCode::OK);
    let preview = preview.text().await.expect("preview");
    assert!(
        preview.contains("This will retry <strong>1</strong> job."),
        "{preview}"
    );
    let max_id = i64::MAX.to_string();
    let act = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &cookie,
        &[window.as_slice(), &[("max_id", max_id.as_str())]].concat(),
    )
    .await;
    assert!(act.status().is_redirection(), "{}", act.status());
    let after = statuses(&mut conn, &seeded.failed[..3]);
    assert_eq!(
        after.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        ["failed", "pending", "failed"],
        "only the 10:30 order's email is retried"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_dashboard_refuses_wrong_tokens_missing_csrf_and_read_only_sessions() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let seeded = seed(&mut conn);
    let client = raw_client();

    // Pages need a session; the login page carries the security headers.
    let response = client
        .get(app.url("/admin/jobs"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/admin/login");
    let login = client
        .get(app.url("/admin/login"))
        .send()
        .await
        .expect("GET");
    let csp = login.headers()["content-security-policy"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("script-src 'nonce-"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(login.headers()["x-frame-options"], "DENY");

    // A wrong token.
    let wrong = client
        .post(app.url("/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "guess")]))
        .send()
        .await
        .expect("POST");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get("set-cookie").is_none());

    // The cookie: HttpOnly, SameSite=Strict; Secure except on loopback http.
    let response = client
        .post(app.url("/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", OPERATOR)]))
        .send()
        .await
        .expect("POST");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("Secure"),
        "plain http to 127.0.0.1: {cookie}"
    );
    let proxied = client
        .post(app.url("/admin/login"))
        .header("x-forwarded-proto", "https")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", OPERATOR)]))
        .send()
        .await
        .expect("POST");
    // The request's X-Forwarded-Proto does not decide: the public URL
    // (PUBLIC_BASE_URL, here the loopback demo's) does (admin_sessions.rs).
    let cookie = proxied.headers()["set-cookie"].to_str().expect("ASCII");
    assert!(!cookie.contains("Secure"), "{cookie}");

    // A POST without the form token, and one with another session's token.
    let (operator_cookie, operator_csrf) = http_login(&client, &app, OPERATOR).await;
    let id = seeded.failed[0].to_string();
    let no_csrf = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &operator_cookie,
        &[("action", "retry"), ("id", id.as_str())],
    )
    .await;
    assert_eq!(no_csrf.status(), StatusCode::FORBIDDEN);
    let (viewer_cookie, viewer_csrf) = http_login(&client, &app, VIEWER).await;
    let crossed = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &operator_cookie,
        &[
            ("action", "retry"),
            ("id", id.as_str()),
            ("csrf", viewer_csrf.as_str()),
        ],
    )
    .await;
    assert_eq!(crossed.status(), StatusCode::FORBIDDEN);

    // The read-only role, with its own valid form token.
    let read_only = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &viewer_cookie,
        &[
            ("action", "retry"),
            ("id", id.as_str()),
            ("csrf", viewer_csrf.as_str()),
        ],
    )
    .await;
    assert_eq!(read_only.status(), StatusCode::FORBIDDEN);
    let preview = post_form(
        &client,
        &app,
        "/admin/jobs/preview",
        &viewer_cookie,
        &[
            ("action", "retry"),
            ("status", "failed"),
            ("csrf", viewer_csrf.as_str()),
        ],
    )
    .await;
    assert_eq!(preview.status(), StatusCode::FORBIDDEN);
    assert_eq!(statuses(&mut conn, &seeded.failed)[0].0, "failed");
    assert!(audit_rows(&mut conn).is_empty(), "refusals write nothing");

    // A bulk action with no filter needs the explicit "every job".
    let unfiltered = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &operator_cookie,
        &[
            ("action", "cancel"),
            ("max_id", "999999"),
            ("csrf", operator_csrf.as_str()),
        ],
    )
    .await;
    assert_eq!(unfiltered.status(), StatusCode::BAD_REQUEST);
    // A processing job cannot be cancelled.
    let processing: i64 = jobs_all::table
        .filter(jobs_all::status.eq("processing"))
        .select(jobs_all::id)
        .first(&mut conn)
        .expect("a processing job");
    let processing_id = processing.to_string();
    let refused = post_form(
        &client,
        &app,
        "/admin/jobs/act",
        &operator_cookie,
        &[
            ("action", "cancel"),
            ("id", processing_id.as_str()),
            ("csrf", operator_csrf.as_str()),
        ],
    )
    .await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert!(
        refused
            .text()
            .await
            .expect("body")
            .contains("is processing")
    );
    assert!(audit_rows(&mut conn).is_empty());

    // Failed logins are rate-limited (one failure above already counts).
    let mut statuses_seen = Vec::new();
    for _ in 0..10 {
        let response = client
            .post(app.url("/admin/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", "guess")]))
            .send()
            .await
            .expect("POST");
        statuses_seen.push(response.status().as_u16());
    }
    assert_eq!(
        statuses_seen.iter().filter(|s| **s == 401).count(),
        9,
        "{statuses_seen:?}"
    );
    let limited = client
        .post(app.url("/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", OPERATOR)]))
        .send()
        .await
        .expect("POST");
    assert_eq!(
        limited.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "even the right token waits"
    );
    assert!(limited.headers().contains_key("retry-after"));
    // Sessions already open keep working.
    let still = client
        .get(app.url("/admin"))
        .header("cookie", &operator_cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(still.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_pages_answer_well_under_a_second_on_a_million_jobs() {
    // Alone among the heavy tests: its bound is about the code, not its neighbours.
    let _heavy = crate::support::seats::heavy();
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let order = place_order(&mut conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect("place order")
        .order_id();
    let started = Instant::now();
    // Loading into a table and then indexing it is several times faster than
    // maintaining its indexes row by row: set the secondary indexes aside and
    // rebuild them from their own definitions, so the schema measured below is
    // exactly the migrated one.
    #[derive(QueryableByName)]
    struct IndexDef {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        def: String,
    }
    let indexes: Vec<IndexDef> = diesel::sql_query(
        "SELECT indexname AS name, indexdef AS def FROM pg_indexes \
         WHERE tablename = 'jobs' AND indexname <> 'jobs_pkey'",
    )
    .load(&mut conn)
    .expect("index definitions");
    // Layout v2: jobs_claim_idx, jobs_kind_claim_idx, jobs_finished_idx,
    // jobs_order_id_idx, jobs_ordering_key_idx.
    assert!(indexes.len() >= 5, "the migrated indexes");
    for index in &indexes {
        diesel::sql_query(format!("DROP INDEX {}", index.name))
            .execute(&mut conn)
            .expect("set an index aside");
    }
    diesel::sql_query("SELECT jobs_done_ensure_partitions(now() - interval '30 days', 2)")
        .execute(&mut conn)
        .expect("the archive's daily partitions");
    // 1,000,000 jobs: mostly done over the last 30 days (in the archive,
    // jobs_done, where the relay puts them), 1% failed, 1% pending, a few
    // processing (in jobs); every 1,000th belongs to the one order. Ids rise
    // with time across both, as the sequence hands them out.
    for (table, which) in [("jobs_done", "= 'done'"), ("jobs", "<> 'done'")] {
        diesel::sql_query(format!(
            "INSERT INTO {table} (id, order_id, kind, payload, status, run_after, attempts, \
                                  max_attempts, locked_by, locked_at, lease_expires_at, \
                                  lease_token, created_at, finished_at, last_error)
             SELECT g,
                    CASE WHEN g % 1000 = 0 THEN {order} END,
                    (ARRAY['confirmation_email','receipt_pdf','order_webhook','noop'])[1 + g % 4],
                    '{{\"n\": 1}}'::jsonb,
                    s.status,
                    t,
                    CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
                    8,
                    CASE WHEN s.status = 'pending' THEN NULL ELSE 'relay-' || (g % 3) END,
                    CASE WHEN s.status = 'pending' THEN NULL ELSE t END,
                    CASE WHEN s.status = 'processing' THEN now() + interval '1 minute' END,
                    CASE WHEN s.status = 'pending' THEN NULL ELSE g END,
                    t,
                    CASE WHEN s.status IN ('done', 'failed') THEN t + interval '1 second' END,
                    CASE WHEN s.status = 'failed' THEN 'HTTP 503 from the webhook receiver' END
             FROM generate_series(1, 1000000) AS g,
                  LATERAL (SELECT now() - (1000000 - g) * interval '2.5 seconds' AS t) AS tt,
                  LATERAL (SELECT CASE WHEN g % 100 = 7 THEN 'failed'
                                       WHEN g % 100 = 9 THEN 'pending'
                                       WHEN g % 100000 = 11 THEN 'processing'
                                       ELSE 'done' END AS status) AS s
             WHERE s.status {which}"
        ))
        .execute(&mut conn)
        .expect("a million jobs");
    }
    diesel::sql_query("SELECT setval('jobs_id_seq', 1000000)")
        .execute(&mut conn)
        .expect("the sequence past the loaded ids");
    let loaded = started.elapsed();
    // Index builds sort in memory when they may.
    diesel::sql_query("SET maintenance_work_mem = '256MB'")
        .execute(&mut conn)
        .expect("maintenance_work_mem");
    for index in &indexes {
        diesel::sql_query(&index.def)
            .execute(&mut conn)
            .expect("rebuild an index");
    }
    diesel::sql_query("ANALYZE jobs, jobs_done")
        .execute(&mut conn)
        .expect("analyze");
    eprintln!(
        "inserted 1,000,000 jobs in {loaded:?}, indexed and analyzed them in {:?}",
        started.elapsed() - loaded
    );

    // The overview's statements never read the history: no partition of the
    // archive older than yesterday (UTC) appears in their plans, whatever its
    // index. `jobs` itself holds only the backlog and the failed and cancelled
    // jobs in layout v2 (1% + 1% here), so the planner may scan it.
    #[derive(QueryableByName)]
    struct PlanLine {
        #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
        line: String,
    }
    #[derive(QueryableByName)]
    struct Partition {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let history: Vec<String> = diesel::sql_query(
        "SELECT inhrelid::regclass::text AS name FROM pg_inherits \
         WHERE inhparent = 'jobs_done'::regclass \
           AND jobs_done_partition_upper_bound(inhrelid) \
               <= (date_trunc('day', now() AT TIME ZONE 'UTC') - interval '1 day') AT TIME ZONE 'UTC'",
    )
    .load::<Partition>(&mut conn)
    .expect("the archive's old partitions")
    .into_iter()
    .map(|p| p.name)
    .collect();
    assert!(history.len() >= 28, "{history:?}");
    for (name, sql) in [
        (
            "kind_status_counts",
            include_str!("../../crates/order-service/src/admin/sql/kind_status_counts.sql"),
        ),
        (
            "queue_health",
            include_str!("../../crates/order-service/src/admin/sql/queue_health.sql"),
        ),
        (
            "throughput",
            include_str!("../../crates/order-service/src/admin/sql/throughput.sql"),
        ),
        (
            "relays",
            include_str!("../../crates/order-service/src/admin/sql/relays.sql"),
        ),
    ] {
        let plan: Vec<PlanLine> = diesel::sql_query(format!("EXPLAIN {sql}"))
            .load(&mut conn)
            .expect("explain");
        let plan: Vec<String> = plan.into_iter().map(|l| l.line).collect();
        let read = |partition: &String| {
            plan.iter().any(|l| {
                l.contains(&format!(" on {partition} ")) || l.ends_with(&format!(" on {partition}"))
            })
        };
        assert!(
            !history.iter().any(read),
            "{name} reads the archive's history:\n{}",
            plan.join("\n")
        );
    }

    let client = raw_client();
    let (cookie, csrf) = http_login(&client, &app, OPERATOR).await;
    // The pages are timed with no other test beside this one; the million
    // rows above were loaded beside them.
    let quiet = crate::support::seats::quiet(&_heavy);
    let pages = [
        "/admin".to_owned(),
        "/admin/jobs".to_owned(),
        "/admin/jobs?status=failed".to_owned(),
        "/admin/jobs?status=pending".to_owned(),
        "/admin/jobs?status=done&kind=noop".to_owned(),
        "/admin/jobs?error=webhook%20receiver".to_owned(),
        "/admin/jobs?status=cancelled".to_owned(),
        "/admin/jobs?before=500000".to_owned(),
        "/admin/jobs?from=2020-01-01T00:00&to=2020-01-02T00:00".to_owned(),
        format!("/admin/jobs?order={order}"),
        format!("/admin/orders/{order}"),
        "/admin/audit".to_owned(),
        "/admin/endpoints".to_owned(),
    ];
    let mut report = Vec::new();
    for path in &pages {
        // The first request warms caches; the best of the next two is the
        // one measured, so that one stall of a machine running the whole
        // suite at once is not taken for the page's cost.
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let started = Instant::now();
            let response = client
                .get(app.url(path))
                .header("cookie", &cookie)
                .send()
                .await
                .expect("GET");
            let status = response.status();
            let body = response.text().await.expect("body");
            best = best.min(started.elapsed());
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
        }
        report.push((path.clone(), best));
    }
    let started = Instant::now();
    let preview = post_form(
        &client,
        &app,
        "/admin/jobs/preview",
        &cookie,
        &[
            ("action", "retry"),
            ("kind", "noop"),
            ("csrf", csrf.as_str()),
        ],
    )
    .await;
    let elapsed = started.elapsed();
    let body = preview.text().await.expect("body");
    assert!(
        body.contains("This will retry <strong>10,000</strong> jobs"),
        "{body}"
    );
    report.push(("POST /admin/jobs/preview (kind noop)".to_owned(), elapsed));
    for (path, took) in &report {
        eprintln!("{took:>10.1?}  {path}");
    }
    drop(quiet);
    for (path, took) in &report {
        assert!(*took < Duration::from_millis(700), "{path} took {took:?}");
    }
    app.stop().await;
}
