//! The console as the stack serves it: its page, and where its users sign in. A stack with
//! its own user pool names its domain, whose endpoints are Cognito's; a JWT stack's issuer
//! names them in its discovery document, read the first time a page asks and kept for the
//! function's life (read again on the next asking if it could not be).

use std::time::Duration;

use sas_console::{Discovery, Setting, SignIn};
use tokio::sync::OnceCell;

/// How long the issuer's discovery document may take, well within API Gateway's 30 seconds.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct ConsoleSite {
    setting: Setting,
    /// The identity pools' endpoint the page calls.
    identity: String,
    resolved: OnceCell<SignIn>,
    http: reqwest::Client,
}

impl ConsoleSite {
    pub fn new(setting: Setting, identity: String) -> ConsoleSite {
        let http =
            reqwest::Client::builder().timeout(DISCOVERY_TIMEOUT).build().unwrap_or_default();
        ConsoleSite { setting, identity, resolved: OnceCell::new(), http }
    }

    /// The page's sign-in, or why it cannot be told (the issuer could not be read, or named
    /// endpoints the page may not use).
    pub async fn sign_in(&self) -> Result<&SignIn, String> {
        self.resolved
            .get_or_try_init(|| async {
                let discovered = match self.setting.discovery_url() {
                    None => None,
                    Some(url) => Some(self.discover(&url).await?),
                };
                self.setting.sign_in(discovered.as_ref(), &self.identity)
            })
            .await
    }

    async fn discover(&self, url: &str) -> Result<Discovery, String> {
        let unread = |e: reqwest::Error| {
            format!("the issuer's discovery document {url} could not be read: {e}")
        };
        let answer = self.http.get(url).send().await.map_err(unread)?;
        let answer = answer.error_for_status().map_err(unread)?;
        answer.json().await.map_err(|e| format!("{url} is not a discovery document: {e}"))
    }
}
