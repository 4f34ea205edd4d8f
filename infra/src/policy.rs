//! Least privilege, checked on every local run: each function's permissions as `template.yaml`
//! grants them, what each AWS API request needs, and the verdict IAM would give.
//!
//! A function's permissions are those of its role, evaluated against the provisioned stack (so
//! their ARNs are the ones the requests name). A role the template declares
//! (`Role: {Fn::GetAtt: [<role>, Arn]}`) grants its inline policies and nothing else. A role SAM
//! makes grants the function's `Policies` plus what SAM attaches by itself that the local stack
//! exercises: for a function with an SQS event source, the managed policy
//! `AWSLambdaSQSQueueExecutionRole`, which allows `sqs:ReceiveMessage`, `sqs:DeleteMessage` and
//! `sqs:GetQueueAttributes` on every queue (`*`), as the pollers need. (SAM also attaches logs
//! and X-Ray on `*`, which no function code calls through the proxy.)
//!
//! Evaluation is IAM's for identity-based policies: an explicit `Deny` wins, then any `Allow`;
//! otherwise the request is denied. Actions match case-insensitively, resources
//! case-sensitively, both with the wildcards `*` and `?`. What cannot be evaluated exactly is
//! refused when the policies are read, never skipped: managed policies, SAM policy templates,
//! conditions (but on an `Allow` of services no local request reaches), `NotAction` and
//! `NotResource` in an `Allow`, a role given by ARN, a permissions boundary. A request is mapped
//! to every (action, resource ARN) pair IAM authorises it by (a transaction by its item
//! actions, a batch by its single action); a request that cannot be mapped is denied.
//!
//! [`Access`] applies this to live requests: it knows each function by the access key id its
//! processes sign with (the function's logical id), records every denial and every grant a
//! call used, and so can tell at the end which grants no call needed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;
use crate::provision::Stack;
use crate::template::{LOCAL_ACCOUNT, Template, scalar_string};

/// The services whose requests the proxy maps, and so checks.
const PROXY_SERVICES: [&str; 4] = ["dynamodb", "sqs", "events", "secretsmanager"];

/// The managed policy SAM attaches to a function with an SQS event source, as it stands.
const SQS_EVENT_SOURCE_POLICY: &str = "AWSLambdaSQSQueueExecutionRole";
const SQS_EVENT_SOURCE_ACTIONS: [&str; 3] =
    ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"];

/// Whether a statement allows or denies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    Allow,
    Deny,
}

/// Where a statement comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The function's `Policies` in the template.
    Template,
    /// Attached by SAM: the managed policy's name.
    Implied(String),
}

/// One statement, with its resources evaluated in the stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub effect: Effect,
    /// Action patterns (`sqs:SendMessage`, `dynamodb:*`).
    pub actions: Vec<String>,
    /// `NotAction`: the statement covers every action but these (only in a `Deny`).
    pub not_action: bool,
    /// Resource patterns (ARNs, possibly with wildcards, or `*`).
    pub resources: Vec<String>,
    /// `NotResource`: every resource but these (only in a `Deny`).
    pub not_resource: bool,
    pub origin: Origin,
}

impl Statement {
    fn covers(&self, need: &Need) -> bool {
        let action = self.actions.iter().any(|p| action_matches(p, &need.action));
        let resource = self.resources.iter().any(|p| wildcard(p, &need.resource));
        action != self.not_action && resource != self.not_resource
    }
}

/// One (action, resource) pair a request needs allowed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Need {
    /// `service:Action`, as IAM names it.
    pub action: String,
    /// The ARN, or `*` for actions that take no resource.
    pub resource: String,
}

impl Need {
    pub fn new(action: impl Into<String>, resource: impl Into<String>) -> Need {
        Need { action: action.into(), resource: resource.into() }
    }
}

/// A grant: one action pattern of one `Allow` statement on one of its resource patterns, by
/// position (statement, action, resource).
type GrantId = (usize, usize, usize);

/// What IAM answers for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every need is allowed; these grants allowed them.
    Allowed(Vec<GrantId>),
    /// The first need not allowed, and whether a `Deny` refused it (rather than no `Allow`).
    Denied { need: Need, explicit: bool },
}

/// One function's permissions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    pub statements: Vec<Statement>,
}

impl Permissions {
    /// IAM's verdict on a request that needs every one of `needs`.
    pub fn decide(&self, needs: &[Need]) -> Decision {
        let mut used = Vec::new();
        for need in needs {
            if self.statements.iter().any(|s| s.effect == Effect::Deny && s.covers(need)) {
                return Decision::Denied { need: need.clone(), explicit: true };
            }
            let before = used.len();
            for (si, s) in self.statements.iter().enumerate() {
                if s.effect != Effect::Allow {
                    continue;
                }
                for (ai, action) in s.actions.iter().enumerate() {
                    if !action_matches(action, &need.action) {
                        continue;
                    }
                    for (ri, resource) in s.resources.iter().enumerate() {
                        if wildcard(resource, &need.resource) {
                            used.push((si, ai, ri));
                        }
                    }
                }
            }
            if used.len() == before {
                return Decision::Denied { need: need.clone(), explicit: false };
            }
        }
        Decision::Allowed(used)
    }
}

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
        let redrive = crate::dead_letters::redrive_policy(stack, resource)?;
        let target = redrive.get("deadLetterTargetArn").map(scalar_string).transpose()?;
        if let (Some(dlq), Some(arn)) = (target, stack.attribute(id, "Arn")) {
            scope.redrive_sources.entry(dlq).or_default().push(arn);
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
            origin: Origin::Implied(SQS_EVENT_SOURCE_POLICY.to_owned()),
        });
    }
    Ok(statements)
}

