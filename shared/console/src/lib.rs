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

/// Where a user of a stack's console signs in, and gets credentials: all public names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    pub region: String,
    /// The user pool's sign-in domain (`<prefix>.auth.<region>.amazoncognito.com`).
    pub domain: String,
    /// The user pool's app client for the console (public: no secret).
    pub client_id: String,
    pub identity_pool: String,
    /// The user pool as the identity pool names it (`cognito-idp.<region>.amazonaws.com/<id>`).
    pub provider: String,
}

impl Mode {
    /// The `config.json` the page reads first.
    pub fn config(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The policy a browser holds the page to: nothing but its own files, calls to its own
    /// origin (and, signed in, to its sign-in and identity services), no frames (so no other
    /// site can overlay it), no inline script.
    pub fn content_security_policy(&self) -> String {
        let connect = match self {
            Mode::Proxy => "'self'".to_owned(),
            Mode::Signed(s) => format!(
                "'self' https://{} https://cognito-identity.{}.amazonaws.com",
                s.domain, s.region
            ),
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
            // SVG's namespace (which fetches nothing) and the sign-in services the stack's
            // configuration names.
            let named = body
                .replace("\"http://www.w3.org/2000/svg\"", "")
                .replace("\"https://\" + config.domain", "")
                .replace("\"https://cognito-identity.\" + config.region", "");
            assert!(!named.contains("http://") && !named.contains("https://"), "{body}");
            assert!(!named.contains("onclick=") && !named.contains("<script>"), "{body}");
        }
        assert_eq!(file("index.html").map(|f| f.0), Some("text/html; charset=utf-8"));
        assert!(file("../Cargo.toml").is_none());
    }

    #[test]
    fn a_signed_in_page_may_call_its_sign_in_services_and_nothing_else() {
        let signed = Mode::Signed(SignIn {
            region: "eu-west-1".into(),
            domain: "ops.auth.eu-west-1.amazoncognito.com".into(),
            client_id: "c".into(),
            identity_pool: "eu-west-1:p".into(),
            provider: "cognito-idp.eu-west-1.amazonaws.com/u".into(),
        });
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
}
