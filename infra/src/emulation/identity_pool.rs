//! Cognito's identity pools, emulated for the users of an OpenID Connect issuer: what a JWT
//! stack's console calls once its user has signed in at the issuer (`GetId`, then
//! `GetCredentialsForIdentity`), in Cognito's own JSON protocol, from a page of another
//! origin as Cognito allows.
//!
//! The ID token is checked as IAM's OIDC provider checks it (the issuer's, for one of the
//! provider's client ids, not expired), and the role mapping's rules are applied in order as
//! Cognito applies them: the first that holds gives the role, and none denies. The
//! credentials are the local stack's: an access key id that says which managed policy the
//! role holds (see [`crate::access::callers`]) and the local secret, so that every call the
//! page signs with them is authorised by the API as a call of that role would be.

use axum::body::{Body, to_bytes};
use axum::http::{HeaderValue, Method, Request, Response, StatusCode};
use chrono::Utc;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::Error;
use crate::access::callers::Callers;
use crate::access::issuer::cors;
use crate::access::{jwt, sigv4};
use crate::emulation::provision::Stack;
use crate::emulation::template::{Template, scalar_string};

/// How long credentials last, as Cognito's do.
const CREDENTIAL_SECONDS: i64 = 3600;

/// One rule of a role mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub claim: String,
    pub match_type: String,
    pub value: String,
    /// The access key id's prefix of the role's policy.
    pub prefix: String,
}

impl Rule {
    fn holds(&self, claims: &Map<String, Value>) -> bool {
        let Some(found) = claims.get(&self.claim).and_then(Value::as_str) else {
            return false;
        };
        match self.match_type.as_str() {
            "Equals" => found == self.value,
            "Contains" => found.contains(&self.value),
            "StartsWith" => found.starts_with(&self.value),
            "NotEqual" => found != self.value,
            _ => false,
        }
    }
}

/// An identity pool whose users come from one OpenID Connect provider.
#[derive(Clone, Debug)]
pub struct IdentityPool {
    pub region: String,
    pub pool_id: String,
    /// The provider's name in `Logins`: its URL without the scheme.
    pub provider: String,
    pub issuer: String,
    pub client_ids: Vec<String>,
    pub rules: Vec<Rule>,
}

impl IdentityPool {
    /// The identity pool of `template` as `stack` resolves it, if it takes an OpenID Connect
    /// provider's users.
    pub fn read(template: &Template, stack: &Stack) -> Result<Option<IdentityPool>, Error> {
        let held = |kind: &'static str| {
            template
                .of_kind(kind)
                .filter(|(_, r)| stack.context.holds(r.condition.as_deref()))
                .collect::<Vec<_>>()
        };
        let bad = |m: String| Error::Template(m);
        for (id, pool) in held("AWS::Cognito::IdentityPool") {
            let properties = stack.eval(&pool.properties)?;
            let Some(arns) = properties.get("OpenIdConnectProviderARNs").and_then(Value::as_array)
            else {
                continue;
            };
            let [arn] = arns.as_slice() else {
                return Err(bad(format!("{id}: locally, one OpenID Connect provider only")));
            };
            let provider = held("AWS::IAM::OIDCProvider")
                .into_iter()
                .find(|(p, _)| stack.reference(p).as_deref() == arn.as_str())
                .ok_or_else(|| {
                    bad(format!(
                        "{id}: the provider {arn} is not one the stack makes; locally the stack makes its own (leave ConsoleOidcProviderArn empty)"
                    ))
                })?;
            let provider = stack.eval(&provider.1.properties)?;
            let issuer = provider.get("Url").map(scalar_string).transpose()?.unwrap_or_default();
            let client_ids = provider
                .get("ClientIdList")
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(|c| c.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let pool_id = stack.reference(id).unwrap_or_default();
            let mut rules = Vec::new();
            for (_, attachment) in held("AWS::Cognito::IdentityPoolRoleAttachment") {
                let a = stack.eval(&attachment.properties)?;
                if a.get("IdentityPoolId").and_then(Value::as_str) != Some(pool_id.as_str()) {
                    continue;
                }
                let mappings = a.get("RoleMappings").and_then(Value::as_object);
                for mapping in mappings.into_iter().flat_map(|m| m.values()) {
                    let listed =
                        mapping.pointer("/RulesConfiguration/Rules").and_then(Value::as_array);
                    for rule in listed.into_iter().flatten() {
                        let text =
                            |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or_default();
                        rules.push(Rule {
                            claim: text("Claim").to_owned(),
                            match_type: text("MatchType").to_owned(),
                            value: text("Value").to_owned(),
                            prefix: role_prefix(template, stack, text("RoleARN"))?,
                        });
                    }
                }
            }
            let provider = issuer.split_once("://").map_or(issuer.as_str(), |(_, r)| r).to_owned();
            return Ok(Some(IdentityPool {
                region: stack.context.region.clone(),
                pool_id,
                provider,
                issuer,
                client_ids,
                rules,
            }));
        }
        Ok(None)
    }