impl Policies {
    /// `arn` by the logical id of the resource it is (or is part of), if the template has it.
    fn name(&self, arn: &str) -> Option<String> {
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
    // A condition is not evaluated locally. On an Allow for services the proxy never maps (a
    // KMS decrypt Secrets Manager makes for the caller) it changes nothing local; anywhere else
    // it would, so it is refused.
    if map.contains_key("Condition") {
        let actions = strings(map.get("Action").unwrap_or(&Value::Null)).unwrap_or_default();
        let unseen = |a: &String| {
            let service = a.split_once(':').map_or(a.as_str(), |(s, _)| s).to_ascii_lowercase();
            !service.contains(['*', '?']) && !PROXY_SERVICES.contains(&service.as_str())
        };
        if effect == Effect::Deny || actions.is_empty() || !actions.iter().all(unseen) {
            return Err("conditions are not evaluated locally".into());
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
    Ok(Statement { effect, actions, not_action, resources, not_resource, origin: Origin::Template })
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

/// IAM's wildcard match: `*` stands for any run of characters, `?` for any one.
pub fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and how much of the text it has taken so far.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            star = Some((sp, st + 1));
            pi = sp + 1;
            ti = st + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn action_matches(pattern: &str, action: &str) -> bool {
    wildcard(&pattern.to_ascii_lowercase(), &action.to_ascii_lowercase())
}

/// A request the checker cannot map to what it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmapped {
    /// The action as far as it is known (`dynamodb:CreateBackup`).
    pub action: String,
    pub reason: String,
}

/// The (action, resource) pairs a request needs, from its `X-Amz-Target` header and JSON body
/// (DynamoDB, SQS, EventBridge and Secrets Manager all speak JSON protocols to the SDK). Never
/// empty.
pub fn needs(target: Option<&str>, body: &[u8], scope: &Scope) -> Result<Vec<Need>, Unmapped> {
    let Some((prefix, operation)) = target.and_then(|t| t.split_once('.')) else {
        return Err(Unmapped {
            action: target.unwrap_or("unknown").to_owned(),
            reason: "no X-Amz-Target names the operation (only JSON protocols are mapped)".into(),
        });
    };
    let service = match prefix {
        p if p.starts_with("DynamoDB_") => "dynamodb",
        "AmazonSQS" => "sqs",
        "AWSEvents" => "events",
        "secretsmanager" => "secretsmanager",
        other => other,
    };
    let unmapped = |reason: String| Unmapped { action: format!("{service}:{operation}"), reason };
    let json: Value = if body.is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_slice(body).map_err(|e| unmapped(format!("the body is not JSON: {e}")))?
    };
    let needs = match service {
        "dynamodb" => dynamodb(operation, &json, scope),
        "sqs" => sqs(operation, &json, scope),
        "events" => events(operation, &json, scope),
        "secretsmanager" => secrets(operation, &json, scope),
        other => Err(format!("the service {other} is not mapped")),
    }
    .map_err(unmapped)?;
    let mut unique: Vec<Need> = Vec::with_capacity(needs.len());
    for need in needs {
        if !unique.contains(&need) {
            unique.push(need);
        }
    }
    if unique.is_empty() {
        return Err(Unmapped {
            action: format!("{service}:{operation}"),
            reason: "it names no resource".into(),
        });
    }
    Ok(unique)
}

fn text<'a>(json: &'a Value, key: &str) -> Result<&'a str, String> {
    json.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("no {key}"))
}

fn dynamodb(operation: &str, json: &Value, scope: &Scope) -> Result<Vec<Need>, String> {
    let region = &scope.region;
    // A table may be named by its name or (since 2024) by its ARN.
    let table = |name: &str| {
        if name.starts_with("arn:") {
            name.to_owned()
        } else {
            format!("arn:aws:dynamodb:{region}:{LOCAL_ACCOUNT}:table/{name}")
        }
    };
    let need = |action: &str, resource: String| Need::new(format!("dynamodb:{action}"), resource);
    match operation {
        "GetItem"
        | "PutItem"
        | "UpdateItem"
        | "DeleteItem"
        | "DescribeTable"
        | "CreateTable"
        | "DeleteTable"
        | "UpdateTable"
        | "DescribeTimeToLive"
        | "UpdateTimeToLive"
        | "DescribeContinuousBackups" => Ok(vec![need(operation, table(text(json, "TableName")?))]),
        // An index is a resource of its own: the table's ARN does not grant it.
        "Query" | "Scan" => {
            let mut arn = table(text(json, "TableName")?);
            if let Some(index) = json.get("IndexName").and_then(Value::as_str) {
                arn = format!("{arn}/index/{index}");
            }
            Ok(vec![need(operation, arn)])
        }
        // A transaction is authorised item by item, each by the single-item action it performs.
        "TransactWriteItems" | "TransactGetItems" => {
            let items =
                json.get("TransactItems").and_then(Value::as_array).ok_or("no TransactItems")?;
            items
                .iter()
                .map(|item| {
                    let (kind, body) = item
                        .as_object()
                        .and_then(|o| o.iter().next())
                        .ok_or_else(|| format!("transaction item {item} names no action"))?;
                    let action = match (operation, kind.as_str()) {
                        ("TransactWriteItems", "Put") => "PutItem",
                        ("TransactWriteItems", "Update") => "UpdateItem",
                        ("TransactWriteItems", "Delete") => "DeleteItem",
                        ("TransactWriteItems", "ConditionCheck") => "ConditionCheckItem",
                        ("TransactGetItems", "Get") => "GetItem",
                        _ => return Err(format!("transaction item {kind} is not mapped")),
                    };
                    Ok(need(action, table(text(body, "TableName")?)))
                })
                .collect()
        }
        // A batch is authorised by its own action, once per table it touches.
        "BatchWriteItem" | "BatchGetItem" => {
            let tables =
                json.get("RequestItems").and_then(Value::as_object).ok_or("no RequestItems")?;
            Ok(tables.keys().map(|name| need(operation, table(name))).collect())
        }
        "ListTables" => Ok(vec![need(operation, "*".to_owned())]),
        other => Err(format!("the DynamoDB operation {other} is not mapped")),
    }
}

