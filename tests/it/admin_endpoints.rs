//! The dashboard's endpoint actions (enable, disable, recover with a preview)
//! over HTTP against a real server and a real relay, and the endpoint pages in
//! a headless Chromium; and a relay without `WEBHOOK_URL`, which delivers to
//! the endpoint rows.

use std::time::Duration;

use diesel::prelude::*;
use order_service::endpoints::spec::{EndpointName, EndpointUrl, EventTypes, SigningSecret};
use order_service::endpoints::{NewEndpoint, store, target};
use order_service::schema::{endpoints, jobs_all};
use reqwest::StatusCode;

use crate::admin::{
    OPERATOR, VIEWER, admin_settings, http_login, log_in, post_form, raw_client, screenshot_path,
    wait_for_text, wait_for_url,
};
use crate::endpoint_delivery::{
    add_endpoint, delivery_relay, done_webhooks, failed_webhooks, pay, place, reference_verify,
};
use crate::support::app::{TestApp, spawn_app_with};
use crate::support::browser::Browser;
use crate::support::http::{Answer, HttpSink};
use crate::support::process::{BinProcess, Launch};
use crate::support::{TestDb, init_tracing, wait_until};

#[derive(Debug, QueryableByName)]
struct AuditRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    actor: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    action: String,
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    target: serde_json::Value,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    affected: i64,
}

fn audit(conn: &mut PgConnection) -> Vec<AuditRow> {
    diesel::sql_query("SELECT actor, action, target, affected FROM admin_audit ORDER BY id")
        .load(conn)
        .expect("audit rows")
}

fn state_of(conn: &mut PgConnection, id: i64) -> (bool, Option<String>) {
    endpoints::table
        .find(id)
        .select((endpoints::enabled, endpoints::disabled_reason))
        .first(conn)
        .expect("endpoint row")
}

/// The `value` of the hidden input `name` on `page`.
fn hidden(page: &str, name: &str) -> String {
    page.split(&format!("name=\"{name}\" value=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no hidden {name} on\n{page}"))
        .to_owned()
}

fn location(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("a Location")
        .to_owned()
}

