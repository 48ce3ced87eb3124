//! A real headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`), for the dashboard's end-to-end tests. The driver
//! runs in its own process group; dropping the [`Browser`] ends the
//! session, kills the group and any Chromium process left on its profile
//! directory, and reaps them — also when a test panics.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::guard::require_tool;

/// The W3C WebDriver name of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
    profile: tempfile::TempDir,
    screenshots: PathBuf,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("base", &self.base)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session that accepts
    /// the test cluster's self-signed certificate; screenshots go to
    /// `screenshots`.
    pub fn start(screenshots: &Path) -> Browser {
        let chromium = require_tool("chromium");
        let chromedriver = require_tool("chromedriver");
        std::fs::create_dir_all(screenshots).expect("create the screenshot directory");
        let profile = tempfile::Builder::new()
            .prefix("corral-chromium-")
            .tempdir()
            .expect("create a Chromium profile directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("find a free port")
            .port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http,
            profile,
            screenshots: screenshots.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|status| status["value"]["ready"] == true);
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start within 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
            &format!("--user-data-dir={}", browser.profile.path().display()),
        ];
        let created = browser.call(
            reqwest::Method::POST,
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "acceptInsecureCerts": true,
                "goog:chromeOptions": {"binary": chromium, "args": args},
            }}})),
        );
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id from chromedriver: {created}"))
            .to_string();
        browser
    }

    /// A WebDriver command; panics with the driver's answer on an error.
    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method.clone(), path, body) {
            Ok(value) => value,
            Err(answer) => panic!("WebDriver {method} {path}: {answer}"),
        }
    }

    /// A WebDriver command; the driver's error answer as `Err`.
    fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Value> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"));
        let status = response.status();
        let value: Value = response.json().unwrap_or(Value::Null);
        if status.is_success() {
            Ok(value["value"].clone())
        } else {
            Err(json!({"status": status.as_u16(), "answer": value["value"]}))
        }
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        self.call(
            reqwest::Method::POST,
            &self.session_path("/url"),
            Some(json!({"url": url})),
        );
    }

    /// The page's URL now.
    pub fn url(&self) -> String {
        self.call(reqwest::Method::GET, &self.session_path("/url"), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub fn script(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            &self.session_path("/execute/sync"),
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Runs `script` in the page and waits for it to call its last
    /// argument (WebDriver's asynchronous script) with the result.
    pub fn script_async(&self, script: &str, args: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            &self.session_path("/execute/async"),
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Runs `script` every 100 ms until it returns something other than
    /// `null` or `false`; panics naming `what` (and the page's text) after
    /// `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.script(script, json!([]));
            if !value.is_null() && value != Value::Bool(false) {
                return value;
            }
            if Instant::now() > deadline {
                let text = self.script(
                    "return document.body ? document.body.innerText : ''",
                    json!([]),
                );
                panic!(
                    "timed out after {timeout:?} waiting for {what} at {}; the page shows:\n{}",
                    self.url(),
                    text.as_str().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The element `css` selects (panics if none).
    fn element(&self, css: &str) -> String {
        let found = self.call(
            reqwest::Method::POST,
            &self.session_path("/element"),
            Some(json!({"using": "css selector", "value": css})),
        );
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_string()
    }

    /// Clicks the element `css` selects; an element a live page replaced
    /// between finding and clicking is found again.
    pub fn click(&self, css: &str) {
        for _ in 0..20 {
            let id = self.element(css);
            match self.try_call(
                reqwest::Method::POST,
                &self.session_path(&format!("/element/{id}/click")),
                Some(json!({})),
            ) {
                Ok(_) => return,
                Err(answer) if answer["answer"]["error"] == "stale element reference" => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(answer) => panic!("WebDriver click on {css}: {answer}"),
            }
        }
        panic!("{css} was replaced every time it was about to be clicked");
    }

    /// Replaces the text of the input `css` selects with `text`.
    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call(
            reqwest::Method::POST,
            &self.session_path(&format!("/element/{id}/clear")),
            Some(json!({})),
        );
        self.call(
            reqwest::Method::POST,
            &self.session_path(&format!("/element/{id}/value")),
            Some(json!({"text": text})),
        );
    }

    /// Sends `keys` to the element `css` selects (a focusable element that
    /// is not an input, e.g. a terminal); WebDriver's `\u{E007}` is Enter.
    pub fn type_into_keys(&self, css: &str, keys: &str) {
        let id = self.element(css);
        self.call(
            reqwest::Method::POST,
            &self.session_path(&format!("/element/{id}/value")),
            Some(json!({"text": keys})),
        );
    }

    /// Forgets every cookie (signs the browser out).
    pub fn delete_cookies(&self) {
        self.call(reqwest::Method::DELETE, &self.session_path("/cookie"), None);
    }

    /// Saves a screenshot as `NAME.png` among the screenshots, checks it
    /// is not blank (its pixels vary), prints and returns its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let encoded = self.call(
            reqwest::Method::GET,
            &self.session_path("/screenshot"),
            None,
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("the screenshot is base64");
        let path = self.screenshots.join(format!("{name}.png"));
        std::fs::write(&path, &bytes).expect("write the screenshot");
        let spread = pixel_spread(&bytes);
        assert!(
            spread > 8.0,
            "screenshot {} looks blank: its brightness varies by only {spread:.1}",
            path.display()
        );
        eprintln!(
            "screenshot: {} (brightness spread {spread:.1})",
            path.display()
        );
        path
    }
}

/// The standard deviation of a PNG's pixel brightness (0–255): near zero
/// for a blank page.
pub fn pixel_spread(png_bytes: &[u8]) -> f64 {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("the screenshot is a PNG");
    let mut buffer = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut buffer)
        .expect("decode the screenshot");
    let channels = info.color_type.samples();
    let pixels = &buffer[..info.buffer_size()];
    let brightness: Vec<f64> = pixels
        .chunks(channels)
        .map(|p| p.iter().take(3).map(|&c| f64::from(c)).sum::<f64>() / p.len().min(3) as f64)
        .collect();
    let count = brightness.len().max(1) as f64;
    let mean = brightness.iter().sum::<f64>() / count;
    (brightness.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / count).sqrt()
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self
                .http
                .delete(format!("{}/session/{}", self.base, self.session))
                .timeout(Duration::from_secs(10))
                .send();
        }
        let group = nix::unistd::Pid::from_raw(-(self.driver.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Chromium processes that left the group: found by their profile.
        let profile = self.profile.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&profile) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        // Reap any that were our children's children re-parented to us
        // (none usually: they belong to init once the driver is gone).
        while let Ok(status) =
            nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
    }
}