fn sqs(operation: &str, json: &Value, scope: &Scope) -> Result<Vec<Need>, String> {
    let region = &scope.region;
    let queue = |name: &str| format!("arn:aws:sqs:{region}:{LOCAL_ACCOUNT}:{name}");
    let need = |action: &str, resource: String| Need::new(format!("sqs:{action}"), resource);
    let by_url = |action: &str| -> Result<Vec<Need>, String> {
        let url = text(json, "QueueUrl")?;
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        Ok(vec![need(action, queue(name))])
    };
    match operation {
        // A batch is authorised as the single-message action it repeats.
        "SendMessage" | "SendMessageBatch" => by_url("SendMessage"),
        "DeleteMessage" | "DeleteMessageBatch" => by_url("DeleteMessage"),
        "ChangeMessageVisibility" | "ChangeMessageVisibilityBatch" => {
            by_url("ChangeMessageVisibility")
        }
        "ReceiveMessage"
        | "GetQueueAttributes"
        | "SetQueueAttributes"
        | "PurgeQueue"
        | "DeleteQueue"
        | "ListQueueTags"
        | "TagQueue"
        | "UntagQueue"
        | "ListDeadLetterSourceQueues" => by_url(operation),
        "GetQueueUrl" | "CreateQueue" => Ok(vec![need(operation, queue(text(json, "QueueName")?))]),
        "ListQueues" => Ok(vec![need(operation, "*".to_owned())]),
        // The task reads and deletes the dead letters and sends them on with the caller's
        // permissions: without them it would start, then fail. Without a destination they go
        // back to the queues they came from.
        "StartMessageMoveTask" => {
            let source = text(json, "SourceArn")?;
            let mut needs: Vec<Need> =
                ["StartMessageMoveTask", "ReceiveMessage", "DeleteMessage", "GetQueueAttributes"]
                    .into_iter()
                    .map(|action| need(action, source.to_owned()))
                    .collect();
            match json.get("DestinationArn").and_then(Value::as_str) {
                Some(destination) => needs.push(need("SendMessage", destination.to_owned())),
                None => needs.extend(
                    scope
                        .redrive_sources
                        .get(source)
                        .into_iter()
                        .flatten()
                        .map(|q| need("SendMessage", q.clone())),
                ),
            }
            Ok(needs)
        }
        "ListMessageMoveTasks" => Ok(vec![need(operation, text(json, "SourceArn")?.to_owned())]),
        other => Err(format!("the SQS operation {other} is not mapped")),
    }
}

fn events(operation: &str, json: &Value, scope: &Scope) -> Result<Vec<Need>, String> {
    let region = &scope.region;
    let bus = |name: Option<&str>| match name.filter(|n| !n.is_empty()) {
        Some(arn) if arn.starts_with("arn:") => arn.to_owned(),
        Some(name) => format!("arn:aws:events:{region}:{LOCAL_ACCOUNT}:event-bus/{name}"),
        None => format!("arn:aws:events:{region}:{LOCAL_ACCOUNT}:event-bus/default"),
    };
    let need = |resource: String| Need::new(format!("events:{operation}"), resource);
    match operation {
        // Each entry is authorised on the bus it goes to.
        "PutEvents" => {
            let entries = json.get("Entries").and_then(Value::as_array).ok_or("no Entries")?;
            Ok(entries
                .iter()
                .map(|e| need(bus(e.get("EventBusName").and_then(Value::as_str))))
                .collect())
        }
        "DescribeEventBus" => Ok(vec![need(bus(json.get("Name").and_then(Value::as_str)))]),
        other => Err(format!("the EventBridge operation {other} is not mapped")),
    }
}

fn secrets(operation: &str, json: &Value, scope: &Scope) -> Result<Vec<Need>, String> {
    let need = |resource: String| Need::new(format!("secretsmanager:{operation}"), resource);
    match operation {
        "GetSecretValue" | "DescribeSecret" | "ListSecretVersionIds" | "GetResourcePolicy" => {
            Ok(vec![need(secret_arn(text(json, "SecretId")?, scope))])
        }
        "ListSecrets" => Ok(vec![need("*".to_owned())]),
        other => Err(format!("the Secrets Manager operation {other} is not mapped")),
    }
}

/// A secret's ARN from its id: a full ARN, a partial one (without the random suffix), or a
/// name. A secret the stack does not know gets `??????` for its suffix, which only a policy
/// that leaves the suffix open (`name-??????`, `name-*`, `*`) allows, as on AWS.
fn secret_arn(id: &str, scope: &Scope) -> String {
    let known = |name: &str| scope.secrets.get(name).cloned();
    if let Some((_, name)) = id.split_once(":secret:") {
        if scope.secrets.values().any(|arn| arn == id) || secret_name(name) != name {
            id.to_owned()
        } else {
            known(name).unwrap_or_else(|| format!("{id}-??????"))
        }
    } else {
        known(id).unwrap_or_else(|| {
            format!("arn:aws:secretsmanager:{}:{LOCAL_ACCOUNT}:secret:{id}-??????", scope.region)
        })
    }
}

/// A secret's name from the last part of its ARN: without the `-` and six characters Secrets
/// Manager appends.
fn secret_name(last: &str) -> &str {
    match last.rsplit_once('-') {
        Some((name, suffix))
            if suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            name
        }
        _ => last,
    }
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// No statement allows it.
    NoAllow,
    /// A `Deny` statement refuses it.
    ExplicitDeny,
    /// The checker cannot tell what the request needs (default deny), and why.
    Unmapped(String),
}

/// A request a function's policy did not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// The function's logical id.
    pub function: String,
    /// The API operation (`TransactWriteItems`).
    pub operation: String,
    /// The first need that was not allowed.
    pub action: String,
    pub resource: String,
    pub cause: Cause,
    /// How many requests were refused so (in the records of [`Access`]).
    pub count: u64,
}

impl Denial {
    /// The role session a function's calls are made as on AWS (SAM names the role after the
    /// function).
    pub fn principal(&self) -> String {
        let f = &self.function;
        format!("arn:aws:sts::{LOCAL_ACCOUNT}:assumed-role/{f}Role/{f}")
    }

    /// The message AWS gives with its `AccessDeniedException`.
    pub fn message(&self) -> String {
        let head = format!(
            "User: {} is not authorized to perform: {} on resource: {}",
            self.principal(),
            self.action,
            self.resource
        );
        match &self.cause {
            Cause::NoAllow => {
                format!("{head} because no identity-based policy allows the {} action", self.action)
            }
            Cause::ExplicitDeny => {
                format!("{head} with an explicit deny in an identity-based policy")
            }
            Cause::Unmapped(why) => {
                format!("{head} because the local stack cannot tell what the request needs ({why})")
            }
        }
    }
}

