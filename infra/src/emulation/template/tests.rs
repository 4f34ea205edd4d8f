//! The template's parsing and the evaluation of its intrinsic functions.

use serde_json::json;

use super::*;

const T: &str = r#"
Parameters:
  Threshold: {Type: Number, Default: 3}
  Email: {Type: String, Default: ""}
Conditions:
  HasEmail:
    Fn::Not: [{Fn::Equals: [{Ref: Email}, ""]}]
Resources:
  Queue:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 60
  Sub:
    Type: AWS::SNS::Subscription
    Condition: HasEmail
    Properties: {Endpoint: {Ref: Email}}
"#;

#[test]
fn parameters_conditions_and_intrinsics_evaluate() {
    let t = Template::parse(T).unwrap();
    assert_eq!(t.resources.len(), 2);
    let mut ctx = Context::new(&t, "demo", "us-east-1", &HashMap::new()).unwrap();
    assert!(!ctx.holds(Some("HasEmail")));
    ctx.refs.insert("Queue".into(), "http://q".into());
    ctx.attributes.insert(("Queue".into(), "Arn".into()), "arn:q".into());
    let v: Value = serde_json::json!({
        "a": {"Ref": "Threshold"},
        "b": {"Fn::Sub": "${AWS::StackName}-${Queue}-${Queue.Arn}-${!Literal}"},
        "c": {"Fn::If": ["HasEmail", "yes", {"Ref": "AWS::NoValue"}]},
        "d": {"Fn::Join": [",", ["x", {"Ref": "Threshold"}]]}
    });
    let out = ctx.eval(&v).unwrap();
    assert_eq!(
        out,
        serde_json::json!({"a": "3", "b": "demo-http://q-arn:q-${Literal}", "d": "x,3"})
    );
    let with_email =
        Context::new(&t, "s", "r", &HashMap::from([("Email".into(), "ops@example.com".into())]))
            .unwrap();
    assert!(with_email.holds(Some("HasEmail")));
}

#[test]
fn loops_expand_and_their_names_and_mappings_evaluate() {
    let t = Template::parse(
        r#"
Mappings:
  Agents:
    inventory: {Url: "http://inventory"}
    payment: {Url: "http://payment"}
Resources:
  Fn::ForEach::Agents:
    - Agent
    - [inventory, payment]
    - ${Agent}Queue:
        Type: AWS::SQS::Queue
        Properties:
          Url:
            Fn::FindInMap: [Agents, {Ref: Agent}, Url]
      ${Agent}Policy:
        Type: AWS::IAM::Policy
        Properties:
          Queue: {Ref: {Fn::Sub: "${Agent}Queue"}}
          Arn:
            Fn::GetAtt: [{Fn::Sub: "${Agent}Queue"}, Arn]
"#,
    )
    .unwrap();
    let ids: Vec<&str> = t.resources.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["inventoryPolicy", "inventoryQueue", "paymentPolicy", "paymentQueue"]);
    let mut ctx = Context::new(&t, "s", "us-east-1", &HashMap::new()).unwrap();
    ctx.refs.insert("paymentQueue".into(), "https://q/payment".into());
    ctx.attributes.insert(("paymentQueue".into(), "Arn".into()), "arn:payment".into());
    let queue = ctx.eval(&t.resource("paymentQueue").unwrap().properties).unwrap();
    assert_eq!(queue["Url"], "http://payment");
    let policy = ctx.eval(&t.resource("paymentPolicy").unwrap().properties).unwrap();
    assert_eq!(policy, json!({"Queue": "https://q/payment", "Arn": "arn:payment"}));
}

#[test]
fn short_form_tags_are_refused_by_line() {
    let err = Template::parse(
        "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n      X: !Ref Y\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("line 5") && err.to_string().contains("!Ref"), "{err}");
}

#[test]
fn unknown_references_are_named() {
    let t = Template::parse(T).unwrap();
    let ctx = Context::new(&t, "s", "r", &HashMap::new()).unwrap();
    let err = ctx.eval(&serde_json::json!({"Ref": "Nope"})).unwrap_err();
    assert!(err.to_string().contains("Nope"));
}
