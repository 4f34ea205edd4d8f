//! A first `sam deploy`, as close as a machine without an AWS account gets: `template.yaml` is
//! built by `sam build` (the compile step replaced by a stand-in that writes which binary each
//! function gets) and packaged by `sam package` into a bucket on moto; at its defaults and at
//! each documented choice it is expanded as CloudFormation would (its `Fn::ForEach` loops by
//! SAM CLI's language extensions, then SAM's translator), checked for what neither cfn-lint
//! nor moto sees (functions in `Rules`, unconditional reservations, grants outside the stack,
//! visibility timeouts, the pollers' concurrency, dashboards CloudWatch would refuse or that
//! read metrics nobody emits, resources a failed first create would leave behind, the limits
//! of CloudFormation and IAM), and created in moto's CloudFormation (`tests/deploy_check.py`,
//! with SAM CLI from PyPI in `.venv-sam`, the venv `sam_local.rs` makes with the same
//! requirement). Then copies of the template with one known deploy fault each must fail the
//! same check, naming the fault.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sas_infra::emulation::emulator::{MOTO_REQUIREMENT, python_with, workspace_root};
use sas_tests::Moto;

/// SAM CLI as `sam_local.rs` pins it (from 1.170, with the language extensions module); it
/// brings SAM's translator, boto3 and PyYAML. moto beside it, in the check's own process, for
/// a CloudFormation that fails a first create as AWS does.
const TOOLS: [&str; 2] = ["aws-sam-cli>=1.170,<2", MOTO_REQUIREMENT];

/// What the check imports.
const MODULES: &str = "samcli.lib.cfn_language_extensions, samtranslator, boto3, yaml, moto.server";

/// The most agents one stack holds: 500 resources, 79 of the stack's own and 11 per agent.
const MOST_AGENTS: usize = 37;

fn check(template: &Path, moto: Option<&Moto>) -> Output {
    check_with(template, moto, None)
}

/// The check, with the template's list of agents grown to `agents` if given.
fn check_with(template: &Path, moto: Option<&Moto>, agents: Option<usize>) -> Output {
    let python = python_with(".venv-sam", &TOOLS, MODULES).unwrap();
    let mut command = Command::new(python);
    command.arg(workspace_root().join("tests/deploy_check.py")).arg(template);
    command.env("STACK_METRICS", sas_engine::metrics::NAMES.join(","));
    if let Some(agents) = agents {
        command.env("AGENTS", agents.to_string());
    }
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
    assert!(choices >= 7, "the defaults and the six documented choices: {printed}");
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
    // Every function holds its own binary: the five agents' loop makes 4 HTTP agents and the
    // ledger's own.
    assert!(
        printed.contains("packaging: 11 functions of 8 binaries, 8 distinct artefacts"),
        "{printed}"
    );
    assert_eq!(printed.matches("limits: 148 of 500 resources").count(), choices, "{printed}");
    // A stack's life: created, updated with an agent added, deleted (what it keeps put back as
    // AWS keeps it), and created again under the same name.
    for step in [
        "life: create: CREATE_COMPLETE",
        "life: update with an agent added: UPDATE_COMPLETE",
        "life: created again under the same name: CREATE_COMPLETE",
        "kept by a delete: KeysTable, LedgerAccountsTable, LedgerStatementsBucket, OrdersTable, PayloadBucket, StateTable",
        // `sam deploy` with the committed samconfig.toml and no flag.
        "sam deploy: with samconfig.toml alone, stack sas CREATE_COMPLETE",
        // A first create that fails is deleted, and the same command run again creates it.
        "failed first create: sam deploy exited 1, stack sas then deleted",
        "failed first create: the same sam deploy again exited 0, stack sas CREATE_COMPLETE",
    ] {
        assert!(printed.contains(step), "{step}: {printed}");
    }
}