/// A permission granted to a function: one action pattern on one resource pattern of an
/// `Allow` statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub function: String,
    pub action: String,
    pub resource: String,
    /// The resource by the logical id the template gives it (`StateTable`,
    /// `StateTable/index/ByAttention`), when it names one.
    pub resource_name: Option<String>,
    pub origin: Origin,
    /// Requests it allowed.
    pub uses: u64,
}

/// What the checks found so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessReport {
    /// Requests checked, by function.
    pub checked: BTreeMap<String, u64>,
    /// Distinct denials, in the order first seen, each with how often it happened.
    pub denials: Vec<Denial>,
    /// Grants of the template's `Policies` that no request used. Grants SAM attaches by itself
    /// are left out: the template cannot take them back.
    pub unused: Vec<Grant>,
    /// Grants of the template's `Policies` for services no local check sees (a function URL's
    /// `lambda:InvokeFunctionUrl`, unless its gateway reports its checks here): neither used nor
    /// unused as far as the local stack can tell.
    #[serde(default)]
    pub unchecked: Vec<Grant>,
}

impl AccessReport {
    /// The report in a few lines: denials in full, unused grants counted by function.
    pub fn brief(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_checks(&mut text);
        if self.unused.is_empty() {
            text.push_str("access: every permission the template grants was used\n");
        } else {
            let mut by_function: BTreeMap<&str, usize> = BTreeMap::new();
            for g in &self.unused {
                *by_function.entry(g.function.as_str()).or_default() += 1;
            }
            let counts: Vec<String> = by_function.iter().map(|(f, n)| format!("{f} {n}")).collect();
            text.push_str(&format!(
                "access: {} granted permissions no call used in this run ({}); `local-stack up` lists them when it stops\n",
                self.unused.len(),
                counts.join(", ")
            ));
        }
        text
    }

    /// The calls checked, and every denial.
    fn write_checks(&self, f: &mut impl fmt::Write) -> fmt::Result {
        let checked: u64 = self.checked.values().sum();
        let denied: u64 = self.denials.iter().map(|d| d.count).sum();
        writeln!(
            f,
            "access: {checked} AWS calls checked against the functions' policies, {denied} denied"
        )?;
        for d in &self.denials {
            let cause = match &d.cause {
                Cause::NoAllow => "no statement allows it".to_owned(),
                Cause::ExplicitDeny => "a Deny statement refuses it".to_owned(),
                Cause::Unmapped(why) => format!("not mapped: {why}"),
            };
            writeln!(
                f,
                "  DENIED {}: {} on {} ({}: {cause}), {} time(s)",
                d.function, d.action, d.resource, d.operation, d.count
            )?;
        }
        Ok(())
    }
}

/// A heading with the number of `grants`, then one grant a line.
fn write_grants(f: &mut fmt::Formatter<'_>, heading: &str, grants: &[Grant]) -> fmt::Result {
    writeln!(f, "access: {} {heading}:", grants.len())?;
    grants.iter().try_for_each(|g| writeln!(f, "  {g}"))
}

impl fmt::Display for AccessReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_checks(f)?;
        if self.unused.is_empty() {
            writeln!(f, "access: every permission the template grants was used")?;
        } else {
            write_grants(f, "permissions the template grants were not used", &self.unused)?;
        }
        if !self.unchecked.is_empty() {
            write_grants(
                f,
                "permissions of services the local checks do not see",
                &self.unchecked,
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.resource_name.as_deref().unwrap_or(&self.resource);
        write!(f, "{}: {} on {resource}", self.function, self.action)
    }
}

/// The live check: every request signed with a function's access key id is decided against
/// that function's permissions; other keys (the stack's own clients) are not checked. Clones
/// share their records.
#[derive(Clone, Debug)]
pub struct Access(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    policies: Policies,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    checked: BTreeMap<String, u64>,
    denials: Vec<Denial>,
    uses: HashMap<(String, GrantId), u64>,
    /// The services whose calls are checked: those the proxy maps, and any other reported.
    services: BTreeSet<String>,
}

impl Access {
    pub fn new(policies: Policies) -> Access {
        let records =
            Records { services: PROXY_SERVICES.map(str::to_owned).into(), ..Records::default() };
        Access(Arc::new(Shared { policies, records: Mutex::new(records) }))
    }

    pub fn policies(&self) -> &Policies {
        &self.0.policies
    }

    /// Whether a request to an AWS API may go on: `Ok` if it is allowed or not signed by a
    /// function, otherwise the denial, which is recorded and logged.
    pub fn authorize(
        &self,
        access_key_id: &str,
        target: Option<&str>,
        body: &[u8],
    ) -> Result<(), Box<Denial>> {
        if !self.0.policies.functions.contains_key(access_key_id) {
            return Ok(());
        }
        let operation = target.and_then(|t| t.split_once('.')).map_or("unknown", |(_, op)| op);
        match needs(target, body, &self.0.policies.scope) {
            Ok(needs) => self.authorize_needs(access_key_id, operation, &needs),
            Err(Unmapped { action, reason }) => {
                let mut records = lock(&self.0.records);
                *records.checked.entry(access_key_id.to_owned()).or_default() += 1;
                Err(refuse(
                    &mut records,
                    Denial {
                        function: access_key_id.to_owned(),
                        operation: operation.to_owned(),
                        action,
                        resource: "*".into(),
                        cause: Cause::Unmapped(reason),
                        count: 1,
                    },
                ))
            }
        }
    }

    /// Whether a call that needs every one of `needs` may go on, as [`Access::authorize`]: for
    /// calls that do not go through the proxy (a signed request to a function URL, checked by
    /// the gateway that serves it), so that they are recorded with the rest.
    pub fn authorize_needs(
        &self,
        access_key_id: &str,
        operation: &str,
        needs: &[Need],
    ) -> Result<(), Box<Denial>> {
        let Some(permissions) = self.0.policies.functions.get(access_key_id) else {
            return Ok(());
        };
        let decision = permissions.decide(needs);
        let mut records = lock(&self.0.records);
        *records.checked.entry(access_key_id.to_owned()).or_default() += 1;
        for need in needs {
            if let Some((service, _)) = need.action.split_once(':') {
                if !records.services.contains(service) {
                    records.services.insert(service.to_owned());
                }
            }
        }
        match decision {
            Decision::Allowed(grants) => {
                for grant in grants {
                    *records.uses.entry((access_key_id.to_owned(), grant)).or_default() += 1;
                }
                Ok(())
            }
            Decision::Denied { need, explicit } => Err(refuse(
                &mut records,
                Denial {
                    function: access_key_id.to_owned(),
                    operation: operation.to_owned(),
                    action: need.action,
                    resource: need.resource,
                    cause: if explicit { Cause::ExplicitDeny } else { Cause::NoAllow },
                    count: 1,
                },
            )),
        }
    }