async fn get_page(client: &reqwest::Client, app: &TestApp, path: &str, cookie: &str) -> String {
    let response = client
        .get(app.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    response.text().await.expect("page")
}

/// Each recovered order's deliveries, by order: its types, in arrival order.
fn types_by_order(sink: &HttpSink, skip: usize) -> std::collections::HashMap<i64, Vec<String>> {
    let mut by_order: std::collections::HashMap<i64, Vec<String>> = Default::default();
    for request in &sink.requests()[skip..] {
        let body = request.json();
        by_order
            .entry(body["data"]["order"]["id"].as_i64().expect("order id"))
            .or_default()
            .push(body["type"].as_str().expect("type").to_owned());
    }
    by_order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_from_the_dashboard_requeues_exactly_the_previewed_count_and_audits_it() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    // The first three calls are refused for good (400): the three placements.
    let erp = HttpSink::start(
        [
            Answer::status(400),
            Answer::status(400),
            Answer::status(400),
        ],
        Answer::status(204),
    )
    .await;
    let (erp_id, _) = add_endpoint(&mut conn, "erp", &erp, None, 4);
    let orders: Vec<i64> = (0..3).map(|_| place(&mut conn)).collect();
    for &order in &orders {
        pay(&mut conn, order);
    }
    let relay = delivery_relay(&app.db, &erp, 4);
    wait_until(
        "the three placements failed",
        Duration::from_secs(30),
        || failed_webhooks(&mut conn).len() == 3,
    )
    .await;
    // One failed long ago: outside the window the operator asks for.
    let failed = failed_webhooks(&mut conn);
    diesel::sql_query("UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(failed[0])
        .execute(&mut conn)
        .expect("age one failure");

    let client = raw_client();
    let (cookie, csrf) = http_login(&client, &app, OPERATOR).await;
    let preview_path = format!("/admin/endpoints/{erp_id}/recover/preview");
    let recover_path = format!("/admin/endpoints/{erp_id}/recover");

    // No form token: refused, nothing previewed or changed.
    let refused = post_form(&client, &app, &preview_path, &cookie, &[("since", "6h")]).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // A read-only session may look, not act.
    let (viewer_cookie, viewer_csrf) = http_login(&client, &app, VIEWER).await;
    let refused = post_form(
        &client,
        &app,
        &preview_path,
        &viewer_cookie,
        &[("csrf", &viewer_csrf), ("since", "6h")],
    )
    .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // A since that is not a time says so.
    let bad = post_form(
        &client,
        &app,
        &preview_path,
        &cookie,
        &[("csrf", &csrf), ("since", "ten")],
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let said = bad.text().await.expect("page");
    assert!(
        said.contains("&quot;ten&quot; is neither a duration"),
        "{said}"
    );

    // The preview counts, and changes nothing.
    let preview = post_form(
        &client,
        &app,
        &preview_path,
        &cookie,
        &[("csrf", &csrf), ("since", "6h")],
    )
    .await;
    assert_eq!(preview.status(), StatusCode::OK);
    let page = preview.text().await.expect("preview page");
    assert!(
        page.contains("<strong>2</strong> failed deliveries since"),
        "{page}"
    );
    assert!(page.contains("will be re-queued"), "{page}");
    assert_eq!(
        failed_webhooks(&mut conn),
        failed,
        "a preview changes nothing"
    );
    let previewed = hidden(&page, "previewed");
    assert_eq!(previewed, "2");
    let (since, until) = (hidden(&page, "since"), hidden(&page, "until"));

    // The confirmation without its token is refused and changes nothing.
    let fields = [
        ("since", since.as_str()),
        ("until", until.as_str()),
        ("previewed", previewed.as_str()),
    ];
    let refused = post_form(&client, &app, &recover_path, &cookie, &fields).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(failed_webhooks(&mut conn), failed);
    assert!(audit(&mut conn).is_empty(), "refusals are not actions");

    let mut with_token = vec![("csrf", csrf.as_str())];
    with_token.extend(fields);
    let done = post_form(&client, &app, &recover_path, &cookie, &with_token).await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let landing = location(&done);
    assert_eq!(landing, format!("/admin/endpoints/{erp_id}?done=recover:2"));
    let page = get_page(&client, &app, &landing, &cookie).await;
    assert!(page.contains("Re-queued 2 failed deliveries"), "{page}");

    let rows = audit(&mut conn);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].actor.as_str(), rows[0].action.as_str()),
        ("operator#1", "endpoint.recover")
    );
    assert_eq!(rows[0].affected, 2, "re-queued what the preview counted");
    assert_eq!(rows[0].target["previewed"], 2);
    assert_eq!(rows[0].target["endpoint"], "erp");

    wait_until(
        "the recovered orders are delivered",
        Duration::from_secs(30),
        || done_webhooks(&mut conn) == 4,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.stop().await;
    assert_eq!(
        failed_webhooks(&mut conn),
        vec![failed[0]],
        "the failure outside the window stays failed"
    );
    assert_eq!(erp.requests().len(), 7, "3 refused + 2 x (placed, paid)");
    let by_order = types_by_order(&erp, 3);
    assert_eq!(by_order.len(), 2, "{by_order:?}");
    for types in by_order.values() {
        assert_eq!(types, &["order.placed", "order.paid"]);
    }

    // The audit page shows the action.
    let page = get_page(&client, &app, "/admin/audit", &cookie).await;
    assert!(page.contains("endpoint.recover"), "{page}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_from_the_dashboard_holds_deliveries_and_enabling_releases_them_in_order() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let (erp_id, _) = add_endpoint(&mut conn, "erp", &erp, None, 4);
    let orders: Vec<i64> = (0..3).map(|_| place(&mut conn)).collect();
    for &order in &orders {
        pay(&mut conn, order);
    }
    let client = raw_client();
    let (cookie, csrf) = http_login(&client, &app, OPERATOR).await;
    let disable = format!("/admin/endpoints/{erp_id}/disable");
    let enable = format!("/admin/endpoints/{erp_id}/enable");

    // No token, or another session's: refused, the endpoint as it was.
    let refused = post_form(&client, &app, &disable, &cookie, &[]).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let forged = "0f".repeat(32);
    let refused = post_form(&client, &app, &disable, &cookie, &[("csrf", &forged)]).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(state_of(&mut conn, erp_id), (true, None));

    // Disabled from the list's button: back to the list, which says so.
    let done = post_form(
        &client,
        &app,
        &disable,
        &cookie,
        &[("csrf", &csrf), ("back", "list")],
    )
    .await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let landing = location(&done);
    assert_eq!(landing, format!("/admin/endpoints?done=disable:{erp_id}"));
    let page = get_page(&client, &app, &landing, &cookie).await;
    assert!(page.contains("Disabled erp"), "{page}");
    assert!(page.contains("disabled (operator)"), "{page}");
    assert!(
        page.contains(&format!("action=\"/admin/endpoints/{erp_id}/enable\"")),
        "a disabled endpoint offers Enable: {page}"
    );
    assert_eq!(
        state_of(&mut conn, erp_id),
        (false, Some("operator".to_owned()))
    );

    // Its six deliveries wait while a relay runs.
    let relay = delivery_relay(&app.db, &erp, 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        erp.requests().is_empty(),
        "a disabled endpoint gets nothing"
    );
    assert_eq!(done_webhooks(&mut conn), 0);

    // Enabled from its page: everything that waited goes out, each order's
    // events in order.
    let done = post_form(&client, &app, &enable, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        location(&done),
        format!("/admin/endpoints/{erp_id}?done=enable:{erp_id}")
    );
    assert_eq!(state_of(&mut conn, erp_id), (true, None));
    wait_until("what waited is delivered", Duration::from_secs(30), || {
        erp.requests().len() == 6
    })
    .await;
    relay.stop().await;
    let by_order = types_by_order(&erp, 0);
    for order in &orders {
        assert_eq!(
            by_order[order],
            ["order.placed", "order.paid"],
            "order {order}"
        );
    }

    let rows = audit(&mut conn);
    let actions: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|r| (r.actor.as_str(), r.action.as_str(), r.affected))
        .collect();
    assert_eq!(
        actions,
        [
            ("operator#1", "endpoint.disable", 0),
            ("operator#1", "endpoint.enable", 0)
        ]
    );
    assert!(rows.iter().all(|r| r.target["id"] == erp_id));
    app.stop().await;
}

/// Three endpoints (healthy, failing with failed deliveries, disabled by the
/// breaker) and an attempt log with an answer that is markup; returns the
/// failing one's id.
fn seed_endpoints(conn: &mut PgConnection) -> i64 {
    let add = |conn: &mut PgConnection, name: &str, url: &str| {
        store::add(
            conn,
            &NewEndpoint {
                name: EndpointName::parse(name).expect("name"),
                url: EndpointUrl::parse(url, false).expect("url"),
                event_types: EventTypes::ALL,
                rate_limit: None,
                max_in_flight: 8,
                secret: SigningSecret::generate().expect("secret"),
                nats: None,
            },
            &order_service::sealed::Keyring::none(),
        )
        .expect("add")
        .id
    };
    let analytics = add(conn, "analytics", "https://analytics.example.com/in/t0k");
    let erp = add(
        conn,
        "erp",
        "https://erp.example.com/hooks/orders?token=s3cret",
    );
    let crm = add(conn, "crm", "https://crm.example.com/webhooks");
    for _ in 0..3 {
        place(conn);
    }
    let run = |conn: &mut PgConnection, sql: &str| {
        diesel::sql_query(sql)
            .bind::<diesel::sql_types::BigInt, _>(erp)
            .execute(conn)
            .expect("seed");
    };
    // erp refused every placement for good, ten minutes ago.
    run(
        conn,
        "UPDATE jobs SET status = 'failed', attempts = 1, locked_by = 'relay-a', \
         lease_token = nextval('jobs_lease_token_seq'), locked_at = now() - interval '10 minutes', \
         finished_at = now() - interval '10 minutes', last_error = 'HTTP 400' \
         WHERE kind = 'order_webhook' AND payload ->> 'endpoint_id' = $1::text",
    );
    run(
        conn,
        "UPDATE endpoints SET failing_since = now() - interval '12 minutes' WHERE id = $1",
    );
    run(
        conn,
        "INSERT INTO delivery_attempts \
           (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome, excerpt) \
         SELECT g, $1, 1, now() - make_interval(mins => 60 - g), 40 + g * 7, \
                CASE WHEN g % 4 = 0 THEN 400 WHEN g % 5 = 0 THEN NULL ELSE 200 END, \
                CASE WHEN g % 4 = 0 THEN 'permanent' WHEN g % 5 = 0 THEN 'retryable' ELSE 'ok' END, \
                CASE WHEN g % 4 = 0 THEN '<script>alert(\"x\")</script> bad & <b>refused</b>' \
                     WHEN g % 5 = 0 THEN 'cannot connect to the webhook receiver: connection refused' \
                     ELSE 'ok' END \
         FROM generate_series(1, 55) AS g",
    );
    diesel::sql_query(
        "UPDATE endpoints SET enabled = false, disabled_reason = 'failing', \
         failing_since = now() - interval '5 days 2 hours' WHERE id = $1",
    )
    .bind::<diesel::sql_types::BigInt, _>(crm)
    .execute(conn)
    .expect("crm disabled");
    diesel::sql_query(
        "INSERT INTO delivery_attempts \
           (job_id, endpoint_id, attempt, started_at, duration_ms, status_code, outcome, excerpt) \
         SELECT g, $1, 1, now() - make_interval(mins => g), 80 + g, 204, 'ok', '' \
         FROM generate_series(1, 20) AS g",
    )
    .bind::<diesel::sql_types::BigInt, _>(analytics)
    .execute(conn)
    .expect("analytics attempts");
    erp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_recovers_and_enables_endpoints_in_a_real_browser() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let erp = seed_endpoints(&mut conn);
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.viewport(false).await;
    log_in(&browser, &app, OPERATOR).await;

    browser.goto(&app.url("/admin/endpoints")).await;
    let list = wait_for_text(&browser, "last 1,000 delivery attempts").await;
    for expected in [
        "analytics",
        "erp",
        "failing",
        "crm",
        "disabled (failing)",
        "100.0%",
    ] {
        assert!(list.contains(expected), "{expected:?} in\n{list}");
    }
    assert!(!list.contains("s3cret"), "no URL path or query: {list}");
    browser
        .screenshot(&screenshot_path("endpoints-actions-desktop"))
        .await;

    // erp's page: its state, its buttons, its log with the markup escaped.
    browser
        .goto(&app.url(&format!("/admin/endpoints/{erp}")))
        .await;
    let page = wait_for_text(&browser, "Endpoint erp").await;
    assert!(
        page.contains("<script>alert(\"x\")</script> bad & <b>refused</b>"),
        "the answer shows as text: {page}"
    );
    assert!(page.contains("no answer"), "{page}");
    let source = browser
        .execute("return document.documentElement.outerHTML;")
        .await;
    let source = source.as_str().expect("HTML");
    assert!(
        source.contains(
            "&lt;script&gt;alert(\"x\")&lt;/script&gt; bad &amp; &lt;b&gt;refused&lt;/b&gt;"
        ),
        "escaped in the HTML"
    );
    assert!(
        browser.find_all("main script").await.is_empty(),
        "no script got in"
    );
    assert!(page.contains("Older attempts"), "55 attempts: two pages");
    browser
        .screenshot(&screenshot_path("endpoint-actions-desktop"))
        .await;
    browser.click("a[rel=next]").await;
    wait_for_url(&browser, "?before=").await;
    let older = wait_for_text(&browser, "Newest").await;
    assert!(
        older.contains("#1"),
        "the oldest attempt is on page two: {older}"
    );

    // Recover: the preview says how many, then the confirmation acts.
    browser
        .goto(&app.url(&format!("/admin/endpoints/{erp}")))
        .await;
    wait_for_text(&browser, "Preview recovery").await;
    browser.click("#recover button[type=submit]").await;
    let preview = wait_for_text(&browser, "will be re-queued").await;
    assert!(preview.contains("3 failed deliveries since"), "{preview}");
    browser
        .screenshot(&screenshot_path("endpoint-recover-preview-desktop"))
        .await;
    browser.click("main form button[type=submit]").await;
    let after = wait_for_text(&browser, "Re-queued 3 failed deliveries").await;
    assert!(after.contains("Endpoint erp"), "{after}");
    assert!(failed_webhooks(&mut conn).is_empty(), "all three went back");
    browser
        .screenshot(&screenshot_path("endpoint-recovered-desktop"))
        .await;

    // crm, disabled by the breaker, enabled from the list.
    browser.goto(&app.url("/admin/endpoints")).await;
    wait_for_text(&browser, "disabled (failing)").await;
    browser
        .click("form[action$='/enable'] button[type=submit]")
        .await;
    let list = wait_for_text(&browser, "Enabled crm").await;
    assert!(!list.contains("disabled (failing)"), "{list}");

    // On a phone.
    browser.viewport(true).await;
    for (name, path) in [
        ("endpoints-actions", "/admin/endpoints".to_owned()),
        ("endpoint-actions", format!("/admin/endpoints/{erp}")),
    ] {
        browser.goto(&app.url(&path)).await;
        wait_for_text(&browser, "ndpoint").await;
        browser
            .screenshot(&screenshot_path(&format!("{name}-phone")))
            .await;
        let overflow = browser
            .execute("return document.documentElement.scrollWidth > window.innerWidth;")
            .await;
        assert_eq!(
            overflow,
            serde_json::json!(false),
            "{path}: no sideways scrolling"
        );
    }
    browser.quit().await;

    let rows = audit(&mut conn);
    let actions: Vec<(&str, i64)> = rows
        .iter()
        .map(|r| (r.action.as_str(), r.affected))
        .collect();
    assert_eq!(actions, [("endpoint.recover", 3), ("endpoint.enable", 0)]);
    app.stop().await;
}

/// An order's delivery, with the relay binary started as a deployment runs
/// it: no WEBHOOK_URL, no WEBHOOK_SECRET, only the endpoint rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_webhook_url_delivers_to_the_endpoint_rows() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let erp = HttpSink::start([], Answer::status(204)).await;
    let (_, secret) = add_endpoint(&mut conn, "erp", &erp, None, 4);
    let order = place(&mut conn);
    pay(&mut conn, order);

    let launch = Launch::relay("no-webhook-url", &db.url)
        .without_env("WEBHOOK_URL")
        .without_env("WEBHOOK_SECRET")
        .args(&["--kinds", "order_webhook,endpoint_notice"]);
    let (mut relay, _) = BinProcess::start_relay(launch).await;
    wait_until("both deliveries are done", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == 2
    })
    .await;
    relay.terminate().await;

    let requests = erp.requests();
    let types: Vec<_> = requests
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(types, ["order.placed", "order.paid"]);
    for request in &requests {
        reference_verify(request, &secret).expect("signed with erp's secret");
    }
    let default: i64 = endpoints::table
        .filter(endpoints::name.eq(target::DEFAULT_ENDPOINT))
        .count()
        .get_result(&mut conn)
        .expect("count");
    assert_eq!(default, 0, "no WEBHOOK_URL, no `default`");
}

