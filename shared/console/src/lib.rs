//! The operators' console: a page that shows what a stack is doing and gives its commands,
//! all through the admin API, so that what a caller may see and do is what the API's policies
//! allow, whatever the page shows.
//!
//! The page is three files with nothing external (no fonts, no scripts from elsewhere). It
//! holds no secret: where it is served from decides how its calls are signed. `sas console`
//! serves it on loopback and signs its calls with the operator's own AWS credentials, as `sas`
//! signs its own ([`Mode::Proxy`]).

/// The files of the page: path, content type, content.
pub const FILES: [(&str, &str, &str); 3] = [
    ("", "text/html; charset=utf-8", include_str!("../page/index.html")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../page/console.js")),
    ("console.css", "text/css; charset=utf-8", include_str!("../page/console.css")),
];

/// The policy a browser holds the page to: nothing but its own files and its own origin's
/// API, no frames (so no other site can overlay it), no inline script.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The header that carries a loopback console's session token on every call of its API:
/// a header no other site's page can set without the server's leave, which it never gives.
pub const TOKEN_HEADER: &str = "x-sas-console";

/// How the page reaches the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Through the server that serves it, at `api/admin/...`, which signs each call: the page
    /// sends the session token it was opened with, and nothing else proves who it is.
    Proxy,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Proxy => "proxy",
        }
    }
}

/// The page's file at `path` (relative to where the console is served), with its content type.
pub fn file(path: &str) -> Option<(&'static str, &'static str)> {
    let path = path.trim_start_matches('/');
    let path = if path == "index.html" { "" } else { path };
    FILES.iter().find(|(p, _, _)| *p == path).map(|(_, kind, body)| (*kind, *body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_its_own_files() {
        let (_, index) = file("").unwrap();
        assert!(index.contains("src=\"console.js\""), "{index}");
        assert!(index.contains("href=\"console.css\""), "{index}");
        for (_, _, body) in FILES {
            // Nothing fetched from elsewhere, nothing run inline (the one address named is
            // SVG's namespace, which names and fetches nothing).
            let named = body.replace("\"http://www.w3.org/2000/svg\"", "");
            assert!(!named.contains("http://") && !named.contains("https://"), "{body}");
            assert!(!body.contains("onclick=") && !body.contains("<script>"), "{body}");
        }
        assert_eq!(file("index.html").map(|f| f.0), Some("text/html; charset=utf-8"));
        assert!(file("../Cargo.toml").is_none());
    }
}
