//! What a request needs: the IAM actions and resource ARNs it is authorised by, from its
//! operation and body.

use serde_json::Value;

use percent_encoding::percent_decode_str;

use super::read::{Scope, secret_name};
use super::rest::{maps, rest_json};
use super::verdict::Need;
use super::wire::{AwsRequest, Protocol};
use crate::emulation::template::LOCAL_ACCOUNT;

/// A request the checker cannot map to what it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmapped {
    /// The action as far as it is known (`dynamodb:CreateBackup`).
    pub action: String,
    pub reason: String,
}

/// The (action, resource) pairs a request needs, by the protocol its service speaks: the JSON
/// protocols (DynamoDB, SQS, EventBridge, Secrets Manager) from `X-Amz-Target` and the body;
/// the query protocol (SNS, SQS from other SDKs) from the form; S3's REST protocol from the
/// method, the path (path-style: `/<bucket>/<key>`) and the query. Never empty.
pub fn needs(request: &AwsRequest<'_>, scope: &Scope) -> Result<Vec<Need>, Unmapped> {
    let service = request.service();
    let (operation, needs) = match request.protocol() {
        Protocol::Json { operation, .. } => {
            let unmapped =
                |reason: String| Unmapped { action: format!("{service}:{operation}"), reason };
            let json: Value = if request.body.is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_json::from_slice(request.body)
                    .map_err(|e| unmapped(format!("the body is not JSON: {e}")))?
            };
            let needs = match service.as_str() {
                "dynamodb" => dynamodb(&operation, &json, scope),
                "sqs" => sqs(&operation, &json, scope),
                "events" => events(&operation, &json, scope),
                "secretsmanager" => secrets(&operation, &json, scope),
                other => Err(format!("the service {other} is not mapped")),
            }
            .map_err(unmapped)?;
            (operation, needs)
        }
        Protocol::Query { action, params } => {
            let unmapped =
                |reason: String| Unmapped { action: format!("{service}:{action}"), reason };
            // The query protocol's parameters are the JSON protocol's members, flattened.
            let json =
                Value::Object(params.into_iter().map(|(k, v)| (k, Value::String(v))).collect());
            let needs = match service.as_str() {
                "sqs" => sqs(&action, &json, scope),
                "sns" => sns(&action, &json, scope),
                other => Err(format!("the query-protocol service {other} is not mapped")),
            }
            .map_err(unmapped)?;
            (action, needs)
        }
        Protocol::Rest => match service.as_str() {
            "s3" => {
                let (operation, needs) = s3(request).map_err(|(operation, reason)| Unmapped {
                    action: format!("s3:{operation}"),
                    reason,
                })?;
                (operation.to_owned(), needs)
            }
            other => match rest_json(other, request, scope) {
                Some((operation, Ok(needs))) => (operation.to_owned(), needs),
                Some((operation, Err(reason))) => {
                    return Err(Unmapped { action: format!("{other}:{operation}"), reason });
                }
                None => {
                    let mapped = if maps(other) {
                        format!("the REST operation {} {} of {other}", request.method, request.path)
                    } else {
                        format!("the REST service {other}")
                    };
                    return Err(Unmapped {
                        action: format!("{other}:{} {}", request.method, request.path),
                        reason: format!("{mapped} is not mapped"),
                    });
                }
            },
        },
    };
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

/// A request's operation, as AWS names it (`PutItem`, `Publish`, `PutObject`), for the counts
/// and the reports; `unknown` for a request the proxy cannot read.
pub fn operation(request: &AwsRequest<'_>) -> String {
    match request.protocol() {
        Protocol::Json { operation, .. } => operation,
        Protocol::Query { action, .. } => action,
        Protocol::Rest if request.service() == "s3" => match s3(request) {
            Ok((operation, _)) | Err((operation, _)) => operation.to_owned(),
        },
        Protocol::Rest => {
            let scope = Scope::default();
            match rest_json(&request.service(), request, &scope) {
                Some((operation, _)) => operation.to_owned(),
                None => format!("{} {}", request.method, request.path),
            }
        }
    }
}

