//! The dashboard tests' browser: a chromedriver process and a headless Chromium session on it,
//! with waits on conditions (never fixed sleeps).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use eggtimer_tests::{find_program, free_port, temp_dir};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// How long a wait for the page may take.
pub const T: Duration = Duration::from_secs(30);

/// A chromedriver process and a headless Chromium session on it.
pub struct Browser {
    pub client: Client,
    driver: Child,
    shots: PathBuf,
}

impl Browser {
    pub async fn start() -> Browser {
        let driver_bin = find_program(&["chromedriver"]).expect(
            "chromedriver is not on PATH: install Chromium and its driver \
             (Debian/Ubuntu: `sudo apt-get install -y chromium chromium-driver`)",
        );
        let chrome = find_program(&["chromium", "chromium-browser", "google-chrome"]).expect(
            "no Chromium on PATH: install it (Debian/Ubuntu: `sudo apt-get install -y chromium chromium-driver`)",
        );
        let port = free_port();
        // its own process group: dropping the Browser kills chromedriver and the Chromium it
        // started (which would otherwise outlive the test and keep polling)
        let driver = Command::new(driver_bin)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let profile = temp_dir("chromium-profile");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chrome,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                    "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        });
        let caps = match caps {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + T;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session on chromedriver at {url}: {e}"),
            }
        };
        Browser {
            client,
            driver,
            shots: temp_dir("screenshots"),
        }
    }

    /// Waits until the element `css` exists and `ok` holds for its text; returns the text.
    pub async fn text_until(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + T;
        let mut last = String::new();
        loop {
            if let Ok(e) = self.client.find(Locator::Css(css)).await
                && let Ok(t) = e.text().await
            {
                if ok(&t) {
                    return t;
                }
                last = t;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {css} still shows {last:?}\npage: {}",
                self.client.source().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `css` matches exactly `n` elements.
    pub async fn count_until(&self, css: &str, n: usize) {
        let deadline = Instant::now() + T;
        loop {
            let got = self
                .client
                .find_all(Locator::Css(css))
                .await
                .map_or(0, |v| v.len());
            if got == n {
                return;
            }
            assert!(Instant::now() < deadline, "{css}: {got} elements, not {n}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks `css`, finding it again when the page re-rendered it in between (lists refresh
    /// every 2 s: the element found can be replaced before the click lands).
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + T;
        loop {
            match self.element(css).await.click().await {
                Ok(()) => return,
                Err(err) if err.to_string().contains("stale") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => panic!("clicking {css}: {err}"),
            }
        }
    }

    /// Waits for the element `css`.
    pub async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(T)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css).await;
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    pub async fn open(&self, base: &str, page: &str) {
        self.client
            .goto(&format!("{base}/ui/#/{page}"))
            .await
            .unwrap();
    }

    /// Photographs the page as `<name>.png`.
    pub async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), &png).unwrap();
        if let Some(dir) = std::env::var_os("EGGTIMER_SCREENSHOTS") {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(PathBuf::from(dir).join(format!("{name}.png")), &png).unwrap();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = self.driver.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's process group; no memory is involved.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}