    /// Serves the pool on a free loopback port; returns its endpoint and the task.
    pub async fn serve(self) -> Result<(String, tokio::task::JoinHandle<()>), Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::Local(format!("local network: {e}")))?;
        let endpoint = format!(
            "http://{}/",
            listener.local_addr().map_err(|e| Error::Local(format!("local network: {e}")))?
        );
        let pool = std::sync::Arc::new(self);
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let pool = pool.clone();
            async move { cors(pool.answer(request).await) }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok((endpoint, task))
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        if request.method() == Method::OPTIONS {
            return Response::new(Body::empty());
        }
        let target = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = to_bytes(request.into_body(), 64 * 1024).await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer = match target.strip_prefix("AWSCognitoIdentityService.") {
            Some("GetId") => self.get_id(&body),
            Some("GetCredentialsForIdentity") => self.credentials(&body),
            _ => Err(("UnknownOperationException", format!("{target:?} is not emulated"))),
        };
        let (status, body) = match answer {
            Ok(body) => (StatusCode::OK, body),
            Err((kind, message)) => {
                (StatusCode::BAD_REQUEST, json!({"__type": kind, "message": message}))
            }
        };
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/x-amz-json-1.1"));
        response
    }

    /// The signed-in user's claims, from the token `Logins` gives for the provider.
    fn claims(&self, body: &Value) -> Result<Map<String, Value>, (&'static str, String)> {
        let token = body
            .get("Logins")
            .and_then(|logins| logins.get(&self.provider))
            .and_then(Value::as_str)
            .ok_or((
                "NotAuthorizedException",
                format!("no token of {} in Logins", self.provider),
            ))?;
        jwt::verify(Some(token), &self.issuer, &self.client_ids, Utc::now()).map_err(|refusal| {
            ("NotAuthorizedException", format!("Invalid login token. {refusal}"))
        })
    }

    fn identity_id(&self, claims: &Map<String, Value>) -> String {
        let sub = claims.get("sub").and_then(Value::as_str).unwrap_or_default();
        let digest = hex::encode(Sha256::digest(format!("{}#{sub}", self.provider)));
        format!("{}:{}", self.region, &digest[..32])
    }

    fn get_id(&self, body: &Value) -> Result<Value, (&'static str, String)> {
        if body.get("IdentityPoolId").and_then(Value::as_str) != Some(self.pool_id.as_str()) {
            return Err(("ResourceNotFoundException", "no such identity pool".into()));
        }
        let claims = self.claims(body)?;
        Ok(json!({"IdentityId": self.identity_id(&claims)}))
    }

    fn credentials(&self, body: &Value) -> Result<Value, (&'static str, String)> {
        let claims = self.claims(body)?;
        let identity = self.identity_id(&claims);
        if body.get("IdentityId").and_then(Value::as_str) != Some(identity.as_str()) {
            return Err(("NotAuthorizedException", "the token is not this identity's".into()));
        }
        let Some(rule) = self.rules.iter().find(|r| r.holds(&claims)) else {
            return Err((
                "InvalidIdentityPoolConfigurationException",
                "no rule of the role mapping matches the token, and an ambiguous role is denied"
                    .into(),
            ));
        };
        let sub = claims.get("sub").and_then(Value::as_str).unwrap_or_default();
        let expiration = Utc::now().timestamp() + CREDENTIAL_SECONDS;
        Ok(json!({
            "IdentityId": identity,
            "Credentials": {
                "AccessKeyId": format!("{}-{sub}", rule.prefix),
                "SecretKey": sigv4::LOCAL_SECRET_KEY,
                "SessionToken": format!("local-session-{sub}"),
                "Expiration": expiration,
            }
        }))
    }
}

