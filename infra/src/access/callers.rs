//! Who may call which route of the HTTP API, as IAM decides it on AWS: a signed caller holds one
//! of the template's managed policies (`ClientPolicy`, `OperatorPolicy`, `ReadOnlyPolicy`,
//! `AnswererPolicy`), and an `AWS_IAM` route answers 403 to a caller whose policy does not allow
//! `execute-api:Invoke` on it.
//!
//! Locally an access key id names the caller, and also says which policy it holds: a key
//! that begins with `ops` holds `OperatorPolicy` (the `sas` CLI's), one that begins with `read`
//! holds `ReadOnlyPolicy` (someone who looks and may not act), one that begins with `answer`
//! holds `AnswererPolicy` (a party answering steps that wait for it), any other `ClientPolicy`;
//! `local-stack up --caller KEY=POLICY` gives a key any managed policy of the template, or
//! `none`. The policies are read from the template and evaluated in the stack, so the ARNs they
//! name are the local API's (`arn:aws:execute-api:<region>:<account>:<api id>/<stage>/<METHOD>/<path>`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::Error;
use crate::access::policy::{self, Decision, Need, Permissions};
use crate::emulation::provision::Stack;
use crate::emulation::template::Template;

/// The policy of an access key id that begins with [`OPERATOR_PREFIX`].
pub const OPERATOR_POLICY: &str = "OperatorPolicy";
/// The policy of an access key id that begins with [`ANSWERER_PREFIX`].
pub const ANSWERER_POLICY: &str = "AnswererPolicy";
/// Access key ids that begin with this hold [`ANSWERER_POLICY`].
pub const ANSWERER_PREFIX: &str = "answer";
/// The policy of an access key id that begins with [`READER_PREFIX`].
pub const READER_POLICY: &str = "ReadOnlyPolicy";
/// Access key ids that begin with this hold [`READER_POLICY`].
pub const READER_PREFIX: &str = "read";
/// The policy of every other access key id.
pub const CLIENT_POLICY: &str = "ClientPolicy";
/// Access key ids that begin with this hold [`OPERATOR_POLICY`].
pub const OPERATOR_PREFIX: &str = "ops";
/// A policy name that grants nothing.
pub const NO_POLICY: &str = "none";

/// The callers' policies, and which caller holds which.
#[derive(Clone, Debug)]
pub struct Callers {
    /// The API's ARN, without the stage, method and path.
    api_arn: String,
    /// Each managed policy of the template, by logical id.
    policies: BTreeMap<String, Permissions>,
    /// Policies given to access key ids by name.
    assigned: BTreeMap<String, String>,
}

