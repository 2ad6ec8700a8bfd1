//! confirmation_email end to end: a real relay, lettre, and an SMTP server on port 0.

use order_service::orders::order_enqueuer;
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use order_service::effects::email::{EmailConfig, Mailer};
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::{self, EffectError, JobContext, JobHandler};
use order_service::orders::{NewOrder, Order, OrderId, load_order, place_order};
use order_service::schema::{jobs_all, receipts};
use tokio_util::sync::CancellationToken;

use crate::support::smtp::{Mail, SmtpSink};
use crate::support::{
    RunningRelay, TestDb, executor, init_tracing, order_json, spawn_relay, test_settings,
    wait_until,
};

const MAIL_FROM: &str = "Outbox Shop <orders@shop.example>";

fn mailer_for(smtp_url: String) -> Mailer {
    Mailer::new(&EmailConfig {
        smtp_url,
        mail_from: MAIL_FROM.to_owned(),
        public_base_url: "https://shop.example/".to_owned(),
        receipt_links: Some(crate::support::app::test_receipt_links()),
    })
    .expect("mailer")
}

/// Places one order; returns its id and the id of its confirmation_email job.
fn place(conn: &mut PgConnection, name: &str, max_attempts: i32) -> (i64, i64) {
    let order = NewOrder::parse(&order_json(name)).expect("valid order");
    let order_id = place_order(conn, &order_enqueuer(), &order, None, max_attempts)
        .expect("place order")
        .order_id();
    let job_id = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq("confirmation_email"))
        .select(jobs_all::id)
        .first(conn)
        .expect("confirmation_email job");
    (order_id, job_id)
}

/// A relay for the confirmation and the receipt it waits for.
fn email_relay(db: &TestDb, mailer: Mailer) -> RunningRelay {
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        Some(mailer),
        None,
        ReceiptSettings::default(),
    ));
    spawn_relay(db, relay_settings(), effects)
}

fn relay_settings() -> order_service::worker_pool::PoolSettings {
    test_settings("mail-relay", &["confirmation_email", "receipt_pdf"])
}

/// How many confirmation_email jobs have `status`.
fn emails(conn: &mut PgConnection, status: &str) -> i64 {
    jobs_all::table
        .filter(jobs_all::kind.eq("confirmation_email"))
        .filter(jobs_all::status.eq(status))
        .count()
        .get_result(conn)
        .expect("count emails")
}

fn job(conn: &mut PgConnection, id: i64) -> (String, i32, Option<String>) {
    jobs_all::table
        .find(id)
        .select((jobs_all::status, jobs_all::attempts, jobs_all::last_error))
        .first(conn)
        .expect("job row")
}

