//! Creating a template's resources on an AWS API endpoint.
//!
//! Tables (with their global secondary indexes), queues (with their redrive policies), event
//! buses and rules (with their queue targets) are created for real; creation is idempotent, so
//! provisioning twice against the same endpoint reuses what exists. Resources the runner
//! emulates itself (functions, the HTTP API) and those with no local meaning (alarms, e-mail
//! subscriptions, access policies) are not created; each is listed in [`Stack::skipped`] with
//! the reason, and references to them still resolve, so the rest of the template evaluates.

use std::collections::HashMap;

use crate::emulation::aws::Clients;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;
use tracing::debug;

use crate::Error;
use crate::emulation::template::{Context, LOCAL_ACCOUNT, Resource, Template, scalar_string};

/// How to provision.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Prefix of every physical name, like a CloudFormation stack name.
    pub stack_name: String,
    pub region: String,
    /// Parameter values that replace the template's defaults.
    pub parameters: HashMap<String, String>,
    /// Attributes of resources provided from elsewhere, e.g. (`RemoteSimFunctionUrl`,
    /// `FunctionUrl`) for the URL of a locally running service.
    pub attributes: HashMap<(String, String), Value>,
}

/// What was created, and how to refer to it.
#[derive(Clone, Debug)]
pub struct Stack {
    pub context: Context,
    /// Logical ids of the resources created (or found existing), in creation order.
    pub created: Vec<String>,
    /// Resources not created, with their type and why.
    pub skipped: Vec<(String, String, String)>,
}

impl Stack {
    /// The `Ref` of a created resource (a table's name, a queue's URL, a bus's name).
    pub fn reference(&self, logical_id: &str) -> Option<String> {
        self.context.refs.get(logical_id).and_then(|v| scalar_string(v).ok())
    }

    /// A `Fn::GetAtt` of a created resource.
    pub fn attribute(&self, logical_id: &str, attribute: &str) -> Option<String> {
        self.context
            .attributes
            .get(&(logical_id.to_owned(), attribute.to_owned()))
            .and_then(|v| scalar_string(v).ok())
    }

    /// Evaluates any template fragment (a function's environment, an output) in this stack.
    pub fn eval(&self, value: &Value) -> Result<Value, Error> {
        self.context.eval(value)
    }
}

/// Why a resource type is not created locally; `None` for types that are.
fn not_created(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "AWS::DynamoDB::Table"
        | "AWS::SQS::Queue"
        | "AWS::S3::Bucket"
        | "AWS::Events::EventBus"
        | "AWS::Events::Rule" => return None,
        "AWS::Serverless::Function" | "AWS::Lambda::Function" => {
            "run by the local stack as a process"
        }
        "AWS::Serverless::HttpApi"
        | "AWS::ApiGatewayV2::Api"
        | "AWS::ApiGatewayV2::Stage"
        | "AWS::ApiGatewayV2::Route"
        | "AWS::ApiGatewayV2::Integration"
        | "AWS::ApiGatewayV2::Authorizer" => "served by the local stack on 127.0.0.1",
        "AWS::Lambda::Permission" => "the local stack invokes the functions itself",
        "AWS::SQS::QueuePolicy"
        | "AWS::SNS::TopicPolicy"
        | "AWS::S3::BucketPolicy"
        | "AWS::IAM::ManagedPolicy" => {
            "resource and managed policies are not enforced locally (the functions' own policies are, by the AWS proxy)"
        }
        "AWS::IAM::Role" | "AWS::IAM::RolePolicy" => {
            "each function's role and the policies added to it are checked on every call by the AWS proxy, not created"
        }
        "AWS::Logs::LogGroup" => "the local stack prints the functions' logs itself",
        "AWS::SNS::Topic" => "alerts are read from the alerts queue locally",
        "AWS::SNS::Subscription" => "e-mail is not delivered locally",
        "AWS::CloudWatch::Alarm" => {
            "alarms are CloudWatch's; locally, dead letters are reported as they arrive and the demo checks the functions' metrics"
        }
        "AWS::CloudWatch::Dashboard" => {
            "dashboards are CloudWatch's; locally, `local-stack up` serves a live page and the demo writes a report"
        }
        "AWS::Cognito::UserPool"
        | "AWS::Cognito::UserPoolDomain"
        | "AWS::Cognito::UserPoolClient"
        | "AWS::Cognito::UserPoolGroup" => {
            "the console's user pool is Cognito's: locally its page is served, and signs its calls with the local keys a tab is given"
        }
        "AWS::Cognito::IdentityPool"
        | "AWS::Cognito::IdentityPoolRoleAttachment"
        | "AWS::IAM::OIDCProvider" => {
            "the identity pool is emulated for an OpenID Connect issuer's users only (a JWT stack's console), on a port of its own"
        }
        _ => "this resource type is not supported locally",
    })
}