fn sns(action: &str, json: &Value, scope: &Scope) -> Result<Vec<Need>, String> {
    let need = |resource: String| Need::new(format!("sns:{action}"), resource);
    let topic = |name: &str| format!("arn:aws:sns:{}:{LOCAL_ACCOUNT}:{name}", scope.region);
    match action {
        // A message to a topic (or, with TargetArn, to an endpoint), or an SMS to a number.
        "Publish" | "PublishBatch" => {
            let arn = json
                .get("TopicArn")
                .or_else(|| json.get("TargetArn"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            match arn {
                Some(arn) => Ok(vec![need(arn)]),
                None if json.get("PhoneNumber").is_some() => Ok(vec![need("*".to_owned())]),
                None => Err("no TopicArn, TargetArn or PhoneNumber".into()),
            }
        }
        "CreateTopic" => Ok(vec![need(topic(text(json, "Name")?))]),
        "GetTopicAttributes"
        | "SetTopicAttributes"
        | "DeleteTopic"
        | "Subscribe"
        | "ListSubscriptionsByTopic"
        | "TagResource"
        | "UntagResource" => {
            let arn = json.get("TopicArn").or_else(|| json.get("ResourceArn"));
            Ok(vec![need(arn.and_then(Value::as_str).ok_or("no TopicArn")?.to_owned())])
        }
        "Unsubscribe" | "GetSubscriptionAttributes" | "SetSubscriptionAttributes" => {
            Ok(vec![need(text(json, "SubscriptionArn")?.to_owned())])
        }
        "ListTopics" | "ListSubscriptions" => Ok(vec![need("*".to_owned())]),
        other => Err(format!("the SNS operation {other} is not mapped")),
    }
}

/// S3's sub-resources of a bucket and the actions that read and write them, by the query
/// parameter that names them.
const BUCKET_SUBRESOURCES: [(&str, &str, &str, &str); 11] = [
    // (parameter, read operation and action, write operation and action)
    ("acl", "GetBucketAcl", "PutBucketAcl", ""),
    ("cors", "GetBucketCors", "PutBucketCORS", "GetBucketCORS"),
    (
        "encryption",
        "GetBucketEncryption",
        "PutEncryptionConfiguration",
        "GetEncryptionConfiguration",
    ),
    (
        "lifecycle",
        "GetBucketLifecycleConfiguration",
        "PutLifecycleConfiguration",
        "GetLifecycleConfiguration",
    ),
    (
        "notification",
        "GetBucketNotificationConfiguration",
        "PutBucketNotification",
        "GetBucketNotification",
    ),
    ("policy", "GetBucketPolicy", "PutBucketPolicy", ""),
    ("tagging", "GetBucketTagging", "PutBucketTagging", ""),
    ("versioning", "GetBucketVersioning", "PutBucketVersioning", ""),
    (
        "publicAccessBlock",
        "GetPublicAccessBlock",
        "PutBucketPublicAccessBlock",
        "GetBucketPublicAccessBlock",
    ),
    ("ownershipControls", "GetBucketOwnershipControls", "PutBucketOwnershipControls", ""),
    ("location", "GetBucketLocation", "", ""),
];

/// What an S3 request is, and the actions it needs on its bucket or object: the operation's
/// name first (also when it cannot be mapped, with the reason).
fn s3(request: &AwsRequest<'_>) -> Result<(&'static str, Vec<Need>), (&'static str, String)> {
    let method = request.method.to_ascii_uppercase();
    let (bucket, key) = request.bucket_and_key();
    let need = |action: &str, resource: String| Need::new(format!("s3:{action}"), resource);
    let Some(bucket) = bucket else {
        return match method.as_str() {
            "GET" => Ok(("ListBuckets", vec![need("ListAllMyBuckets", "*".to_owned())])),
            _ => Err(("unknown", format!("{method} / names no bucket"))),
        };
    };
    let bucket_arn = format!("arn:aws:s3:::{bucket}");
    let Some(key) = key else {
        for (parameter, read, write, read_action) in BUCKET_SUBRESOURCES {
            if !request.query_has(parameter) {
                continue;
            }
            let (operation, action) = match method.as_str() {
                "GET" => (read, if read_action.is_empty() { read } else { read_action }),
                "PUT" if !write.is_empty() => (write, write),
                "DELETE" if parameter == "policy" => ("DeleteBucketPolicy", "DeleteBucketPolicy"),
                _ => return Err(("unknown", format!("{method} ?{parameter} is not mapped"))),
            };
            return Ok((operation, vec![need(action, bucket_arn)]));
        }
        return match method.as_str() {
            "PUT" => Ok(("CreateBucket", vec![need("CreateBucket", bucket_arn)])),
            "DELETE" => Ok(("DeleteBucket", vec![need("DeleteBucket", bucket_arn)])),
            "HEAD" => Ok(("HeadBucket", vec![need("ListBucket", bucket_arn)])),
            "GET" if request.query_has("uploads") => {
                Ok(("ListMultipartUploads", vec![need("ListBucketMultipartUploads", bucket_arn)]))
            }
            "GET" if request.query_has("versions") => {
                Ok(("ListObjectVersions", vec![need("ListBucketVersions", bucket_arn)]))
            }
            "GET" => Ok(("ListObjectsV2", vec![need("ListBucket", bucket_arn)])),
            // Each object of a batch delete is authorised as its own delete.
            "POST" if request.query_has("delete") => {
                let keys = xml_values(request.body, "Key");
                if keys.is_empty() {
                    return Err(("DeleteObjects", "no Key in the body".into()));
                }
                let needs = keys
                    .into_iter()
                    .map(|k| need("DeleteObject", format!("{bucket_arn}/{k}")))
                    .collect();
                Ok(("DeleteObjects", needs))
            }
            _ => Err(("unknown", format!("{method} on a bucket is not mapped"))),
        };
    };
    let object = format!("{bucket_arn}/{key}");
    let versioned = request.query_has("versionId");
    let found = match method.as_str() {
        "PUT" if request.query_has("tagging") => ("PutObjectTagging", "PutObjectTagging"),
        "PUT" if request.query_has("acl") => ("PutObjectAcl", "PutObjectAcl"),
        "PUT" if request.query_has("uploadId") => ("UploadPart", "PutObject"),
        "PUT" if request.copy_source.is_some() => {
            // A copy reads its source with the caller's permissions too.
            let source = request.copy_source.unwrap_or_default();
            let source = percent_decode_str(source.trim_start_matches('/')).decode_utf8_lossy();
            let source = source.split('?').next().unwrap_or_default();
            return Ok((
                "CopyObject",
                vec![
                    need("PutObject", object),
                    need("GetObject", format!("arn:aws:s3:::{source}")),
                ],
            ));
        }
        "PUT" => ("PutObject", "PutObject"),
        "GET" if request.query_has("tagging") => ("GetObjectTagging", "GetObjectTagging"),
        "GET" if request.query_has("acl") => ("GetObjectAcl", "GetObjectAcl"),
        "GET" if request.query_has("uploadId") => ("ListParts", "ListMultipartUploadParts"),
        "GET" | "HEAD" if versioned => {
            (if method == "GET" { "GetObject" } else { "HeadObject" }, "GetObjectVersion")
        }
        "GET" => ("GetObject", "GetObject"),
        "HEAD" => ("HeadObject", "GetObject"),
        "DELETE" if request.query_has("uploadId") => {
            ("AbortMultipartUpload", "AbortMultipartUpload")
        }
        "DELETE" if request.query_has("tagging") => ("DeleteObjectTagging", "DeleteObjectTagging"),
        "DELETE" if versioned => ("DeleteObject", "DeleteObjectVersion"),
        "DELETE" => ("DeleteObject", "DeleteObject"),
        "POST" if request.query_has("uploads") => ("CreateMultipartUpload", "PutObject"),
        "POST" if request.query_has("uploadId") => ("CompleteMultipartUpload", "PutObject"),
        "POST" if request.query_has("restore") => ("RestoreObject", "RestoreObject"),
        _ => return Err(("unknown", format!("{method} on an object is not mapped"))),
    };
    Ok((found.0, vec![need(found.1, object)]))
}

/// The text of every `<tag>...</tag>` of an XML body, unescaped.
fn xml_values(body: &[u8], tag: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = text.as_ref();
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(
            after[..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[end + close.len()..];
    }
    out
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
    // A request of one item is also known by its item's partition key.
    let item_need = |action: &str, body: &Value| -> Result<Need, String> {
        let arn = table(text(body, "TableName")?);
        let key = leading_key(body, &arn, scope);
        let need = need(action, arn);
        Ok(match key {
            Some(key) => need.with_leading_keys(vec![key]),
            None => need,
        })
    };
    match operation {
        "GetItem" | "PutItem" | "UpdateItem" | "DeleteItem" => {
            Ok(vec![item_need(operation, json)?])
        }
        "DescribeTable"
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
                    item_need(action, body)
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

/// The partition key of the item a request of one item names (its `Key`, or a put's `Item`),
/// where the template gives the table's key schema.
fn leading_key(body: &Value, table: &str, scope: &Scope) -> Option<String> {
    let attribute = scope.partition_keys.get(table)?;
    let value = body.get("Key").or_else(|| body.get("Item"))?.get(attribute)?;
    ["S", "N", "B"].iter().find_map(|kind| value.get(kind)?.as_str()).map(str::to_owned)
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
