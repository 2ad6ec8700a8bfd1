//! The dashboard's view of job dependencies: a job's page (what it waits for,
//! with links to its parents, and the jobs that wait for it) and an order's
//! timeline, where the confirmation waits for its receipt. Over plain HTTP,
//! and the job page in a real headless Chromium at desktop width.

use diesel::prelude::*;
use order_service::orders::{order_enqueuer, place_order};
use order_service::schema::jobs_all;
use reqwest::StatusCode;

use crate::admin::{
    OPERATOR, admin_settings, http_login, log_in, raw_client, screenshot_path, wait_for_text,
};
use crate::support::app::spawn_app_with;
use crate::support::browser::Browser;
use crate::support::sample_order;

/// Places an order (no relay runs, so its confirmation keeps waiting) and
/// returns the order's id, its confirmation_email's and its receipt_pdf's.
fn placed(conn: &mut PgConnection) -> (i64, i64, i64) {
    let order_id = place_order(conn, &order_enqueuer(), &sample_order(), None, 8)
        .expect("place order")
        .order_id();
    let job = |conn: &mut PgConnection, kind: &str| -> i64 {
        jobs_all::table
            .filter(jobs_all::order_id.eq(order_id))
            .filter(jobs_all::kind.eq(kind))
            .select(jobs_all::id)
            .first(conn)
            .expect("the order's job")
    };
    let email = job(conn, "confirmation_email");
    let receipt = job(conn, "receipt_pdf");
    (order_id, email, receipt)
}

async fn page(client: &reqwest::Client, url: String, cookie: &str) -> (StatusCode, String) {
    let response = client
        .get(url)
        .header("cookie", cookie)
        .send()
        .await
        .expect("GET");
    let status = response.status();
    (status, response.text().await.expect("page"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_page_links_its_parents_and_its_children() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let (order_id, email, receipt) = placed(&mut conn);
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;

    // The email: waiting for the receipt, a link to it, and its policy.
    let (status, html) = page(&client, app.url(&format!("/admin/jobs/{email}")), &cookie).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains(&format!("Job #{email}")), "{html}");
    assert!(
        html.contains(&format!(
            "waiting for <a href=\"/admin/jobs/{receipt}\">receipt_pdf #{receipt}</a>"
        )),
        "{html}"
    );
    assert!(
        html.contains(&format!("<a href=\"/admin/jobs/{receipt}\">#{receipt}</a>"))
            && html.contains("waits for it"),
        "the parents' table: {html}"
    );
    assert!(html.contains("<code>run</code>"), "{html}");
    assert!(html.contains("No job waits for this one."), "{html}");
    assert!(
        html.contains(&format!("href=\"/admin/orders/{order_id}\"")),
        "{html}"
    );

    // The receipt: no parents, the email as its child, still waiting.
    let (status, html) = page(&client, app.url(&format!("/admin/jobs/{receipt}")), &cookie).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("enqueued without parents"), "{html}");
    assert!(
        html.contains(&format!("<a href=\"/admin/jobs/{email}\">#{email}</a>"))
            && html.contains("it waits for this job"),
        "the children's table: {html}"
    );

    // The jobs list links each job to its page.
    let (_, html) = page(
        &client,
        app.url(&format!("/admin/jobs?order={order_id}")),
        &cookie,
    )
    .await;
    assert!(
        html.contains(&format!("href=\"/admin/jobs/{email}\"")),
        "{html}"
    );

    // No such job, or not a job id: a 404 page, not a panic.
    for bad in ["999999999", "0", "-1", "abc"] {
        let (status, html) = page(&client, app.url(&format!("/admin/jobs/{bad}")), &cookie).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{bad}: {html}");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_timeline_shows_the_email_waiting_for_the_receipt() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let (order_id, email, receipt) = placed(&mut conn);
    let client = raw_client();
    let (cookie, _) = http_login(&client, &app, OPERATOR).await;

    let (status, html) = page(
        &client,
        app.url(&format!("/admin/orders/{order_id}")),
        &cookie,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains(&format!(
            "confirmation_email waiting for receipt_pdf #{receipt}"
        )),
        "{html}"
    );
    assert!(
        html.contains(&format!("<a href=\"/admin/jobs/{email}\">job #{email}</a>")),
        "{html}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_page_in_a_real_browser_at_desktop_width() {
    let app = spawn_app_with(admin_settings()).await;
    let mut conn = app.db.conn();
    let (_, email, receipt) = placed(&mut conn);
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.viewport(false).await;
    log_in(&browser, &app, OPERATOR).await;
    browser
        .goto(&app.url(&format!("/admin/jobs/{email}")))
        .await;
    let text = wait_for_text(&browser, "Waits for").await;
    assert!(text.contains(&format!("receipt_pdf #{receipt}")), "{text}");
    browser.screenshot(&screenshot_path("job-desktop")).await;
    // The link leads to the parent's page, which names the email as its child.
    browser
        .click(&format!("main a[href=\"/admin/jobs/{receipt}\"]"))
        .await;
    let text = wait_for_text(&browser, &format!("Job #{receipt}")).await;
    assert!(text.contains(&format!("#{email}")), "{text}");
    browser
        .screenshot(&screenshot_path("job-parent-desktop"))
        .await;
    browser.quit().await;
    app.stop().await;
}
