//! receipt_pdf end to end: the relay renders the receipt and stores it with the
//! job's completion; the stored PDF is read back with a PDF library.
//!
//! `RECEIPT_SAMPLE_DIR=/some/dir` keeps the PDFs this file renders, for a look.

use order_service::orders::order_enqueuer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::prelude::*;
use order_service::effects::receipt::ReceiptSettings;
use order_service::effects::{self, EffectError, JobContext, JobHandler};
use order_service::orders::{NewOrder, place_order};
use order_service::schema::{jobs, jobs_all, receipts};
use tokio_util::sync::CancellationToken;

use crate::support::{
    TestDb, count, executor, init_tracing, order_json, spawn_relay, test_cjk_font, test_settings,
    wait_until,
};

fn place(conn: &mut PgConnection, body: &serde_json::Value) -> (i64, i64) {
    let order = NewOrder::parse(body).expect("valid order");
    let order_id = place_order(conn, &order_enqueuer(), &order, None, 8)
        .expect("place order")
        .order_id();
    let job_id = jobs_all::table
        .filter(jobs_all::order_id.eq(order_id))
        .filter(jobs_all::kind.eq("receipt_pdf"))
        .select(jobs_all::id)
        .first(conn)
        .expect("receipt_pdf job");
    (order_id, job_id)
}

fn stored_receipts(conn: &mut PgConnection) -> Vec<(i64, Vec<u8>)> {
    receipts::table
        .select((receipts::order_id, receipts::pdf))
        .order(receipts::order_id)
        .load(conn)
        .expect("receipts")
}

fn text_of(pdf: &[u8]) -> String {
    pdf_extract::extract_text_from_mem(pdf).expect("the receipt is a readable PDF")
}

