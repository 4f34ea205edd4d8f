// How the console proves who uses it, wherever it is served from (`config.json` says which):
//
// - "proxy": `sas console` serves it on loopback and signs every call itself with the
//   operator's AWS credentials; the page sends the session token it was opened with.
// - "signed": the stack serves it, and its calls are signed here, in the browser, with SigV4
//   for execute-api, with the short-lived credentials the stack's Cognito identity pool gives
//   a signed-in user for the role of their group (operators or readers). Sign-in is the
//   issuer's own page (authorisation code with PKCE): the stack's user pool, or a JWT stack's
//   own issuer. Nothing but those credentials, for this tab, is kept.
"use strict";

window.SasAccess = (() => {
  const CREDENTIALS = "sas-console-credentials";
  const PKCE = "sas-console-pkce";
  const SESSION = "sas-console-session";
  const encoder = new TextEncoder();
  // Why the sign-in this page came back from gave no credentials, if it gave none.
  let refusal = null;

  class SessionError extends Error {}

  function hex(buffer) {
    return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  function base64url(buffer) {
    return btoa(String.fromCharCode(...new Uint8Array(buffer)))
      .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  async function sha256(text) {
    return crypto.subtle.digest("SHA-256", encoder.encode(text));
  }

  async function hmac(key, text) {
    const raw = typeof key === "string" ? encoder.encode(key) : key;
    const k = await crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    return crypto.subtle.sign("HMAC", k, encoder.encode(text));
  }

  // RFC 3986's encoding, as SigV4 wants it: everything but letters, digits and -_.~
  function strict(text) {
    return encodeURIComponent(text).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
  }

  // The headers that sign a request to `url` for execute-api in `region` (RFC 3986 query,
  // each path segment encoded again as every service but S3 expects).
  async function signature(method, url, body, credentials, region) {
    const u = new URL(url, location.href);
    const stamp = new Date().toISOString().replace(/[-:]|\.\d{3}/g, "");
    const day = stamp.slice(0, 8);
    const headers = { host: u.host, "x-amz-date": stamp };
    if (body) headers["content-type"] = "application/json";
    if (credentials.sessionToken) headers["x-amz-security-token"] = credentials.sessionToken;
    const names = Object.keys(headers).sort();
    const path = u.pathname.split("/").map(strict).join("/");
    const query = [...u.searchParams.entries()]
      .map(([k, v]) => [strict(k), strict(v)])
      .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0))
      .map(([k, v]) => k + "=" + v).join("&");
    const canonical = [method, path, query,
      names.map((n) => n + ":" + String(headers[n]).trim() + "\n").join(""),
      names.join(";"), hex(await sha256(body || ""))].join("\n");
    const scope = day + "/" + region + "/execute-api/aws4_request";
    const toSign = ["AWS4-HMAC-SHA256", stamp, scope, hex(await sha256(canonical))].join("\n");
    let key = await hmac("AWS4" + credentials.secretAccessKey, day);
    for (const part of [region, "execute-api", "aws4_request"]) key = await hmac(key, part);
    const signed = hex(await hmac(key, toSign));
    delete headers.host; // the browser sends it, as signed
    headers.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.accessKeyId + "/" + scope
      + ", SignedHeaders=" + names.join(";") + ", Signature=" + signed;
    return headers;
  }

  // The credentials of this tab's session, or a SessionError saying why there are none.
  function credentials() {
    const kept = JSON.parse(sessionStorage.getItem(CREDENTIALS) || "null");
    if (!kept) throw new SessionError(refusal || "not signed in");
    if (kept.expiration && kept.expiration < Date.now() + 30000) {
      sessionStorage.removeItem(CREDENTIALS);
      throw new SessionError("the session has expired: sign in again");
    }
    return kept;
  }

  // What a call of the admin API needs: its URL and headers.
  async function prepare(config, method, path, body) {
    if (config.mode === "proxy") {
      return { url: "api/" + path,
        headers: { "content-type": "application/json", "x-sas-console": sessionStorage.getItem(SESSION) || "" } };
    }
    const url = new URL("../" + path, location.href).href;
    return { url, headers: await signature(method, url, body, credentials(), config.region) };
  }

  // `url` with `params` added to its query (an issuer's endpoint may carry one already).
  function withQuery(url, params) {
    return url + (url.includes("?") ? "&" : "?") + new URLSearchParams(params);
  }

  // Sends the browser to the issuer's sign-in page.
  async function signIn(config) {
    const random = (n) => base64url(crypto.getRandomValues(new Uint8Array(n)));
    const verifier = random(48);
    const state = random(16);
    sessionStorage.setItem(PKCE, JSON.stringify({ verifier, state }));
    location.assign(withQuery(config.authorize, {
      response_type: "code", client_id: config.client_id, redirect_uri: redirect(),
      scope: "openid", state, code_challenge: base64url(await sha256(verifier)),
      code_challenge_method: "S256",
    }));
  }

  function redirect() {
    return location.origin + location.pathname;
  }

  // Back from the sign-in page with a code: its tokens, then the identity pool's credentials
  // for the role of the user's group.
  async function finish(config, code, state) {
    const saved = JSON.parse(sessionStorage.getItem(PKCE) || "{}");
    sessionStorage.removeItem(PKCE);
    if (!saved.state || saved.state !== state) throw new SessionError("the sign-in did not start here: sign in again");
    const tokens = await fetch(config.token, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ grant_type: "authorization_code", client_id: config.client_id,
        code, redirect_uri: redirect(), code_verifier: saved.verifier }),
    }).then((r) => r.json());
    if (!tokens.id_token) throw new SessionError("the sign-in was refused: " + (tokens.error || "no token"));
    const logins = { [config.provider]: tokens.id_token };
    const identity = (target, body) => fetch(config.identity, {
      method: "POST",
      headers: { "content-type": "application/x-amz-json-1.1", "x-amz-target": "AWSCognitoIdentityService." + target },
      body: JSON.stringify(body),
    }).then(async (r) => {
      const answer = await r.json();
      if (!r.ok) throw new SessionError("no credentials for this user (is it in the operators or readers group?): " + (answer.message || r.status));
      return answer;
    });
    const { IdentityId } = await identity("GetId", { IdentityPoolId: config.identity_pool, Logins: logins });
    const { Credentials: c } = await identity("GetCredentialsForIdentity", { IdentityId, Logins: logins });
    sessionStorage.setItem(CREDENTIALS, JSON.stringify({ accessKeyId: c.AccessKeyId,
      secretAccessKey: c.SecretKey, sessionToken: c.SessionToken, expiration: c.Expiration * 1000 }));
  }

  // Forgets this tab's credentials, and ends the issuer's session where it has a place for
  // that (the browser then comes back here); whether the browser goes there.
  function signOut(config) {
    sessionStorage.removeItem(CREDENTIALS);
    if (config.mode === "signed" && config.logout) {
      // Cognito reads logout_uri, other issuers post_logout_redirect_uri.
      location.assign(withQuery(config.logout, {
        client_id: config.client_id, logout_uri: redirect(), post_logout_redirect_uri: redirect() }));
      return true;
    }
    return false;
  }

  // Reads where the page is served from, takes a proxy's session token or a sign-in's code
  // out of the address, and returns the configuration.
  async function begin() {
    const config = await fetch("config.json", { cache: "no-store" }).then((r) => r.json());
    if (config.mode === "proxy") {
      const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
      if (fragment.get("session")) {
        sessionStorage.setItem(SESSION, fragment.get("session"));
        history.replaceState(null, "", location.pathname + "#/");
      }
      return config;
    }
    const query = new URLSearchParams(location.search);
    if (query.get("code")) {
      history.replaceState(null, "", location.pathname + "#/");
      try {
        await finish(config, query.get("code"), query.get("state"));
      } catch (e) {
        // Shown on the sign-in page, from which the user may try again.
        if (!(e instanceof SessionError)) throw e;
        refusal = e.message;
      }
    }
    return config;
  }

  return { begin, prepare, signIn, signOut, SessionError };
})();
