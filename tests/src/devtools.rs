//! A page of headless Chromium driven as a person would drive it: opened at an address,
//! clicked, typed into, read, through the browser's DevTools protocol (JSON over a WebSocket).
//!
//! Only what the tests need: go to an address, run a script in the page and take its value,
//! wait until a script's value holds, and take a screenshot. A script that throws fails the
//! call with the page's own message.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::browser::Chromium;

/// Longest a call of the protocol may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One browser, with one page open.
#[derive(Debug)]
pub struct Tab {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Kept so that dropping the tab ends the browser.
    _browser: Child,
    _profile: tempdir::Dir,
}

mod tempdir {
    use std::path::PathBuf;

    /// A folder removed when dropped: the browser's profile.
    #[derive(Debug)]
    pub struct Dir(pub PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Tab {
    /// Starts `browser` headless with a fresh profile, `width` by `height` pixels, on a blank
    /// page.
    pub async fn open(browser: &Chromium, width: u32, height: u32) -> Result<Tab, String> {
        let profile = std::env::temp_dir().join(format!(
            "sas-devtools-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        std::fs::create_dir_all(&profile).map_err(|e| e.to_string())?;
        let mut child = browser
            .headless()
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("chromium did not start: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let find = async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("ws://") {
                    return Some(line[at..].trim().to_owned());
                }
            }
            None
        };
        let browser_url = tokio::time::timeout(CALL_TIMEOUT, find)
            .await
            .map_err(|_| "chromium did not say where its DevTools listen".to_owned())?
            .ok_or("chromium ended before its DevTools listened")?;
        // Keep reading its messages, or it blocks once the pipe is full.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let http = browser_url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .ok_or("no address in the DevTools URL")?
            .to_owned();
        let targets: Value = reqwest::get(format!("http://{http}/json/list"))
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let page = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .ok_or_else(|| format!("no page among {targets}"))?
            .to_owned();
        let (socket, _) =
            tokio_tungstenite::connect_async(page).await.map_err(|e| format!("DevTools: {e}"))?;
        let mut tab = Tab { socket, next_id: 0, _browser: child, _profile: tempdir::Dir(profile) };
        tab.call("Page.enable", json!({})).await?;
        tab.call("Runtime.enable", json!({})).await?;
        Ok(tab)
    }

    /// Sends one command and returns its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket.send(Message::text(message)).await.map_err(|e| e.to_string())?;
        let answer = async {
            while let Some(message) = self.socket.next().await {
                let Ok(Message::Text(text)) = message else { continue };
                let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                if value["id"] == id {
                    return match value.get("error") {
                        Some(error) => Err(format!("{method}: {error}")),
                        None => Ok(value["result"].clone()),
                    };
                }
            }
            Err("the browser closed its DevTools".to_owned())
        };
        tokio::time::timeout(CALL_TIMEOUT, answer)
            .await
            .map_err(|_| format!("{method}: no answer in {CALL_TIMEOUT:?}"))?
    }

    /// Goes to `url`, and waits until its document has loaded.
    pub async fn goto(&mut self, url: &str) -> Result<(), String> {
        self.call("Page.navigate", json!({ "url": url })).await?;
        self.wait_for("document.readyState === 'complete'", Duration::from_secs(30)).await?;
        Ok(())
    }

    /// The value of `script` run in the page (a promise is awaited).
    pub async fn eval(&mut self, script: &str) -> Result<Value, String> {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": script, "awaitPromise": true, "returnByValue": true }),
            )
            .await?;
        if let Some(thrown) = result.get("exceptionDetails") {
            let text = thrown
                .pointer("/exception/description")
                .or_else(|| thrown.get("text"))
                .and_then(Value::as_str)
                .unwrap_or("an exception");
            return Err(format!("{script}: {text}"));
        }
        Ok(result.pointer("/result/value").cloned().unwrap_or(Value::Null))
    }

    /// Waits until `script`'s value is true as JavaScript takes it (not false, null, absent,
    /// 0 or empty), and returns it; fails past `within`, saying what the page showed last.
    pub async fn wait_for(&mut self, script: &str, within: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        loop {
            let value = self.eval(script).await?;
            let falsy = match &value {
                Value::Null | Value::Bool(false) => true,
                Value::Number(n) => n.as_f64() == Some(0.0),
                Value::String(s) => s.is_empty(),
                _ => false,
            };
            if !falsy {
                return Ok(value);
            }
            if Instant::now() > deadline {
                let shown = self.eval("document.body ? document.body.innerText : ''").await?;
                return Err(format!("not in {within:?}: {script}\nthe page shows:\n{shown}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Clicks the element `selector` names, as a person would (it must be there).
    pub async fn click(&mut self, selector: &str) -> Result<(), String> {
        let script = format!(
            "(() => {{ const e = document.querySelector({s}); if (!e) throw new Error('nothing matches ' + {s}); e.click(); return true; }})()",
            s = Value::String(selector.to_owned())
        );
        self.eval(&script).await.map(|_| ())
    }

    /// Types `text` into the field `selector` names, replacing what it held.
    pub async fn fill(&mut self, selector: &str, text: &str) -> Result<(), String> {
        let script = format!(
            "(() => {{ const e = document.querySelector({s}); if (!e) throw new Error('nothing matches ' + {s}); e.focus(); e.value = {t}; e.dispatchEvent(new Event('input', {{ bubbles: true }})); return true; }})()",
            s = Value::String(selector.to_owned()),
            t = Value::String(text.to_owned())
        );
        self.eval(&script).await.map(|_| ())
    }

    /// The page as a PNG.
    pub async fn screenshot(&mut self) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" })).await?;
        let data = shot["data"].as_str().ok_or("no screenshot data")?;
        base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| e.to_string())
    }
}

/// A name unlikely to be taken twice in one process's temporary folder.
fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}