fn keep_sample(name: &str, pdf: &[u8]) {
    if let Some(dir) = std::env::var_os("RECEIPT_SAMPLE_DIR") {
        std::fs::create_dir_all(&dir).expect("create RECEIPT_SAMPLE_DIR");
        let path = std::path::Path::new(&dir).join(name);
        std::fs::write(&path, pdf).expect("write sample receipt");
        eprintln!("kept {}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_receipt_shows_order_items_total_and_an_international_customer() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (euro_order, _) = place(&mut conn, &order_json("Иванов Пётр"));
    let (yen_order, _) = place(
        &mut conn,
        &serde_json::json!({
            "customer_email": "giorgos@example.gr",
            "customer_name": "Γιώργος Παπαδόπουλος",
            "currency": "JPY",
            "items": [
                {"sku": "SAKE-720", "name": "Junmai sake 720 ml", "quantity": 3, "unit_price_cents": 2800},
                {"sku": "BOX-1", "name": "Gift box «Überraschung»", "quantity": 1, "unit_price_cents": 500}
            ]
        }),
    );
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        None,
        None,
        ReceiptSettings::default(),
    ));
    let relay = spawn_relay(&db, test_settings("receipts", &["receipt_pdf"]), effects);

    wait_until("both receipts rendered", Duration::from_secs(30), || {
        count(&mut conn, "done") == 2
    })
    .await;
    relay.stop().await;

    let stored = stored_receipts(&mut conn);
    assert_eq!(
        stored.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![euro_order, yen_order]
    );
    for (order_id, pdf) in &stored {
        assert!(pdf.starts_with(b"%PDF-"), "order {order_id}");
        assert!(pdf.len() < 200_000, "fonts are subset: {} bytes", pdf.len());
        keep_sample(&format!("receipt-{order_id}.pdf"), pdf);
    }

    let euro = text_of(&stored[0].1);
    for expected in [
        "Outbox Relay Demo Shop",
        &format!("#{euro_order}"),
        "Иванов Пётр",
        "ada@example.com",
        "Green tea",
        "TEA-1",
        "4.50 EUR",
        "9.00 EUR",
        "Mug",
        "12.00 EUR",
        "21.00 EUR",
    ] {
        assert!(euro.contains(expected), "{expected:?} not in:\n{euro}");
    }

    let yen = text_of(&stored[1].1);
    for expected in [
        &format!("#{yen_order}"),
        "Γιώργος Παπαδόπουλος",
        "Junmai sake 720 ml",
        "2,800 JPY",
        "8,400 JPY",
        "Gift box «Überraschung»",
        "8,900 JPY",
    ] {
        assert!(yen.contains(expected), "{expected:?} not in:\n{yen}");
    }
    assert!(!yen.contains("8,900.00"), "JPY has no minor unit:\n{yen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_or_rerun_receipt_job_never_stores_a_second_receipt() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (order_id, job_id) = place(&mut conn, &order_json("Zoë Ångström"));
    let effects = Arc::new(effects::workers(
        db.pool(4),
        None,
        None,
        ReceiptSettings::default(),
    ));
    // The first attempt renders a receipt, then "loses" its completion: the
    // rendered PDF must go nowhere and the retry must store exactly one.
    let failed_once = Arc::new(AtomicBool::new(false));
    let relay = spawn_relay(
        &db,
        test_settings("receipts", &["receipt_pdf"]),
        executor(move |job| {
            let effects = Arc::clone(&effects);
            let failed_once = Arc::clone(&failed_once);
            async move {
                let ctx = JobContext::new(&job, CancellationToken::new());
                let rendered = effects.execute(&job, ctx).await?;
                assert!(rendered.is_some(), "a receipt job returns its PDF to store");
                if !failed_once.swap(true, Ordering::SeqCst) {
                    return Err(EffectError::retryable("worker lost after rendering"));
                }
                Ok(rendered)
            }
        }),
    );

    wait_until("the receipt job is done", Duration::from_secs(30), || {
        count(&mut conn, "done") == 1
    })
    .await;
    let attempts: i32 = jobs_all::table
        .find(job_id)
        .select(jobs_all::attempts)
        .first(&mut conn)
        .expect("attempts");
    assert_eq!(attempts, 2);
    let first = stored_receipts(&mut conn);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, order_id);

    // An operator runs the finished job again: back from the archive into
    // jobs (where a relay that moves done jobs has put it), then due.
    diesel::sql_query(
        "WITH moved AS (DELETE FROM jobs_done WHERE id = $1 \
             RETURNING id, order_id, kind, payload, status, run_after, attempts, max_attempts, \
                       locked_by, locked_at, lease_expires_at, created_at, finished_at, \
                       last_error, lease_token, trace_context, ordering_key, blocked) \
         INSERT INTO jobs (id, order_id, kind, payload, status, run_after, attempts, \
                           max_attempts, locked_by, locked_at, lease_expires_at, created_at, \
                           finished_at, last_error, lease_token, trace_context, ordering_key, \
                           blocked) \
         SELECT * FROM moved",
    )
    .bind::<diesel::sql_types::BigInt, _>(job_id)
    .execute(&mut conn)
    .expect("bring the job back from the archive");
    diesel::update(jobs::table.find(job_id))
        .set((
            jobs::status.eq("pending"),
            jobs::attempts.eq(0),
            jobs::finished_at.eq(None::<chrono::DateTime<chrono::Utc>>),
            jobs::run_after.eq(diesel::dsl::now),
        ))
        .execute(&mut conn)
        .expect("re-queue the job");
    wait_until("the re-run is done", Duration::from_secs(30), || {
        let (status, attempts): (String, i32) = jobs_all::table
            .find(job_id)
            .select((jobs_all::status, jobs_all::attempts))
            .first(&mut conn)
            .expect("job");
        status == "done" && attempts == 1
    })
    .await;
    relay.stop().await;

    let after = stored_receipts(&mut conn);
    assert_eq!(after.len(), 1, "still exactly one receipt");
    assert_eq!(
        after[0].1, first[0].1,
        "the first receipt is kept as it was"
    );
    assert!(text_of(&after[0].1).contains("Zoë Ångström"));
}

