//! Each function's permissions read from the template: the inline statements of its role, or
//! of the role SAM makes for it (with what SAM attaches by itself), refused when they cannot be
//! evaluated exactly.

use std::collections::BTreeMap;

use serde_json::Value;

use super::PROXY_SERVICES;
use super::verdict::{Condition, Effect, Origin, Permissions, Statement};
use crate::Error;
use crate::emulation::provision::Stack;
use crate::emulation::template::{Template, scalar_string};

/// The managed policy SAM attaches to a function with an SQS event source, as it stands.
pub(super) const SQS_EVENT_SOURCE_POLICY: &str = "AWSLambdaSQSQueueExecutionRole";
const SQS_EVENT_SOURCE_ACTIONS: [&str; 3] =
    ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"];

/// What requests are resolved against: the stack's region, and what the template says about
/// its queues and secrets.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub region: String,
    /// The queues whose messages each dead-letter queue holds, by ARN: where a move task
    /// without a destination sends them back to.
    pub redrive_sources: BTreeMap<String, Vec<String>>,
    /// Secret ARNs by secret name: a request may name a secret either way, and its ARN ends
    /// with a suffix only the service knows.
    pub secrets: BTreeMap<String, String>,
    /// Each table's partition key attribute, by the table's ARN: what a request of one item
    /// is known by in a condition on `dynamodb:LeadingKeys`.
    pub partition_keys: BTreeMap<String, String>,
}

/// Every function's permissions, and what requests are resolved against.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    /// By logical id, which is also the access key id the function's processes sign with.
    pub functions: BTreeMap<String, Permissions>,
    pub scope: Scope,
    /// Logical ids by ARN, to name resources in reports.
    names: Vec<(String, String)>,
}

/// The permissions of every function of `template` whose condition holds, evaluated in `stack`.
pub fn policies(template: &Template, stack: &Stack) -> Result<Policies, Error> {
    let globals = template.globals.get("Function").cloned().unwrap_or(Value::Null);
    let mut functions = BTreeMap::new();
    for (id, resource) in template.of_kind("AWS::Serverless::Function") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        let bad = |m: String| Error::Template(format!("{id}: {m}"));
        let properties = &resource.properties;
        if properties.get("PermissionsBoundary").is_some()
            || globals.get("PermissionsBoundary").is_some()
        {
            return Err(bad(
                "PermissionsBoundary: a permissions boundary is not evaluated locally".into(),
            ));
        }
        let role = properties.get("Role").or_else(|| globals.get("Role"));
        let statements = match role {
            Some(role) => {
                if properties.get("Policies").is_some() {
                    return Err(bad("Policies: SAM ignores them beside a Role".into()));
                }
                role_statements(template, stack, role).map_err(bad)?
            }
            None => made_by_sam(stack, properties).map_err(bad)?,
        };
        functions.insert(id.to_owned(), Permissions { statements });
    }

    let mut scope = Scope { region: stack.context.region.clone(), ..Scope::default() };
    for (id, resource) in template.of_kind("AWS::SQS::Queue") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        let redrive = crate::observe::dead_letters::redrive_policy(stack, resource)?;
        let target = redrive.get("deadLetterTargetArn").map(scalar_string).transpose()?;
        if let (Some(dlq), Some(arn)) = (target, stack.attribute(id, "Arn")) {
            scope.redrive_sources.entry(dlq).or_default().push(arn);
        }
    }
    for (id, resource) in template.of_kind("AWS::DynamoDB::Table") {
        let Some(arn) = stack.attribute(id, "Arn") else { continue };
        let schema = resource.properties.get("KeySchema").and_then(Value::as_array);
        let hash = schema.into_iter().flatten().find(|k| k["KeyType"] == "HASH");
        if let Some(name) = hash.and_then(|k| k["AttributeName"].as_str()) {
            scope.partition_keys.insert(arn, name.to_owned());
        }
    }
    let mut names = Vec::new();
    for ((id, attribute), value) in &stack.context.attributes {
        let Some(arn) = value.as_str() else { continue };
        if attribute == "Arn" {
            names.push((arn.to_owned(), id.clone()));
        }
    }
    for value in stack.context.refs.values().chain(stack.context.attributes.values()) {
        let Some(arn) = value.as_str() else { continue };
        if let Some((_, name)) =
            arn.split_once(":secretsmanager:").and_then(|(_, r)| r.split_once(":secret:"))
        {
            scope.secrets.insert(secret_name(name).to_owned(), arn.to_owned());
        }
    }
    // The longest ARN first, so that an index is named after its table and not the reverse.
    names.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.cmp(b)));
    Ok(Policies { functions, scope, names })
}

