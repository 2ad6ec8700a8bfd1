//! `outbox-relay demo` end to end, as a newcomer runs it: the built binary,
//! a short run, and what it leaves in its out directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

use crate::support::db::admin_url;

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "outbox-demo-test-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Files in `dir` with `extension`, sorted by name.
fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{} is readable: {e}", dir.display()))
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    found.sort();
    found
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[test]
fn the_demo_delivers_to_both_endpoints_and_the_stream_leaves_its_files_and_drops_its_database() {
    let _seat = crate::support::seats::scratch(40);
    let tmp = TempDir::new();
    let out = tmp.0.join("out");
    let stdout_path = tmp.0.join("stdout.txt");
    let stderr_path = tmp.0.join("stderr.txt");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["demo", "--orders", "3", "--out"])
        .arg(&out)
        .env("DATABASE_URL", admin_url())
        .env_remove("RELAY_BACKOFF_BASE")
        .env_remove("JOB_MAX_ATTEMPTS")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("run outbox-relay demo");
    let pid = child.id();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the demo") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the demo did not finish within 90s; stdout so far:\n{}",
                std::fs::read_to_string(&stdout_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    eprintln!("demo finished in {:.1}s", started.elapsed().as_secs_f64());
    assert!(
        status.success(),
        "{status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("3 orders placed"), "{stdout}");
    // Order #1 paid by a Stripe-signed event, the second copy a repeat; the
    // inbox's rows in the summary.
    assert!(
        stdout.contains("order #1   payment_intent.succeeded: applied"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the same event again (Stripe retries): repeat"),
        "{stdout}"
    );
    assert!(
        stdout.contains("order #3   charge.refunded: applied"),
        "{stdout}"
    );
    let inbox_rows = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("stripe ") && l.contains("evt_demo_"))
        .count();
    assert_eq!(
        inbox_rows, 3,
        "three messages stored, the repeat not again: {stdout}"
    );
    // 3 orders: 3 placements, order #1 paid (by a Stripe event), shipped and
    // delivered, order #2 cancelled, order #3 paid and refunded by Stripe
    // events; and order #4, placed with a 3s payment window and left unpaid,
    // expired by the relay's sweep: 11 events, each to both webhook
    // endpoints and, when a NATS server answers on 4222, to the stream; 4
    // receipts; 8 emails (4 confirmations, the shipping, the cancellation,
    // the refund and the expiry).
    let nats = !stdout.contains("NATS: skipped");
    let jobs = 4 + 8 + 2 * 11 + if nats { 11 } else { 0 };
    assert!(
        stdout.contains(&format!("{jobs} jobs: {jobs} done, 0 failed")),
        "{stdout}"
    );
    // Order #1's ledger, read back through GET /orders/1/effects: its
    // emails' SMTP replies, its receipt's digest, its deliveries' answers.
    assert!(
        stdout.contains("Effect ledger of order #1 (GET /orders/1/effects"),
        "{stdout}"
    );
    let ledger: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Effect ledger of order #1"))
        .collect();
    for answer in ["smtp 250 ", "pdf sha256 ", "http 200"] {
        assert!(
            ledger.iter().any(|l| l.contains(answer)),
            "{answer:?} in the ledger: {stdout}"
        );
    }
    assert!(
        stdout.contains("order #4   expired unpaid")
            && stdout.contains("Payment window: order #4 was placed with a 3s window"),
        "{stdout}"
    );
    if nats {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with("events ") && l.contains(" holds "))
            .unwrap_or_else(|| panic!("a row for the NATS endpoint: {stdout}"));
        assert!(line.contains("11 of 11"), "{line}");
        assert!(
            line.contains("stream DEMO_ORDERS_")
                && line.contains("holds 11 messages: one per event"),
            "the stream's count beside the webhooks: {line}"
        );
    } else {
        assert!(
            stdout.contains("NATS: skipped (nothing answers on 127.0.0.1:4222)"),
            "{stdout}"
        );
        crate::support::optional_tool_missing(
            "a NATS server on 127.0.0.1:4222 (the demo skipped its NATS endpoint)",
            "Debian: apt-get install nats-server, then nats-server -js",
        );
    }
    // Both endpoints got every event, each signed with its own secret only;
    // analytics was refused 3 calls, then recovered.
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")) && l.contains(" of "))
            .unwrap_or_else(|| panic!("a row for {name}: {stdout}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        row("shop-erp"),
        "shop-erp 11 of 11 11 0 11 of 11 verify with shop-erp's secret, 0 with analytics'"
    );
    assert_eq!(
        row("analytics"),
        "analytics 11 of 11 14 3 14 of 14 verify with analytics' secret, 0 with shop-erp's"
    );
    assert!(
        stdout.contains("it answered 503 to its first 3 calls, then recovered"),
        "{stdout}"
    );
    let at_analytics = stdout
        .lines()
        .find(|l| l.contains("Order #1's events at analytics, as they arrived: "))
        .unwrap_or_else(|| panic!("order #1's events at analytics: {stdout}"));
    assert!(
        at_analytics.contains("1:order.placed")
            && at_analytics.ends_with(
                "1:order.placed ✓ → 2:order.paid ✓ → 3:order.shipped ✓ → 4:order.delivered ✓"
            ),
        "order #1's events arrive in order, the later ones held back by a refused one: {at_analytics}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // One confirmation per order, the shipping, the cancellation, the
    // refund and the expiry emails, each a whole message a mail client opens.
    let emails = files(&out.join("emails"), "eml");
    assert_eq!(emails.len(), 8, "{emails:?}\n{stdout}");
    let mut subjects = Vec::new();
    for path in &emails {
        let text = std::fs::read_to_string(path).expect("an .eml is UTF-8");
        let headers = outbox_dev_tools::demo::sinks::smtp::parse_headers(
            text.split("\r\n\r\n").next().unwrap_or_default(),
        );
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let subject = header("Subject");
        // The file is named for its email (`0006-job-39.cancelled.eml`).
        let file = path.to_string_lossy();
        assert_eq!(
            file.ends_with(".confirmation.eml"),
            subject.ends_with("is confirmed")
        );
        assert!(subject.starts_with("Your order #"), "{text}");
        assert!(header("Message-ID").starts_with("<job-"), "{text}");
        if subject.ends_with("is confirmed") {
            // The confirmation carries the receipt it waited for: the same
            // bytes the API serves, which the demo saved in receipts/.
            use mail_parser::MimeHeaders as _;
            assert!(
                header("Content-Type").starts_with("multipart/mixed"),
                "{text}"
            );
            let order_id = subject
                .trim_start_matches("Your order #")
                .trim_end_matches(" is confirmed");
            let parsed = mail_parser::MessageParser::default()
                .parse(text.as_bytes())
                .expect("a MIME message");
            let attached: Vec<_> = parsed.attachments().collect();
            assert_eq!(attached.len(), 1, "{text}");
            assert_eq!(
                attached[0].attachment_name(),
                Some(format!("receipt-{order_id}.pdf").as_str())
            );
            assert!(attached[0].is_content_type("application", "pdf"));
            let served = std::fs::read(out.join("receipts").join(format!("order-{order_id}.pdf")))
                .expect("the receipt the demo fetched");
            assert!(
                attached[0].contents() == served.as_slice(),
                "the attachment of order #{order_id} is its receipt"
            );
        } else {
            assert!(
                header("Content-Type").starts_with("multipart/alternative"),
                "{text}"
            );
        }
        if subject.ends_with("is confirmed") || subject.ends_with("is on its way") {
            assert!(text.contains("/receipt.pdf"), "{text}");
        }
        if subject.ends_with("is on its way") {
            assert!(
                text.contains("JD014600006281"),
                "the tracking number: {text}"
            );
        }
        if subject.ends_with("has been cancelled") {
            assert!(text.contains("out of stock"), "the reason: {text}");
            assert!(file.ends_with(".cancelled.eml"), "{file}");
        }
        subjects.push(subject);
    }
    subjects.sort();
    assert_eq!(
        subjects,
        [
            "Your order #1 is confirmed",
            "Your order #1 is on its way",
            "Your order #2 has been cancelled",
            "Your order #2 is confirmed",
            "Your order #3 has been refunded",
            "Your order #3 is confirmed",
            "Your order #4 has expired unpaid",
            "Your order #4 is confirmed",
        ]
    );

    // Every webhook request, the refused ones included, in its endpoint's
    // directory, with its headers and signatures the receiver checked with
    // that endpoint's secret.
    for (endpoint, calls, refused) in [("shop-erp", 11, 0), ("analytics", 14, 3)] {
        let webhooks: Vec<serde_json::Value> = files(&out.join("webhooks").join(endpoint), "json")
            .iter()
            .map(|path| {
                serde_json::from_slice(&std::fs::read(path).expect("readable"))
                    .unwrap_or_else(|e| panic!("{} is JSON: {e}", path.display()))
            })
            .collect();
        assert_eq!(webhooks.len(), calls, "{endpoint}: {webhooks:?}");
        let mut answers_by_key: HashMap<String, Vec<i64>> = HashMap::new();
        for hook in &webhooks {
            let kind = hook["body"]["type"].as_str().unwrap_or_default();
            if kind == "order.placed" {
                assert_eq!(hook["body"]["event"], "order.placed", "{hook}");
            } else {
                assert!(kind.starts_with("order."), "{hook}");
            }
            assert!(
                hook["headers"]["webhook-signature"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("v1,")),
                "{hook}"
            );
            assert_eq!(hook["signature_valid"], true, "{endpoint}: {hook}");
            let key = hook["headers"]["idempotency-key"]
                .as_str()
                .expect("an Idempotency-Key header")
                .to_owned();
            answers_by_key
                .entry(key)
                .or_default()
                .push(hook["answered"].as_i64().expect("the answer's status"));
        }
        assert_eq!(answers_by_key.len(), 11, "{endpoint}: {answers_by_key:?}");
        let refusals: usize = answers_by_key
            .values()
            .map(|answers| answers.iter().filter(|&&a| a == 503).count())
            .sum();
        assert_eq!(refusals, refused, "{endpoint}: {answers_by_key:?}");
        assert!(
            answers_by_key
                .values()
                .all(|answers| answers.last() == Some(&200)),
            "every delivery to {endpoint} ends accepted: {answers_by_key:?}"
        );
    }

    // The receipts, fetched from the API, are PDFs a PDF library reads.
    let receipts = files(&out.join("receipts"), "pdf");
    assert_eq!(receipts.len(), 4, "{receipts:?}");
    for path in &receipts {
        let pdf = std::fs::read(path).expect("readable receipt");
        assert!(pdf.starts_with(b"%PDF-"), "{}", path.display());
        let text = pdf_extract::extract_text_from_mem(&pdf)
            .unwrap_or_else(|e| panic!("{} is a readable PDF: {e}", path.display()));
        assert!(text.contains("Total"), "{}: {text}", path.display());
    }

    // The scratch database is gone with the demo.
    let mut admin = PgConnection::establish(&admin_url()).expect("connect to the test server");
    let left: Count =
        diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname LIKE $1")
            .bind::<Text, _>(format!("outbox_demo_{pid}_%"))
            .get_result(&mut admin)
            .expect("query pg_database");
    assert_eq!(left.n, 0, "the demo's scratch database was dropped");
}

/// Server processes whose command line names `dir_prefix`.
fn postgres_processes_under(dir_prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(dir_prefix))
        .collect()
}

/// A second Ctrl-C exits at once, skipping destructors; the private server the
/// demo started must not outlive it, nor its temporary directory remain.
#[test]
fn a_second_ctrl_c_still_stops_and_removes_the_private_postgres() {
    if outbox_dev_tools::private_pg::find_bindir().is_none() {
        panic!("initdb and pg_ctl are needed (the CI script installs the PostgreSQL server)");
    }
    let tmp = TempDir::new();
    let stdout_path = tmp.0.join("stdout.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["demo", "--orders", "500", "--out"])
        .arg(tmp.0.join("out"))
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("run outbox-relay demo");
    let prefix = std::env::temp_dir()
        .join(format!("outbox-relay-pg-{}-", child.id()))
        .to_string_lossy()
        .into_owned();
    let started = Instant::now();
    while !std::fs::read_to_string(&stdout_path)
        .unwrap_or_default()
        .contains("Database ready")
    {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the demo exited before its database was ready"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no private PostgreSQL within 60s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !postgres_processes_under(&prefix).is_empty(),
        "the private server runs under {prefix}*"
    );

    let interrupt = || {
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill -INT")
    };
    interrupt();
    std::thread::sleep(Duration::from_millis(20));
    interrupt();
    let status = child.wait().expect("the demo exits");
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(130),
        "exited on the second signal:\n{stdout}"
    );

    // The graceful path may have started a `pg_ctl stop` of its own, which
    // the forced exit leaves to finish: give it a moment.
    let exited = Instant::now();
    while !postgres_processes_under(&prefix).is_empty()
        && exited.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = postgres_processes_under(&prefix);
    assert!(left.is_empty(), "still running: {left:?}");
    let dirs: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
}

/// With a fourth order, Stripe "cannot deliver" its payment: the demo
/// reconciles against its local event log and the order ends `paid`, the
/// message stored `via = reconcile`, and the summary says so.
#[test]
fn the_demo_recovers_a_payment_stripe_could_not_deliver() {
    let _seat = crate::support::seats::scratch(40);
    let tmp = TempDir::new();
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["demo", "--orders", "4", "--out"])
        .arg(tmp.0.join("out"))
        .env("DATABASE_URL", admin_url())
        .env_remove("JOB_MAX_ATTEMPTS")
        .stdin(Stdio::null())
        .output()
        .expect("run outbox-relay demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("recovered 1, already in the inbox 0; order #4   now paid (via reconcile)"),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("stripe ") && l.contains("_4 "))
        .unwrap_or_else(|| panic!("the recovered message's row: {stdout}"));
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        words[2..],
        ["payment_intent.succeeded", "#4", "reconcile", "applied"],
        "{row}"
    );
    assert!(
        stdout.contains("Order #4 was paid via reconcile"),
        "{stdout}"
    );
}
