//! The proxy's counting, fault rules and answers, and what the SDK makes of them.

use serde_json::json;

use super::*;

/// How a request of a JSON protocol, with `target` and `body`, is counted.
fn classify(target: Option<&str>, body: &[u8]) -> Call {
    let request = crate::access::policy::AwsRequest {
        method: "POST",
        path: "/",
        target,
        body,
        ..Default::default()
    };
    super::classify(&request)
}

fn counted(target: Option<&str>, body: &[u8]) -> (String, String) {
    let c = classify(target, body);
    (c.service, c.counted_as)
}

#[test]
fn requests_are_classified_by_target_or_action() {
    assert_eq!(
        counted(Some("DynamoDB_20120810.DeleteItem"), b""),
        ("dynamodb".into(), "DeleteItem".into())
    );
    let batch = classify(
            Some("AmazonSQS.SendMessageBatch"),
            br#"{"QueueUrl":"http://127.0.0.1:5000/123456789012/sas-local-ReplyQueue","Entries":[{},{}]}"#,
        );
    assert_eq!((batch.counted_as.as_str(), batch.sends), ("SendMessageBatch to ReplyQueue", 2));
    let agent = classify(
        Some("AmazonSQS.GetQueueAttributes"),
        br#"{"QueueUrl":"http://127.0.0.1:5000/123456789012/0f9e8d7c-6b5a-4c3d-2e1f-0a9b8c7d6e5f_agent_payment"}"#,
    );
    assert_eq!(agent.counted_as, "GetQueueAttributes of payment", "an agent's queue by its agent");
    assert_eq!(
        counted(Some("DynamoDB_20120810.PutItem"), br#"{"TableName":"local-StateTable"}"#),
        ("dynamodb".into(), "PutItem on StateTable".into())
    );
    assert_eq!(received(br#"{"Messages":[{},{},{}]}"#), 3);
    assert_eq!(received(b"{}"), 0);
    assert_eq!(
        counted(Some("DynamoDB_20120810.GetItem"), br#"{"TableName":"t","ConsistentRead":true}"#),
        ("dynamodb".into(), "GetItem, consistent".into())
    );
    let eventual = classify(Some("DynamoDB_20120810.GetItem"), br#"{"TableName":"t"}"#);
    assert_eq!(eventual.counted_as, "GetItem, eventual");
    assert_eq!(eventual.operation, "GetItem", "faults match the plain operation");
    assert_eq!(
        counted(Some("AWSEvents.PutEvents"), b""),
        ("eventbridge".into(), "PutEvents".into())
    );
    assert_eq!(
        counted(None, b"Action=SendMessage&QueueUrl=x"),
        ("other".into(), "SendMessage".into())
    );
}

#[test]
fn a_rule_hits_its_service_and_operation_as_often_as_it_says() {
    let faults = WireFaults::default();
    let put = classify(Some("DynamoDB_20120810.PutItem"), br#"{"TableName":"s-StateTable"}"#);
    let receive = classify(Some("AmazonSQS.ReceiveMessage"), b"{}");
    faults.set(vec![
        FaultRule {
            times: Some(2),
            ..FaultRule::new("dynamodb", Some("PutItem"), WireFault::Throttle)
        },
        FaultRule::new("*", None, WireFault::Slow { ms: 5 }),
    ]);
    assert_eq!(faults.take(&put, None), Some(WireFault::Throttle));
    assert_eq!(faults.take(&receive, None), Some(WireFault::Slow { ms: 5 }));
    assert_eq!(faults.take(&put, None), Some(WireFault::Throttle));
    // Spent: the next rule takes over.
    assert_eq!(faults.take(&put, None), Some(WireFault::Slow { ms: 5 }));
    // A rule can name the table (or queue) too.
    faults.set(vec![FaultRule::new(
        "dynamodb",
        Some("PutItem on QueueWaitsTable"),
        WireFault::Throttle,
    )]);
    assert_eq!(faults.take(&put, None), None);
    // And whose requests it hits, and how many of them.
    faults.set(vec![FaultRule {
        caller: Some("SchedulerFunction".into()),
        every: Some(3),
        ..FaultRule::new("dynamodb", Some("PutItem on StateTable"), WireFault::Throttle)
    }]);
    assert_eq!(faults.take(&put, Some("SupervisorFunction")), None);
    let hits: Vec<bool> =
        (0..6).map(|_| faults.take(&put, Some("SchedulerFunction")).is_some()).collect();
    assert_eq!(hits, [true, false, false, true, false, false]);
    faults.clear();
    assert_eq!(faults.take(&put, None), None);
}

#[test]
fn rules_are_read_from_json_strictly() {
    let rules: Vec<FaultRule> = serde_json::from_str(
        r#"[{"service":"dynamodb","operation":"TransactWriteItems","times":1,
                 "fault":{"kind":"cancel","reasons":["None","TransactionConflict"]}}]"#,
    )
    .unwrap();
    assert_eq!(
        rules[0].fault,
        WireFault::Cancel { reasons: vec!["None".into(), "TransactionConflict".into()] }
    );
    assert!(
        serde_json::from_str::<Vec<FaultRule>>(
            r#"[{"service":"sqs","fault":{"kind":"throttle"},"often":2}]"#
        )
        .is_err()
    );
    // What it counts is its own.
    assert!(
        serde_json::from_str::<Vec<FaultRule>>(
            r#"[{"service":"sqs","fault":{"kind":"throttle"},"seen":2}]"#
        )
        .is_err()
    );
}

#[test]
fn injected_errors_speak_each_services_protocol() {
    let r = error_response(
        "dynamodb",
        &WireFault::Cancel { reasons: vec!["None".into(), "TransactionConflict".into()] },
    );
    assert_eq!(r.status(), 400);
    let r = error_response("sqs", &WireFault::ServerError { status: 503 });
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-amzn-query-error"], "InternalServerError;Receiver");
}

#[test]
fn a_failed_entry_is_reported_in_each_services_batch_answer() {
    let rule: FaultRule = serde_json::from_str(
            r#"{"service":"sqs","operation":"SendMessageBatch","fault":{"kind":"fail_entry","index":1}}"#,
        )
        .unwrap();
    assert_eq!(rule.fault, WireFault::FailEntry { index: 1 });
    let json = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();

    let request = br#"{"QueueUrl":"q","Entries":[{"Id":"0"},{"Id":"1"},{"Id":"2"}]}"#;
    assert!(take_entry(request, 3).is_none());
    let taken = take_entry(request, 1).unwrap();
    assert_eq!((taken.entry["Id"].as_str(), taken.left), (Some("1"), 2));
    assert_eq!(json(&taken.rest)["Entries"], json!([{"Id": "0"}, {"Id": "2"}]));
    let answer = br#"{"Successful":[{"Id":"0","MessageId":"a"},{"Id":"2","MessageId":"c"}]}"#;
    let sqs = json(&with_failed_entry("sqs", Some(answer), 1, &taken.entry).unwrap());
    assert_eq!(sqs["Successful"].as_array().unwrap().len(), 2);
    assert_eq!(sqs["Failed"][0]["Id"], "1");
    assert_eq!(
        (&sqs["Failed"][0]["Code"], &sqs["Failed"][0]["SenderFault"]),
        (&json!("InternalError"), &json!(false))
    );
    // Nothing forwarded: the proxy answers alone.
    let alone = json(&with_failed_entry("sqs", None, 0, &taken.entry).unwrap());
    assert_eq!(
        (alone["Successful"].as_array().unwrap().len(), alone["Failed"][0]["Id"].as_str()),
        (0, Some("1"))
    );

    let answer = br#"{"FailedEntryCount":0,"Entries":[{"EventId":"a"},{"EventId":"c"}]}"#;
    let events = json(&with_failed_entry("eventbridge", Some(answer), 1, &json!({})).unwrap());
    assert_eq!(events["FailedEntryCount"], 1);
    assert_eq!(events["Entries"][0]["EventId"], "a");
    assert_eq!(events["Entries"][1]["ErrorCode"], "InternalFailure");
    assert_eq!(events["Entries"][2]["EventId"], "c");
}

#[test]
fn the_access_key_id_is_read_from_the_credential() {
    let mut headers = axum::http::HeaderMap::new();
    assert_eq!(access_key_id(&headers), None);
    headers.insert(
            "authorization",
            axum::http::HeaderValue::from_static(
                "AWS4-HMAC-SHA256 Credential=SchedulerFunction/20261121/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00",
            ),
        );
    assert_eq!(access_key_id(&headers), Some("SchedulerFunction"));
}

/// A proxy that checks requests against the functions of `template`, in front of an emulator
/// answering as `upstream` does; and its URL.
async fn checking(template: &str, upstream: axum::Router) -> (Proxy, String) {
    use crate::access::policy::policies;
    use crate::emulation::provision::{Options, dry_run};
    use crate::emulation::template::Template;

    let template = Template::parse(template).unwrap();
    let options =
        Options { stack_name: "t".into(), region: "us-east-1".into(), ..Options::default() };
    let stack = dry_run(&template, &options).unwrap();
    let access = Access::new(policies(&template, &stack).unwrap());
    let emulator = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emulator_url = format!("http://{}", emulator.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(emulator, upstream).await });
    let proxy = Proxy::new(Upstreams::single(emulator_url)).with_access(access);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(proxy.clone().serve(listener));
    (proxy, endpoint)
}

/// One function `F` that may read one table, and nothing else.
const READER: &str = r#"
Resources:
  Table:
    Type: AWS::DynamoDB::Table
  Queue:
    Type: AWS::SQS::Queue
  F:
    Type: AWS::Serverless::Function
    Properties:
      Policies:
        - Statement:
            - Effect: Allow
              Action: dynamodb:GetItem
              Resource:
                Fn::GetAtt: [Table, Arn]
"#;

#[tokio::test]
async fn denials_reach_the_sdk_as_each_service_s_access_denied() {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    use aws_sdk_dynamodb::types::AttributeValue;

    use crate::access::policy::AccessReport;
    use crate::emulation::aws::{Clients, Endpoints};

    // The emulator behind the proxy answers whatever reaches it with an empty success.
    let empty = axum::Router::new()
        .fallback(|| async { ([("content-type", "application/x-amz-json-1.0")], "{}") });
    let (proxy, endpoint) = checking(READER, empty).await;
    let endpoints = Endpoints::single(&endpoint);
    let f = Clients::signing_as(&endpoints, "us-east-1", "F").await;
    let key = || AttributeValue::S("1".into());

    f.dynamodb.get_item().table_name("t-Table").key("k", key()).send().await.unwrap();
    let put =
        f.dynamodb.put_item().table_name("t-Table").item("k", key()).send().await.unwrap_err();
    assert!(put.as_service_error().is_some(), "{put:?}");
    assert_eq!(put.code(), Some("AccessDeniedException"));
    assert_eq!(
        put.message(),
        Some(
            "User: arn:aws:sts::123456789012:assumed-role/FRole/F is not authorized to perform: dynamodb:PutItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/t-Table because no identity-based policy allows the dynamodb:PutItem action"
        )
    );
    let send = f
        .sqs
        .send_message()
        .queue_url(format!("{endpoint}/123456789012/t-Queue"))
        .message_body("x")
        .send()
        .await
        .unwrap_err();
    assert!(send.as_service_error().is_some(), "{send:?}");
    assert_eq!(send.code(), Some("AccessDenied"));
    assert!(
        send.message().is_some_and(|m| m
            .contains("sqs:SendMessage on resource: arn:aws:sqs:us-east-1:123456789012:t-Queue")),
        "{send:?}"
    );
    let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
        .source("s")
        .detail_type("d")
        .detail("{}")
        .build();
    let publish = f.events.put_events().entries(entry).send().await.unwrap_err();
    assert!(publish.as_service_error().is_some(), "{publish:?}");
    assert_eq!(publish.code(), Some("AccessDeniedException"));

    // The stack's own clients are not a function: they pass unchecked.
    let stack_clients = Clients::new(&endpoints, "us-east-1").await;
    stack_clients.dynamodb.put_item().table_name("t-Table").item("k", key()).send().await.unwrap();

    let report: AccessReport =
        reqwest::get(format!("{endpoint}{ACCESS_PATH}")).await.unwrap().json().await.unwrap();
    let denied: Vec<(&str, &str)> =
        report.denials.iter().map(|d| (d.function.as_str(), d.action.as_str())).collect();
    assert_eq!(
        denied,
        [("F", "dynamodb:PutItem"), ("F", "sqs:SendMessage"), ("F", "events:PutEvents")]
    );
    assert_eq!(report.checked["F"], 4);
    assert!(report.unused.is_empty(), "the one grant was used: {report:?}");
    let counted = proxy.counts.snapshot();
    assert_eq!(counted.values().map(|s| s.requests).sum::<u64>(), 2, "denied calls are not billed");
}

/// `F` may write objects under one prefix of a bucket, and nothing else.
const WRITER: &str = r#"
Resources:
  F:
    Type: AWS::Serverless::Function
    Properties:
      Policies:
        - Statement:
            - Effect: Allow
              Action: s3:PutObject
              Resource: arn:aws:s3:::t-bucket/statements/*
"#;

/// S3 (REST-XML) and SNS (the query protocol) are checked as the JSON services are, and a
/// denial reaches their SDKs as their own access-denied error, naming the action.
#[tokio::test]
async fn rest_and_query_protocol_requests_are_checked_and_denied_in_their_own_format() {
    use aws_sdk_s3::error::ProvideErrorMetadata;

    let (proxy, endpoint) = checking(WRITER, axum::Router::new().fallback(|| async { "" })).await;

    let credentials = aws_credential_types::Credentials::new("F", "local", None, None, "test");
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(credentials)
        .endpoint_url(&endpoint)
        .load()
        .await;
    // Path-style, as every S3 client of a local endpoint must be: `<endpoint>/<bucket>/<key>`.
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build(),
    );
    let body = || aws_sdk_s3::primitives::ByteStream::from_static(b"{}");
    s3.put_object().bucket("t-bucket").key("statements/a").body(body()).send().await.unwrap();
    let outside =
        s3.put_object().bucket("t-bucket").key("other/a").body(body()).send().await.unwrap_err();
    assert_eq!(outside.code(), Some("AccessDenied"), "{outside:?}");
    let delete =
        s3.delete_object().bucket("t-bucket").key("statements/a").send().await.unwrap_err();
    assert_eq!(delete.code(), Some("AccessDenied"), "{delete:?}");
    assert!(
        delete.message().is_some_and(|m| m.contains(
            "is not authorized to perform: s3:DeleteObject on resource: arn:aws:s3:::t-bucket/statements/a"
        )),
        "{delete:?}"
    );

    let sns = aws_sdk_sns::Client::new(&sdk);
    let publish = sns
        .publish()
        .topic_arn("arn:aws:sns:us-east-1:123456789012:alerts")
        .message("hi")
        .send()
        .await
        .unwrap_err();
    assert_eq!(publish.code(), Some("AuthorizationError"), "{publish:?}");
    assert!(
        publish.message().is_some_and(|m| m.contains("sns:Publish on resource: arn:aws:sns:")),
        "{publish:?}"
    );

    assert_eq!(requests(&proxy), ["s3 PutObject × 1"], "only the call allowed is counted");
}

/// One function `F` that may create reminders in EventBridge Scheduler, passing one role.
const SCHEDULER: &str = r#"
Resources:
  F:
    Type: AWS::Serverless::Function
    Properties:
      Policies:
        - Statement:
            - Effect: Allow
              Action: scheduler:CreateSchedule
              Resource: arn:aws:scheduler:us-east-1:123456789012:schedule/default/remind-*
            - Effect: Allow
              Action: iam:PassRole
              Resource: arn:aws:iam::123456789012:role/reminders
"#;

/// A REST-JSON service's requests are checked by their method and path, and a denial is
/// answered as the service answers it: 403, the code in `x-amzn-ErrorType`, the message in
/// the body, naming the action and the resource.
#[tokio::test]
async fn rest_json_requests_are_checked_by_their_route_and_denied_in_their_own_format() {
    use crate::access::sigv4::local_signer;

    let (proxy, endpoint) =
        checking(SCHEDULER, axum::Router::new().fallback(|| async { "{}" })).await;
    let http = &reqwest::Client::new();
    let send = |service: &str, method: reqwest::Method, path: &str, body: serde_json::Value| {
        let request = http
            .request(method, format!("{endpoint}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        let signer = local_signer("F", "us-east-1", service);
        async move { signer.send(http, request).await.unwrap() }
    };
    let reminder = serde_json::json!({
        "ScheduleExpression": "at(2026-12-01T09:00:00)",
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "Target": {"Arn": "arn:aws:sqs:us-east-1:123456789012:q", "RoleArn": "arn:aws:iam::123456789012:role/reminders"}
    });
    let created =
        send("scheduler", reqwest::Method::POST, "/schedules/remind-o1", reminder.clone()).await;
    assert_eq!(created.status(), 200);

    let mut other_role = reminder;
    other_role["Target"]["RoleArn"] = "arn:aws:iam::123456789012:role/admin".into();
    let passed = send("scheduler", reqwest::Method::POST, "/schedules/remind-o2", other_role).await;
    assert_eq!(passed.status(), 403);
    let deleted =
        send("scheduler", reqwest::Method::DELETE, "/schedules/remind-o1", serde_json::Value::Null)
            .await;
    assert_eq!(deleted.status(), 403);
    assert_eq!(deleted.headers()["x-amzn-errortype"], "AccessDeniedException");
    let body: serde_json::Value = deleted.json().await.unwrap();
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "is not authorized to perform: scheduler:DeleteSchedule on resource: arn:aws:scheduler:us-east-1:123456789012:schedule/default/remind-o1"
        ),
        "{body}"
    );
    let invoked = send(
        "lambda",
        reqwest::Method::POST,
        "/2015-03-31/functions/pricing/invocations",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(invoked.status(), 403);

    let counted = requests(&proxy);
    assert_eq!(counted, ["scheduler CreateSchedule × 1"], "only the call allowed is counted");
    let report = proxy.access.as_ref().unwrap().report();
    let denied: Vec<_> = report.denials.iter().map(|d| d.action.as_str()).collect();
    assert_eq!(denied, ["iam:PassRole", "scheduler:DeleteSchedule", "lambda:InvokeFunction"]);
}

/// The requests the proxy counted, as `service operation × requests`.
fn requests(proxy: &Proxy) -> Vec<String> {
    let counted = proxy.counts.snapshot();
    counted
        .into_iter()
        .map(|((service, op), s)| format!("{service} {op} × {}", s.requests))
        .collect()
}