    /// Every grant of every function, with how many requests it allowed.
    pub fn grants(&self) -> Vec<Grant> {
        let records = lock(&self.0.records);
        let policies = &self.0.policies;
        let mut out = Vec::new();
        for (function, permissions) in &policies.functions {
            for (si, s) in permissions.statements.iter().enumerate() {
                if s.effect != Effect::Allow {
                    continue;
                }
                for (ai, action) in s.actions.iter().enumerate() {
                    for (ri, resource) in s.resources.iter().enumerate() {
                        out.push(Grant {
                            function: function.clone(),
                            action: action.clone(),
                            resource: resource.clone(),
                            resource_name: policies.name(resource),
                            origin: s.origin.clone(),
                            uses: records
                                .uses
                                .get(&(function.clone(), (si, ai, ri)))
                                .copied()
                                .unwrap_or(0),
                        });
                    }
                }
            }
        }
        out
    }

    /// What the checks found so far.
    pub fn report(&self) -> AccessReport {
        let grants = self.grants();
        let records = lock(&self.0.records);
        // A pattern whose service is a wildcard may be used by any checked service.
        let seen = |action: &str| {
            let service = action.split_once(':').map_or(action, |(s, _)| s).to_ascii_lowercase();
            service.contains(['*', '?']) || records.services.contains(&service)
        };
        let (unused, unchecked) = grants
            .into_iter()
            .filter(|g| g.uses == 0 && g.origin == Origin::Template)
            .partition(|g| seen(&g.action));
        AccessReport {
            checked: records.checked.clone(),
            denials: records.denials.clone(),
            unused,
            unchecked,
        }
    }
}