/// The access key id's prefix of the role whose ARN is `arn`: that of the managed policy the
/// role holds.
fn role_prefix(template: &Template, stack: &Stack, arn: &str) -> Result<String, Error> {
    for (id, role) in template.of_kind("AWS::IAM::Role") {
        let role_arn = stack.eval(&json!({"Fn::GetAtt": [id, "Arn"]})).ok();
        if role_arn.as_ref().and_then(Value::as_str) != Some(arn) {
            continue;
        }
        let policies = role.properties.get("ManagedPolicyArns").and_then(Value::as_array);
        let named: Vec<&str> = policies
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("Ref").and_then(Value::as_str))
            .collect();
        return match named.as_slice() {
            [policy] => Callers::prefix_of(policy).map(str::to_owned),
            _ => None,
        }
        .ok_or_else(|| {
            Error::Template(format!(
                "{id}: locally, a role of the identity pool holds one of the callers' managed policies, not {named:?}"
            ))
        });
    }
    Err(Error::Template(format!("the identity pool maps to {arn}, which is no role of the stack")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::callers::{OPERATOR_PREFIX, READER_PREFIX};
    use crate::emulation::provision::{local_dry_run, project_template};

    fn pool() -> IdentityPool {
        let template = project_template();
        let parameters = [
            ("Console", "true"),
            ("ApiAuth", "JWT"),
            ("JwtIssuer", "http://127.0.0.1:9/issuer"),
            ("JwtAudience", "orders"),
            ("ConsoleClientId", "console"),
        ];
        let stack = local_dry_run(&template, &parameters);
        IdentityPool::read(&template, &stack).unwrap().expect("the JWT stack's console has one")
    }

    #[test]
    fn the_pool_takes_the_issuer_s_users_and_maps_their_groups_to_the_operators_and_readers_roles()
    {
        let pool = pool();
        assert_eq!(pool.provider, "127.0.0.1:9/issuer");
        assert_eq!(pool.client_ids, ["console"]);
        let rules: Vec<_> = pool
            .rules
            .iter()
            .map(|r| (r.claim.as_str(), r.value.as_str(), r.prefix.as_str()))
            .collect();
        assert_eq!(
            rules,
            [
                ("groups", "sas-operators", OPERATOR_PREFIX),
                ("groups", "sas-readers", READER_PREFIX)
            ]
        );
        let token = |groups: &[&str]| {
            let mut claims = jwt::claims(
                &pool.issuer,
                "console",
                "ada",
                Utc::now(),
                chrono::Duration::minutes(5),
            );
            claims["groups"] = json!(groups);
            json!({"IdentityPoolId": pool.pool_id, "Logins": {pool.provider.clone(): jwt::mint(&claims)}})
        };
        let id = pool.get_id(&token(&["team-a", "sas-operators"])).unwrap()["IdentityId"].clone();
        let ask = |groups: &[&str]| {
            let mut body = token(groups);
            body["IdentityId"] = id.clone();
            pool.credentials(&body)
        };
        let key = |groups: &[&str]| ask(groups).map(|c| c["Credentials"]["AccessKeyId"].clone());
        assert_eq!(key(&["team-a", "sas-operators"]).unwrap(), "ops-ada");
        assert_eq!(key(&["sas-readers"]).unwrap(), "read-ada", "the reader's rule, second");
        assert_eq!(
            key(&["sas-readers", "sas-operators"]).unwrap(),
            "ops-ada",
            "the first that holds"
        );
        assert_eq!(key(&["team-a"]).unwrap_err().0, "InvalidIdentityPoolConfigurationException");

        // Another client's token, or an identity that is not the token's, is refused.
        let mut other =
            jwt::claims(&pool.issuer, "orders", "ada", Utc::now(), chrono::Duration::minutes(5));
        other["groups"] = json!(["sas-operators"]);
        let body = json!({"IdentityPoolId": pool.pool_id, "IdentityId": id, "Logins": {pool.provider.clone(): jwt::mint(&other)}});
        assert_eq!(pool.credentials(&body).unwrap_err().0, "NotAuthorizedException");
        let mut body = token(&["sas-operators"]);
        body["IdentityId"] = json!("us-east-1:someone-else");
        assert_eq!(pool.credentials(&body).unwrap_err().0, "NotAuthorizedException");
    }

    #[test]
    fn a_stack_whose_console_signs_in_at_its_user_pool_has_no_emulated_pool() {
        let template = project_template();
        let stack = local_dry_run(&template, &[("Console", "true")]);
        assert!(IdentityPool::read(&template, &stack).unwrap().is_none());
    }
}
