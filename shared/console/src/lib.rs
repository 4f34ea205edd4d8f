//! The operators' console: a page that shows what a stack is doing and gives its commands,
//! all through the admin API, so that what a caller may see and do is what the API's policies
//! allow, whatever the page shows.
//!
//! The page is four files with nothing from elsewhere (no fonts, no scripts of other sites),
//! and holds no secret: where it is served from decides how its calls are signed, and its
//! `config.json` tells it. `sas console` serves it on loopback and signs its calls itself with
//! the operator's own AWS credentials ([`Mode::Proxy`]); a stack deployed with its console
//! serves it at `/console/` and the page signs its calls with the credentials its users get
//! by signing in ([`Mode::Signed`]).

use serde::{Deserialize, Serialize};

/// The files of the page: path, content type, content.
pub const FILES: [(&str, &str, &str); 4] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../page/index.html")),
    ("access.js", "text/javascript; charset=utf-8", include_str!("../page/access.js")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../page/console.js")),
    ("console.css", "text/css; charset=utf-8", include_str!("../page/console.css")),
];

/// The header that carries a loopback console's session token on every call of its API:
/// a header no other site's page can set without the server's leave, which it never gives.
pub const TOKEN_HEADER: &str = "x-sas-console";

/// How the page reaches the admin API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// Through the server that serves it, at `api/admin/...`, which signs each call: the page
    /// sends the session token it was opened with, and nothing else proves who it is.
    Proxy,
    /// Straight to the API it is served by, each call signed in the page with SigV4, with
    /// the credentials the stack's identity pool gives a signed-in user.
    Signed(SignIn),
}

/// Where a user of a stack's console signs in, and gets credentials: all public names, as
/// the page reads them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    pub region: String,
    /// The console's app client at the issuer (public: no secret).
    pub client_id: String,
    pub identity_pool: String,
    /// The issuer as the identity pool names it in `Logins`: a user pool's
    /// `cognito-idp.<region>.amazonaws.com/<id>`, another issuer's URL without `https://`.
    pub provider: String,
    /// Where the browser goes to sign in (the authorisation code flow with PKCE).
    pub authorize: String,
    /// Where the page trades the code for tokens.
    pub token: String,
    /// Where the browser goes to end the issuer's session, if the issuer has such a place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logout: Option<String>,
    /// The identity pools' endpoint (Cognito's in the region, or an emulator's).
    pub identity: String,
}

/// The console's sign-in as a stack configures its admin function (`CONSOLE_SIGNIN`): the
/// domain of its own user pool, or the issuer of a JWT stack, whose endpoints its discovery
/// document names. (Kept short: it counts towards the function's 4 KB of environment.)
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    pub region: String,
    pub client_id: String,
    pub identity_pool: String,
    pub provider: String,
    /// A Cognito user pool's sign-in domain (`<prefix>.auth.<region>.amazoncognito.com`).
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
}

/// What an issuer's `/.well-known/openid-configuration` says that the console needs.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
}

impl Setting {
    /// The address of the issuer's discovery document, for a setting that names an issuer.
    pub fn discovery_url(&self) -> Option<String> {
        self.issuer
            .as_ref()
            .map(|i| format!("{}/.well-known/openid-configuration", i.trim_end_matches('/')))
    }

    /// The page's sign-in, from this setting, the issuer's discovery document where it names
    /// an issuer, and the identity pools' endpoint `identity`; or why there is none.
    pub fn sign_in(
        &self,
        discovered: Option<&Discovery>,
        identity: &str,
    ) -> Result<SignIn, String> {
        let (authorize, token, logout) = match (&self.issuer, discovered) {
            // A user pool's endpoints, as Cognito places them on its domain.
            (None, _) => match &self.domain {
                Some(d) => (
                    format!("https://{d}/oauth2/authorize"),
                    format!("https://{d}/oauth2/token"),
                    Some(format!("https://{d}/logout")),
                ),
                None => return Err("the sign-in names neither an issuer nor a domain".into()),
            },
            (Some(_), None) => return Err("the issuer's discovery document is not read yet".into()),
            (Some(issuer), Some(d)) => {
                if d.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
                    return Err(format!(
                        "the discovery document is for issuer {:?}, not {issuer:?}",
                        d.issuer
                    ));
                }
                let endpoints = [Some(&d.authorization_endpoint), Some(&d.token_endpoint)];
                for url in endpoints.into_iter().chain([d.end_session_endpoint.as_ref()]).flatten()
                {
                    if !secure(url) {
                        return Err(format!("the issuer's endpoint {url:?} is not https"));
                    }
                }
                (
                    d.authorization_endpoint.clone(),
                    d.token_endpoint.clone(),
                    d.end_session_endpoint.clone(),
                )
            }
        };
        Ok(SignIn {
            region: self.region.clone(),
            client_id: self.client_id.clone(),
            identity_pool: self.identity_pool.clone(),
            provider: self.provider.clone(),
            authorize,
            token,
            logout,
            identity: identity.to_owned(),
        })
    }
}

/// An address the page may send a code or a token to: https, or loopback's own http (where an
/// issuer and identity pools run on a developer's machine).
fn secure(url: &str) -> bool {
    url.starts_with("https://")
        || ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"]
            .iter()
            .any(|p| url.starts_with(p))
}

/// The scheme, host and port of `url`, as a content security policy names a source.
fn origin(url: &str) -> &str {
    let rest = url.find("://").map_or(0, |i| i + 3);
    url[rest..].find('/').map_or(url, |end| &url[..rest + end])
}

