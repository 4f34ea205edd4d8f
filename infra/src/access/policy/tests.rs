//! The policy check against hand-written policies and against the project's template.

use std::collections::BTreeMap;

use serde_json::Value;

use super::read::{SQS_EVENT_SOURCE_POLICY, secret_name};
use super::*;
use crate::Error;
use crate::emulation::provision::{Stack, local_dry_run, project_template};
use crate::emulation::template::Template;

/// A request of a JSON protocol: its target and body.
fn json_request<'a>(target: Option<&'a str>, body: &'a [u8]) -> AwsRequest<'a> {
    AwsRequest { method: "POST", path: "/", target, body, ..AwsRequest::default() }
}

/// What a JSON-protocol request needs.
fn needs(target: Option<&str>, body: &[u8], scope: &Scope) -> Result<Vec<Need>, Unmapped> {
    super::needs(&json_request(target, body), scope)
}

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
    Properties:
      KeySchema:
        - {{AttributeName: Id, KeyType: HASH}}
        - {{AttributeName: At, KeyType: RANGE}}
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
    let one = serde_json::json!({ "TransactItems": [put(&table("StateTable"))] });
    let submission =
        request(&policies, "SubmissionFunction", "DynamoDB_20120810.TransactWriteItems", one);
    assert!(matches!(submission, Decision::Allowed(_)), "{submission:?}");

    // It may read the orders table, not write it.
    let two = serde_json::json!({ "TransactItems": [
            put(&table("StateTable")), put(&table("OrdersTable"))] });
    let decision =
        request(&policies, "SubmissionFunction", "DynamoDB_20120810.TransactWriteItems", two);
    let orders = stack.attribute("OrdersTable", "Arn").unwrap();
    assert_eq!(denied(&decision), Some(("dynamodb:PutItem", orders.as_str(), false)));

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
        request(&policies, "AdminFunction", "DynamoDB_20120810.Query", body)
    };
    assert!(matches!(query(Some("ByAttention")), Decision::Allowed(_)));
    let state = stack.attribute("StateTable", "Arn").unwrap();
    assert_eq!(
        denied(&query(None)),
        Some(("dynamodb:Query", state.as_str(), false)),
        "the table itself"
    );
    // The operators' listings never read the supervisor's expiry index.
    let expiry = format!("{state}/index/ByCompleteBy");
    assert_eq!(
        denied(&query(Some("ByCompleteBy"))),
        Some(("dynamodb:Query", expiry.as_str(), false))
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
    assert!(matches!(batch("SchedulerQueue", "AmazonSQS.SendMessageBatch"), Decision::Allowed(_)));
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
            Need::new("dynamodb:BatchWriteItem", "arn:aws:dynamodb:us-east-1:123456789012:table/a"),
            Need::new("dynamodb:BatchWriteItem", "arn:aws:dynamodb:us-east-1:123456789012:table/b"),
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
    assert_eq!(unmapped(Some("DynamoDB_20120810.CreateBackup")).action, "dynamodb:CreateBackup");
    assert_eq!(unmapped(Some("AWSEvents.PutRule")).action, "events:PutRule");
    assert!(unmapped(Some("Kinesis_20131202.PutRecord")).reason.contains("not mapped"));
    assert!(
        unmapped(None).reason.contains("the REST service unknown is not mapped"),
        "{:?}",
        unmapped(None)
    );
    let access = Access::new(policies);
    let refused = access
        .authorize(
            "SchedulerFunction",
            &json_request(Some("DynamoDB_20120810.CreateBackup"), b"{}"),
        )
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
fn each_agent_writes_only_its_own_items_of_the_services_table() {
    let (stack, policies) = real();
    let table = stack.reference("ServicesTable").unwrap();
    let update = |function: &str, key: &str| {
        let body = serde_json::json!({ "TableName": table, "Key": { "Service": { "S": key } } });
        request(&policies, function, "DynamoDB_20120810.UpdateItem", body)
    };
    // Its health, a hold of one action, the turns of its resumed calls, its tally and places.
    for own in
        ["payment", "payment/charge", "payment/resumed#rate", "payment#rate", "payment#flight"]
    {
        assert!(matches!(update("paymentAgentFunction", own), Decision::Allowed(_)), "{own}");
    }
    for other in ["shipping", "shipping#rate", "shipping/resumed#rate", "paymentx", "paymentx#rate"]
    {
        let decision = update("paymentAgentFunction", other);
        let services = stack.attribute("ServicesTable", "Arn").unwrap();
        assert_eq!(denied(&decision), Some(("dynamodb:UpdateItem", services.as_str(), false)));
    }
    let put = serde_json::json!({ "TableName": table, "Item": { "Service": { "S": "shipping" } } });
    assert!(
        denied(&request(
            &policies,
            "paymentAgentFunction",
            "DynamoDB_20120810.PutItem",
            put.clone()
        ))
        .is_some()
    );
    // An operator's hold or the supervisor's record of one is written for any service.
    assert!(matches!(
        request(&policies, "SupervisorFunction", "DynamoDB_20120810.PutItem", put),
        Decision::Allowed(_)
    ));
    // A transaction is held to the keys of each of its items.
    let both = serde_json::json!({ "TransactItems": [
        { "Update": { "TableName": table, "Key": { "Service": { "S": "payment#rate" } } } },
        { "Update": { "TableName": table, "Key": { "Service": { "S": "shipping#rate" } } } }] });
    let decision =
        request(&policies, "paymentAgentFunction", "DynamoDB_20120810.TransactWriteItems", both);
    let need = match decision {
        Decision::Denied { need, .. } => need,
        other => panic!("{other:?}"),
    };
    assert_eq!(need.leading_keys, Some(vec!["shipping#rate".to_owned()]));
}

#[test]
fn a_condition_on_partition_keys_is_evaluated_only_where_every_request_names_one() {
    let policies = one(
        "            - Effect: Allow\n              Action: [dynamodb:GetItem]\n              Resource: \"*\"\n              Condition: {ForAllValues:StringEquals: {dynamodb:LeadingKeys: [a]}}",
    )
    .unwrap();
    let get = |table: &str, key: &str| {
        let key = serde_json::json!({ "Id": { "S": key }, "At": { "N": "1" } });
        let body = serde_json::json!({ "TableName": table, "Key": key });
        request(&policies, "F", "DynamoDB_20120810.GetItem", body)
    };
    let table = TABLE.rsplit_once('/').unwrap().1;
    assert!(matches!(get(table, "a"), Decision::Allowed(_)));
    assert!(denied(&get(table, "b")).is_some());
    assert!(denied(&get(table, "a*")).is_some(), "StringEquals takes no wildcard");
    // A table whose key schema the template does not give: its partition key cannot be read,
    // and a key that cannot be read matches nothing.
    assert!(denied(&get("elsewhere", "a")).is_some());
    let refused = |statements: &str| one(statements).unwrap_err().to_string();
    let scan = refused(
        "            - Effect: Allow\n              Action: [dynamodb:GetItem, dynamodb:Scan]\n              Resource: \"*\"\n              Condition: {ForAllValues:StringLike: {dynamodb:LeadingKeys: [a]}}",
    );
    assert!(scan.contains("only on the actions of one item"), "{scan}");
    let every = refused(
        "            - Effect: Allow\n              Action: dynamodb:*\n              Resource: \"*\"\n              Condition: {ForAllValues:StringLike: {dynamodb:LeadingKeys: [a]}}",
    );
    assert!(every.contains("only on the actions of one item"), "{every}");
    let deny = refused(
        "            - Effect: Deny\n              Action: dynamodb:GetItem\n              Resource: \"*\"\n              Condition: {ForAllValues:StringLike: {dynamodb:LeadingKeys: [a]}}",
    );
    assert!(deny.contains("in a Deny"), "{deny}");
    let other = refused(
        "            - Effect: Allow\n              Action: dynamodb:GetItem\n              Resource: \"*\"\n              Condition: {ForAnyValue:StringLike: {dynamodb:LeadingKeys: [a]}}",
    );
    assert!(other.contains("conditions are not evaluated locally"), "{other}");
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
        with("      Policies: AmazonSQSFullAccess").contains("managed policy AmazonSQSFullAccess")
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
    assert_eq!(
        access.authorize("F", &json_request(Some("DynamoDB_20120810.GetItem"), get)),
        Ok(())
    );
    assert_eq!(
        access.authorize("local", &json_request(Some("DynamoDB_20120810.DeleteItem"), get)),
        Ok(()),
        "not a function: unchecked"
    );
    let denial = access
        .authorize("F", &json_request(Some("DynamoDB_20120810.DeleteItem"), get))
        .unwrap_err();
    assert_eq!(
        denial.message(),
        format!(
            "User: arn:aws:sts::123456789012:assumed-role/FRole/F is not authorized to perform: dynamodb:DeleteItem on resource: {TABLE} because no identity-based policy allows the dynamodb:DeleteItem action"
        )
    );
    let _ = access.authorize("F", &json_request(Some("DynamoDB_20120810.DeleteItem"), get));
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
fn grants_replaced_while_the_check_runs_decide_the_calls_to_come() {
    let grant = |actions: &str| {
        one(&format!(
            r#"            - Effect: Allow
              Action: [{actions}]
              Resource:
                Fn::GetAtt: [Table, Arn]"#
        ))
        .unwrap()
    };
    let access = Access::new(grant("dynamodb:GetItem, dynamodb:DeleteItem"));
    let item = br#"{"TableName":"local-Table"}"#;
    let delete =
        || access.authorize("F", &json_request(Some("DynamoDB_20120810.DeleteItem"), item));
    assert_eq!(delete(), Ok(()));
    // A grant taken out of the template, and the template read again.
    assert_eq!(access.replace(grant("dynamodb:GetItem")), ["F"]);
    assert!(delete().is_err(), "the grant taken away is no longer in force");
    assert_eq!(access.replace(grant("dynamodb:GetItem")), Vec::<String>::new(), "unchanged");
    let unused: Vec<String> = access.report().unused.iter().map(|g| g.action.clone()).collect();
    assert_eq!(unused, ["dynamodb:GetItem"], "the grants in force, their uses counted afresh");
}

#[test]
fn grants_of_services_no_check_sees_are_told_apart() {
    let p = one(r#"            - Effect: Allow
              Action: lambda:InvokeFunctionUrl
              Resource: "*"
            - Effect: Allow
              Action: kinesis:PutRecord
              Resource: "*"
            - Effect: Allow
              Action: dynamodb:GetItem
              Resource: "*""#)
    .unwrap();
    let access = Access::new(p);
    let report = access.report();
    let names = |grants: &[Grant]| grants.iter().map(|g| g.action.clone()).collect::<Vec<_>>();
    assert_eq!(names(&report.unused), ["lambda:InvokeFunctionUrl", "dynamodb:GetItem"]);
    assert_eq!(names(&report.unchecked), ["kinesis:PutRecord"]);
    assert!(report.to_string().contains("services the local checks do not see"));

    // A function URL's calls, which the gateway checks, count like the proxy's.
    let url =
        Need::new("lambda:InvokeFunctionUrl", "arn:aws:lambda:us-east-1:123456789012:function:x");
    assert_eq!(
        access.authorize_needs("F", "InvokeFunctionUrl", std::slice::from_ref(&url)),
        Ok(())
    );
    let report = access.report();
    assert_eq!(names(&report.unused), ["dynamodb:GetItem"]);
    let write = Need::new("lambda:InvokeFunction", url.resource.clone());
    let denied = access.authorize_needs("F", "Invoke", &[write]).unwrap_err();
    assert_eq!(
        (denied.action.as_str(), denied.operation.as_str()),
        ("lambda:InvokeFunction", "Invoke")
    );
    // So do those of a service whatever reports them, once one does.
    let record = Need::new("kinesis:PutRecord", "arn:aws:kinesis:us-east-1:123456789012:stream/s");
    assert_eq!(access.authorize_needs("F", "PutRecord", &[record]), Ok(()));
    assert!(access.report().unchecked.is_empty());
    assert_eq!(access.report().checked["F"], 3);
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

/// An S3 request, path-style: `method`, the path and the query.
fn s3_request<'a>(
    method: &'a str,
    path: &'a str,
    query: &'a str,
    body: &'a [u8],
) -> AwsRequest<'a> {
    AwsRequest {
        method,
        path,
        query,
        authorization: Some(
            "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
        ),
        body,
        ..AwsRequest::default()
    }
}

#[test]
fn s3_requests_need_their_action_on_their_bucket_or_object() {
    let (_, policies) = real();
    let scope = &policies.scope;
    let needed = |request: AwsRequest<'_>| {
        let needs = super::needs(&request, scope).unwrap();
        let named: Vec<String> =
            needs.iter().map(|n| format!("{} {}", n.action, n.resource)).collect();
        (operation(&request), named.join(", "))
    };
    let cases = [
        (s3_request("PUT", "/b", "", b""), "CreateBucket", "s3:CreateBucket arn:aws:s3:::b"),
        (s3_request("HEAD", "/b", "", b""), "HeadBucket", "s3:ListBucket arn:aws:s3:::b"),
        (
            s3_request("GET", "/b", "list-type=2&prefix=a%2F", b""),
            "ListObjectsV2",
            "s3:ListBucket arn:aws:s3:::b",
        ),
        (s3_request("DELETE", "/b", "", b""), "DeleteBucket", "s3:DeleteBucket arn:aws:s3:::b"),
        (
            s3_request("PUT", "/b", "tagging", b""),
            "PutBucketTagging",
            "s3:PutBucketTagging arn:aws:s3:::b",
        ),
        (
            s3_request("GET", "/b", "location", b""),
            "GetBucketLocation",
            "s3:GetBucketLocation arn:aws:s3:::b",
        ),
        (
            s3_request("PUT", "/b/statements/a%20b.json", "x-id=PutObject", b"{}"),
            "PutObject",
            "s3:PutObject arn:aws:s3:::b/statements/a b.json",
        ),
        (s3_request("GET", "/b/k", "", b""), "GetObject", "s3:GetObject arn:aws:s3:::b/k"),
        (s3_request("HEAD", "/b/k", "", b""), "HeadObject", "s3:GetObject arn:aws:s3:::b/k"),
        (
            s3_request("GET", "/b/k", "versionId=3", b""),
            "GetObject",
            "s3:GetObjectVersion arn:aws:s3:::b/k",
        ),
        (s3_request("DELETE", "/b/k", "", b""), "DeleteObject", "s3:DeleteObject arn:aws:s3:::b/k"),
        (
            s3_request("POST", "/b/k", "uploads", b""),
            "CreateMultipartUpload",
            "s3:PutObject arn:aws:s3:::b/k",
        ),
        (
            s3_request("PUT", "/b/k", "partNumber=1&uploadId=u", b""),
            "UploadPart",
            "s3:PutObject arn:aws:s3:::b/k",
        ),
        (
            s3_request("DELETE", "/b/k", "uploadId=u", b""),
            "AbortMultipartUpload",
            "s3:AbortMultipartUpload arn:aws:s3:::b/k",
        ),
        (
            s3_request(
                "POST",
                "/b",
                "delete",
                b"<Delete><Object><Key>x</Key></Object><Object><Key>y&amp;z</Key></Object></Delete>",
            ),
            "DeleteObjects",
            "s3:DeleteObject arn:aws:s3:::b/x, s3:DeleteObject arn:aws:s3:::b/y&z",
        ),
        (s3_request("GET", "/", "", b""), "ListBuckets", "s3:ListAllMyBuckets *"),
    ];
    for (request, operation, needs) in cases {
        assert_eq!(needed(request), (operation.to_owned(), needs.to_owned()), "{request:?}");
    }
    // A copy reads its source with the caller's permissions too.
    let mut copy = s3_request("PUT", "/b/to", "", b"");
    copy.copy_source = Some("/src/from%2Fkey?versionId=1");
    assert_eq!(
        needed(copy),
        (
            "CopyObject".to_owned(),
            "s3:PutObject arn:aws:s3:::b/to, s3:GetObject arn:aws:s3:::src/from/key".to_owned()
        )
    );
    let refused = super::needs(&s3_request("PATCH", "/b/k", "", b""), scope).unwrap_err();
    assert!(refused.reason.contains("PATCH on an object is not mapped"), "{refused:?}");
}

#[test]
fn query_protocol_requests_are_read_from_their_form() {
    let (stack, policies) = real();
    let scope = &policies.scope;
    fn form<'a>(service: &str, body: &'a [u8]) -> AwsRequest<'a> {
        AwsRequest {
            method: "POST",
            path: "/",
            authorization: Some(if service == "sns" {
                "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/sns/aws4_request, SignedHeaders=host, Signature=00"
            } else {
                "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=00"
            }),
            body,
            ..AwsRequest::default()
        }
    }
    let publish = form(
        "sns",
        b"Action=Publish&Version=2010-03-31&TopicArn=arn%3Aaws%3Asns%3Aus-east-1%3A123456789012%3Aalerts&Message=hi+there",
    );
    assert_eq!(operation(&publish), "Publish");
    assert_eq!(
        super::needs(&publish, scope).unwrap(),
        [Need::new("sns:Publish", "arn:aws:sns:us-east-1:123456789012:alerts")]
    );
    let create = form("sns", b"Action=CreateTopic&Name=orders");
    assert_eq!(
        super::needs(&create, scope).unwrap(),
        [Need::new("sns:CreateTopic", "arn:aws:sns:us-east-1:123456789012:orders")]
    );
    // SQS in the query protocol (other SDKs than Rust's) needs what its JSON protocol does.
    let url = stack.reference("ReplyQueue").unwrap();
    let body = format!(
        "Action=SendMessage&QueueUrl={}&MessageBody=x",
        url.replace(':', "%3A").replace('/', "%2F")
    );
    let send = form("sqs", body.as_bytes());
    let queue = url.rsplit('/').next().unwrap();
    assert_eq!(
        super::needs(&send, scope).unwrap(),
        [Need::new("sqs:SendMessage", format!("arn:aws:sqs:us-east-1:123456789012:{queue}"))]
    );
    let unknown = super::needs(&form("sns", b"Action=OptInPhoneNumber&phoneNumber=1"), scope);
    assert!(unknown.unwrap_err().reason.contains("OptInPhoneNumber is not mapped"));
}

