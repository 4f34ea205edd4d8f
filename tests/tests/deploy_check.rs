//! A first `sam deploy`, as close as a machine without an AWS account gets: `template.yaml` at
//! its defaults and at each documented choice is expanded as CloudFormation would (its
//! `Fn::ForEach` loops by SAM CLI's language extensions, then SAM's translator), checked for
//! what neither cfn-lint nor moto sees (functions in `Rules`, unconditional reservations,
//! grants outside the stack, visibility timeouts, the pollers' concurrency), and created in
//! moto's CloudFormation (`tests/deploy_check.py`, with SAM CLI from PyPI in `.venv-sam`, the
//! venv `sam_local.rs` makes with the same requirement). Then copies of the template with one
//! known deploy fault each must fail the same check, naming the fault.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sas_infra::emulation::emulator::{python_with, workspace_root};
use sas_tests::Moto;

/// SAM CLI as `sam_local.rs` pins it (from 1.170, with the language extensions module); it
/// brings SAM's translator, boto3 and PyYAML.
const TOOLS: [&str; 1] = ["aws-sam-cli>=1.170,<2"];

fn check(template: &Path, moto: Option<&Moto>) -> Output {
    let python = python_with(
        ".venv-sam",
        &TOOLS,
        "samcli.lib.cfn_language_extensions, samtranslator, boto3, yaml",
    )
    .unwrap();
    let mut command = Command::new(python);
    command.arg(workspace_root().join("tests/deploy_check.py")).arg(template);
    if let Some(moto) = moto {
        command.env("MOTO_URL", &moto.endpoint);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_template_deploys_at_its_defaults_and_at_each_documented_choice() {
    let moto = Moto::start().unwrap();
    let output = check(&workspace_root().join("template.yaml"), Some(&moto));
    let printed = text(&output);
    println!("{printed}");
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("deploy check: passed"), "{printed}");
    let choices = printed.lines().filter(|l| l.starts_with("== ")).count();
    assert!(choices >= 6, "the defaults and the five documented choices: {printed}");
    assert_eq!(
        printed.matches("moto: CREATE_COMPLETE").count(),
        choices,
        "every choice is created: {printed}"
    );
    assert_eq!(
        printed.matches("loops: Fn::ForEach::Agent made ").count(),
        choices,
        "every choice has its agents: {printed}"
    );
    assert!(!printed.contains("FAILED"), "{printed}");
}

/// `template.yaml` with each `(old, new)` of `changes` made once, written for this test.
fn broken(name: &str, changes: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    for (old, new) in changes {
        assert_eq!(text.matches(old).count(), 1, "{name}: the template must hold {old:?} once");
        text = text.replacen(old, new, 1);
    }
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-check-{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn each_deploy_fault_fails_the_check_and_is_named() {
    let cases = [
        (
            "join-in-rules",
            "            - Fn::Contains:\n                - Ref: JwtAudience\n                - \"\"\n",
            "            - Fn::Equals:\n                - Fn::Join:\n                    - \"\"\n                    - Ref: JwtAudience\n                - \"\"\n",
            "rule JwtNeedsIssuerAndAudience uses Fn::Join",
        ),
        (
            "reservation",
            "      ReservedConcurrentExecutions:\n        Fn::If:\n          - SimReservesConcurrency\n          - 1\n          - Ref: AWS::NoValue\n",
            "      ReservedConcurrentExecutions: 1\n",
            "RemoteSimFunction reserves concurrency with no condition",
        ),
        (
            "role-made-by-sam",
            "      Role:\n        Fn::GetAtt: [StatusFunctionRole, Arn]\n",
            "",
            "StatusFunctionRole has the managed policy",
        ),
        (
            "grant-on-everything",
            "              # How long the queues are, once a sweep: a late message is not a lost one.\n              - Effect: Allow\n                Action: dynamodb:Scan\n                Resource:\n                  Fn::GetAtt: [QueueWaitsTable, Arn]\n",
            "              - Effect: Allow\n                Action: dynamodb:Scan\n                Resource: \"*\"\n",
            "grants ['dynamodb:Scan'] on \"*\"",
        ),
        (
            // The same fault in a grant the agents' loop gives another function's role.
            "grant-on-everything-in-loop",
            "              # How long the agent's queue is, once a sweep: a late message is not a lost one.\n              - Effect: Allow\n                Action: sqs:GetQueueAttributes\n                Resource:\n                  Fn::GetAtt: [{Fn::Sub: \"${Agent}Queue\"}, Arn]\n",
            "              - Effect: Allow\n                Action: sqs:GetQueueAttributes\n                Resource: \"*\"\n",
            "inventorySupervisorGrant grants ['sqs:GetQueueAttributes'] on \"*\"",
        ),
        (
            "grant-to-a-role-outside",
            "          RoleName:\n            Ref: AdminFunctionRole\n",
            "          RoleName: operators\n",
            "inventoryAdminGrant grants to the role \"operators\", which is not a role of the stack",
        ),
        (
            // Any stack's secret of the agent's name, not the stack's own.
            "secret-of-every-stack",
            "                    Action: secretsmanager:GetSecretValue\n                    Resource:\n                      Fn::Sub: \"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${AWS::StackName}/${Agent}-??????\"\n",
            "                    Action: secretsmanager:GetSecretValue\n                    Resource:\n                      Fn::Sub: \"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:*/${Agent}-??????\"\n",
            "inventoryAgentFunctionRole grants ['secretsmanager:GetSecretValue'] on",
        ),
        (
            // A decrypt on `*` whose condition no longer holds it to the stack's secret.
            "decrypt-of-any-secret",
            "                        kms:EncryptionContext:SecretARN:\n                          Fn::Sub: \"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${AWS::StackName}/${Agent}-??????\"\n",
            "                        kms:EncryptionContext:SecretARN:\n                          Fn::Sub: \"arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:*\"\n",
            "inventoryAgentFunctionRole grants ['kms:Decrypt'] on \"*\"",
        ),
        (
            "short-visibility",
            "      VisibilityTimeout: 71 # SchedulerFunction: 6 x 10 s, the longest batching window (10 s), and a second\n      SqsManagedSseEnabled: true\n      RedrivePolicy:\n        deadLetterTargetArn:\n          Fn::GetAtt: [SchedulerDeadLetterQueue, Arn]",
            "      VisibilityTimeout: 61\n      SqsManagedSseEnabled: true\n      RedrivePolicy:\n        deadLetterTargetArn:\n          Fn::GetAtt: [SchedulerDeadLetterQueue, Arn]",
            "SchedulerQueue hides a message 61 s, under 6 x 10 s + 10 s",
        ),
        (
            // An agent's queue, made by the loop, too short for its function's 90 s.
            "agent-short-visibility",
            "      VisibilityTimeout: 540 # the agent's function: 6 x 90 s\n",
            "      VisibilityTimeout: 539\n",
            "inventoryQueue hides a message 539 s, under 6 x 90 s + 0 s",
        ),
        (
            "pollers-too-many",
            "    Type: Number\n    Default: 2\n    MinValue: 2\n    MaxValue: 1000\n",
            "    Type: Number\n    Default: 200\n    MinValue: 2\n    MaxValue: 1000\n",
            "concurrent executions, more than an account's 1000",
        ),
    ];
    for (name, old, new, named) in cases {
        let mut changes = vec![(old, new)];
        if name == "role-made-by-sam" {
            // SAM names the role it makes <Function>Role: the template's own must step aside.
            changes.push(("\n  StatusFunctionRole:\n", "\n  StatusFunctionOldRole:\n"));
        }
        let output = check(&broken(name, &changes), None);
        let printed = text(&output);
        assert!(!output.status.success(), "{name}: the check passed a broken template: {printed}");
        assert!(printed.contains(named), "{name}: the check must say {named:?}: {printed}");
    }
}