#[test]
fn one_stack_holds_as_many_agents_as_the_readme_says_and_no_more() {
    let template = workspace_root().join("template.yaml");
    let output = check_with(&template, None, Some(MOST_AGENTS));
    let printed = text(&output);
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("limits: 500 of 500 resources"), "{printed}");
    // Every function's environment fits, with every agent's entries in every per-agent list.
    assert!(
        printed.contains("environments: the largest, AdminFunction's, 3573 of 4096"),
        "{printed}"
    );
    let output = check_with(&template, None, Some(MOST_AGENTS + 1));
    let printed = text(&output);
    assert!(!output.status.success(), "one agent more must not fit: {printed}");
    assert!(
        printed.contains("the stack has 511 resources, over CloudFormation's 500"),
        "{printed}"
    );
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    assert!(readme.contains(&format!("holds {MOST_AGENTS} agents")), "the README states the limit");

    // Given every agent's entry of the service URLs, as the stack did, each agent's
    // environment is over Lambda's 4 KB at that many agents.
    let urls = "              SERVICE_URLS:\n                Fn::Join:\n                  - \"\"\n                  - - \"${Agent}=\"\n";
    let whole = "              SERVICE_URLS:\n                Fn::Join: [\",\", {Ref: ServiceUrls}]\n              SERVICE_URLS_OWN:\n                Fn::Join:\n                  - \"\"\n                  - - \"${Agent}=\"\n";
    let output = check_with(&broken("whole-lists", &[(urls, whole)]), None, Some(MOST_AGENTS));
    let printed = text(&output);
    assert!(!output.status.success(), "{printed}");
    assert!(
        printed.contains("agent01AgentFunction's environment takes")
            && printed.contains("over Lambda's 4096"),
        "{printed}"
    );
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
            // The same fault in a grant of the agents' loop.
            "grant-on-everything-in-loop",
            "                  # Read-only calls made at cold start to open the connections before the first event.\n                  - Effect: Allow\n                    Action: sqs:GetQueueAttributes\n                    Resource:\n                      Fn::GetAtt: [ReplyQueue, Arn]\n",
            "                  - Effect: Allow\n                    Action: sqs:GetQueueAttributes\n                    Resource: \"*\"\n",
            "inventoryAgentFunctionRole grants ['sqs:GetQueueAttributes'] on \"*\"",
        ),
        (
            "grant-to-a-role-outside",
            "      RoleName:\n        Ref: ledgerAgentFunctionRole\n",
            "      RoleName: operators\n",
            "ledgerAgentGrant grants to the role \"operators\", which is not a role of the stack",
        ),
        (
            // Queues named after the stack's name and `-`, which another stack's names may
            // begin with (`<stack>-x`).
            "grant-on-other-stacks-queues",
            "                  - Fn::Sub:\n                    - \"arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${StackId}_dlq_*\"\n",
            "                  - Fn::Sub:\n                    - \"arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-*\"\n",
            "AdminFunctionRole grants ['sqs:GetQueueAttributes', 'sqs:ReceiveMessage'",
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
            "      VisibilityTimeout: 550 # the agent's function: 6 x 90 s, and the longest batching window (10 s)\n",
            "      VisibilityTimeout: 549\n",
            "inventoryQueue hides a message 549 s, under 6 x 90 s + 10 s",
        ),
        (
            // A trailing comma where a row was taken out.
            "dashboard-not-json",
            "{\"label\": \"replies\"}]\n                  ]\n                }},\n                {\"type\": \"metric\", \"x\": 8, \"y\": 15,",
            "{\"label\": \"replies\"}],\n                  ]\n                }},\n                {\"type\": \"metric\", \"x\": 8, \"y\": 15,",
            "Dashboard's DashboardBody is not JSON",
        ),
        (
            "dashboard-metric-nobody-emits",
            "\"OldestInFlightAge\", \"Function\", \"supervisor\", {\"label\": \"oldest in flight\"}",
            "\"OldestOrderAge\", \"Function\", \"supervisor\", {\"label\": \"oldest in flight\"}",
            "Dashboard shows OldestOrderAge, which no function of the stack emits",
        ),
        (
            "kept-after-a-failed-create",
            "  OrdersTable:\n    Type: AWS::DynamoDB::Table\n    DeletionPolicy:\n      Fn::If: [KeepOrders, RetainExceptOnCreate, Delete]\n",
            "  OrdersTable:\n    Type: AWS::DynamoDB::Table\n    DeletionPolicy:\n      Fn::If: [KeepOrders, Retain, Delete]\n",
            "OrdersTable is kept with DeletionPolicy Retain",
        ),
        (
            // Kept by a delete under a name the next create takes again.
            "kept-under-the-stack-s-name",
            "      TableName:\n        Fn::Sub:\n          - \"ledger-accounts-${StackId}\"\n          - {StackId: {Fn::Select: [2, {Fn::Split: [\"/\", {Ref: AWS::StackId}]}]}}\n",
            "      TableName:\n        Fn::Sub: \"${AWS::StackName}-ledger-accounts\"\n",
            "LedgerAccountsTable is kept by a delete under the name",
        ),
        (
            "access-log-outside-vendedlogs",
            "          - \"/aws/vendedlogs/${AWS::StackName}/${StackId}/api-access\"\n",
            "          - \"/sas/${AWS::StackName}/${StackId}/api-access\"\n",
            "HttpApiStage delivers its access log into ApiAccessLogGroup, not named under /aws/vendedlogs/",
        ),
        (
            "bucket-without-tls-only",
            "              - Fn::GetAtt: [LedgerStatementsBucket, Arn]\n              - Fn::Sub: \"${LedgerStatementsBucket.Arn}/*\"\n            Condition:\n              Bool:\n                aws:SecureTransport: \"false\"\n",
            "              - Fn::GetAtt: [LedgerStatementsBucket, Arn]\n              - Fn::Sub: \"${LedgerStatementsBucket.Arn}/*\"\n",
            "LedgerStatementsBucket lacks: TLS-only bucket policy",
        ),
        (
            "rule-target-without-dead-letters",
            "        - Id: CallbacksQueue\n          Arn:\n            Fn::GetAtt: [CallbacksQueue, Arn]\n          DeadLetterConfig:\n            Arn:\n              Fn::GetAtt: [EventsDeadLetterQueue, Arn]\n",
            "        - Id: CallbacksQueue\n          Arn:\n            Fn::GetAtt: [CallbacksQueue, Arn]\n",
            "CallbacksRule's target CallbacksQueue has no DeadLetterConfig",
        ),
        (
            "ok-actions",
            "      AlarmActions:\n        - Ref: AlertsTopic\n\n  EventsDeadLetterAlarm:\n",
            "      AlarmActions:\n        - Ref: AlertsTopic\n      OKActions:\n        - Ref: AlertsTopic\n\n  EventsDeadLetterAlarm:\n",
            "SchedulerDeadLetterAlarm has OKActions",
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

/// `samconfig.toml` without what `sam deploy` needs without --guided fails the check, named:
/// without a stack name; and with a failed first create rolled back rather than deleted, which
/// the same `sam deploy` run again cannot retry.
#[test]
fn a_configuration_that_only_a_guided_deploy_takes_fails_the_check() {
    let config = std::fs::read_to_string(workspace_root().join("samconfig.toml")).unwrap();
    let python = python_with(".venv-sam", &TOOLS, MODULES).unwrap();
    let check = |name: &str, config: String| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-check-{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let output = Command::new(&python)
            .arg(workspace_root().join("tests/deploy_check.py"))
            .arg(workspace_root().join("template.yaml"))
            .env("STACK_METRICS", sas_engine::metrics::NAMES.join(","))
            .env("SAMCONFIG", &path)
            .output()
            .unwrap();
        let printed = text(&output);
        assert!(!output.status.success(), "{name}: {printed}");
        printed
    };
    let unnamed: String =
        config.lines().filter(|l| !l.starts_with("stack_name")).map(|l| format!("{l}\n")).collect();
    assert_ne!(unnamed, config, "samconfig.toml sets stack_name");
    let printed = check("unnamed", unnamed);
    assert!(printed.contains("names no stack_name"), "{printed}");

    let rolled_back = config.replace("on_failure = \"DELETE\"", "on_failure = \"ROLLBACK\"");
    assert_ne!(rolled_back, config, "samconfig.toml sets on_failure");
    let printed = check("rolled-back", rolled_back);
    for named in [
        "does not set on_failure = \"DELETE\"",
        "a failed first create left stack sas in ROLLBACK_COMPLETE",
    ] {
        assert!(printed.contains(named), "{named}: {printed}");
    }
}

/// A loop's function whose CodeUri does not vary with the agent: SAM CLI packages the first
/// agent's build for all of them, and the ledger agent would ship the HTTP agent's binary.
#[test]
fn an_agent_packaged_with_another_s_binary_fails_the_check() {
    let moto = Moto::start().unwrap();
    let path = broken(
        "static-code-uri",
        &[(
            "          CodeUri:\n            Fn::FindInMap: [AgentBinaries, {Ref: Agent}, CodeUri, {DefaultValue: .}]\n",
            "          CodeUri: .\n",
        )],
    );
    let output = check(&path, Some(&moto));
    let printed = text(&output);
    assert!(!output.status.success(), "the check passed a static CodeUri: {printed}");
    assert!(
        printed.contains(
            "ledgerAgentFunction would run 'binary agent', not its own binary 'ledger-agent'"
        ),
        "{printed}"
    );
}

/// What deploying `after` over a stack of `before` does to the resources it has.
fn compare(before: &Path, after: &Path) -> Output {
    let python = python_with(".venv-sam", &TOOLS, "samtranslator, yaml").unwrap();
    Command::new(python)
        .arg(workspace_root().join("tests/deploy_check.py"))
        .arg("--compare")
        .args([before, after])
        .output()
        .unwrap()
}

#[test]
fn an_update_that_adds_an_agent_keeps_every_resource_in_place() {
    let template = workspace_root().join("template.yaml");
    let list = "    - [inventory, payment, shipping, ledger, notify]\n";
    let added = [(list, "    - [inventory, payment, shipping, ledger, notify, email]\n")];
    let output = compare(&template, &broken("email-added", &added));
    let printed = text(&output);
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("11 added, 0 removed, 0 changed, 0 replaced"), "{printed}");

    // The check bites: a change that names a queue replaces it.
    let renamed = [
        added[0],
        (
            "  SchedulerQueue:\n    Type: AWS::SQS::Queue\n    Properties:\n",
            "  SchedulerQueue:\n    Type: AWS::SQS::Queue\n    Properties:\n      QueueName: scheduler\n",
        ),
    ];
    let output = compare(&template, &broken("queue-renamed", &renamed));
    let printed = text(&output);
    assert!(!output.status.success(), "{printed}");
    assert!(printed.contains("SchedulerQueue (QueueName) is replaced"), "{printed}");

    // A workflow version is a file built into the functions' code, which the template does not
    // name: it changes their code, which CloudFormation updates in place, and no resource.
    let text = std::fs::read_to_string(&template).unwrap();
    assert!(!text.contains("shared/workflows"), "template names the workflows' folder");
    for file in std::fs::read_dir(workspace_root().join("shared/workflows")).unwrap() {
        let name = file.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            assert!(!text.contains(&name), "template names the workflow file {name}");
        }
    }
}
