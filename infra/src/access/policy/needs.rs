//! What a request needs: the IAM actions and resource ARNs it is authorised by, from its
//! operation and body.

use serde_json::Value;

use super::read::{Scope, secret_name};
use super::verdict::Need;
use crate::emulation::template::LOCAL_ACCOUNT;

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