/// Records a denial (one more of the same, or a new one) and logs it.
fn refuse(records: &mut Records, denial: Denial) -> Box<Denial> {
    tracing::warn!(
        function = %denial.function,
        action = %denial.action,
        resource = %denial.resource,
        operation = %denial.operation,
        "access denied: the function's policy does not allow this call"
    );
    fn key(d: &Denial) -> (&str, &str, &str, &str, &Cause) {
        (&d.function, &d.operation, &d.action, &d.resource, &d.cause)
    }
    if let Some(seen) = records.denials.iter_mut().find(|d| key(d) == key(&denial)) {
        seen.count += 1;
    } else {
        records.denials.push(denial.clone());
    }
    Box::new(denial)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{local_dry_run, project_template};

    fn stack_of(template: &Template) -> Stack {
        local_dry_run(template, &[])
    }

    fn real() -> (Stack, Policies) {
        let template = project_template();
        let stack = stack_of(&template);
        let policies = policies(&template, &stack).unwrap();
        (stack, policies)
    }

    /// A template of one function `F` with these policy statements (YAML, indented for
    /// `Statement:`) and a table, a queue and a bus.
    fn one(statements: &str) -> Result<Policies, Error> {
        let text = format!(
            r#"
Resources:
  Table:
    Type: AWS::DynamoDB::Table
  Queue:
    Type: AWS::SQS::Queue
  Other:
    Type: AWS::SQS::Queue
    Properties:
      RedrivePolicy:
        deadLetterTargetArn:
          Fn::GetAtt: [Queue, Arn]
        maxReceiveCount: 5
  F:
    Type: AWS::Serverless::Function
    Properties:
      Policies:
        - Statement:
{statements}
"#
        );
        let template = Template::parse(&text).unwrap();
        policies(&template, &stack_of(&template))
    }

    fn request(policies: &Policies, function: &str, target: &str, body: Value) -> Decision {
        let needs = needs(Some(target), body.to_string().as_bytes(), &policies.scope).unwrap();
        policies.functions[function].decide(&needs)
    }

    fn denied(decision: &Decision) -> Option<(&str, &str, bool)> {
        match decision {
            Decision::Denied { need, explicit } => Some((&need.action, &need.resource, *explicit)),
            Decision::Allowed(_) => None,
        }
    }

    const TABLE: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/local-Table";

    #[test]
    fn a_transaction_needs_its_item_action_on_every_table_it_touches() {
        let (stack, policies) = real();
        let table = |id: &str| stack.reference(id).unwrap();
        let put = |t: &str| serde_json::json!({ "Put": { "TableName": t, "Item": {} } });
        let both = serde_json::json!({ "TransactItems": [put(&table("OrdersTable")), put(&table("StateTable"))] });
        let submission =
            request(&policies, "SubmissionFunction", "DynamoDB_20120810.TransactWriteItems", both);
        assert!(matches!(submission, Decision::Allowed(_)), "{submission:?}");

        let three = serde_json::json!({ "TransactItems": [
            put(&table("OrdersTable")), put(&table("StateTable")), put(&table("QueueWaitsTable"))] });
        let decision =
            request(&policies, "SubmissionFunction", "DynamoDB_20120810.TransactWriteItems", three);
        let waits = stack.attribute("QueueWaitsTable", "Arn").unwrap();
        assert_eq!(denied(&decision), Some(("dynamodb:PutItem", waits.as_str(), false)));

        // The status function may read both tables, but write neither, even in a transaction.
        let check = serde_json::json!({ "TransactItems": [
            { "ConditionCheck": { "TableName": table("StateTable") } },
            { "Update": { "TableName": table("StateTable") } }] });
        let decision =
            request(&policies, "StatusFunction", "DynamoDB_20120810.TransactWriteItems", check);
        assert_eq!(denied(&decision).map(|d| d.0), Some("dynamodb:ConditionCheckItem"));
        let needs = needs(
            Some("DynamoDB_20120810.TransactGetItems"),
            serde_json::json!({ "TransactItems": [{ "Get": { "TableName": table("OrdersTable") } }] })
                .to_string()
                .as_bytes(),
            &policies.scope,
        )
        .unwrap();
        assert_eq!(
            needs,
            [Need::new("dynamodb:GetItem", stack.attribute("OrdersTable", "Arn").unwrap())]
        );
    }

    #[test]
    fn an_index_is_a_resource_of_its_own() {
        let (stack, policies) = real();
        let table = stack.reference("StateTable").unwrap();
        let query = |index: Option<&str>| {
            let mut body = serde_json::json!({ "TableName": table, "KeyConditionExpression": "x" });
            if let Some(i) = index {
                body["IndexName"] = i.into();
            }
            request(&policies, "SupervisorFunction", "DynamoDB_20120810.Query", body)
        };
        assert!(matches!(query(Some("ByCompleteBy")), Decision::Allowed(_)));
        let state = stack.attribute("StateTable", "Arn").unwrap();
        assert_eq!(
            denied(&query(None)),
            Some(("dynamodb:Query", state.as_str(), false)),
            "the table itself"
        );
        let attention = format!("{state}/index/ByAttention");
        assert_eq!(
            denied(&query(Some("ByAttention"))),
            Some(("dynamodb:Query", attention.as_str(), false))
        );

        // And a grant on the table does not reach its indexes.
        let p = one(
            "            - Effect: Allow\n              Action: dynamodb:Query\n              Resource:\n                Fn::GetAtt: [Table, Arn]",
        )
        .unwrap();
        let on_index = request(
            &p,
            "F",
            "DynamoDB_20120810.Query",
            serde_json::json!({"TableName": "local-Table", "IndexName": "I"}),
        );
        assert_eq!(denied(&on_index).map(|d| d.1.to_owned()), Some(format!("{TABLE}/index/I")));
    }

    #[test]
    fn wildcards_grant_resources_and_actions() {
        let p = one(r#"            - Effect: Allow
              Action: DynamoDB:Get*
              Resource:
                Fn::Sub: "${Table.Arn}*"
            - Effect: Allow
              Action: ["sqs:Send?essage"]
              Resource: "*""#)
        .unwrap();
        let get = |table: &str| {
            request(&p, "F", "DynamoDB_20120810.GetItem", serde_json::json!({ "TableName": table }))
        };
        assert!(matches!(get("local-Table"), Decision::Allowed(_)), "actions match in any case");
        assert!(matches!(get(TABLE), Decision::Allowed(_)), "a table named by its ARN");
        assert!(denied(&get("local-Tablet")).is_none(), "the pattern's * reaches past the name");
        assert!(denied(&get("local-table")).is_some(), "resources match case-sensitively");
        let send = request(
            &p,
            "F",
            "AmazonSQS.SendMessage",
            serde_json::json!({ "QueueUrl": "http://h/123456789012/anything" }),
        );
        assert!(matches!(send, Decision::Allowed(_)));
        let put = request(
            &p,
            "F",
            "DynamoDB_20120810.PutItem",
            serde_json::json!({ "TableName": "local-Table" }),
        );
        assert_eq!(denied(&put), Some(("dynamodb:PutItem", TABLE, false)));
        assert!(wildcard("a*b?c", "axxbyc") && wildcard("*", "") && !wildcard("a?", "a"));
        assert!(wildcard("*-??????", "s-AbC123") && !wildcard("*-??????", "s-AbC12"));
    }

    #[test]
    fn an_explicit_deny_wins() {
        let p = one(r#"            - Effect: Allow
              Action: dynamodb:*
              Resource: "*"
            - Effect: Deny
              Action: dynamodb:DeleteItem
              Resource:
                Fn::GetAtt: [Table, Arn]
            - Effect: Deny
              NotAction: ["dynamodb:*", "sqs:*"]
              Resource: "*""#)
        .unwrap();
        let call = |op: &str| {
            request(
                &p,
                "F",
                &format!("DynamoDB_20120810.{op}"),
                serde_json::json!({ "TableName": "local-Table" }),
            )
        };
        assert!(matches!(call("PutItem"), Decision::Allowed(_)));
        assert_eq!(denied(&call("DeleteItem")), Some(("dynamodb:DeleteItem", TABLE, true)));
        let bus = request(&p, "F", "AWSEvents.DescribeEventBus", serde_json::json!({}));
        assert_eq!(
            denied(&bus),
            Some((
                "events:DescribeEventBus",
                "arn:aws:events:us-east-1:123456789012:event-bus/default",
                true
            )),
            "a Deny with NotAction covers every other action"
        );
    }

    #[test]
    fn batches_are_authorised_as_their_single_action() {
        let (stack, policies) = real();
        let batch = |queue: &str, target: &str| {
            let url = stack.reference(queue).unwrap();
            request(
                &policies,
                "SubmissionFunction",
                target,
                serde_json::json!({ "QueueUrl": url, "Entries": [{}, {}] }),
            )
        };
        assert!(matches!(
            batch("SchedulerQueue", "AmazonSQS.SendMessageBatch"),
            Decision::Allowed(_)
        ));
        let reply = stack.attribute("ReplyQueue", "Arn").unwrap();
        assert_eq!(
            denied(&batch("ReplyQueue", "AmazonSQS.SendMessageBatch")),
            Some(("sqs:SendMessage", reply.as_str(), false))
        );
        let scheduler = stack.attribute("SchedulerQueue", "Arn").unwrap();
        assert_eq!(
            denied(&batch("SchedulerQueue", "AmazonSQS.DeleteMessageBatch")),
            Some(("sqs:DeleteMessage", scheduler.as_str(), false))
        );
        let needs = |target: &str, body: Value| {
            needs(Some(target), body.to_string().as_bytes(), &policies.scope).unwrap()
        };
        assert_eq!(
            needs(
                "DynamoDB_20120810.BatchWriteItem",
                serde_json::json!({ "RequestItems": { "a": [], "b": [] } })
            ),
            [
                Need::new(
                    "dynamodb:BatchWriteItem",
                    "arn:aws:dynamodb:us-east-1:123456789012:table/a"
                ),
                Need::new(
                    "dynamodb:BatchWriteItem",
                    "arn:aws:dynamodb:us-east-1:123456789012:table/b"
                ),
            ]
        );
        let url = stack.reference("SchedulerQueue").unwrap();
        assert_eq!(
            needs("AmazonSQS.ChangeMessageVisibilityBatch", serde_json::json!({ "QueueUrl": url })),
            [Need::new("sqs:ChangeMessageVisibility", scheduler.clone())]
        );
        // Events are authorised per entry, on the bus each goes to.
        let bus = stack.attribute("EventBus", "Arn").unwrap();
        let name = stack.reference("EventBus").unwrap();
        assert_eq!(
            needs(
                "AWSEvents.PutEvents",
                serde_json::json!({ "Entries": [{ "EventBusName": name }, { "EventBusName": bus }, {}] })
            ),
            [
                Need::new("events:PutEvents", bus.clone()),
                Need::new(
                    "events:PutEvents",
                    "arn:aws:events:us-east-1:123456789012:event-bus/default"
                ),
            ]
        );
    }

    #[test]
    fn an_unknown_operation_or_service_is_refused() {
        let (_, policies) = real();
        let unmapped = |target: Option<&str>| {
            needs(target, b"{\"TableName\":\"t\"}", &policies.scope).unwrap_err()
        };
        assert_eq!(
            unmapped(Some("DynamoDB_20120810.CreateBackup")).action,
            "dynamodb:CreateBackup"
        );
        assert_eq!(unmapped(Some("AWSEvents.PutRule")).action, "events:PutRule");
        assert!(unmapped(Some("Kinesis_20131202.PutRecord")).reason.contains("not mapped"));
        assert!(unmapped(None).reason.contains("X-Amz-Target"));
        let access = Access::new(policies);
        let refused = access
            .authorize("SchedulerFunction", Some("DynamoDB_20120810.CreateBackup"), b"{}")
            .unwrap_err();
        assert!(matches!(refused.cause, Cause::Unmapped(_)), "{refused:?}");
        assert!(refused.message().contains("is not authorized to perform: dynamodb:CreateBackup"));
    }

    #[test]
    fn each_poller_may_read_its_own_queues_and_no_other() {
        let (stack, policies) = real();
        let receive = |function: &str, queue: &str| {
            let url = stack.reference(queue).unwrap();
            request(
                &policies,
                function,
                "AmazonSQS.ReceiveMessage",
                serde_json::json!({ "QueueUrl": url }),
            )
        };
        assert!(matches!(receive("SchedulerFunction", "SchedulerQueue"), Decision::Allowed(_)));
        assert!(matches!(receive("SchedulerFunction", "ReplyQueue"), Decision::Allowed(_)));
        assert!(denied(&receive("SchedulerFunction", "paymentQueue")).is_some());
        assert!(matches!(receive("paymentAgentFunction", "paymentQueue"), Decision::Allowed(_)));
        assert!(denied(&receive("paymentAgentFunction", "shippingQueue")).is_some());
        // The grants each agent adds to the other functions' roles are read with them.
        let send = |function: &str, queue: &str| {
            let url = stack.reference(queue).unwrap();
            request(
                &policies,
                function,
                "AmazonSQS.SendMessage",
                serde_json::json!({ "QueueUrl": url }),
            )
        };
        assert!(matches!(send("SchedulerFunction", "shippingQueue"), Decision::Allowed(_)));
        assert!(denied(&send("SupervisorFunction", "shippingQueue")).is_some());
        assert!(denied(&receive("StatusFunction", "SchedulerQueue")).is_some(), "no event source");
        for (function, permissions) in &policies.functions {
            assert!(
                permissions.statements.iter().all(|s| s.origin == Origin::Template),
                "{function} has a role of its own: nothing is attached behind the template's back"
            );
        }
    }

    #[test]
    fn a_role_sam_makes_for_an_sqs_event_source_reads_every_queue() {
        let text = "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      Events:\n        E:\n          Type: SQS\n          Properties:\n            Queue: {Fn::GetAtt: [Q, Arn]}\n";
        let template = Template::parse(text).unwrap();
        let policies = policies(&template, &stack_of(&template)).unwrap();
        let implied = policies.functions["F"].statements.last().unwrap();
        assert_eq!(implied.origin, Origin::Implied(SQS_EVENT_SOURCE_POLICY.into()));
        assert_eq!(implied.resources, ["*"], "the managed policy names no queue");
    }

    #[test]
    fn what_cannot_be_evaluated_exactly_is_refused_when_read() {
        let refused = |statements: &str| one(statements).unwrap_err().to_string();
        let condition = refused(
            "            - Effect: Allow\n              Action: sqs:*\n              Resource: \"*\"\n              Condition: {Bool: {aws:SecureTransport: true}}",
        );
        assert!(condition.contains("F:") && condition.contains("conditions"), "{condition}");
        let not_action = refused(
            "            - Effect: Allow\n              NotAction: sqs:*\n              Resource: \"*\"",
        );
        assert!(not_action.contains("NotAction in an Allow"), "{not_action}");
        let not_resource = refused(
            "            - Effect: Allow\n              Action: sqs:*\n              NotResource: \"*\"",
        );
        assert!(not_resource.contains("NotResource in an Allow"), "{not_resource}");
        assert!(refused("            - Effect: Maybe\n              Action: sqs:*\n              Resource: \"*\"").contains("Effect"));

        let with = |properties: &str| {
            let text = format!(
                "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n{properties}\n"
            );
            let template = Template::parse(&text).unwrap();
            policies(&template, &stack_of(&template)).map(|_| ()).unwrap_err().to_string()
        };
        assert!(
            with("      Policies: AmazonSQSFullAccess")
                .contains("managed policy AmazonSQSFullAccess")
        );
        let sam = with(
            "      Policies:\n        - SQSPollerPolicy:\n            QueueName: {Fn::GetAtt: [Q, QueueName]}",
        );
        assert!(sam.contains("SAM policy template SQSPollerPolicy"), "{sam}");
        assert!(with("      Role: arn:aws:iam::123456789012:role/r").contains("Role"));
    }

    #[test]
    fn a_move_task_needs_to_read_the_dead_letters_and_send_them_back() {
        let p = one("            - Effect: Allow\n              Action: sqs:StartMessageMoveTask\n              Resource: \"*\"").unwrap();
        let dlq = "arn:aws:sqs:us-east-1:123456789012:local-Queue";
        let needs = needs(
            Some("AmazonSQS.StartMessageMoveTask"),
            serde_json::json!({ "SourceArn": dlq }).to_string().as_bytes(),
            &p.scope,
        )
        .unwrap();
        let actions: Vec<(&str, &str)> =
            needs.iter().map(|n| (n.action.as_str(), n.resource.as_str())).collect();
        assert_eq!(
            actions,
            [
                ("sqs:StartMessageMoveTask", dlq),
                ("sqs:ReceiveMessage", dlq),
                ("sqs:DeleteMessage", dlq),
                ("sqs:GetQueueAttributes", dlq),
                ("sqs:SendMessage", "arn:aws:sqs:us-east-1:123456789012:local-Other"),
            ]
        );
        assert_eq!(
            p.functions["F"].decide(&needs),
            Decision::Denied { need: needs[1].clone(), explicit: false }
        );
    }

    #[test]
    fn secrets_are_named_by_name_or_arn() {
        let mut scope = Scope { region: "us-east-1".into(), ..Scope::default() };
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:token-AbC123";
        scope.secrets.insert(secret_name("token-AbC123").to_owned(), arn.to_owned());
        let need = |id: &str| {
            needs(
                Some("secretsmanager.GetSecretValue"),
                serde_json::json!({ "SecretId": id }).to_string().as_bytes(),
                &scope,
            )
            .unwrap()
            .remove(0)
            .resource
        };
        assert_eq!(need("token"), arn);
        assert_eq!(need(arn), arn);
        assert_eq!(
            need("arn:aws:secretsmanager:us-east-1:123456789012:secret:token"),
            arn,
            "a partial ARN"
        );
        let unknown = need("other");
        assert_eq!(unknown, "arn:aws:secretsmanager:us-east-1:123456789012:secret:other-??????");
        assert!(wildcard(
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:other-??????",
            &unknown
        ));
        assert!(!wildcard(
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:other-XyZ789",
            &unknown
        ));
    }

    #[test]
    fn the_records_tell_denials_and_grants_no_call_used() {
        let p = one(r#"            - Effect: Allow
              Action: [dynamodb:GetItem, dynamodb:PutItem]
              Resource:
                - Fn::GetAtt: [Table, Arn]
                - Fn::Sub: "${Table.Arn}/index/*""#)
        .unwrap();
        let access = Access::new(p);
        let get = br#"{"TableName":"local-Table"}"#;
        assert_eq!(access.authorize("F", Some("DynamoDB_20120810.GetItem"), get), Ok(()));
        assert_eq!(
            access.authorize("local", Some("DynamoDB_20120810.DeleteItem"), get),
            Ok(()),
            "not a function: unchecked"
        );
        let denial = access.authorize("F", Some("DynamoDB_20120810.DeleteItem"), get).unwrap_err();
        assert_eq!(
            denial.message(),
            format!(
                "User: arn:aws:sts::123456789012:assumed-role/FRole/F is not authorized to perform: dynamodb:DeleteItem on resource: {TABLE} because no identity-based policy allows the dynamodb:DeleteItem action"
            )
        );
        let _ = access.authorize("F", Some("DynamoDB_20120810.DeleteItem"), get);
        let report = access.report();
        assert_eq!(report.checked, BTreeMap::from([("F".to_owned(), 3)]));
        assert_eq!(report.denials.len(), 1);
        assert_eq!(
            (report.denials[0].action.as_str(), report.denials[0].count),
            ("dynamodb:DeleteItem", 2)
        );
        let unused: Vec<(&str, Option<&str>)> =
            report.unused.iter().map(|g| (g.action.as_str(), g.resource_name.as_deref())).collect();
        assert_eq!(
            unused,
            [
                ("dynamodb:GetItem", Some("Table/index/*")),
                ("dynamodb:PutItem", Some("Table")),
                ("dynamodb:PutItem", Some("Table/index/*")),
            ]
        );
        let text = report.to_string();
        assert!(text.contains("3 AWS calls checked") && text.contains("2 denied"), "{text}");
        assert!(
            text.contains("DENIED F: dynamodb:DeleteItem")
                && text.contains("F: dynamodb:PutItem on Table\n"),
            "{text}"
        );
    }

    #[test]
    fn grants_of_services_no_check_sees_are_told_apart() {
        let p = one(r#"            - Effect: Allow
              Action: lambda:InvokeFunctionUrl
              Resource: "*"
            - Effect: Allow
              Action: dynamodb:GetItem
              Resource: "*""#)
        .unwrap();
        let access = Access::new(p);
        let report = access.report();
        let names = |grants: &[Grant]| grants.iter().map(|g| g.action.clone()).collect::<Vec<_>>();
        assert_eq!(names(&report.unused), ["dynamodb:GetItem"]);
        assert_eq!(names(&report.unchecked), ["lambda:InvokeFunctionUrl"]);
        assert!(report.to_string().contains("services the local checks do not see"));

        // Once a gateway reports the calls it checks, they count like the proxy's.
        let url = Need::new(
            "lambda:InvokeFunctionUrl",
            "arn:aws:lambda:us-east-1:123456789012:function:x",
        );
        assert_eq!(
            access.authorize_needs("F", "InvokeFunctionUrl", std::slice::from_ref(&url)),
            Ok(())
        );
        let report = access.report();
        assert_eq!(names(&report.unused), ["dynamodb:GetItem"]);
        assert!(report.unchecked.is_empty());
        let write = Need::new("lambda:InvokeFunction", url.resource.clone());
        let denied = access.authorize_needs("F", "Invoke", &[write]).unwrap_err();
        assert_eq!(
            (denied.action.as_str(), denied.operation.as_str()),
            ("lambda:InvokeFunction", "Invoke")
        );
        assert_eq!(access.report().checked["F"], 2);
    }

    #[test]
    fn the_template_s_policies_are_all_read() {
        let (_, policies) = real();
        for function in [
            "SubmissionFunction",
            "StatusFunction",
            "SchedulerFunction",
            "SupervisorFunction",
            "AdminFunction",
        ] {
            let statements = &policies.functions[function].statements;
            assert!(statements.iter().any(|s| s.origin == Origin::Template), "{function}");
        }
        let sim = &policies.functions["RemoteSimFunction"].statements;
        assert!(
            sim.iter()
                .flat_map(|s| &s.actions)
                .all(|a| a.starts_with("logs:") || a.starts_with("xray:")),
            "no AWS calls of its own, only its logs and traces: {sim:?}"
        );
    }
}