/// The statements of a role the template declares (`Role: {Fn::GetAtt: [<id>, Arn]}` naming
/// an `AWS::IAM::Role`): its inline `Policies`. Managed policies and boundaries are refused.
fn role_statements(
    template: &Template,
    stack: &Stack,
    role: &Value,
) -> Result<Vec<Statement>, String> {
    let id = role
        .get("Fn::GetAtt")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2 && a[1] == "Arn")
        .and_then(|a| a[0].as_str())
        .ok_or("Role: only a role of the template (Fn::GetAtt: [<role>, Arn]) is read locally")?;
    let (_, resource) = template
        .resources
        .iter()
        .find(|(r, res)| r == id && res.kind == "AWS::IAM::Role")
        .ok_or_else(|| format!("Role: {id} is not an AWS::IAM::Role of the template"))?;
    let properties = stack.eval(&resource.properties).map_err(|e| e.to_string())?;
    for key in ["ManagedPolicyArns", "PermissionsBoundary"] {
        if properties.get(key).is_some() {
            return Err(format!("{id}: {key} is not read locally; write its statements inline"));
        }
    }
    let mut statements = Vec::new();
    for policy in properties.get("Policies").and_then(Value::as_array).into_iter().flatten() {
        let document = policy
            .get("PolicyDocument")
            .ok_or_else(|| format!("{id}: a policy without a PolicyDocument"))?;
        for s in document_statements(document).map_err(|m| format!("{id}: {m}"))? {
            statements.push(statement(s).map_err(|m| format!("{id}: statement {s}: {m}"))?);
        }
    }
    // Policies the template adds to the role as resources of their own (each agent's grants
    // on the other functions' roles).
    for (policy_id, policy) in template.of_kind("AWS::IAM::RolePolicy") {
        let role_name = policy.properties.get("RoleName").and_then(|r| r.get("Ref"));
        if role_name.and_then(Value::as_str) != Some(id)
            || !stack.context.holds(policy.condition.as_deref())
        {
            continue;
        }
        let properties = stack.eval(&policy.properties).map_err(|e| e.to_string())?;
        let document = properties
            .get("PolicyDocument")
            .ok_or_else(|| format!("{policy_id}: a policy without a PolicyDocument"))?;
        for s in document_statements(document).map_err(|m| format!("{policy_id}: {m}"))? {
            statements.push(statement(s).map_err(|m| format!("{policy_id}: statement {s}: {m}"))?);
        }
    }
    Ok(statements)
}

/// What a role SAM makes for the function grants: its `Policies`, and the managed policies SAM
/// attaches by itself that the local stack exercises (for an SQS event source,
/// `AWSLambdaSQSQueueExecutionRole`, on every queue of the account).
fn made_by_sam(stack: &Stack, properties: &Value) -> Result<Vec<Statement>, String> {
    let declared = stack
        .eval(properties.get("Policies").unwrap_or(&Value::Null))
        .map_err(|e| e.to_string())?;
    let mut statements = Vec::new();
    for document in documents(&declared)? {
        for s in document {
            statements.push(statement(s).map_err(|m| format!("statement {s}: {m}"))?);
        }
    }
    let events = properties.get("Events").and_then(Value::as_object);
    if events
        .into_iter()
        .flatten()
        .any(|(_, e)| e.get("Type").and_then(Value::as_str) == Some("SQS"))
    {
        statements.push(Statement {
            effect: Effect::Allow,
            actions: SQS_EVENT_SOURCE_ACTIONS.map(str::to_owned).to_vec(),
            not_action: false,
            resources: vec!["*".to_owned()],
            not_resource: false,
            condition: None,
            origin: Origin::Implied(SQS_EVENT_SOURCE_POLICY.to_owned()),
        });
    }
    Ok(statements)
}