/// Creates every resource of `template` that has a local equivalent.
pub async fn provision(
    template: &Template,
    clients: &Clients,
    options: &Options,
) -> Result<Stack, Error> {
    let mut ctx =
        Context::new(template, &options.stack_name, &options.region, &options.parameters)?;
    ctx.attributes.extend(options.attributes.clone());
    let mut stack = Stack { context: ctx, created: Vec::new(), skipped: Vec::new() };

    let mut pending = Vec::new();
    for (id, resource) in &template.resources {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        match not_created(&resource.kind) {
            None => pending.push((id.as_str(), resource)),
            Some(reason) => {
                stand_in(&mut stack.context, id, resource, options);
                stack.skipped.push((id.clone(), resource.kind.clone(), reason.to_owned()));
            }
        }
    }
    // Create in dependency order: a resource whose properties refer to something not created
    // yet waits for the next round.
    while !pending.is_empty() {
        let mut waiting = Vec::new();
        let mut progressed = false;
        for (id, resource) in pending {
            let properties = match stack.context.eval(&resource.properties) {
                Ok(p) => p,
                Err(Error::Template(m)) if m.contains("not known (yet)") => {
                    waiting.push((id, resource));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let name = physical_name(&options.stack_name, id);
            create(clients, &mut stack, id, &resource.kind, &name, &properties).await.map_err(
                |message| Error::Create {
                    logical_id: id.into(),
                    kind: resource.kind.clone(),
                    message,
                },
            )?;
            debug!(logical_id = id, "created");
            stack.created.push(id.to_owned());
            progressed = true;
        }
        if !progressed && !waiting.is_empty() {
            let ids: Vec<&str> = waiting.iter().map(|(id, _)| *id).collect();
            return Err(Error::Template(format!("unresolvable references in {}", ids.join(", "))));
        }
        pending = waiting;
    }
    Ok(stack)
}

/// Creates resource `id` of type `kind` as `name`, with its evaluated `properties`.
async fn create(
    clients: &Clients,
    stack: &mut Stack,
    id: &str,
    kind: &str,
    name: &str,
    properties: &Value,
) -> Result<(), String> {
    let Clients { dynamodb, sqs, events, s3, .. } = clients;
    match kind {
        "AWS::DynamoDB::Table" => {
            create_table(dynamodb, &mut stack.context, id, name, properties).await?;
            if properties.get("TimeToLiveSpecification").is_some() {
                // Set, and described as on AWS; the emulator keeps items past their time.
                let reason = "configured, but the emulator deletes no expired item".into();
                let property = format!("{id}.TimeToLiveSpecification");
                stack.skipped.push((property, kind.into(), reason));
            }
        }
        "AWS::SQS::Queue" => create_queue(sqs, &mut stack.context, id, name, properties).await?,
        "AWS::S3::Bucket" => {
            let unapplied = create_bucket(s3, &mut stack.context, id, name, properties).await?;
            for (property, reason) in unapplied {
                stack.skipped.push((format!("{id}.{property}"), kind.into(), reason));
            }
        }
        "AWS::Events::EventBus" => {
            create_bus(events, &mut stack.context, id, name, properties).await?
        }
        "AWS::Events::Rule" => {
            let dropped = create_rule(events, &mut stack.context, id, name, properties).await?;
            for target in dropped {
                stack.skipped.push((
                    format!("{id} → {target}"),
                    "rule target".into(),
                    "only queue targets are delivered locally".into(),
                ));
            }
        }
        _ => unreachable!("filtered by not_created"),
    }
    Ok(())
}

/// Physical names as CloudFormation would make them: short, unique per stack, and valid for
/// tables, queues and rules alike.
fn physical_name(stack: &str, logical_id: &str) -> String {
    let mut name = format!("{stack}-{logical_id}");
    name.retain(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    name.truncate(80);
    name
}

/// Resolves every resource of `template` to the names it would get, creating nothing: for
/// inspecting what a template asks for, and for tests.
pub fn dry_run(template: &Template, options: &Options) -> Result<Stack, Error> {
    let mut context =
        Context::new(template, &options.stack_name, &options.region, &options.parameters)?;
    context.attributes.extend(options.attributes.clone());
    for (id, resource) in &template.resources {
        if context.holds(resource.condition.as_deref()) {
            stand_in(&mut context, id, resource, options);
        }
    }
    Ok(Stack { context, created: Vec::new(), skipped: Vec::new() })
}

/// The project's `template.yaml`, for tests of what it declares.
#[cfg(test)]
pub(crate) fn project_template() -> Template {
    Template::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml"))
        .unwrap()
}

/// A dry run of `template` as the local stack names things (stack `local` in us-east-1, the
/// simulated service's URL on a made-up port), with `parameters`.
pub fn local_names(template: &Template, parameters: &[(&str, &str)]) -> Result<Stack, Error> {
    let options = Options {
        stack_name: "local".into(),
        region: "us-east-1".into(),
        parameters: parameters.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        attributes: HashMap::from([(
            ("RemoteSimFunctionUrl".into(), "FunctionUrl".into()),
            Value::String("http://127.0.0.1:9999/".into()),
        )]),
    };
    dry_run(template, &options)
}

/// [`local_names`], for tests.
#[cfg(test)]
pub(crate) fn local_dry_run(template: &Template, parameters: &[(&str, &str)]) -> Stack {
    local_names(template, parameters).unwrap()
}

/// References to resources that are not created still resolve, to what they would be named.
fn stand_in(ctx: &mut Context, id: &str, resource: &Resource, options: &Options) {
    let kind = resource.kind.as_str();
    let name = physical_name(&options.stack_name, id);
    let region = &options.region;
    // A queue, table or bucket the template names keeps its name (agents find theirs by name).
    let named = ["QueueName", "TableName", "BucketName"]
        .iter()
        .find_map(|key| resource.properties.get(*key))
        .and_then(|n| ctx.eval(n).ok())
        .and_then(|n| scalar_string(&n).ok());
    let name = named.unwrap_or(name);
    let (reference, arn) = match kind {
        "AWS::SQS::Queue" => {
            ctx.attributes.insert((id.to_owned(), "QueueName".into()), Value::String(name.clone()));
            (
                format!("https://sqs.{region}.amazonaws.com/{LOCAL_ACCOUNT}/{name}"),
                format!("arn:aws:sqs:{region}:{LOCAL_ACCOUNT}:{name}"),
            )
        }
        "AWS::DynamoDB::Table" => {
            (name.clone(), format!("arn:aws:dynamodb:{region}:{LOCAL_ACCOUNT}:table/{name}"))
        }
        "AWS::Events::EventBus" => {
            (name.clone(), format!("arn:aws:events:{region}:{LOCAL_ACCOUNT}:event-bus/{name}"))
        }
        "AWS::SNS::Topic" => {
            let arn = format!("arn:aws:sns:{region}:{LOCAL_ACCOUNT}:{name}");
            (arn.clone(), arn)
        }
        "AWS::S3::Bucket" => (bucket_name(&name), format!("arn:aws:s3:::{}", bucket_name(&name))),
        "AWS::Serverless::Function" | "AWS::Lambda::Function" => {
            (name.clone(), format!("arn:aws:lambda:{region}:{LOCAL_ACCOUNT}:function:{name}"))
        }
        "AWS::Cognito::UserPool" => {
            let id_ = format!("{region}_{}", name.replace('-', ""));
            let provider = format!("cognito-idp.{region}.amazonaws.com/{id_}");
            ctx.attributes.insert((id.to_owned(), "ProviderName".into()), Value::String(provider));
            (id_.clone(), format!("arn:aws:cognito-idp:{region}:{LOCAL_ACCOUNT}:userpool/{id_}"))
        }
        "AWS::IAM::OIDCProvider" => {
            // Named by its issuer's URL without the scheme, as IAM names it.
            let url = resource.properties.get("Url").and_then(|u| ctx.eval(u).ok());
            let url = url.as_ref().and_then(|u| scalar_string(u).ok()).unwrap_or(name);
            let host = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
            let arn = format!("arn:aws:iam::{LOCAL_ACCOUNT}:oidc-provider/{host}");
            (arn.clone(), arn)
        }
        _ => (name.clone(), format!("arn:aws:local:{region}:{LOCAL_ACCOUNT}:{name}")),
    };
    ctx.refs.insert(id.to_owned(), Value::String(reference));
    ctx.attributes.insert((id.to_owned(), "Arn".into()), Value::String(arn));
}

/// A bucket's name from a physical name: S3 takes lowercase letters, digits and `-`, 3 to 63.
fn bucket_name(name: &str) -> String {
    let mut name = name.to_ascii_lowercase().replace('_', "-");
    name.truncate(63);
    name
}

/// Creates the bucket with the configuration its properties declare (encryption, public
/// access block, ownership, lifecycle rules); returns each property it did not apply, with why.
async fn create_bucket(
    client: &aws_sdk_s3::Client,
    ctx: &mut Context,
    id: &str,
    default_name: &str,
    p: &Value,
) -> Result<Vec<(String, String)>, String> {
    let name = bucket_name(&text(p, "BucketName").unwrap_or_else(|| default_name.to_owned()));
    let failed = |call: &str, e: String| format!("{call} {name}: {e}");
    match client.create_bucket().bucket(&name).send().await {
        Ok(_) => {}
        // Started again on the same emulator: the bucket is the stack's already.
        Err(e) if e.as_service_error().is_some_and(|s| s.is_bucket_already_owned_by_you()) => {}
        Err(e) => {
            return Err(failed(
                "CreateBucket",
                aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
            ));
        }
    }
    ctx.refs.insert(id.to_owned(), Value::String(name.clone()));
    ctx.attributes
        .insert((id.to_owned(), "Arn".into()), Value::String(format!("arn:aws:s3:::{name}")));
    let mut unapplied = Vec::new();
    for (property, value) in p.as_object().into_iter().flatten() {
        let applied = match property.as_str() {
            "BucketName" => Ok(true),
            "BucketEncryption" => bucket::encryption(client, &name, value).await,
            "PublicAccessBlockConfiguration" => bucket::public_access(client, &name, value).await,
            "OwnershipControls" => bucket::ownership(client, &name, value).await,
            "LifecycleConfiguration" => bucket::lifecycle(client, &name, value).await,
            _ => Ok(false),
        };
        match applied {
            Ok(true) => {}
            Ok(false) => unapplied.push((property.clone(), "not configured locally".into())),
            Err(e) => return Err(failed(property, e)),
        }
    }
    if p.get("LifecycleConfiguration").is_some() {
        // Configured, and read back as on AWS; the emulator keeps objects past their rule.
        unapplied.push((
            "LifecycleConfiguration".into(),
            "configured, but the emulator expires no object".into(),
        ));
    }
    Ok(unapplied)
}

/// A bucket's configuration, from its template properties, as the S3 API takes it. Each
/// returns whether it applied the property (`false`: a form it does not know).
mod bucket {
    use aws_sdk_s3::Client;
    use aws_sdk_s3::error::DisplayErrorContext;
    use aws_sdk_s3::types::{
        AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus,
        LifecycleExpiration, LifecycleRule, LifecycleRuleFilter, ObjectOwnership,
        OwnershipControls, OwnershipControlsRule, PublicAccessBlockConfiguration,
        ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration,
        ServerSideEncryptionRule,
    };
    use serde_json::Value;

    fn error(e: impl std::error::Error + Send + Sync + 'static) -> String {
        DisplayErrorContext(e).to_string()
    }

    pub(super) async fn encryption(client: &Client, name: &str, v: &Value) -> Result<bool, String> {
        let rules = v["ServerSideEncryptionConfiguration"].as_array().cloned().unwrap_or_default();
        let mut configuration = ServerSideEncryptionConfiguration::builder();
        for rule in &rules {
            let by_default = &rule["ServerSideEncryptionByDefault"];
            let Some(algorithm) = by_default["SSEAlgorithm"].as_str() else { return Ok(false) };
            let mut default = ServerSideEncryptionByDefault::builder()
                .sse_algorithm(ServerSideEncryption::from(algorithm));
            if let Some(key) = by_default["KMSMasterKeyID"].as_str() {
                default = default.kms_master_key_id(key);
            }
            let rule = ServerSideEncryptionRule::builder()
                .apply_server_side_encryption_by_default(default.build().map_err(error)?);
            configuration = configuration.rules(rule.build());
        }
        client
            .put_bucket_encryption()
            .bucket(name)
            .server_side_encryption_configuration(configuration.build().map_err(error)?)
            .send()
            .await
            .map_err(error)?;
        Ok(!rules.is_empty())
    }

    pub(super) async fn public_access(
        client: &Client,
        name: &str,
        v: &Value,
    ) -> Result<bool, String> {
        let flag = |key: &str| v[key].as_bool().or_else(|| v[key].as_str().map(|s| s == "true"));
        let block = PublicAccessBlockConfiguration::builder()
            .set_block_public_acls(flag("BlockPublicAcls"))
            .set_block_public_policy(flag("BlockPublicPolicy"))
            .set_ignore_public_acls(flag("IgnorePublicAcls"))
            .set_restrict_public_buckets(flag("RestrictPublicBuckets"))
            .build();
        client
            .put_public_access_block()
            .bucket(name)
            .public_access_block_configuration(block)
            .send()
            .await
            .map_err(error)?;
        Ok(true)
    }

    pub(super) async fn ownership(client: &Client, name: &str, v: &Value) -> Result<bool, String> {
        let mut controls = OwnershipControls::builder();
        for rule in v["Rules"].as_array().into_iter().flatten() {
            let Some(owner) = rule["ObjectOwnership"].as_str() else { return Ok(false) };
            let rule = OwnershipControlsRule::builder()
                .object_ownership(ObjectOwnership::from(owner))
                .build()
                .map_err(error)?;
            controls = controls.rules(rule);
        }
        client
            .put_bucket_ownership_controls()
            .bucket(name)
            .ownership_controls(controls.build().map_err(error)?)
            .send()
            .await
            .map_err(error)?;
        Ok(true)
    }

    pub(super) async fn lifecycle(client: &Client, name: &str, v: &Value) -> Result<bool, String> {
        let mut configuration = BucketLifecycleConfiguration::builder();
        for rule in v["Rules"].as_array().into_iter().flatten() {
            let known =
                ["Id", "Status", "Prefix", "ExpirationInDays", "AbortIncompleteMultipartUpload"];
            if rule.as_object().is_none_or(|r| r.keys().any(|k| !known.contains(&k.as_str()))) {
                return Ok(false);
            }
            let days = rule["ExpirationInDays"]
                .as_i64()
                .or_else(|| rule["ExpirationInDays"].as_str().and_then(|d| d.parse().ok()));
            let status = match rule["Status"].as_str() {
                Some("Enabled") => ExpirationStatus::Enabled,
                _ => ExpirationStatus::Disabled,
            };
            let prefix = rule["Prefix"].as_str().unwrap_or_default();
            let mut built = LifecycleRule::builder()
                .status(status)
                .filter(LifecycleRuleFilter::builder().prefix(prefix).build());
            if let Some(id) = rule["Id"].as_str() {
                built = built.id(id);
            }
            if let Some(days) = days.and_then(|d| i32::try_from(d).ok()) {
                built = built.expiration(LifecycleExpiration::builder().days(days).build());
            }
            let unfinished = &rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"];
            let unfinished =
                unfinished.as_i64().or_else(|| unfinished.as_str().and_then(|d| d.parse().ok()));
            if let Some(days) = unfinished.and_then(|d| i32::try_from(d).ok()) {
                let abort = AbortIncompleteMultipartUpload::builder().days_after_initiation(days);
                built = built.abort_incomplete_multipart_upload(abort.build());
            }
            configuration = configuration.rules(built.build().map_err(error)?);
        }
        client
            .put_bucket_lifecycle_configuration()
            .bucket(name)
            .lifecycle_configuration(configuration.build().map_err(error)?)
            .send()
            .await
            .map_err(error)?;
        Ok(true)
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(|x| scalar_string(x).ok())
}

async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    ctx: &mut Context,
    id: &str,
    default_name: &str,
    p: &Value,
) -> Result<(), String> {
    let name = text(p, "TableName").unwrap_or_else(|| default_name.to_owned());
    let keys = |v: Option<&Value>| -> Result<Vec<KeySchemaElement>, String> {
        v.and_then(Value::as_array)
            .ok_or("KeySchema missing")?
            .iter()
            .map(|k| {
                KeySchemaElement::builder()
                    .attribute_name(text(k, "AttributeName").unwrap_or_default())
                    .key_type(KeyType::from(text(k, "KeyType").unwrap_or_default().as_str()))
                    .build()
                    .map_err(|e| e.to_string())
            })
            .collect()
    };
    let mut request = client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(keys(p.get("KeySchema"))?));
    for a in p.get("AttributeDefinitions").and_then(Value::as_array).into_iter().flatten() {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(text(a, "AttributeName").unwrap_or_default())
                .attribute_type(ScalarAttributeType::from(
                    text(a, "AttributeType").unwrap_or_default().as_str(),
                ))
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    for g in p.get("GlobalSecondaryIndexes").and_then(Value::as_array).into_iter().flatten() {
        let projection = g.get("Projection").cloned().unwrap_or_default();
        let mut proj = Projection::builder().projection_type(ProjectionType::from(
            text(&projection, "ProjectionType").unwrap_or("ALL".into()).as_str(),
        ));
        for attr in
            projection.get("NonKeyAttributes").and_then(Value::as_array).into_iter().flatten()
        {
            proj = proj.non_key_attributes(scalar_string(attr).map_err(|e| e.to_string())?);
        }
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(text(g, "IndexName").unwrap_or_default())
                .set_key_schema(Some(keys(g.get("KeySchema"))?))
                .projection(proj.build())
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    match request.send().await {
        Ok(_) => {}
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => return Err(aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string()),
    }
    let ttl = p.get("TimeToLiveSpecification");
    if let Some(attribute) =
        ttl.filter(|t| t["Enabled"] == true).and_then(|t| text(t, "AttributeName"))
    {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(attribute)
            .enabled(true)
            .build()
            .map_err(|e| e.to_string())?;
        let set = client.update_time_to_live().table_name(&name).time_to_live_specification(spec);
        match set.send().await {
            Ok(_) => {}
            // Set already: the table was there.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.meta().code() == Some("ValidationException")) => {}
            Err(e) => return Err(aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string()),
        }
    }
    ctx.refs.insert(id.into(), Value::String(name.clone()));
    let arn = format!("arn:aws:dynamodb:{}:{LOCAL_ACCOUNT}:table/{name}", ctx.region);
    ctx.attributes.insert((id.into(), "Arn".into()), Value::String(arn));
    Ok(())
}

async fn create_queue(
    client: &aws_sdk_sqs::Client,
    ctx: &mut Context,
    id: &str,
    default_name: &str,
    p: &Value,
) -> Result<(), String> {
    let fifo = p.get("FifoQueue").is_some_and(|v| v == &Value::Bool(true) || v == "true");
    let mut name = text(p, "QueueName").unwrap_or_else(|| default_name.to_owned());
    if fifo && !name.ends_with(".fifo") {
        name.push_str(".fifo");
    }
    let mut request = client.create_queue().queue_name(&name);
    for (key, attr) in [
        ("VisibilityTimeout", QueueAttributeName::VisibilityTimeout),
        ("MessageRetentionPeriod", QueueAttributeName::MessageRetentionPeriod),
        ("DelaySeconds", QueueAttributeName::DelaySeconds),
        ("ReceiveMessageWaitTimeSeconds", QueueAttributeName::ReceiveMessageWaitTimeSeconds),
        ("MaximumMessageSize", QueueAttributeName::MaximumMessageSize),
    ] {
        if let Some(v) = text(p, key) {
            request = request.attributes(attr, v);
        }
    }
    if fifo {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    if let Some(redrive) = p.get("RedrivePolicy") {
        request = request.attributes(QueueAttributeName::RedrivePolicy, redrive.to_string());
    }
    let url = request
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?
        .queue_url
        .ok_or("no queue URL returned")?;
    let arn = format!("arn:aws:sqs:{}:{LOCAL_ACCOUNT}:{name}", ctx.region);
    ctx.refs.insert(id.into(), Value::String(url.clone()));
    ctx.attributes.insert((id.into(), "Arn".into()), Value::String(arn));
    ctx.attributes.insert((id.into(), "QueueName".into()), Value::String(name));
    ctx.attributes.insert((id.into(), "QueueUrl".into()), Value::String(url));
    Ok(())
}

async fn create_bus(
    client: &aws_sdk_eventbridge::Client,
    ctx: &mut Context,
    id: &str,
    default_name: &str,
    p: &Value,
) -> Result<(), String> {
    let name = text(p, "Name").unwrap_or_else(|| default_name.to_owned());
    match client.create_event_bus().name(&name).send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error().is_some_and(|s| s.is_resource_already_exists_exception()) => {}
        Err(e) => return Err(aws_sdk_eventbridge::error::DisplayErrorContext(e).to_string()),
    }
    let arn = format!("arn:aws:events:{}:{LOCAL_ACCOUNT}:event-bus/{name}", ctx.region);
    ctx.refs.insert(id.into(), Value::String(name.clone()));
    ctx.attributes.insert((id.into(), "Arn".into()), Value::String(arn));
    ctx.attributes.insert((id.into(), "Name".into()), Value::String(name));
    Ok(())
}

/// Creates the rule and its queue targets; returns the targets that were not queues.
async fn create_rule(
    client: &aws_sdk_eventbridge::Client,
    ctx: &mut Context,
    id: &str,
    default_name: &str,
    p: &Value,
) -> Result<Vec<String>, String> {
    let name = text(p, "Name").unwrap_or_else(|| default_name.to_owned());
    let bus = text(p, "EventBusName").unwrap_or_else(|| "default".into());
    let mut rule = client.put_rule().name(&name).event_bus_name(&bus);
    if let Some(pattern) = p.get("EventPattern") {
        rule = rule.event_pattern(pattern.to_string());
    }
    if let Some(schedule) = text(p, "ScheduleExpression") {
        rule = rule.schedule_expression(schedule);
    }
    let out = rule
        .send()
        .await
        .map_err(|e| aws_sdk_eventbridge::error::DisplayErrorContext(e).to_string())?;
    let mut dropped = Vec::new();
    let mut targets = Vec::new();
    for t in p.get("Targets").and_then(Value::as_array).into_iter().flatten() {
        let arn = text(t, "Arn").unwrap_or_default();
        if !arn.starts_with("arn:aws:sqs:") {
            dropped.push(arn);
            continue;
        }
        targets.push(
            aws_sdk_eventbridge::types::Target::builder()
                .id(text(t, "Id").unwrap_or_else(|| format!("target-{}", targets.len())))
                .arn(arn)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    if !targets.is_empty() {
        client
            .put_targets()
            .rule(&name)
            .event_bus_name(&bus)
            .set_targets(Some(targets))
            .send()
            .await
            .map_err(|e| aws_sdk_eventbridge::error::DisplayErrorContext(e).to_string())?;
    }
    ctx.refs.insert(id.into(), Value::String(name));
    if let Some(arn) = out.rule_arn {
        ctx.attributes.insert((id.into(), "Arn".into()), Value::String(arn));
    }
    Ok(dropped)
}