/// Set in the subset of Noto Sans CJK that ships with the tests
/// (`tests/fonts/`), given as `RECEIPT_FONT_PATH` would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn japanese_chinese_and_korean_names_and_items_are_printed_not_boxes() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let order = |email: &str, name: &str, currency: &str, items: serde_json::Value| {
        serde_json::json!({
            "customer_email": email,
            "customer_name": name,
            "currency": currency,
            "items": items,
        })
    };
    let (japanese, _) = place(
        &mut conn,
        &order(
            "yamada@example.jp",
            "山田太郎",
            "JPY",
            serde_json::json!([
                {"sku": "MATCHA-30", "name": "抹茶 (宇治) 30g", "quantity": 2, "unit_price_cents": 1800},
                {"sku": "BOWL-1", "name": "お茶碗", "quantity": 1, "unit_price_cents": 4500}
            ]),
        ),
    );
    let (chinese, _) = place(
        &mut conn,
        &order(
            "wang@example.cn",
            "王小明",
            "CNY",
            serde_json::json!([
                {"sku": "LJ-250", "name": "西湖龙井茶 250克", "quantity": 1, "unit_price_cents": 16800}
            ]),
        ),
    );
    let (korean, _) = place(
        &mut conn,
        &order(
            "kim@example.kr",
            "김민준",
            "KRW",
            serde_json::json!([
                {"sku": "BORI-1", "name": "보리차 티백", "quantity": 3, "unit_price_cents": 4900}
            ]),
        ),
    );
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        None,
        None,
        ReceiptSettings::with_cjk_font(&test_cjk_font()).expect("the test CJK font"),
    ));
    let relay = spawn_relay(&db, test_settings("receipts", &["receipt_pdf"]), effects);
    wait_until("three receipts rendered", Duration::from_secs(60), || {
        count(&mut conn, "done") == 3
    })
    .await;
    relay.stop().await;

    let stored = stored_receipts(&mut conn);
    assert_eq!(
        stored.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![japanese, chinese, korean]
    );
    let expectations: [&[&str]; 3] = [
        &[
            "山田太郎",
            "抹茶 (宇治) 30g",
            "お茶碗",
            "3,600 JPY",
            "8,100 JPY",
        ],
        &["王小明", "西湖龙井茶 250克", "168.00 CNY"],
        &["김민준", "보리차 티백", "14,700 KRW"],
    ];
    for ((order_id, pdf), expected) in stored.iter().zip(expectations) {
        keep_sample(&format!("receipt-cjk-{order_id}.pdf"), pdf);
        // Both fonts are subset: a CJK collection embedded whole is megabytes.
        assert!(pdf.len() < 100_000, "order {order_id}: {} bytes", pdf.len());
        let text = text_of(pdf);
        for expected in expected {
            assert!(
                text.contains(expected),
                "order {order_id}: {expected:?} not in:\n{text}\n\
                 (does tests/fonts/ hold every character the test prints?)"
            );
        }
    }
}

/// A stored order whose currency the service no longer knows (the column's
/// CHECK takes any three capitals) cannot be rendered however often it is
/// tried: the job fails at once, and says which code it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_with_an_unknown_stored_currency_fails_its_receipt_for_good() {
    init_tracing();
    let db = TestDb::new();
    let mut conn = db.conn();
    let (order_id, job_id) = place(&mut conn, &order_json("Ada Lovelace"));
    diesel::sql_query("UPDATE orders SET currency = 'XYZ' WHERE id = $1")
        .bind::<diesel::sql_types::BigInt, _>(order_id)
        .execute(&mut conn)
        .expect("an unknown code");
    let effects: Arc<dyn JobHandler> = Arc::new(effects::workers(
        db.pool(4),
        None,
        None,
        ReceiptSettings::default(),
    ));
    let relay = spawn_relay(&db, test_settings("receipts", &["receipt_pdf"]), effects);
    wait_until("the receipt job failed", Duration::from_secs(30), || {
        count(&mut conn, "failed") == 1
    })
    .await;
    relay.stop().await;

    let (attempts, last_error): (i32, Option<String>) = jobs_all::table
        .find(job_id)
        .select((jobs_all::attempts, jobs_all::last_error))
        .first(&mut conn)
        .expect("the job");
    assert_eq!(attempts, 1, "a permanent failure: {last_error:?}");
    let last_error = last_error.unwrap_or_default();
    assert!(
        last_error.contains(&format!("order {order_id}")) && last_error.contains("\"XYZ\""),
        "{last_error}"
    );
    assert!(stored_receipts(&mut conn).is_empty());
}