impl Callers {
    /// Reads the managed policies of `template` in `stack`, with `assigned` policies (access key
    /// id, policy logical id or `none`) taking the place of the default.
    pub fn read(
        template: &Template,
        stack: &Stack,
        assigned: &[(String, String)],
    ) -> Result<Callers, Error> {
        let api_arn = stack.eval(&json!({"Fn::Sub":
            "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${HttpApi}"}))?;
        let api_arn = api_arn.as_str().unwrap_or_default().to_owned();
        let mut policies = BTreeMap::new();
        for (id, resource) in template.of_kind("AWS::IAM::ManagedPolicy") {
            if !stack.context.holds(resource.condition.as_deref()) {
                continue;
            }
            let properties = stack.eval(&resource.properties)?;
            let document = properties.get("PolicyDocument").unwrap_or(&Value::Null);
            let statements = policy::read_document(document)
                .map_err(|m| Error::Template(format!("{id}: {m}")))?;
            policies.insert(id.to_owned(), Permissions { statements });
        }
        for (key, name) in assigned {
            if name != NO_POLICY && !policies.contains_key(name) {
                return Err(Error::Template(format!(
                    "caller {key}: no managed policy {name} in the template (there are: {}, or {NO_POLICY})",
                    policies.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        let assigned = assigned.iter().cloned().collect();
        Ok(Callers { api_arn, policies, assigned })
    }

    /// The policy `access_key` holds.
    pub fn policy_of(&self, access_key: &str) -> &str {
        match self.assigned.get(access_key) {
            Some(name) => name,
            None if access_key.starts_with(OPERATOR_PREFIX) => OPERATOR_POLICY,
            None if access_key.starts_with(ANSWERER_PREFIX) => ANSWERER_POLICY,
            None if access_key.starts_with(READER_PREFIX) => READER_POLICY,
            None => CLIENT_POLICY,
        }
    }

    /// A prefix of the access key ids that hold `policy` by default, if any do.
    pub fn prefix_of(policy: &str) -> Option<&'static str> {
        match policy {
            OPERATOR_POLICY => Some(OPERATOR_PREFIX),
            ANSWERER_POLICY => Some(ANSWERER_PREFIX),
            READER_POLICY => Some(READER_PREFIX),
            CLIENT_POLICY => Some("client"),
            _ => None,
        }
    }

    /// Whether `access_key`'s policy allows it to call `method path` (a path as the client
    /// sent it, without the query). `Err` says why not.
    pub fn allows(&self, access_key: &str, method: &str, path: &str) -> Result<(), String> {
        let name = self.policy_of(access_key);
        let resource = format!(
            "{}/$default/{}/{}",
            self.api_arn,
            method.to_ascii_uppercase(),
            path.trim_start_matches('/')
        );
        let need = Need::new("execute-api:Invoke", resource.as_str());
        let allowed = self
            .policies
            .get(name)
            .is_some_and(|p| matches!(p.decide(&[need]), Decision::Allowed(_)));
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "{access_key} holds {name}, which does not allow execute-api:Invoke on {resource}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulation::provision::{local_dry_run, project_template};

    #[test]
    fn clients_reach_the_order_routes_and_operators_the_admin_routes() {
        let template = project_template();
        let stack = local_dry_run(&template, &[]);
        let assigned = [("auditor".to_owned(), NO_POLICY.to_owned())];
        let callers = Callers::read(&template, &stack, &assigned).unwrap();
        let id = "7b0a4c2e-3f55-4a9e-9d0e-2b8f1c6d5e4a";
        let order = format!("/orders/{id}");
        let admin = format!("/admin/orders/{id}");
        let cases = [
            ("me", "POST", "/orders", true),
            ("me", "GET", order.as_str(), true),
            ("me", "GET", admin.as_str(), false),
            ("me", "DELETE", order.as_str(), false),
            ("ops", "GET", admin.as_str(), true),
            ("ops-alice", "POST", "/admin/orders/x/cancel", true),
            ("ops", "POST", "/orders", false),
            ("ops", "GET", order.as_str(), false),
            ("answerer", "POST", &format!("{order}/steps/approval/complete"), true),
            ("answerer", "POST", "/orders", false),
            ("answerer", "GET", order.as_str(), false),
            ("me", "POST", &format!("{order}/steps/approval/complete"), false),
            ("ops", "POST", &format!("{admin}/steps/approval/refuse"), true),
            ("reader", "GET", admin.as_str(), true),
            ("reader-bob", "GET", "/admin/services", true),
            ("reader", "POST", &format!("{admin}/redrive"), false),
            ("reader", "POST", "/admin/services/payment/hold", false),
            ("reader", "POST", "/orders", false),
            ("reader", "GET", order.as_str(), false),
            ("auditor", "POST", "/orders", false),
            ("auditor", "GET", admin.as_str(), false),
        ];
        for (caller, method, path, allowed) in cases {
            assert_eq!(
                callers.allows(caller, method, path).is_ok(),
                allowed,
                "{caller} {method} {path}: {:?}",
                callers.allows(caller, method, path)
            );
        }
        let why = callers.allows("me", "GET", &admin).unwrap_err();
        assert!(why.contains("me holds ClientPolicy"), "{why}");
    }

    #[test]
    fn a_caller_given_a_policy_the_template_lacks_is_refused_at_start() {
        let template = project_template();
        let stack = local_dry_run(&template, &[]);
        let assigned = [("me".to_owned(), "AdminEverything".to_owned())];
        let refused = Callers::read(&template, &stack, &assigned).unwrap_err().to_string();
        assert!(refused.contains("no managed policy AdminEverything"), "{refused}");
        assert!(refused.contains("ClientPolicy, OperatorPolicy, ReadOnlyPolicy"), "{refused}");
    }
}
