//! Secrets given in a file (`--secret-file PATH`) or on standard input
//! (`--secret-file -`), so that they never show in `ps` or a shell's
//! history: `sources add`, `sources rotate-secret`, `endpoints add`, driven
//! through the real binary.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::inbox::{STANDARD_SECRET, STRIPE_SECRET, intent_succeeded, now, post_stripe};
use crate::support::app::spawn_app;

/// Another Stripe secret, for the rotation.
const ROTATED_SECRET: &str = "whsec_9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f";

/// `outbox-relay <args>` with `stdin` on its standard input.
fn run(url: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("SECRETS_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run outbox-relay");
    let mut input = child.stdin.take().expect("stdin");
    // A command that refuses before reading closes its end: not this test's error.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("wait")
}

fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A usage error (exit 2) whose message names `words` and never `secret`.
fn refused(output: &Output, words: &[&str], secret: Option<&str>) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for word in words {
        assert!(stderr.contains(word), "{word:?} in {stderr}");
    }
    if let Some(secret) = secret {
        assert!(
            !stderr.contains(secret),
            "the secret is not echoed: {stderr}"
        );
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
    fn file(&self, name: &str, content: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, content).expect("write");
        path.display().to_string()
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How many sources and endpoints there are.
fn rows(app: &crate::support::app::TestApp) -> (i64, i64) {
    use diesel::prelude::*;
    use order_service::schema::{endpoints, sources};
    let mut conn = app.db.conn();
    (
        sources::table.count().get_result(&mut conn).expect("count"),
        endpoints::table
            .count()
            .get_result(&mut conn)
            .expect("count"),
    )
}

async fn answer(app: &crate::support::app::TestApp, secret: &str, id: &str) -> StatusCode {
    let body = intent_succeeded(id, json!("1"), 100, "eur", "pi_file");
    post_stripe(app, "stripe", secret, now(), &body)
        .await
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_and_endpoints_read_their_secret_from_a_file_or_standard_input() {
    let app = spawn_app().await;
    let url = app.db.url.clone();
    let dir = TempDir::new("secret-files");
    let stripe_file = dir.file("stripe.secret", &format!("{STRIPE_SECRET}\n"));

    let added = succeeded(&run(
        &url,
        &[
            "sources",
            "add",
            "--name",
            "stripe",
            "--kind",
            "stripe",
            "--secret-file",
            &stripe_file,
        ],
        "",
    ));
    assert!(
        !added.contains(STRIPE_SECRET),
        "a secret given is not printed: {added}"
    );
    crate::inbox::after_source_change().await;
    assert_eq!(
        answer(&app, STRIPE_SECRET, "evt_file_1").await,
        StatusCode::OK
    );

    // Standard input, as `pass show … | outbox-relay …` gives it.
    succeeded(&run(
        &url,
        &[
            "sources",
            "rotate-secret",
            "stripe",
            "--secret-file",
            "-",
            "--keep-old",
            "0s",
        ],
        &format!("{ROTATED_SECRET}\n"),
    ));
    crate::inbox::after_source_change().await;
    assert_eq!(
        answer(&app, STRIPE_SECRET, "evt_file_2").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        answer(&app, ROTATED_SECRET, "evt_file_3").await,
        StatusCode::OK
    );

    let endpoint_file = dir.file("erp.secret", &format!("{STANDARD_SECRET}\n"));
    let added: Value = serde_json::from_str(&succeeded(&run(
        &url,
        &[
            "endpoints",
            "add",
            "--name",
            "erp",
            "--url",
            "https://erp.example.com/hooks",
            "--secret-file",
            &endpoint_file,
            "--json",
        ],
        "",
    )))
    .expect("JSON");
    assert_eq!(
        added["secret"], STANDARD_SECRET,
        "the file's secret, its newline trimmed"
    );
    let piped: Value = serde_json::from_str(&succeeded(&run(
        &url,
        &[
            "endpoints",
            "add",
            "--name",
            "wms",
            "--url",
            "https://wms.example.com/hooks",
            "--secret-file",
            "-",
            "--json",
        ],
        STANDARD_SECRET,
    )))
    .expect("JSON");
    assert_eq!(piped["secret"], STANDARD_SECRET);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_secret_file_is_a_usage_error_naming_its_path_and_writes_nothing() {
    let app = spawn_app().await;
    let url = app.db.url.clone();
    let dir = TempDir::new("bad-secret-files");
    let empty = dir.file("empty.secret", "\n");
    let missing = dir.path("missing.secret");
    let short = dir.file("short.secret", "whsec_tooshort\n");
    let before = rows(&app);
    let source = |file: &str| {
        run(
            &url,
            &[
                "sources",
                "add",
                "--name",
                "s",
                "--kind",
                "stripe",
                "--secret-file",
                file,
            ],
            "",
        )
    };
    refused(&source(&empty), &["--secret-file", &empty, "empty"], None);
    refused(&source(&missing), &["--secret-file", &missing], None);
    refused(&source(&short), &["--secret-file"], Some("whsec_tooshort"));
    refused(&source("-"), &["--secret-file -", "empty"], None);
    let both = run(
        &url,
        &[
            "sources",
            "add",
            "--name",
            "s",
            "--kind",
            "stripe",
            "--secret",
            STRIPE_SECRET,
            "--secret-file",
            &empty,
        ],
        "",
    );
    assert_eq!(both.status.code(), Some(2), "one or the other");
    let rotate = run(
        &url,
        &[
            "sources",
            "rotate-secret",
            "nobody",
            "--secret-file",
            &missing,
        ],
        "",
    );
    refused(&rotate, &["--secret-file", &missing], None);
    let endpoint = run(
        &url,
        &[
            "endpoints",
            "add",
            "--name",
            "erp",
            "--url",
            "https://erp.example.com/hooks",
            "--secret-file",
            &empty,
        ],
        "",
    );
    refused(&endpoint, &["--secret-file", &empty, "empty"], None);

    assert_eq!(rows(&app), before, "nothing written");
    app.stop().await;
}