fn message_id(mail: &Mail) -> String {
    mail.header("message-id").expect("Message-ID header")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_order_gets_one_confirmation_with_both_parts_and_a_job_derived_message_id() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let placed = [
        place(&mut conn, "Ada Lovelace", 8),
        place(&mut conn, "Иванов Пётр", 8),
    ];

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("both confirmations sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 2
    })
    .await;
    relay.stop().await;

    let mails = sink.mails();
    assert_eq!(mails.len(), 2, "one message per order");
    for ((order_id, job_id), name) in placed.iter().zip(["Ada Lovelace", "Иванов Пётр"]) {
        let expected_id = format!("<job-{job_id}.confirmation@shop.example>");
        let mail = mails
            .iter()
            .find(|m| message_id(m) == expected_id)
            .unwrap_or_else(|| panic!("no message with Message-ID {expected_id}"));
        assert!(mail.accepted());
        assert_eq!(mail.rcpt_to, vec!["TO:<ada@example.com>".to_owned()]);
        assert_eq!(mail.mail_from, "FROM:<orders@shop.example>");
        let subject = mail.header("subject").expect("Subject");
        assert!(subject.contains(&format!("#{order_id}")), "{subject}");
        // The text and HTML alternative, and the receipt beside it.
        let content_type = mail.header("content-type").expect("Content-Type");
        assert!(
            content_type.starts_with("multipart/mixed"),
            "{content_type}"
        );

        let receipt = format!("https://shop.example/orders/{order_id}/receipt.pdf");
        let text = mail.part("text/plain").expect("text part");
        let html = mail.part("text/html").expect("HTML part");
        // minijinja's HTML escaping writes `/` as `&#x2f;`, which HTML decodes.
        let html = html.replace("&#x2f;", "/");
        for part in [&text, &html] {
            assert!(part.contains(&format!("Hello {name},")), "{part}");
            assert!(part.contains(&format!("#{order_id}")), "{part}");
            assert!(
                part.contains("Green tea") && part.contains("TEA-1"),
                "{part}"
            );
            assert!(
                part.contains("4.50 EUR") && part.contains("9.00 EUR"),
                "{part}"
            );
            assert!(part.contains("Mug") && part.contains("12.00 EUR"), "{part}");
            assert!(part.contains("21.00 EUR"), "{part}");
            assert!(part.contains(&receipt), "{part}");
        }
        assert!(text.contains("2 × Green tea"), "{text}");
        // A signed link: `&` is `&amp;` in HTML, as it should be.
        assert!(
            html.contains(&format!("href=\"{receipt}?expires="))
                && html.contains("&amp;signature="),
            "{html}"
        );
        assert!(text.contains(&format!("{receipt}?expires=")), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_451_is_retried_and_the_retry_carries_the_same_message_id() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    sink.answer_data_with(["451 4.3.0 Mail server temporarily rejected message"]);
    let (_, job_id) = place(&mut conn, "Ada Lovelace", 8);

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("the confirmation is sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let (status, attempts, _) = job(&mut conn, job_id);
    assert_eq!((status.as_str(), attempts), ("done", 2));
    let mails = sink.mails();
    assert_eq!(mails.len(), 2, "the deferred attempt and the retry");
    assert!(!mails[0].accepted() && mails[1].accepted());
    let expected = format!("<job-{job_id}.confirmation@shop.example>");
    assert_eq!(message_id(&mails[0]), expected);
    assert_eq!(message_id(&mails[1]), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_550_for_the_recipient_fails_the_job_after_one_attempt_quoting_the_server() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    sink.answer_rcpt_with("550 5.1.1 <ada@example.com>: Recipient address rejected: User unknown");
    let (_, job_id) = place(&mut conn, "Ada Lovelace", 8);

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("the confirmation failed", Duration::from_secs(30), || {
        emails(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let (_, attempts, last_error) = job(&mut conn, job_id);
    assert_eq!(attempts, 1);
    let error = last_error.expect("last_error");
    assert!(error.contains("550"), "{error}");
    assert!(
        error.contains("Recipient address rejected: User unknown"),
        "{error}"
    );
    assert!(sink.accepted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_password_never_reaches_last_error_even_when_the_server_echoes_it() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    sink.answer_auth_with("535 5.7.8 Authentication failed for shop / hunter2-s3cret");
    let (_, job_id) = place(&mut conn, "Ada Lovelace", 2);

    let url = format!("smtp://shop:hunter2-s3cret@127.0.0.1:{}", sink.port());
    let relay = email_relay(&db, mailer_for(url));
    wait_until("the confirmation failed", Duration::from_secs(30), || {
        emails(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let (_, attempts, last_error) = job(&mut conn, job_id);
    assert_eq!(
        attempts, 2,
        "refused credentials are retried: the relay's config may be fixed"
    );
    let error = last_error.expect("last_error");
    assert!(error.contains("535"), "{error}");
    assert!(!error.contains("hunter2-s3cret"), "{error}");
}

fn order_with(conn: &mut PgConnection, name: &str, email: &str) -> Order {
    let (order_id, _) = place(conn, "placeholder", 8);
    let mut order = load_order(conn, OrderId::new(order_id))
        .expect("load order")
        .expect("order exists");
    // Set past validation on purpose: the mailer must hold even for data that
    // did not come through NewOrder::parse (old rows, other writers).
    order.customer_name = name.to_owned();
    order.customer_email = email.to_owned();
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_text_is_escaped_in_html_and_cannot_add_headers() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let mut order = order_with(
        &mut conn,
        "<script>alert(1)</script>\r\nBcc: victim@evil.example",
        "ada@example.com",
    );
    order.items[0].name = "Tea <img src=x onerror=alert(2)>".to_owned();

    mailer_for(sink.url())
        .send_confirmation(4242, &order)
        .await
        .expect("sent");

    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    assert_eq!(mail.rcpt_to, vec!["TO:<ada@example.com>".to_owned()]);
    let names: Vec<String> = mail
        .headers()
        .into_iter()
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect();
    assert!(!names.contains(&"bcc".to_owned()), "{names:?}");
    assert_eq!(names.iter().filter(|n| *n == "to").count(), 1, "{names:?}");
    let head = mail.data.split("\r\n\r\n").next().unwrap_or_default();
    assert!(!head.contains("victim@evil.example"), "{head}");

    let html = mail.part("text/html").expect("HTML part");
    assert!(
        !html.contains("<script>") && !html.contains("<img"),
        "{html}"
    );
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
        "{html}"
    );
    assert!(html.contains("Tea &lt;img"), "{html}");
    assert_eq!(message_id(mail), "<job-4242.confirmation@shop.example>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_does_not_parse_is_permanent_and_nothing_is_sent() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let order = order_with(&mut conn, "Ada", "ada at example dot com");

    let error = mailer_for(sink.url())
        .send_confirmation(1, &order)
        .await
        .expect_err("refused");

    assert!(matches!(error, EffectError::Permanent { .. }), "{error:?}");
    assert!(
        error.to_string().contains("not an email address"),
        "{error}"
    );
    assert!(sink.mails().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retryable() {
    let db = TestDb::new();
    let mut conn = db.conn();
    let order = order_with(&mut conn, "Ada", "ada@example.com");
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };

    let error = mailer_for(format!("smtp://127.0.0.1:{port}"))
        .send_confirmation(1, &order)
        .await
        .expect_err("nothing listens");

    assert!(matches!(error, EffectError::Retryable { .. }), "{error:?}");
}

/// The words of an RFC 2047 header value, decoded (`=?utf-8?b?...?=` and plain).
fn decode_header(value: &str) -> String {
    use base64::Engine as _;
    value
        .split_whitespace()
        .map(|word| {
            let lower = word.to_ascii_lowercase();
            match lower
                .strip_prefix("=?utf-8?b?")
                .and_then(|_| word.get(10..word.len().saturating_sub(2)))
            {
                Some(encoded) if lower.ends_with("?=") => String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .expect("base64 encoded-word"),
                )
                .expect("UTF-8 encoded-word"),
                _ => format!(" {word}"),
            }
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_japanese_order_is_mailed_as_utf8_in_both_parts_and_an_encoded_to_header() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let order = NewOrder::parse(&serde_json::json!({
        "customer_email": "yamada@example.jp",
        "customer_name": "山田太郎",
        "currency": "JPY",
        "items": [
            {"sku": "MATCHA-30", "name": "抹茶 (宇治) 30g", "quantity": 2, "unit_price_cents": 1800},
            {"sku": "BOWL-1", "name": "お茶碗", "quantity": 1, "unit_price_cents": 4500}
        ]
    }))
    .expect("valid order");
    place_order(&mut conn, &order_enqueuer(), &order, None, 8).expect("place order");

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("the confirmation is sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let mails = sink.mails();
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    // Every byte on the wire is ASCII: the parts are transfer-encoded and the
    // name in To is an RFC 2047 encoded-word, so no relay along the way needs
    // 8BITMIME or SMTPUTF8 to pass it on intact.
    assert!(
        mail.data.is_ascii(),
        "raw message is not 7-bit:\n{}",
        mail.data
    );
    let to = mail.header("to").expect("To");
    assert_eq!(decode_header(&to), "山田太郎 <yamada@example.jp>", "{to}");
    for part in ["text/plain", "text/html"] {
        let declared = mail
            .data
            .split("\r\n")
            .filter(|line| line.to_ascii_lowercase().starts_with("content-type: text/"))
            .find(|line| line.to_ascii_lowercase().contains(part))
            .unwrap_or_else(|| panic!("no {part} part header in:\n{}", mail.data))
            .to_ascii_lowercase();
        assert!(declared.contains("charset=utf-8"), "{declared}");
        let body = mail.part(part).unwrap_or_else(|| panic!("{part} part"));
        for expected in [
            "山田太郎",
            "抹茶 (宇治) 30g",
            "お茶碗",
            "3,600 JPY",
            "8,100 JPY",
        ] {
            assert!(
                body.contains(expected),
                "{part}: {expected:?} not in:\n{body}"
            );
        }
    }
}

/// The order's stored receipt, as `GET /orders/{id}/receipt.pdf` serves it.
fn stored_receipt(conn: &mut PgConnection, order_id: i64) -> Vec<u8> {
    receipts::table
        .find(order_id)
        .select(receipts::pdf)
        .first(conn)
        .expect("the stored receipt")
}

/// The parts of a message that are attachments: (file name, content type,
/// transfer encoding, decoded bytes).
fn attachments(mail: &Mail) -> Vec<(String, String, String, Vec<u8>)> {
    use mail_parser::MimeHeaders as _;
    let parsed = mail.parsed();
    parsed
        .attachments()
        .map(|part| {
            let content_type = part
                .content_type()
                .map(|ct| format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or_default()))
                .unwrap_or_default();
            (
                part.attachment_name().unwrap_or_default().to_owned(),
                content_type.to_ascii_lowercase(),
                part.content_transfer_encoding()
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                part.contents().to_vec(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confirmation_waits_for_the_receipt_and_carries_the_stored_pdf_byte_for_byte() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let (order_id, job_id) = place(&mut conn, "Ada Lovelace", 8);
    let (waiting_on, policy): (Vec<i64>, Option<String>) = jobs_all::table
        .find(job_id)
        .select((jobs_all::waiting_on, jobs_all::dependency_policy))
        .first(&mut conn)
        .expect("the email's row");
    let receipt_job: i64 = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq("receipt_pdf"))
        .select(jobs_all::id)
        .first(&mut conn)
        .expect("the receipt job");
    assert_eq!(
        waiting_on,
        vec![receipt_job],
        "the email waits for the receipt"
    );
    assert_eq!(policy.as_deref(), Some("run"));

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("the confirmation is sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let pdf = stored_receipt(&mut conn, order_id);
    assert!(pdf.starts_with(b"%PDF-"), "a PDF is stored");
    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    let content_type = mail.header("content-type").expect("Content-Type");
    assert!(
        content_type.starts_with("multipart/mixed"),
        "{content_type}"
    );
    let attached = attachments(mail);
    assert_eq!(attached.len(), 1, "one attachment");
    let (name, content_type, encoding, bytes) = &attached[0];
    assert_eq!(name, &format!("receipt-{order_id}.pdf"));
    assert_eq!(content_type, "application/pdf");
    assert_eq!(encoding, "base64");
    assert_eq!(bytes.len(), pdf.len());
    assert!(
        bytes == &pdf,
        "the attachment is receipts.pdf byte for byte"
    );
    // The body is still both alternatives, and keeps the link.
    let text = mail.part("text/plain").expect("text part");
    let html = mail.part("text/html").expect("HTML part");
    assert!(text.contains(&format!("receipt-{order_id}.pdf")), "{text}");
    let link = format!("https://shop.example/orders/{order_id}/receipt.pdf?expires=");
    assert!(text.contains(&link), "{text}");
    assert!(html.replace("&#x2f;", "/").contains(&link), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_receipt_leaves_the_confirmation_without_attachment_but_with_the_link() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let (order_id, job_id) = place(&mut conn, "Ada Lovelace", 1);
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        Some(mailer_for(sink.url())),
        None,
        ReceiptSettings::default(),
    ));
    // The receipt's one attempt fails for good; the email is the real one.
    let relay = spawn_relay(
        &db,
        relay_settings(),
        executor(move |job| {
            let effects = Arc::clone(&effects);
            async move {
                if job.kind == "receipt_pdf" {
                    return Err(EffectError::permanent("the receipt renderer is broken"));
                }
                let ctx = JobContext::new(&job, CancellationToken::new());
                effects.execute(&job, ctx).await
            }
        }),
    );
    wait_until("the confirmation is sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let receipt_status: String = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq("receipt_pdf"))
        .select(jobs_all::status)
        .first(&mut conn)
        .expect("the receipt job");
    assert_eq!(receipt_status, "failed");
    let (status, _, _) = job(&mut conn, job_id);
    assert_eq!(status, "done");
    let stored: i64 = receipts::table
        .filter(receipts::order_id.eq(order_id))
        .count()
        .get_result(&mut conn)
        .expect("count receipts");
    assert_eq!(stored, 0);

    let mails = sink.accepted();
    assert_eq!(mails.len(), 1, "the email is still sent");
    let mail = &mails[0];
    assert!(attachments(mail).is_empty(), "no attachment");
    assert!(mail.part("application/pdf").is_none());
    let content_type = mail.header("content-type").expect("Content-Type");
    assert!(
        content_type.starts_with("multipart/alternative"),
        "{content_type}"
    );
    let link = format!("https://shop.example/orders/{order_id}/receipt.pdf?expires=");
    let text = mail.part("text/plain").expect("text part");
    assert!(text.contains(&link), "{text}");
    assert!(!text.contains("attached"), "{text}");
    let html = mail.part("text/html").expect("HTML part");
    assert!(html.replace("&#x2f;", "/").contains(&link), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_over_two_mib_stays_behind_the_link() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let sink = SmtpSink::start().await;
    let (order_id, _) = place(&mut conn, "Ada Lovelace", 8);
    // A receipt stored before the job runs stays (the job's insert keeps the
    // first): one byte over the bound.
    let too_large = vec![b'x'; effects::email::MAX_RECEIPT_ATTACHMENT_BYTES + 1];
    diesel::insert_into(receipts::table)
        .values((
            receipts::order_id.eq(order_id),
            receipts::pdf.eq(&too_large),
        ))
        .execute(&mut conn)
        .expect("a large receipt");

    let relay = email_relay(&db, mailer_for(sink.url()));
    wait_until("the confirmation is sent", Duration::from_secs(30), || {
        emails(&mut conn, "done") == 1
    })
    .await;
    relay.stop().await;

    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    assert!(attachments(&mails[0]).is_empty(), "no attachment");
    assert!(
        mails[0].data.len() < 1024 * 1024,
        "the message stays small: {} bytes",
        mails[0].data.len()
    );
    let text = mails[0].part("text/plain").expect("text part");
    assert!(
        text.contains(&format!(
            "https://shop.example/orders/{order_id}/receipt.pdf?expires="
        )),
        "{text}"
    );
}