impl Policies {
    /// `arn` by the logical id of the resource it is (or is part of), if the template has it.
    pub(super) fn name(&self, arn: &str) -> Option<String> {
        self.names.iter().find_map(|(known, id)| {
            if arn == known {
                Some(id.clone())
            } else {
                arn.strip_prefix(known.as_str())
                    .filter(|rest| rest.starts_with('/'))
                    .map(|rest| format!("{id}{rest}"))
            }
        })
    }
}

/// The policy documents of a function's `Policies`, as lists of statements.
fn documents(declared: &Value) -> Result<Vec<Vec<&Value>>, String> {
    let list: Vec<&Value> = match declared {
        Value::Null => Vec::new(),
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    list.into_iter().map(document).collect()
}

/// The statements of one entry of `Policies`, which must be an inline policy document.
fn document(policy: &Value) -> Result<Vec<&Value>, String> {
    match policy {
        Value::String(name) => Err(format!(
            "Policies: the managed policy {name} is not read locally; write its statements inline"
        )),
        Value::Object(map) if map.contains_key("Statement") => {
            document_statements(policy).map_err(|m| format!("Policies: {m}"))
        }
        Value::Object(map) if map.len() == 1 => Err(format!(
            "Policies: the SAM policy template {} is not expanded locally; write its statements \
             inline",
            map.keys().next().map_or("", String::as_str)
        )),
        other => Err(format!("Policies: {other} is not an inline policy document")),
    }
}

/// The statements of a policy document, each read as [`statement`] reads it.
pub fn read_document(document: &Value) -> Result<Vec<Statement>, String> {
    document_statements(document)?
        .into_iter()
        .map(|s| statement(s).map_err(|m| format!("statement {s}: {m}")))
        .collect()
}

/// The statements of a policy document (`Version`, `Id` and `Statement`, nothing else).
fn document_statements(document: &Value) -> Result<Vec<&Value>, String> {
    let map = document.as_object().ok_or("a policy document is a mapping")?;
    let known = |k: &&String| matches!(k.as_str(), "Statement" | "Version" | "Id");
    if let Some(key) = map.keys().find(|k| !known(k)) {
        return Err(format!("{key} is not part of a policy document"));
    }
    match map.get("Statement") {
        Some(Value::Array(statements)) => Ok(statements.iter().collect()),
        Some(one @ Value::Object(_)) => Ok(vec![one]),
        other => Err(format!("Statement is not a statement or a list: {other:?}")),
    }
}

fn statement(value: &Value) -> Result<Statement, String> {
    let map = value.as_object().ok_or("not a mapping")?;
    if let Some(key) = map.keys().find(|k| {
        !matches!(
            k.as_str(),
            "Sid" | "Effect" | "Action" | "NotAction" | "Resource" | "NotResource" | "Condition"
        )
    }) {
        return Err(format!("{key} has no place in a function's policy"));
    }
    let effect = match map.get("Effect").and_then(Value::as_str) {
        Some("Allow") => Effect::Allow,
        Some("Deny") => Effect::Deny,
        other => return Err(format!("Effect must be Allow or Deny, not {other:?}")),
    };
    // Of conditions, only an Allow's hold on DynamoDB's partition keys is evaluated locally.
    // Any other on an Allow for services the proxy never maps (a KMS decrypt Secrets Manager
    // makes for the caller) changes nothing local; anywhere else it would, so it is refused.
    let mut condition = None;
    if let Some(written) = map.get("Condition") {
        let actions = strings(map.get("Action").unwrap_or(&Value::Null)).unwrap_or_default();
        let unseen = |a: &String| {
            let service = a.split_once(':').map_or(a.as_str(), |(s, _)| s).to_ascii_lowercase();
            !service.contains(['*', '?']) && !PROXY_SERVICES.contains(&service.as_str())
        };
        let ignored = effect == Effect::Allow && !actions.is_empty() && actions.iter().all(unseen);
        if !ignored {
            let Some(keys) = leading_keys(written)? else {
                return Err("conditions are not evaluated locally".into());
            };
            if effect == Effect::Deny {
                return Err("conditions are not evaluated locally in a Deny".into());
            }
            let one_item = |a: &String| {
                ITEM_ACTIONS.iter().any(|item| a.eq_ignore_ascii_case(&format!("dynamodb:{item}")))
            };
            if actions.is_empty() || !actions.iter().all(one_item) {
                return Err(format!(
                    "dynamodb:LeadingKeys is evaluated locally only on the actions of one item \
                     ({}), each named",
                    ITEM_ACTIONS.join(", ")
                ));
            }
            condition = Some(keys);
        }
    }
    let pair = |positive: &str, negative: &str| -> Result<(Vec<String>, bool), String> {
        match (map.get(positive), map.get(negative)) {
            (Some(v), None) => Ok((strings(v)?, false)),
            (None, Some(v)) if effect == Effect::Deny => Ok((strings(v)?, true)),
            (None, Some(_)) => Err(format!(
                "{negative} in an Allow grants everything else; list the {}s it allows",
                positive.to_ascii_lowercase()
            )),
            (Some(_), Some(_)) => Err(format!("both {positive} and {negative}")),
            (None, None) => Err(format!("no {positive}")),
        }
    };
    let (actions, not_action) = pair("Action", "NotAction")?;
    let (resources, not_resource) = pair("Resource", "NotResource")?;
    Ok(Statement {
        effect,
        actions,
        not_action,
        resources,
        not_resource,
        condition,
        origin: Origin::Template,
    })
}

/// The DynamoDB actions on one item: each request names its item's key, so its partition key
/// is always known.
const ITEM_ACTIONS: [&str; 5] =
    ["GetItem", "PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem"];

/// A condition that is one `ForAllValues:StringLike` or `ForAllValues:StringEquals` on
/// `dynamodb:LeadingKeys` and nothing else; `None` for any other condition.
fn leading_keys(condition: &Value) -> Result<Option<Condition>, String> {
    let Some(map) = condition.as_object().filter(|m| m.len() == 1) else { return Ok(None) };
    let (operator, keys) = map.iter().next().expect("one entry");
    let like = match operator.as_str() {
        "ForAllValues:StringLike" => true,
        "ForAllValues:StringEquals" => false,
        _ => return Ok(None),
    };
    let Some(keys) = keys.as_object().filter(|k| k.len() == 1) else { return Ok(None) };
    let (key, values) = keys.iter().next().expect("one entry");
    if !key.eq_ignore_ascii_case("dynamodb:LeadingKeys") {
        return Ok(None);
    }
    Ok(Some(Condition::LeadingKeys { patterns: strings(values)?, like }))
}

/// A string, or a non-empty list of strings.
fn strings(value: &Value) -> Result<Vec<String>, String> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| format!("{v} is not a string")))
            .collect(),
        other => Err(format!("{other} is neither a string nor a list of strings")),
    }
}

/// A secret's name from the last part of its ARN: without the `-` and six characters Secrets
/// Manager appends.
pub(super) fn secret_name(last: &str) -> &str {
    match last.rsplit_once('-') {
        Some((name, suffix))
            if suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            name
        }
        _ => last,
    }
}