/// A delivery queued without an endpoint, and no `default` to send it to:
/// retried with an error that says what is missing, and delivered once
/// `default` exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unaddressed_delivery_without_default_waits_naming_the_problem_until_default_exists() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    // No endpoints at all: the placement queues one delivery to `default`.
    place(&mut conn);
    let unaddressed: (i64, serde_json::Value) = jobs_all::table
        .filter(jobs_all::kind.eq("order_webhook"))
        .select((jobs_all::id, jobs_all::payload))
        .first(&mut conn)
        .expect("the unaddressed delivery");
    assert_eq!(unaddressed.1.get("endpoint_id"), None, "{}", unaddressed.1);

    let launch = Launch::relay("no-default", &db.url)
        .without_env("WEBHOOK_URL")
        .without_env("WEBHOOK_SECRET")
        .args(&["--kinds", "order_webhook"]);
    let (mut relay, _) = BinProcess::start_relay(launch).await;
    let row = |conn: &mut PgConnection| -> (String, i32, Option<String>, bool) {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            status: String,
            #[diesel(sql_type = diesel::sql_types::Integer)]
            attempts: i32,
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            last_error: Option<String>,
            #[diesel(sql_type = diesel::sql_types::Bool)]
            later: bool,
        }
        let r: Row = diesel::sql_query(
            "SELECT status, attempts, last_error, run_after > now() + interval '30 seconds' AS later \
             FROM jobs_all WHERE id = $1",
        )
        .bind::<diesel::sql_types::BigInt, _>(unaddressed.0)
        .get_result(conn)
        .expect("the job");
        (r.status, r.attempts, r.last_error, r.later)
    };
    wait_until("the first attempt is over", Duration::from_secs(30), || {
        row(&mut conn).2.is_some()
    })
    .await;
    let (status, attempts, last_error, later) = row(&mut conn);
    assert_eq!((status.as_str(), attempts), ("pending", 1), "retryable");
    let last_error = last_error.unwrap_or_default();
    assert!(
        last_error.contains("goes to the endpoint \"default\", which does not exist")
            && last_error.contains("WEBHOOK_URL"),
        "{last_error}"
    );
    assert!(later, "retried no sooner than a minute later");

    // `default` appears (as `migrate` with WEBHOOK_URL would write it); the
    // retry is made due now rather than waiting out the minute.
    let sink = HttpSink::start([], Answer::status(204)).await;
    let secret = SigningSecret::generate().expect("secret");
    target::upsert_default(
        &mut conn,
        &sink.url(),
        secret.expose(),
        &order_service::sealed::Keyring::none(),
    )
    .expect("default");
    diesel::sql_query("UPDATE jobs SET run_after = now() WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(unaddressed.0)
        .execute(&mut conn)
        .expect("due now");
    wait_until("delivered to default", Duration::from_secs(30), || {
        done_webhooks(&mut conn) == 1
    })
    .await;
    relay.terminate().await;
    let requests = sink.requests();
    assert_eq!(requests.len(), 1);
    reference_verify(&requests[0], secret.expose()).expect("signed with default's secret");
}
