//! A real headless Chromium, driven over the W3C WebDriver protocol by
//! Debian's `chromedriver`.
//!
//! The protocol is a handful of JSON calls over HTTP, so this speaks it with
//! the reqwest client the tests already use instead of adding a WebDriver
//! crate (and its own HTTP and TLS stack) to a build that two cores compile.
//! Full-page screenshots and phone emulation go through chromedriver's
//! Chrome DevTools pass-through (`goog/cdp/execute`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// One chromedriver process and one browser session, ended on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempdir::Dir,
}

/// A temporary directory of our own (the crate has no tempfile dependency).
mod tempdir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> Dir {
            let path = std::env::temp_dir().join(format!(
                "{prefix}-{}-{}",
                std::process::id(),
                fastrand::u64(..)
            ));
            std::fs::create_dir_all(&path).expect("create a temporary directory");
            Dir(path)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A found element.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session.
    ///
    /// `None` when Chromium or chromedriver is not installed: the caller then
    /// skips its test, and one line on stderr names the packages to install.
    /// Under `CI=true` a missing browser fails the test instead, so CI always
    /// runs the browser tests.
    pub async fn start() -> Option<Browser> {
        let driver_bin = find_program(&["chromedriver"]);
        let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]);
        let (Some(driver_bin), Some(chromium)) = (driver_bin, chromium) else {
            let missing = "Chromium or chromedriver is not installed \
                           (Debian: apt-get install chromium chromium-driver)";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{missing}: with CI=true the browser tests must run"
            );
            // Straight to stderr, past the test harness's capture, which would
            // hide it for a test that passes.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: this browser test did not run: {missing}"
            );
            return None;
        };
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            listener.local_addr().expect("address").port()
        };
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = super::app::http_client();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http
                .get(format!("{base}/status"))
                .send()
                .await
                .ok()
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start in 20s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempdir::Dir::new("outbox-admin-chromium");
        let args = vec![
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--hide-scrollbars".to_owned(),
            "--window-size=1280,900".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({
            "capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium, "args": args}
            }}
        });
        let response: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("POST /session")
            .json()
            .await
            .expect("session JSON");
        let session = response["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {response}"))
            .to_owned();
        Some(Browser {
            driver,
            base,
            session,
            http,
            _profile: profile,
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status();
        let body: Value = response.json().await.expect("WebDriver JSON");
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        body["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    pub async fn current_url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The visible text of the page. One script call rather than "find body,
    /// read its text", so a navigation in between cannot leave a stale handle.
    pub async fn text(&self) -> String {
        self.execute("return document.body ? document.body.innerText : '';")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn find(&self, css: &str) -> Element {
        let value = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        Element(
            value[ELEMENT_KEY]
                .as_str()
                .unwrap_or_else(|| panic!("no element {css}: {value}"))
                .to_owned(),
        )
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let value = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|v| v[ELEMENT_KEY].as_str().map(|s| Element(s.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub async fn element_text(&self, element: &Element) -> String {
        self.call(
            reqwest::Method::GET,
            &format!("/element/{}/text", element.0),
            None,
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/clear", element.0),
            Some(json!({})),
        )
        .await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/value", element.0),
            Some(json!({"text": text})),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        )
        .await;
    }

    /// Runs a script in the page (WebDriver's own channel, not subject to
    /// the page's Content-Security-Policy): tests use it to tamper with a form.
    pub async fn execute(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
    }

    /// The value of cookie `name` for the current page, HttpOnly ones
    /// included (WebDriver sees what page scripts cannot).
    pub async fn cookie(&self, name: &str) -> Option<String> {
        let cookies = self.call(reqwest::Method::GET, "/cookie", None).await;
        cookies.as_array()?.iter().find_map(|c| {
            (c["name"] == name).then(|| c["value"].as_str().unwrap_or_default().to_owned())
        })
    }

    /// Sends `headers` with every request the page makes from now on, as a
    /// proxy in front of the server would add them (`X-Forwarded-For`).
    pub async fn extra_headers(&self, headers: Value) {
        self.cdp("Network.enable", json!({})).await;
        self.cdp("Network.setExtraHTTPHeaders", json!({"headers": headers}))
            .await;
    }

    /// A desktop viewport (1280 wide) or a phone's (390 wide, touch, mobile
    /// viewport rules), for the pages loaded next.
    pub async fn viewport(&self, phone: bool) {
        let (width, height, mobile) = if phone {
            (390, 844, true)
        } else {
            (1280, 900, false)
        };
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .await;
    }

    /// A PNG of the whole page (not only the viewport) at `path`.
    pub async fn screenshot(&self, path: &Path) {
        let metrics = self.cdp("Page.getLayoutMetrics", json!({})).await;
        let size = &metrics["cssContentSize"];
        let width = size["width"].as_f64().unwrap_or(1280.0);
        let height = size["height"].as_f64().unwrap_or(900.0).min(6000.0);
        let shot = self
            .cdp(
                "Page.captureScreenshot",
                json!({
                    "format": "png",
                    "optimizeForSpeed": true,
                    "captureBeyondViewport": true,
                    "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
                }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot directory");
        }
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Ends the session and the driver.
    pub async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A panicking test must not leave chromedriver (and its browser) behind.
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