#[test]
fn rest_json_requests_need_their_action_on_what_their_path_and_body_name() {
    let (_, policies) = real();
    let scope = &policies.scope;
    fn signed<'a>(
        service: &'static str,
        method: &'a str,
        path: &'a str,
        query: &'a str,
        body: &'a [u8],
    ) -> AwsRequest<'a> {
        let authorization = match service {
            "scheduler" => {
                "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/scheduler/aws4_request, SignedHeaders=host, Signature=00"
            }
            _ => {
                "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=00"
            }
        };
        AwsRequest {
            method,
            path,
            query,
            authorization: Some(authorization),
            body,
            ..AwsRequest::default()
        }
    }
    let needed = |request: AwsRequest<'_>| {
        let needs = super::needs(&request, scope).unwrap();
        let named: Vec<String> =
            needs.iter().map(|n| format!("{} {}", n.action, n.resource)).collect();
        (operation(&request), named.join(", "))
    };
    let schedule = "arn:aws:scheduler:us-east-1:123456789012:schedule";
    let create = br#"{"GroupName":"reminders","ScheduleExpression":"at(2026-12-01T00:00:00)","FlexibleTimeWindow":{"Mode":"OFF"},"Target":{"Arn":"arn:aws:sqs:us-east-1:123456789012:q","RoleArn":"arn:aws:iam::123456789012:role/r"}}"#;
    let cases = [
        (
            signed("scheduler", "POST", "/schedules/remind-o1", "", create),
            "CreateSchedule",
            format!(
                "scheduler:CreateSchedule {schedule}/reminders/remind-o1, iam:PassRole arn:aws:iam::123456789012:role/r"
            ),
        ),
        (
            signed("scheduler", "DELETE", "/schedules/remind-o1", "groupName=reminders", b""),
            "DeleteSchedule",
            format!("scheduler:DeleteSchedule {schedule}/reminders/remind-o1"),
        ),
        (
            signed("scheduler", "GET", "/schedules/remind-o1", "", b""),
            "GetSchedule",
            format!("scheduler:GetSchedule {schedule}/default/remind-o1"),
        ),
        (
            signed("scheduler", "GET", "/schedules", "NamePrefix=remind", b""),
            "ListSchedules",
            "scheduler:ListSchedules *".to_owned(),
        ),
        (
            signed("lambda", "POST", "/2015-03-31/functions/pricing/invocations", "", b"{}"),
            "Invoke",
            "lambda:InvokeFunction arn:aws:lambda:us-east-1:123456789012:function:pricing"
                .to_owned(),
        ),
        (
            signed(
                "lambda",
                "POST",
                "/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012%3Afunction%3Apricing/invocations",
                "Qualifier=live",
                b"{}",
            ),
            "Invoke",
            "lambda:InvokeFunction arn:aws:lambda:us-east-1:123456789012:function:pricing:live"
                .to_owned(),
        ),
    ];
    for (request, operation, needs) in cases {
        assert_eq!(needed(request), (operation.to_owned(), needs), "{request:?}");
    }
    // A schedule written without the role its target runs as is not one IAM would judge.
    let roleless = signed("scheduler", "POST", "/schedules/x", "", br#"{"Target":{}}"#);
    let refused = super::needs(&roleless, scope).unwrap_err();
    assert_eq!(
        (refused.action.as_str(), refused.reason.as_str()),
        ("scheduler:CreateSchedule", "no Target.RoleArn")
    );
    // An operation of a mapped service that is not in its routes, and a service that is not.
    let patch = signed("scheduler", "PATCH", "/schedules/x", "", b"");
    assert!(
        super::needs(&patch, scope)
            .unwrap_err()
            .reason
            .contains("PATCH /schedules/x of scheduler is not mapped")
    );
    let mut other = signed("scheduler", "POST", "/v2/email/outbound-emails", "", b"{}");
    other.authorization = Some(
        "AWS4-HMAC-SHA256 Credential=F/20261127/us-east-1/ses/aws4_request, SignedHeaders=host, Signature=00",
    );
    assert!(
        super::needs(&other, scope)
            .unwrap_err()
            .reason
            .contains("the REST service ses is not mapped")
    );
}