impl Mode {
    /// The `config.json` the page reads first.
    pub fn config(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The policy a browser holds the page to: nothing but its own files, calls to its own
    /// origin (and, signed in, to the issuer's token endpoint and the identity pools), no frames (so no other
    /// site can overlay it), no inline script.
    pub fn content_security_policy(&self) -> String {
        let connect = match self {
            Mode::Proxy => "'self'".to_owned(),
            Mode::Signed(s) => {
                let mut sources = vec!["'self'", origin(&s.token), origin(&s.identity)];
                sources.dedup();
                sources.join(" ")
            }
        };
        format!(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src {connect}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        )
    }
}

/// The page's file at `path` (relative to where the console is served; empty: the page),
/// with its content type.
pub fn file(path: &str) -> Option<(&'static str, &'static str)> {
    let path = path.trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    FILES.iter().find(|(p, _, _)| *p == path).map(|(_, kind, body)| (*kind, *body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_its_own_files_and_the_services_its_configuration_names() {
        let (_, index) = file("").unwrap();
        for script in ["access.js", "console.js"] {
            assert!(index.contains(&format!("src=\"{script}\"")), "{index}");
        }
        assert!(index.contains("href=\"console.css\""), "{index}");
        for (_, _, body) in FILES {
            // Nothing fetched from elsewhere, nothing run inline: the addresses named are
            // SVG's namespace (which fetches nothing); the sign-in services are those the
            // stack's configuration names.
            let named = body.replace("\"http://www.w3.org/2000/svg\"", "");
            assert!(!named.contains("http://") && !named.contains("https://"), "{body}");
            assert!(!named.contains("onclick=") && !named.contains("<script>"), "{body}");
        }
        assert_eq!(file("index.html").map(|f| f.0), Some("text/html; charset=utf-8"));
        assert!(file("../Cargo.toml").is_none());
    }

    fn cognito() -> Setting {
        Setting {
            region: "eu-west-1".into(),
            client_id: "c".into(),
            identity_pool: "eu-west-1:p".into(),
            provider: "cognito-idp.eu-west-1.amazonaws.com/u".into(),
            domain: Some("ops.auth.eu-west-1.amazoncognito.com".into()),
            issuer: None,
        }
    }

    const IDENTITY: &str = "https://cognito-identity.eu-west-1.amazonaws.com/";

    #[test]
    fn a_signed_in_page_may_call_its_token_endpoint_and_the_identity_pools_and_nothing_else() {
        let sign_in = cognito().sign_in(None, IDENTITY).unwrap();
        assert_eq!(
            sign_in.authorize,
            "https://ops.auth.eu-west-1.amazoncognito.com/oauth2/authorize"
        );
        assert_eq!(
            sign_in.logout.as_deref(),
            Some("https://ops.auth.eu-west-1.amazoncognito.com/logout")
        );
        let signed = Mode::Signed(sign_in);
        let policy = signed.content_security_policy();
        assert!(
            policy.contains(
                "connect-src 'self' https://ops.auth.eu-west-1.amazoncognito.com https://cognito-identity.eu-west-1.amazonaws.com;"
            ),
            "{policy}"
        );
        assert!(Mode::Proxy.content_security_policy().contains("connect-src 'self';"));
        assert_eq!(Mode::Proxy.config(), r#"{"mode":"proxy"}"#);
        assert!(signed.config().starts_with(r#"{"mode":"signed","region":"eu-west-1","#));
    }

    #[test]
    fn an_issuer_s_endpoints_come_from_its_discovery_document_checked_against_it() {
        let issuer = Setting {
            issuer: Some("https://login.example.com/oauth2/default".into()),
            provider: "login.example.com/oauth2/default".into(),
            domain: None,
            ..cognito()
        };
        assert_eq!(
            issuer.discovery_url().as_deref(),
            Some("https://login.example.com/oauth2/default/.well-known/openid-configuration")
        );
        let found: Discovery = serde_json::from_str(
            r#"{"issuer":"https://login.example.com/oauth2/default",
                "authorization_endpoint":"https://login.example.com/oauth2/default/v1/authorize",
                "token_endpoint":"https://tokens.example.net/v1/token",
                "jwks_uri":"https://login.example.com/keys"}"#,
        )
        .unwrap();
        let sign_in = issuer.sign_in(Some(&found), IDENTITY).unwrap();
        assert_eq!(sign_in.authorize, "https://login.example.com/oauth2/default/v1/authorize");
        assert_eq!(sign_in.logout, None);
        let policy = Mode::Signed(sign_in).content_security_policy();
        assert!(
            policy.contains(
                "connect-src 'self' https://tokens.example.net https://cognito-identity.eu-west-1.amazonaws.com;"
            ),
            "{policy}"
        );

        // Not read yet, another issuer's, or an endpoint in the clear: no sign-in.
        assert!(issuer.sign_in(None, IDENTITY).unwrap_err().contains("not read"));
        let other = Discovery { issuer: "https://evil.example".into(), ..found.clone() };
        assert!(issuer.sign_in(Some(&other), IDENTITY).unwrap_err().contains("evil.example"));
        let clear =
            Discovery { token_endpoint: "http://tokens.example.net/token".into(), ..found.clone() };
        assert!(issuer.sign_in(Some(&clear), IDENTITY).unwrap_err().contains("not https"));
        let local = Discovery { token_endpoint: "http://127.0.0.1:4000/token".into(), ..found };
        assert!(issuer.sign_in(Some(&local), IDENTITY).is_ok(), "loopback is the machine's own");
        let neither = Setting { domain: None, ..cognito() };
        assert!(neither.sign_in(None, IDENTITY).is_err());
    }
}
