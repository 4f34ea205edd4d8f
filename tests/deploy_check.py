"""A deploy check beyond lint: `template.yaml` at its defaults and at each documented choice is
expanded as CloudFormation would (its `Fn::ForEach` loops by SAM CLI's own language extensions,
then SAM's own translator), checked for what neither cfn-lint nor moto sees, and created in
moto's CloudFormation.

Checked on the expanded template, with the choice's parameters and conditions resolved:
- `Rules` use only the functions CloudFormation allows there (`Ref` and the rule functions);
- no `ReservedConcurrentExecutions` that is not behind a condition (a new account with 10
  concurrent executions refuses any reservation);
- every IAM grant names the stack's own resources (or a resource a parameter names, such as a
  secret, or one named after the stack, `${AWS::StackName}/...`): no managed policy on any
  role, no policy (`AWS::IAM::RolePolicy`, `AWS::IAM::Policy`) on a role that is not the
  stack's, no `NotAction` or `NotResource`, no `*` but for actions that take no resource
  (X-Ray's writes) or a grant held by a condition that scopes it (a decrypt through Secrets
  Manager for the stack's own secrets);
- each SQS event source mapping's queue keeps a message invisible at least six times its
  function's timeout plus its batching window, as AWS advises;
- every queue's poller is bounded (a `MaximumConcurrency`), and together they fit in the
  concurrency AWS gives an account by default (1,000); beyond a new account's 10 they are
  printed as throttled at times;
- each function's environment fits Lambda's 4 KB, every name as long as it can be;
- what a delete keeps is named by CloudFormation or after the stack's id, never by a name the
  next create under the same stack name would take again;
- the HTTP API's access log is a vended log group (`/aws/vendedlogs/...`), so that no stack
  grows the account's one CloudWatch Logs resource policy;
- every bucket is encrypted, private, TLS-only, with a lifecycle rule;
- every rule's target has a retry policy and a dead-letter queue;
- no alarm mails an OK when a deploy creates it (no `OKActions`);
- `samconfig.toml` lets `sam deploy` run without --guided and a failed first create be retried.

Then the expanded template is created in moto's CloudFormation (at `MOTO_URL`), and what moto
did not create is listed: moto skips several resource types, so the creation checks the wiring
(references, conditions, the parameters), not a deploy. At the defaults a stack's life is
played there too (created, updated with an agent added, deleted with what it keeps put back,
created again under the same name), and `sam deploy` runs with `samconfig.toml` alone; and on a
moto of its own whose CloudFormation fails a first create as AWS does (rolled back), the same
`sam deploy` run twice must create the stack the second time.

Usage: deploy_check.py TEMPLATE. Prints one block per choice; exits 1 if any check failed.
`deploy_check.py --compare BEFORE AFTER` tells what deploying AFTER over a stack of BEFORE
does to the resources it has (an agent added must remove, replace or change none).
"""

import copy
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile

import boto3
import yaml
from samcli.lib.cfn_language_extensions import (
    ProcessingPipeline,
    TemplateParsingProcessor,
    create_default_intrinsic_resolver,
)
from samcli.lib.cfn_language_extensions.models import ResolutionMode, TemplateProcessingContext
from samcli.lib.cfn_language_extensions.processors import ForEachProcessor
from samtranslator.translator.transform import transform

LANGUAGE_EXTENSIONS = "AWS::LanguageExtensions"


def agent_loop(template):
    """The `Fn::ForEach` loop of Resources that declares the agents (the one whose body has a
    function), as (its key, its literal list of agents)."""
    for key, value in template.get("Resources", {}).items():
        if not key.startswith("Fn::ForEach::"):
            continue
        _, collection, body = value
        if any(isinstance(r, dict) and r.get("Type") == "AWS::Serverless::Function" for r in body.values()):
            if not (isinstance(collection, list) and all(isinstance(a, str) for a in collection)):
                raise ValueError(f"{key} takes its agents from {json.dumps(collection)}, not a literal list")
            return key, collection
    raise ValueError("no Fn::ForEach loop of Resources declares a function: the agents cannot be found")


def stage_id(agent):
    """A ten-character id, as API Gateway gives its APIs, made from the agent's name."""
    return (re.sub(r"[^a-z0-9]", "", agent.lower()) + "0123456789")[:10]


def choices(template):
    """The defaults, and each choice the README documents. The agents are the entries of the
    template's agent loop, so an agent added there is covered without a change here."""
    _, agents = agent_loop(template)
    # Each URL as long as an API Gateway stage's (an id, a region and a stage): about 70
    # characters, so that the environments are sized as a team's would be.
    own_urls = {"ServiceUrls": ",".join(f"{a}=https://{stage_id(a)}.execute-api.ap-southeast-4.amazonaws.com/live/" for a in agents)}
    # Every per-agent list with an entry for every agent, each as long as it can be.
    secrets = dict(own_urls)
    secrets["ServiceAuth"] = ",".join(f"{a}={['BEARER', 'API_KEY'][n % 2]}" for n, a in enumerate(agents))
    secrets["ServiceRates"] = ",".join(f"{a}=500" for a in agents)
    secrets["ServiceConcurrency"] = ",".join(f"{a}=10000" for a in agents)
    return {
        "defaults": {},
        "ApiAuth JWT": {"ApiAuth": "JWT", "JwtIssuer": "https://issuer.example.com", "JwtAudience": "orders"},
        "ApiAuth NONE": {"ApiAuth": "NONE"},
        "console": {"Console": "true"},
        "console at a JWT issuer": {
            "ApiAuth": "JWT", "JwtIssuer": "https://issuer.example.com", "JwtAudience": "orders",
            "Console": "true", "ConsoleClientId": "0oa1console",
        },
        "own service URLs": own_urls,
        "secrets and limits": secrets,
        "lean and reserved": {
            "CreateDashboard": "false",
            "KeepOrdersOnDelete": "false",
            "RemoteSimReservedConcurrency": "true",
            "SchedulerBatchingWindowSeconds": "10",
            "AgentBatchingWindowSeconds": "10",
            "LogRetentionDays": "7",
        },
    }


def expand_loops(template, overrides):
    """`template` with its `Fn::ForEach` loops expanded by SAM CLI's language extensions, and
    what the loops leave that only the AWS::LanguageExtensions transform reads (a logical id
    written with `Fn::Sub` in a `Ref` or `Fn::GetAtt`, `Fn::FindInMap` with a `DefaultValue`)
    resolved by SAM CLI's own resolvers, with the choice's parameters. Nothing else is resolved:
    SAM CLI's whole pipeline (`process_template`) would also take every `Fn::If` its way, put
    the parameters' values in place of their `Ref`s, and turn each `Fn::Sub` it cannot finish
    (`${StateTable.Arn}/index/...`, `${AWS::StackName}-...`) into a plain string, which the
    checks below and CloudFormation must see as it is written."""
    context = TemplateProcessingContext(
        fragment=copy.deepcopy(template),
        parameter_values=dict(overrides),
        resolution_mode=ResolutionMode.PARTIAL,
    )
    resolver = create_default_intrinsic_resolver(context)
    expanded = ProcessingPipeline([TemplateParsingProcessor(), ForEachProcessor(intrinsic_resolver=resolver)]).process_template(context)

    def extension_only(value):
        if isinstance(value, dict):
            if len(value) == 1:
                ((function, arg),) = value.items()
                if (
                    (function == "Ref" and not isinstance(arg, str))
                    or (function == "Fn::GetAtt" and isinstance(arg, list) and not isinstance(arg[0], str))
                    or (function == "Fn::FindInMap" and isinstance(arg, list) and len(arg) == 4)
                ):
                    return resolver.resolve_value(value)
            return {k: extension_only(v) for k, v in value.items()}
        if isinstance(value, list):
            return [extension_only(v) for v in value]
        return value

    for section in ("Resources", "Outputs"):
        if section in expanded:
            expanded[section] = extension_only(expanded[section])
    left = [k for section in ("Conditions", "Resources", "Outputs") for k in expanded.get(section, {}) if k.startswith("Fn::ForEach")]
    left += [json.dumps(t) for t in references(expanded.get("Resources", {})) if not isinstance(t, str)]
    if left:
        raise ValueError(f"left unexpanded: {', '.join(left)}")
    # The transforms left to run after AWS::LanguageExtensions, as CloudFormation runs them.
    transforms = expanded.pop("Transform", [])
    transforms = [t for t in (transforms if isinstance(transforms, list) else [transforms]) if t != LANGUAGE_EXTENSIONS]
    if transforms:
        expanded["Transform"] = transforms[0] if len(transforms) == 1 else transforms
    return expanded


def references(value):
    """The logical ids `value` names in `Ref` and `Fn::GetAtt`."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref":
                yield v
            elif k == "Fn::GetAtt":
                yield v[0] if isinstance(v, list) else v.split(".")[0]
            else:
                yield from references(v)
    elif isinstance(value, list):
        for v in value:
            yield from references(v)


# What CloudFormation allows inside Rules.
RULE_FUNCTIONS = {
    "Ref", "Fn::And", "Fn::Contains", "Fn::EachMemberEquals", "Fn::EachMemberIn", "Fn::Equals",
    "Fn::If", "Fn::Not", "Fn::Or", "Fn::RefAll", "Fn::ValueOf", "Fn::ValueOfAll",
}
# Actions that take no resource, so that only `*` can grant them.
RESOURCELESS = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
PSEUDO = {"AWS::Region", "AWS::AccountId", "AWS::Partition", "AWS::StackName", "AWS::URLSuffix", "AWS::StackId"}


class NoManagedPolicies:
    """SAM asks for the account's managed policies only to expand a policy named in `Policies`;
    this template names none, and a template that did would fail here, offline."""

    def load(self):
        return {}


class Choice:
    """The template's parameters and conditions as one choice of parameters sets them."""

    def __init__(self, template, overrides):
        declared = template.get("Parameters", {})
        self.parameters = {k: str(v.get("Default", "")) for k, v in declared.items()}
        self.parameters.update(overrides)
        # A list parameter (CommaDelimitedList, List<...>) is its text split at the commas: an
        # empty one is the list of one empty string, as in CloudFormation.
        self.lists = {k for k, v in declared.items() if v.get("Type") == "CommaDelimitedList" or "List<" in v.get("Type", "")}
        self.conditions = dict(template.get("Conditions", {}))
        self.resolved = {}

    def holds(self, name):
        if name not in self.resolved:
            self.resolved[name] = self.truth(self.conditions[name])
        return self.resolved[name]

    def truth(self, value):
        ((function, arg),) = value.items()
        if function == "Condition":
            return self.holds(arg)
        if function == "Fn::Not":
            return not self.truth(arg[0])
        if function == "Fn::And":
            return all(self.truth(a) for a in arg)
        if function == "Fn::Or":
            return any(self.truth(a) for a in arg)
        if function == "Fn::Equals":
            return self.scalar(arg[0]) == self.scalar(arg[1])
        raise ValueError(f"condition function {function}")

    def scalar(self, value):
        """A value of a condition: a literal, a parameter, or a `Fn::Join` of them."""
        if isinstance(value, dict):
            ((function, arg),) = value.items()
            if function == "Ref":
                text = self.parameters[arg]
                return text.split(",") if arg in self.lists else text
            if function == "Fn::Join":
                separator, items = arg
                items = self.scalar(items)
                if not isinstance(items, list):
                    raise ValueError(f"Fn::Join of {json.dumps(arg[1])}, which is not a list")
                return separator.join(self.scalar(i) for i in items)
            raise ValueError(f"function {function} in a condition's value")
        if isinstance(value, list):
            return [self.scalar(v) for v in value]
        return str(value)

    def resolve_ifs(self, value):
        """`value` with every `Fn::If` taken its way and `AWS::NoValue` dropped."""
        if isinstance(value, dict):
            if set(value) == {"Fn::If"}:
                name, yes, no = value["Fn::If"]
                return self.resolve_ifs(yes if self.holds(name) else no)
            if value == {"Ref": "AWS::NoValue"}:
                return None
            out = {}
            for k, v in value.items():
                v = self.resolve_ifs(v)
                if v is not None:
                    out[k] = v
            return out
        if isinstance(value, list):
            return [v for v in (self.resolve_ifs(v) for v in value) if v is not None]
        return value


def functions_used(value):
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" or k.startswith("Fn::") or k == "Condition":
                yield k
            yield from functions_used(v)
    elif isinstance(value, list):
        for v in value:
            yield from functions_used(v)


def check_rules(template):
    problems = []
    for name, rule in template.get("Rules", {}).items():
        for function in functions_used(rule):
            if function not in RULE_FUNCTIONS:
                problems.append(f"rule {name} uses {function}, which CloudFormation does not allow in Rules")
    return problems


def check_reservations(expanded):
    problems = []
    for rid, r in expanded["Resources"].items():
        if r["Type"] != "AWS::Lambda::Function":
            continue
        reserved = r.get("Properties", {}).get("ReservedConcurrentExecutions")
        if reserved is not None and not (isinstance(reserved, dict) and "Fn::If" in reserved):
            problems.append(f"{rid} reserves concurrency with no condition: a new account with 10 concurrent executions cannot deploy it")
    return problems


# An ARN of this account and region whose name begins with the stack's name and a character no
# stack name has (`/`, `.`), or with the stack's id (the UUID that ends its ARN) and `_`, after
# the resource type (`secret:`, `table/`, ...): the stack's own namespace, which no other
# stack's names enter. (`-` would not do: `<stack>-x` may be another stack's name.)
NAMED_AFTER_STACK = re.compile(
    r"arn:\$\{AWS::Partition\}:[a-z0-9-]+:\$\{AWS::Region\}:\$\{AWS::AccountId\}:"
    r"(?:[A-Za-z0-9-]+[:/])?(?:\$\{AWS::StackName\}[/.]|\$\{AWS::StackId\}_)"
)
# The stack's id as a template writes it: the last part of its ARN.
STACK_ID = {"Fn::Select": [2, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]}


def names_stack_or_parameter(resource, template):
    """Whether `resource` (a statement's Resource item) names a resource of the stack, one a
    parameter names, or one named after the stack (`NAMED_AFTER_STACK`)."""
    known = set(template["Resources"]) | set(template.get("Parameters", {})) | PSEUDO
    if isinstance(resource, str):
        return False  # a literal: `*`, or an ARN of something outside the stack
    if not (isinstance(resource, dict) and len(resource) == 1):
        return False
    ((function, arg),) = resource.items()
    if function == "Ref":
        return arg in known and arg not in PSEUDO
    if function == "Fn::GetAtt":
        target = arg[0] if isinstance(arg, list) else arg.split(".")[0]
        return target in template["Resources"]
    if function == "Fn::Sub":
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        for name, value in variables.items():
            if value != STACK_ID:
                return False  # a variable of the Sub: only the stack's id is read here
            text = text.replace("${" + name + "}", "${AWS::StackId}")
        names = [n.split(".")[0] for n in re.findall(r"\$\{([^}!]+)\}", text)]
        owned = [n for n in names if n not in PSEUDO]
        if not all(n in known for n in owned):
            return False
        return bool(owned) or bool(NAMED_AFTER_STACK.match(text))
    return False


def names_role_of_stack(role, template, choice):
    """Whether `role` (a policy's RoleName or Roles item) is a `Ref` to a role of the template
    that this choice creates."""
    if not (isinstance(role, dict) and set(role) == {"Ref"} and isinstance(role["Ref"], str)):
        return False
    target = template["Resources"].get(role["Ref"], {})
    if target.get("Type") != "AWS::IAM::Role":
        return False
    return not target.get("Condition") or choice.holds(target["Condition"])


# Condition operators that confine a key to the values they list (an `...IfExists` one lets a
# request without the key through; `Not...` ones let everything else through).
CONFINING = {"StringEquals", "StringLike", "ArnEquals", "ArnLike"}


def confined_to(condition, key):
    """The values a statement's `condition` confines `key` to, or None where it does not. The
    operators of a condition all hold together, so one that lists the key confines it."""
    for operator, keys in (condition or {}).items():
        if operator in CONFINING and isinstance(keys, dict) and key in keys:
            values = keys[key]
            return values if isinstance(values, list) else [values]
    return None


def decrypts_stack_secrets_only(statement, template):
    """Whether a statement's condition holds its `kms:Decrypt` on `*` to Secrets Manager's calls
    for secrets of the stack (or ones a parameter names): the key of a secret is the account's,
    not the stack's, so no Resource can say it."""
    via = confined_to(statement.get("Condition"), "kms:ViaService")
    secrets = confined_to(statement.get("Condition"), "kms:EncryptionContext:SecretARN")
    return (
        bool(via)
        and all(isinstance(v, str) and v.startswith("secretsmanager.") for v in via)
        and bool(secrets)
        and all(names_stack_or_parameter(v, template) for v in secrets)
    )


# The resources that grant permissions to the stack's roles; `AWS::IAM::ManagedPolicy` is the
# stack's offer to principals outside it, not a grant of its own.
GRANTS = {"AWS::IAM::Role", "AWS::IAM::Policy", "AWS::IAM::RolePolicy"}


def check_grants(expanded, choice):
    """Each grant of the stack's roles, and how many statements were read, by resource type."""
    problems = []
    read = {}
    for rid, r in expanded["Resources"].items():
        if r["Type"] not in GRANTS:
            continue
        if r.get("Condition") and not choice.holds(r["Condition"]):
            continue
        props = choice.resolve_ifs(r.get("Properties", {}))
        documents = []
        for arn in props.get("ManagedPolicyArns", []):
            # A managed policy of this template (the console's roles hold the operators' and
            # the readers' policies) is checked as the role's own; any other is refused.
            own = expanded["Resources"].get(arn.get("Ref", "")) if isinstance(arn, dict) else None
            if own and own["Type"] == "AWS::IAM::ManagedPolicy":
                documents.append(own.get("Properties", {}).get("PolicyDocument", {}))
                continue
            problems.append(f"{rid} has the managed policy {json.dumps(arn)}: its grants are not the stack's to scope")
        roles = {"AWS::IAM::RolePolicy": [props.get("RoleName")], "AWS::IAM::Policy": props.get("Roles", [])}.get(r["Type"], [])
        for role in roles:
            if not names_role_of_stack(role, expanded, choice):
                problems.append(f"{rid} grants to the role {json.dumps(role)}, which is not a role of the stack")
        for other in ("Users", "Groups"):
            if props.get(other):
                problems.append(f"{rid} grants to {other.lower()} {json.dumps(props[other])}, which are not the stack's")
        documents += [p.get("PolicyDocument", {}) for p in props.get("Policies", [])]
        if "PolicyDocument" in props:
            documents.append(props["PolicyDocument"])
        for document in documents:
            statements = document.get("Statement", [])
            for s in statements if isinstance(statements, list) else [statements]:
                read[r["Type"]] = read.get(r["Type"], 0) + 1
                if s.get("Effect") != "Allow":
                    continue
                if "NotAction" in s or "NotResource" in s:
                    problems.append(f"{rid} grants with NotAction or NotResource, which grant what they do not name")
                    continue
                actions = s.get("Action", [])
                actions = actions if isinstance(actions, list) else [actions]
                resources = s.get("Resource", [])
                resources = resources if isinstance(resources, list) else [resources]
                for resource in resources:
                    if names_stack_or_parameter(resource, expanded):
                        continue
                    if resource == "*" and actions and set(actions) <= RESOURCELESS:
                        continue
                    if resource == "*" and actions == ["kms:Decrypt"] and decrypts_stack_secrets_only(s, expanded):
                        continue
                    problems.append(f"{rid} grants {actions} on {json.dumps(resource)}, which is not a resource of the stack")
    return problems, read


# What the stack's alarms and dashboards may read from AWS's own namespaces.
AWS_METRICS = {
    "AWS/SQS": {"ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage", "NumberOfMessagesSent"},
    "AWS/Lambda": {"Errors", "Throttles", "Invocations", "Duration", "ConcurrentExecutions"},
}
OWN_NAMESPACE = "SchedulerAgentSupervisor/"
PSEUDO_VALUES = {
    "AWS::StackName": "sas", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com",
}


def filled(sub, choice):
    """The text of a `Fn::Sub` with every `${...}` filled as CloudFormation would: a parameter
    with the choice's value, a pseudo parameter with a sample, and anything else (a resource, an
    attribute, a variable of the Sub) with a stand-in name."""
    text, variables = (sub, {}) if isinstance(sub, str) else (sub[0], sub[1])

    def value(match):
        name = match.group(1)
        if name.startswith("!"):
            return "${" + name[1:] + "}"
        if name in PSEUDO_VALUES:
            return PSEUDO_VALUES[name]
        if name in choice.parameters and name not in variables:
            return choice.parameters[name]
        return "stand-in-" + re.sub(r"[^A-Za-z0-9]", "-", name)

    return re.sub(r"\$\{([^}]+)\}", value, text)


def metric_names(body):
    """Each (namespace, metric name) a dashboard body reads: its metric rows and the
    `MetricName=` of its SEARCH expressions. A row is [namespace, name, dimension, value, ...,
    {options}]; "." repeats the row above's value."""
    named = []
    for widget in body.get("widgets", []):
        above = []
        for row in widget.get("properties", {}).get("metrics", []) or []:
            plain = [v for v in row if not isinstance(v, dict)]
            plain = [above[i] if v == "." and i < len(above) else v for i, v in enumerate(plain)]
            if len(plain) >= 2:
                named.append((plain[0], plain[1]))
                above = plain
            for options in (v for v in row if isinstance(v, dict)):
                expression = options.get("expression", "")
                for namespace, name in re.findall(r"\{\\?\"?([^,\"\\]+)\\?\"?,[^}]*\}[^']*MetricName=\\?\"(\w+)", expression):
                    named.append((namespace, name))
    return named


def alarm_metrics(props):
    """Each (namespace, metric name) an alarm reads, directly or through metric math."""
    if "MetricName" in props:
        return [(props.get("Namespace"), props["MetricName"])]
    found = []
    for m in props.get("Metrics", []):
        metric = m.get("MetricStat", {}).get("Metric")
        if metric:
            found.append((metric.get("Namespace"), metric.get("MetricName")))
    return found


def unknown_metric(namespace, name, own):
    if isinstance(namespace, dict) and "Fn::Sub" in namespace:
        namespace = namespace["Fn::Sub"]
    if not isinstance(namespace, str):
        return f"a namespace written as {json.dumps(namespace)}"
    if namespace.startswith(OWN_NAMESPACE):
        return None if name in own else f"{name}, which no function of the stack emits"
    if namespace in AWS_METRICS:
        return None if name in AWS_METRICS[namespace] else f"{namespace} {name}, which the stack does not read elsewhere"
    return f"the namespace {namespace}"


def check_dashboards(expanded, choice, own):
    """Every dashboard body, with its substitutions filled, is JSON that CloudWatch takes (it
    refuses any other, and the stack rolls back), and every dashboard and alarm names only
    metrics the stack emits (`own`: the functions' metric names) or reads from AWS/SQS and
    AWS/Lambda."""
    problems = []
    for rid, r in expanded["Resources"].items():
        if r.get("Condition") and not choice.holds(r["Condition"]):
            continue
        props = choice.resolve_ifs(r.get("Properties", {}))
        if r["Type"] == "AWS::CloudWatch::Alarm":
            for namespace, name in alarm_metrics(props):
                why = unknown_metric(namespace, name, own)
                if why:
                    problems.append(f"{rid} alarms on {why}")
        if r["Type"] != "AWS::CloudWatch::Dashboard":
            continue
        body = props.get("DashboardBody")
        text = filled(body["Fn::Sub"], choice) if isinstance(body, dict) and "Fn::Sub" in body else body
        if not isinstance(text, str):
            problems.append(f"{rid}'s DashboardBody is not a string or a Fn::Sub of one")
            continue
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            line = text.splitlines()[e.lineno - 1].strip() if e.lineno <= len(text.splitlines()) else ""
            problems.append(f"{rid}'s DashboardBody is not JSON ({e.msg} at line {e.lineno}: {line[:80]}): PutDashboard refuses it")
            continue
        for namespace, name in metric_names(parsed):
            why = unknown_metric(namespace, name, own)
            if why:
                problems.append(f"{rid} shows {why}")
    return problems


def check_retention(expanded, choice):
    """A resource kept on deletion is `RetainExceptOnCreate`, so that a first create which rolls
    back removes it (a kept one with a fixed name would make the next deploy fail with "already
    exists"), and has no deletion protection, which would make that rollback fail."""
    problems = []
    for rid, r in expanded["Resources"].items():
        policy = choice.resolve_ifs({"p": r.get("DeletionPolicy", "Delete")})["p"]
        if policy == "Retain":
            problems.append(f"{rid} is kept with DeletionPolicy Retain: a failed first create leaves it behind; use RetainExceptOnCreate")
        protected = choice.resolve_ifs(r.get("Properties", {})).get("DeletionProtectionEnabled")
        if policy == "RetainExceptOnCreate" and protected in (True, "true"):
            problems.append(f"{rid} has deletion protection: the rollback of a failed first create cannot delete it")
    return problems


# The property that names a resource, by type, for the types a stack may keep.
NAME_PROPERTY = {
    "AWS::DynamoDB::Table": "TableName", "AWS::S3::Bucket": "BucketName", "AWS::SQS::Queue": "QueueName",
    "AWS::Logs::LogGroup": "LogGroupName", "AWS::SNS::Topic": "TopicName", "AWS::Events::EventBus": "Name",
    "AWS::SecretsManager::Secret": "Name", "AWS::IAM::Role": "RoleName", "AWS::KMS::Alias": "AliasName",
}


def names_stack_id(value):
    """Whether a name, as the template writes it, holds the stack's id: unique to one create."""
    if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
        arg = value["Fn::Sub"]
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        ids = {n for n, v in variables.items() if v == STACK_ID} | {"AWS::StackId"}
        return any("${" + n + "}" in text for n in ids)
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        return any(names_stack_id(v) or v == STACK_ID for v in value["Fn::Join"][1])
    return False


def check_kept(expanded, choice):
    """What a delete keeps (`Retain`, `RetainExceptOnCreate`) is either named by CloudFormation
    or named after the stack's id: a name of its own that does not hold the id (the stack's
    name, a literal) is met again by the next create under the same stack name, which fails
    with "already exists". Prints what a delete keeps."""
    problems, kept = [], []
    for rid, r in expanded["Resources"].items():
        if r.get("Condition") and not choice.holds(r["Condition"]):
            continue
        policy = choice.resolve_ifs({"p": r.get("DeletionPolicy", "Delete")})["p"]
        if policy not in ("Retain", "RetainExceptOnCreate"):
            continue
        kept.append(rid)
        name = choice.resolve_ifs(r.get("Properties", {})).get(NAME_PROPERTY.get(r["Type"], ""))
        if name is not None and not names_stack_id(name):
            problems.append(
                f"{rid} is kept by a delete under the name {json.dumps(name)}: a stack created again under the same name meets it and fails (already exists); name it after the stack's id, or let CloudFormation name it"
            )
    print(f"kept by a delete: {', '.join(sorted(kept)) or 'nothing'}")
    return problems


def check_vended_logs(expanded, choice):
    """A log group that an AWS service delivers logs into (the HTTP API's access log) is named
    under /aws/vendedlogs/: otherwise the delivery adds the group to the account's one
    CloudWatch Logs resource policy (5,120 characters), which no delete cleans, and after
    enough stacks or deploys the stage's creation fails. No stack writes that policy itself."""
    problems = []
    resources = expanded["Resources"]
    for rid, r in resources.items():
        if r["Type"] == "AWS::Logs::ResourcePolicy":
            problems.append(f"{rid} writes the account's CloudWatch Logs resource policy, which every stack shares")
        if r["Type"] != "AWS::ApiGatewayV2::Stage":
            continue
        destination = choice.resolve_ifs(r.get("Properties", {})).get("AccessLogSettings", {}).get("DestinationArn")
        if destination is None:
            continue
        group = destination.get("Fn::GetAtt", [None])[0] if isinstance(destination, dict) else None
        name = resources.get(group, {}).get("Properties", {}).get("LogGroupName")
        text = name.get("Fn::Sub") if isinstance(name, dict) else name
        text = text[0] if isinstance(text, list) else text
        if not (isinstance(text, str) and text.startswith("/aws/vendedlogs/")):
            problems.append(
                f"{rid} delivers its access log into {group or json.dumps(destination)}, not named under /aws/vendedlogs/: each stack grows the account's CloudWatch Logs resource policy"
            )
    return problems


def check_ok_actions(expanded):
    """No alarm has OKActions: CloudWatch runs them when a new alarm first reaches OK, so every
    deploy that adds alarms (each agent adds four) would mail an operator an "OK" for each."""
    return [
        f"{rid} has OKActions: a deploy that creates it mails an OK nobody asked for; announce a clear from ALARM to OK by a rule"
        for rid, r in expanded["Resources"].items()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r.get("Properties", {}).get("OKActions")
    ]


def check_rule_targets(expanded, choice):
    """Every target of every rule (the schedules SAM makes included) has a retry policy and a
    dead-letter queue: without them, an event EventBridge cannot deliver is dropped after a
    day of retries and nobody learns of it."""
    problems = []
    for rid, r in expanded["Resources"].items():
        if r["Type"] != "AWS::Events::Rule" or (r.get("Condition") and not choice.holds(r["Condition"])):
            continue
        for target in choice.resolve_ifs(r.get("Properties", {})).get("Targets", []):
            missing = [k for k in ("RetryPolicy", "DeadLetterConfig") if k not in target]
            if missing:
                problems.append(f"{rid}'s target {target.get('Id')} has no {' and no '.join(missing)}: what it cannot deliver is lost unseen")
    return problems


def check_buckets(expanded, choice):
    """Every bucket is encrypted, blocks public access, takes requests over TLS only (a bucket
    policy denying aws:SecureTransport false) and has a lifecycle rule."""
    problems = []
    resources = expanded["Resources"]
    tls_only = set()
    for r in resources.values():
        if r["Type"] != "AWS::S3::BucketPolicy":
            continue
        props = r.get("Properties", {})
        bucket = props.get("Bucket", {}).get("Ref") if isinstance(props.get("Bucket"), dict) else None
        for s in props.get("PolicyDocument", {}).get("Statement", []):
            secure = s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")
            if s.get("Effect") == "Deny" and s.get("Principal") == "*" and str(secure).lower() == "false":
                tls_only.add(bucket)
    for rid, r in resources.items():
        if r["Type"] != "AWS::S3::Bucket" or (r.get("Condition") and not choice.holds(r["Condition"])):
            continue
        props = choice.resolve_ifs(r.get("Properties", {}))
        block = props.get("PublicAccessBlockConfiguration", {})
        missing = [
            what for what, ok in (
                ("encryption", "BucketEncryption" in props),
                ("public access blocked", all(block.get(k) in (True, "true") for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))),
                ("TLS-only bucket policy", rid in tls_only),
                ("lifecycle rule", bool(props.get("LifecycleConfiguration", {}).get("Rules"))),
            ) if not ok
        ]
        if missing:
            problems.append(f"{rid} lacks: {', '.join(missing)}")
    return problems


# CloudFormation's most resources in one stack, and IAM's most characters of inline policy
# (all of a role's inline policies together, white space left out).
MOST_RESOURCES = 500
MOST_ROLE_POLICY = 10240
# The longest a value may be once CloudFormation has filled it in, for the policy sizes: a stack
# name CloudFormation takes, and an ARN of any resource of the stack.
LONGEST = {"AWS::StackName": "s" * 128, "AWS::StackId": "0" * 36, "AWS::Region": "ap-southeast-4",
           "AWS::AccountId": "1" * 12, "AWS::Partition": "aws-us-gov", "AWS::URLSuffix": "amazonaws.com.cn"}
ANY_ARN = "a" * 160


def longest(value):
    """`value` with every intrinsic function replaced by the longest text it can become."""
    if isinstance(value, dict) and len(value) == 1:
        ((function, arg),) = value.items()
        if function == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            fill = lambda m: LONGEST.get(m.group(1)) or (LONGEST["AWS::StackId"] if variables.get(m.group(1)) == STACK_ID else ANY_ARN)
            return re.sub(r"\$\{([^}!]+)\}", fill, text)
        if function in ("Ref", "Fn::GetAtt"):
            return LONGEST.get(arg, ANY_ARN) if isinstance(arg, str) else ANY_ARN
    if isinstance(value, dict):
        return {k: longest(v) for k, v in value.items()}
    if isinstance(value, list):
        return [longest(v) for v in value]
    return value


def check_limits(expanded, choice):
    """The stack stays within CloudFormation's resources per stack, and each role within IAM's
    inline policy size, with every name as long as it can be."""
    problems = []
    resources = expanded["Resources"]
    if len(resources) > MOST_RESOURCES:
        problems.append(f"the stack has {len(resources)} resources, over CloudFormation's {MOST_RESOURCES}")
    sizes = {}
    for rid, r in resources.items():
        if r.get("Condition") and not choice.holds(r["Condition"]):
            continue
        props = choice.resolve_ifs(r.get("Properties", {}))
        if r["Type"] == "AWS::IAM::Role":
            for policy in props.get("Policies", []):
                text = json.dumps(longest(policy.get("PolicyDocument", {})), separators=(",", ":"))
                sizes[rid] = sizes.get(rid, 0) + len(text)
        elif r["Type"] == "AWS::IAM::RolePolicy":
            role = props.get("RoleName", {}).get("Ref") if isinstance(props.get("RoleName"), dict) else None
            if not isinstance(role, str):
                continue  # not a role of the stack: check_grants names it
            text = json.dumps(longest(props.get("PolicyDocument", {})), separators=(",", ":"))
            sizes[role] = sizes.get(role, 0) + len(text)
    for role, size in sorted(sizes.items()):
        if size > MOST_ROLE_POLICY:
            problems.append(f"{role} holds {size} characters of inline policy, over IAM's {MOST_ROLE_POLICY}")
    if sizes:
        role, size = max(sizes.items(), key=lambda kv: kv[1])
        print(f"limits: {len(resources)} of {MOST_RESOURCES} resources; the largest inline policy, {role}'s, {size} of {MOST_ROLE_POLICY} characters at most")
    return problems


# Lambda's most bytes of environment variables per function (keys and values together).
MOST_ENVIRONMENT = 4096


def text_of(value, choice, variables=None):
    """What an intrinsic function becomes once CloudFormation has filled it in, as text (or a
    list, for a list parameter, `Fn::Split`): parameters take the choice's values, and
    everything only a deploy knows (a resource's name or attribute, the stack's name and id)
    the longest text it can be (`longest`)."""
    variables = variables or {}
    if isinstance(value, (str, int, float, bool)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, list):
        return [text_of(v, choice, variables) for v in value]
    ((function, arg),) = value.items()
    if function == "Ref":
        if arg in choice.parameters:
            text = choice.parameters[arg]
            return text.split(",") if arg in choice.lists else text
        if arg == "AWS::StackId":
            parts = ("AWS::Partition", "AWS::Region", "AWS::AccountId", "AWS::StackName", "AWS::StackId")
            return "arn:{}:cloudformation:{}:{}:stack/{}/{}".format(*(LONGEST[p] for p in parts))
        return LONGEST.get(arg, ANY_ARN)
    if function == "Fn::GetAtt":
        return ANY_ARN
    if function == "Fn::Join":
        separator, items = arg
        items = text_of(items, choice, variables)
        return separator.join(i if isinstance(i, str) else separator.join(i) for i in items)
    if function == "Fn::Split":
        separator, text = arg
        return text_of(text, choice, variables).split(separator)
    if function == "Fn::Select":
        index, items = arg
        return text_of(items, choice, variables)[int(text_of(index, choice, variables))]
    if function == "Fn::Sub":
        text, own = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        own = {k: (LONGEST["AWS::StackId"] if v == STACK_ID else text_of(v, choice, variables)) for k, v in own.items()}

        def fill(match):
            name = match.group(1)
            if name in own:
                return own[name]
            if name in choice.parameters:
                return choice.parameters[name]
            return LONGEST.get(name, ANY_ARN)

        return re.sub(r"\$\{([^}!]+)\}", fill, text)
    raise ValueError(f"{function} in an environment variable")


def check_environments(expanded, choice):
    """Each function's environment fits Lambda's 4 KB, with the choice's parameters and every
    name as long as it can be."""
    problems, sizes = [], {}
    for rid, r in expanded["Resources"].items():
        if r["Type"] != "AWS::Lambda::Function" or (r.get("Condition") and not choice.holds(r["Condition"])):
            continue
        variables = choice.resolve_ifs(r.get("Properties", {})).get("Environment", {}).get("Variables", {})
        try:
            filled_in = {k: text_of(v, choice) for k, v in variables.items()}
        except (IndexError, ValueError) as e:
            problems.append(f"{rid}'s environment cannot be filled in ({e or 'Fn::Select out of range'}): CloudFormation would fail the deploy")
            continue
        sizes[rid] = sum(len(k.encode()) + len(v.encode()) for k, v in filled_in.items())
    for rid, size in sorted(sizes.items()):
        if size > MOST_ENVIRONMENT:
            problems.append(f"{rid}'s environment takes {size} bytes, over Lambda's {MOST_ENVIRONMENT}")
    if sizes:
        rid, size = max(sizes.items(), key=lambda kv: kv[1])
        print(f"environments: the largest, {rid}'s, {size} of {MOST_ENVIRONMENT} bytes at most")
    return problems


def with_agents(template, count):
    """`template` with its agent loop's list grown to `count` agents (its own, then `agentNN`)."""
    grown = copy.deepcopy(template)
    key, agents = agent_loop(grown)
    more = [f"agent{n:02}" for n in range(1, count + 1)][: max(0, count - len(agents))]
    grown["Resources"][key][1] = agents + more
    return grown


def number(value, choice, default):
    if value is None:
        return default
    if isinstance(value, dict) and "Ref" in value:
        return float(choice.parameters[value["Ref"]])
    return float(value)


def check_visibility(expanded, choice):
    problems = []
    resources = expanded["Resources"]
    for rid, r in resources.items():
        if r["Type"] != "AWS::Lambda::EventSourceMapping":
            continue
        p = r["Properties"]
        source = p.get("EventSourceArn")
        if not (isinstance(source, dict) and "Fn::GetAtt" in source):
            continue
        queue = resources[source["Fn::GetAtt"][0]]
        if queue["Type"] != "AWS::SQS::Queue":
            continue
        function = resources[p["FunctionName"]["Ref"]]
        timeout = number(function["Properties"].get("Timeout"), choice, 3)
        window = number(p.get("MaximumBatchingWindowInSeconds"), choice, 0)
        visibility = number(queue.get("Properties", {}).get("VisibilityTimeout"), choice, 30)
        if visibility < 6 * timeout + window:
            problems.append(
                f"{rid}: {source['Fn::GetAtt'][0]} hides a message {visibility:g} s, under 6 x {timeout:g} s + {window:g} s"
            )
    return problems


# Concurrent executions of a new account, all of which are unreserved, and the quota AWS
# gives an account by default once it is established.
NEW_ACCOUNT_CONCURRENCY = 10
ACCOUNT_CONCURRENCY = 1000


def check_pollers(expanded, choice):
    """The queues' pollers are bounded: each SQS mapping has a MaximumConcurrency (without one
    it grows towards a thousand), and together they ask for no more than an account has by
    default. What they ask for is printed: above a new account's 10 (two scheduler queues and
    more than three agents, at 2 each), they are throttled at times until the quota is raised."""
    problems = []
    total = 0
    resources = expanded["Resources"]
    for rid, r in resources.items():
        if r["Type"] != "AWS::Lambda::EventSourceMapping":
            continue
        source = r["Properties"].get("EventSourceArn")
        if not (isinstance(source, dict) and "Fn::GetAtt" in source):
            continue
        if resources[source["Fn::GetAtt"][0]]["Type"] != "AWS::SQS::Queue":
            continue
        most = r["Properties"].get("ScalingConfig", {}).get("MaximumConcurrency")
        if most is None:
            problems.append(f"{rid} has no MaximumConcurrency: its poller grows until the account throttles everything else")
            continue
        total += number(most, choice, 0)
    if total > ACCOUNT_CONCURRENCY:
        problems.append(f"the queues' pollers ask for {total:g} concurrent executions, more than an account's {ACCOUNT_CONCURRENCY}")
    note = f", more than a new account's {NEW_ACCOUNT_CONCURRENCY}: throttled at times there" if total > NEW_ACCOUNT_CONCURRENCY else ""
    print(f"pollers: at most {total:g} concurrent executions{note}")
    return problems


def expand(template, overrides):
    sam = copy.deepcopy(template)
    # SAM needs the code in S3, as `sam package` leaves it; the local build is not the point.
    sam.get("Globals", {}).get("Function", {}).pop("CodeUri", None)
    for r in sam["Resources"].values():
        if r["Type"] == "AWS::Serverless::Function":
            r["Properties"]["CodeUri"] = "s3://deploy-check/code.zip"
    parameters = {k: str(v.get("Default", "")) for k, v in sam.get("Parameters", {}).items()}
    parameters.update(overrides)
    return transform(sam, parameters, NoManagedPolicies())


# Resource types whose attributes moto cannot give: a reference to one fails the whole stack
# there, so moto's copy reads a stand-in URL instead, and leaves out the outputs (named).
NO_ATTRIBUTES_IN_MOTO = {"AWS::Lambda::Url"}


def for_moto(expanded, choice):
    body = copy.deepcopy(expanded)
    # moto refuses a reference in a branch of Fn::If that the choice does not take (to a
    # resource its condition leaves out), which CloudFormation allows: take the branches here.
    body["Resources"] = {
        rid: choice.resolve_ifs(r)
        for rid, r in body["Resources"].items()
        if not r.get("Condition") or choice.holds(r["Condition"])
    }
    body["Outputs"] = {
        name: choice.resolve_ifs(o)
        for name, o in body.get("Outputs", {}).items()
        if not o.get("Condition") or choice.holds(o["Condition"])
    }
    # moto hands a rule the bus object for `Ref: <bus>`, where AWS gives its name; the bus's
    # `Name` attribute is the same name on AWS.
    for r in body["Resources"].values():
        bus = r.get("Properties", {}).get("EventBusName") if r["Type"] == "AWS::Events::Rule" else None
        if isinstance(bus, dict) and "Ref" in bus:
            r["Properties"]["EventBusName"] = {"Fn::GetAtt": [bus["Ref"], "Name"]}
    unreadable = {rid for rid, r in body["Resources"].items() if r["Type"] in NO_ATTRIBUTES_IN_MOTO}

    def stand_in(value):
        if isinstance(value, dict):
            getatt = value.get("Fn::GetAtt")
            if isinstance(getatt, list) and getatt[0] in unreadable:
                return f"https://{getatt[0]}.{getatt[1]}.invalid/"
            return {k: stand_in(v) for k, v in value.items()}
        if isinstance(value, list):
            return [stand_in(v) for v in value]
        return value

    body["Resources"] = stand_in(body["Resources"])
    left_out = []
    for name, output in list(body.get("Outputs", {}).items()):
        targets = [m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", json.dumps(output))]
        targets += [a[0] for a in find_getatts(output)]
        if any(body["Resources"].get(t, {}).get("Type") in NO_ATTRIBUTES_IN_MOTO for t in targets):
            del body["Outputs"][name]
            left_out.append(name)
    return body, left_out


def find_getatts(value):
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Fn::GetAtt":
                yield v if isinstance(v, list) else v.split(".")
            else:
                yield from find_getatts(v)
    elif isinstance(value, list):
        for v in value:
            yield from find_getatts(v)


def create(cloudformation, name, expanded, overrides, choice):
    parameters = [{"ParameterKey": k, "ParameterValue": v} for k, v in overrides.items()]
    body, left_out = for_moto(expanded, choice)
    if left_out:
        print(f"moto: outputs left out (moto cannot read their attributes): {', '.join(left_out)}")
    cloudformation.create_stack(
        StackName=name,
        TemplateBody=json.dumps(body),
        Parameters=parameters,
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        status = cloudformation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
        if not status.endswith("IN_PROGRESS"):
            break
        time.sleep(1)
    events = cloudformation.describe_stack_events(StackName=name)["StackEvents"]
    failures = [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events if e["ResourceStatus"].endswith("FAILED")]
    created = {r["LogicalResourceId"] for r in cloudformation.list_stack_resources(StackName=name)["StackResourceSummaries"]}
    return status, failures, created


def settle(cloudformation, name):
    """The stack's status once it is no longer in progress, and its resources' failures."""
    deadline = time.time() + 300
    while time.time() < deadline:
        status = cloudformation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
        if not status.endswith("IN_PROGRESS"):
            break
        time.sleep(1)
    events = cloudformation.describe_stack_events(StackName=name)["StackEvents"]
    return status, [f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}" for e in events if e["ResourceStatus"].endswith("FAILED")]


def put_back(session, endpoint, kind, physical):
    """A resource a delete kept, made again in moto under its name (moto's delete removes
    what AWS keeps)."""
    if kind == "AWS::DynamoDB::Table":
        session.client("dynamodb", endpoint_url=endpoint).create_table(
            TableName=physical, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        )
    elif kind == "AWS::S3::Bucket":
        session.client("s3", endpoint_url=endpoint).create_bucket(Bucket=physical)
    else:
        raise ValueError(f"a kept {kind} cannot be put back here")


# The configuration `sam deploy` reads, beside the template.
SAMCONFIG = os.environ.get("SAMCONFIG") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "samconfig.toml")


def check_samconfig(expanded):
    """`samconfig.toml` lets `sam deploy` run without --guided: a stack name, a bucket for the
    packaged template (SAM CLI's own, `resolve_s3`, or one named), the capabilities the
    template needs, and a failed first create deleted (`on_failure = "DELETE"`): otherwise it is
    left in ROLLBACK_COMPLETE, and SAM CLI takes the next deploy for an update, which
    CloudFormation refuses."""
    import tomllib

    with open(SAMCONFIG, "rb") as f:
        deploy = tomllib.load(f).get("default", {}).get("deploy", {}).get("parameters", {})
    problems = []
    if not deploy.get("stack_name"):
        problems.append("samconfig.toml names no stack_name: sam deploy without --guided stops at \"Missing option '--stack-name'\"")
    if not (deploy.get("resolve_s3") or deploy.get("s3_bucket")):
        problems.append("samconfig.toml has neither resolve_s3 nor s3_bucket: the packaged template is over 51,200 bytes and needs a bucket")
    capabilities = set(str(deploy.get("capabilities", "")).split())
    types = {r["Type"] for r in expanded["Resources"].values()}
    # Names IAM resources: a role's RoleName, a managed policy's ManagedPolicyName, ...
    naming = {"AWS::IAM::Role": "RoleName", "AWS::IAM::ManagedPolicy": "ManagedPolicyName", "AWS::IAM::User": "UserName", "AWS::IAM::Group": "GroupName"}
    named_iam = any(naming.get(r["Type"]) in r.get("Properties", {}) for r in expanded["Resources"].values())
    needed = set()
    if any(t.startswith("AWS::IAM::") for t in types):
        needed.add("CAPABILITY_NAMED_IAM" if named_iam else "CAPABILITY_IAM")
    needed.add("CAPABILITY_AUTO_EXPAND")  # the template's transforms
    if needed - capabilities - ({"CAPABILITY_IAM"} if "CAPABILITY_NAMED_IAM" in capabilities else set()):
        problems.append(f"samconfig.toml's capabilities {sorted(capabilities)} miss {sorted(needed - capabilities)}")
    if deploy.get("on_failure") != "DELETE":
        problems.append("samconfig.toml does not set on_failure = \"DELETE\": a failed first create stays in ROLLBACK_COMPLETE, and the next sam deploy is refused as an update")
    return problems


def sam_deploy_with_config(expanded, choice, session, endpoint):
    """`sam deploy` with nothing but `samconfig.toml`, as CI runs it, into the moto at
    `endpoint`: its exit code and what it said. moto expands neither the loops nor SAM's
    resources, so it is handed the template expanded here; it gives no outputs to a stack made
    by a change set, so SAM CLI's own bucket stack is made beforehand with SAM CLI's template,
    as SAM CLI would make it; and it reads a template URL by its path only on `localhost`."""
    from samcli.lib.bootstrap.bootstrap import SAM_CLI_STACK_NAME, _get_stack_template

    cloudformation = session.client("cloudformation", endpoint_url=endpoint)
    if not any(s["StackName"] == SAM_CLI_STACK_NAME for s in cloudformation.describe_stacks()["Stacks"]):
        cloudformation.create_stack(
            StackName=SAM_CLI_STACK_NAME, TemplateBody=_get_stack_template(), Capabilities=["CAPABILITY_IAM"],
            Tags=[{"Key": "ManagedStackSource", "Value": "AwsSamCli"}],
        )
        settle(cloudformation, SAM_CLI_STACK_NAME)
    work = tempfile.mkdtemp(prefix="deploy-check-")
    path = os.path.join(work, "expanded.json")
    with open(path, "w") as f:
        json.dump(for_moto(expanded, choice)[0], f)
    env = dict(
        os.environ, SAM_CLI_TELEMETRY="0", AWS_ENDPOINT_URL=endpoint.replace("127.0.0.1", "localhost"),
        AWS_ACCESS_KEY_ID="deploy-check", AWS_SECRET_ACCESS_KEY="local", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
    )
    command = [sys.executable, "-m", "samcli", "deploy", "--template-file", path, "--config-file", os.path.abspath(SAMCONFIG)]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def configured_stack_name():
    import tomllib

    with open(SAMCONFIG, "rb") as f:
        return tomllib.load(f)["default"]["deploy"]["parameters"].get("stack_name")


def stack_status(cloudformation, name):
    """The status of the stack `name`, or None when there is none."""
    try:
        return cloudformation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
    except Exception as e:
        if "does not exist" in str(e):
            return None
        raise


def check_non_guided_deploy(expanded, choice, session, endpoint):
    """`sam deploy` with nothing but `samconfig.toml` creates the stack."""
    code, said = sam_deploy_with_config(expanded, choice, session, endpoint)
    if code != 0:
        return [f"sam deploy with samconfig.toml alone failed: {said[-600:]}"]
    name = configured_stack_name()
    status = stack_status(session.client("cloudformation", endpoint_url=endpoint), name)
    print(f"sam deploy: with samconfig.toml alone, stack {name} {status}")
    return [] if status == "CREATE_COMPLETE" else [f"sam deploy left stack {name} {status}"]


def play_failed_first_create(expanded, choice, session):
    """A first create that fails, then the retry the README gives: the same `sam deploy` again.
    moto has no failure path (an error while creating a resource is raised to the caller), so
    this runs on a moto of its own, in this process, whose CloudFormation fails the stack's
    first create as AWS does: nothing of it is left but the stack, in ROLLBACK_COMPLETE. SAM CLI with `on_failure = "DELETE"` then deletes it, and the retry
    creates the stack; left rolled back, the retry would be refused as an update."""
    from moto.cloudformation import models
    from moto.server import ThreadedMotoServer

    name = configured_stack_name()
    if not name:
        return ["a failed first create is not played: samconfig.toml names no stack_name"]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://localhost:%d" % server.get_host_and_port()[1]
    backend = models.CloudFormationBackend
    original = backend.execute_change_set
    failing = {name}

    def execute_change_set(self, change_set_name, stack_name=None):
        change_set = self.change_sets.get(change_set_name) or next(
            (c for c in self.change_sets.values() if c.change_set_name == change_set_name), None
        )
        stack = change_set and self.stacks[change_set.stack_id]
        if not stack or change_set.change_set_type != "CREATE" or stack.name not in failing:
            return original(self, change_set_name, stack_name)
        failing.discard(stack.name)
        stack._add_stack_event("CREATE_IN_PROGRESS", resource_status_reason="User Initiated")
        stack._add_stack_event("CREATE_FAILED", resource_status_reason="The following resource(s) failed to create: [StateTable]. ")
        stack._add_stack_event("ROLLBACK_IN_PROGRESS")
        stack._add_stack_event("ROLLBACK_COMPLETE")
        change_set.execution_status = "EXECUTE_FAILED"
        stack.status = "ROLLBACK_COMPLETE"

    backend.execute_change_set = execute_change_set
    try:
        put_code(session, endpoint)
        cloudformation = session.client("cloudformation", endpoint_url=endpoint)
        code, said = sam_deploy_with_config(expanded, choice, session, endpoint)
        after = stack_status(cloudformation, name)
        print(f"failed first create: sam deploy exited {code}, stack {name} then {after or 'deleted'}")
        if code == 0:
            return [f"the failed first create was not played: sam deploy succeeded: {said[-300:]}"]
        if after is not None:
            return [f"a failed first create left stack {name} in {after}: the same sam deploy again would be refused as an update"]
        code, said = sam_deploy_with_config(expanded, choice, session, endpoint)
        status = stack_status(cloudformation, name)
        print(f"failed first create: the same sam deploy again exited {code}, stack {name} {status}")
        if code != 0 or status != "CREATE_COMPLETE":
            return [f"after a failed first create, the same sam deploy again ended {status}: {said[-400:]}"]
        return []
    finally:
        backend.execute_change_set = original
        server.stop()


def play_lifecycle(template, session, endpoint):
    """A stack's life at the defaults, in moto's CloudFormation: created; updated with one
    agent more (its queues, function and alarms, and the workflows that use it in the code);
    deleted, with what the delete keeps put back as AWS leaves it; and created again under the
    same name. Each step must end complete."""
    cloudformation = session.client("cloudformation", endpoint_url=endpoint)
    name = "deploy-check-life"
    _, agents = agent_loop(template)

    def body(t):
        looped = expand_loops(t, {})
        choice = Choice(looped, {})
        expanded = expand(looped, {})
        return json.dumps(for_moto(expanded, choice)[0]), expanded, choice

    capabilities = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
    problems = []
    first, expanded, choice = body(template)
    grown, _, _ = body(with_agents(template, len(agents) + 1))
    steps = [
        ("create", lambda: cloudformation.create_stack(StackName=name, TemplateBody=first, Capabilities=capabilities)),
        ("update with an agent added", lambda: cloudformation.update_stack(StackName=name, TemplateBody=grown, Capabilities=capabilities)),
    ]
    for step, call in steps:
        try:
            call()
            status, failures = settle(cloudformation, name)
        except Exception as e:  # moto refuses at once what AWS would fail while creating
            status, failures = "refused", [" ".join(str(e).split())[-300:]]
        print(f"life: {step}: {status}")
        if not status.endswith("_COMPLETE") or "ROLLBACK" in status:
            return [f"the stack's {step} ended {status}: {'; '.join(failures[:3])}"]
    resources = cloudformation.list_stack_resources(StackName=name)["StackResourceSummaries"]
    physical = {r["LogicalResourceId"]: (r["ResourceType"], r["PhysicalResourceId"]) for r in resources}
    kept = []
    for rid, r in expanded["Resources"].items():
        policy = choice.resolve_ifs({"p": r.get("DeletionPolicy", "Delete")})["p"]
        if policy in ("Retain", "RetainExceptOnCreate") and rid in physical:
            kept.append(physical[rid])
    cloudformation.delete_stack(StackName=name)
    deadline = time.time() + 120
    while time.time() < deadline and any(
        s["StackStatus"] != "DELETE_COMPLETE" for s in cloudformation.list_stacks()["StackSummaries"] if s["StackName"] == name
    ):
        time.sleep(1)
    for kind, resource in kept:
        try:
            put_back(session, endpoint, kind, resource)
        except Exception as e:
            if "already" not in str(e).lower() and "exist" not in str(e).lower():
                raise
    print(f"life: deleted, keeping {len(kept)} resources: {', '.join(r for _, r in kept)}")
    try:
        cloudformation.create_stack(StackName=name, TemplateBody=first, Capabilities=capabilities)
        status, failures = settle(cloudformation, name)
    except Exception as e:
        status, failures = "refused", [" ".join(str(e).split())[-300:]]
    print(f"life: created again under the same name: {status}")
    if status != "CREATE_COMPLETE":
        problems.append(f"the stack created again after a delete ended {status}: {'; '.join(failures[:3])}")
    return problems


# Stands in for cargo under `sam build`: `cargo metadata` names the target directory, and
# `cargo lambda build ... --bin NAME` writes a bootstrap that says which binary it is, so that
# what `sam package` uploads for each function can be read back without compiling anything.
FAKE_CARGO = """#!/bin/sh
case "$1" in
  metadata) printf '{"target_directory": "%s", "packages": []}\\n' "$CARGO_TARGET_DIR"; exit 0;;
  lambda) ;;
  *) echo "stand-in cargo: $*" >&2; exit 2;;
esac
bin=""
while [ $# -gt 0 ]; do
  [ "$1" = "--bin" ] && bin="$2"
  shift
done
[ -n "$bin" ] || { echo "stand-in cargo: no --bin" >&2; exit 2; }
mkdir -p "$CARGO_TARGET_DIR/lambda/$bin"
printf 'binary %s\\n' "$bin" > "$CARGO_TARGET_DIR/lambda/$bin/bootstrap"
"""
ARTEFACTS = "deploy-check-artefacts"


def check_packaging(path, template, session, endpoint):
    """`sam build` (the compile step replaced) and `sam package` into a bucket on moto, as a
    first `sam deploy` does: every function gets an artefact of its own, holding the binary its
    Metadata names. SAM CLI keeps the first iteration's artefact for every function of a loop
    whose CodeUri does not vary with the loop (aws-sam-cli#9117)."""
    work = tempfile.mkdtemp(prefix="deploy-check-")
    tools = os.path.join(work, "bin")
    os.makedirs(tools)
    for name, text in (("cargo", FAKE_CARGO), ("cargo-lambda", "#!/bin/sh\nexit 0\n")):
        with open(os.path.join(tools, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(tools, name), 0o755)
    # SAM CLI as a module of this Python: the venv's `sam` script may name, in its first line,
    # a Python at the path the venv was made in before it was moved into place.
    sam = [sys.executable, "-m", "samcli"]
    env = dict(
        os.environ,
        PATH=f"{tools}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}",
        CARGO_TARGET_DIR=os.path.join(work, "target"),
        SAM_CLI_TELEMETRY="0",
        SAM_CLI_ENABLE_LANGUAGE_EXTENSIONS="1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="deploy-check",
        AWS_SECRET_ACCESS_KEY="local",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
    )
    build = os.path.join(work, "build")
    packaged = os.path.join(work, "packaged.yaml")
    session.client("s3", endpoint_url=endpoint).create_bucket(Bucket=ARTEFACTS)
    for command in (
        [*sam, "build", "--template-file", os.path.abspath(path), "--build-dir", build, "--region", "us-east-1"],
        [*sam, "package", "--template-file", os.path.join(build, "template.yaml"), "--s3-bucket", ARTEFACTS,
         "--output-template-file", packaged, "--region", "us-east-1"],
    ):
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return [f"sam {command[3]} failed: {(done.stdout + done.stderr)[-1500:]}"]

    # The binary each function should hold, from the template as written.
    wanted = {}
    for rid, r in expand_loops(template, {})["Resources"].items():
        if r["Type"] == "AWS::Serverless::Function":
            wanted[rid] = r.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
    s3 = session.client("s3", endpoint_url=endpoint)
    packaged = yaml.safe_load(open(packaged))
    uploaded = expand_loops(packaged, {})["Resources"]
    problems, artefacts = [], {}
    for rid, binary in sorted(wanted.items()):
        uri = uploaded.get(rid, {}).get("Properties", {}).get("CodeUri")
        # The loop's functions find theirs in the mapping SAM CLI wrote, by their agent.
        keys = uri.get("Fn::FindInMap") if isinstance(uri, dict) else None
        if isinstance(keys, list) and len(keys) == 3 and all(isinstance(k, str) for k in keys):
            uri = packaged.get("Mappings", {}).get(keys[0], {}).get(keys[1], {}).get(keys[2])
        if not (isinstance(uri, str) and uri.startswith(f"s3://{ARTEFACTS}/")):
            problems.append(f"{rid}: sam package left CodeUri {json.dumps(uri)}, not an artefact in the bucket")
            continue
        artefacts.setdefault(uri, []).append(rid)
        body = s3.get_object(Bucket=ARTEFACTS, Key=uri.split("/", 3)[3])["Body"].read()
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            held = z.read("bootstrap").decode().strip() if "bootstrap" in z.namelist() else "no bootstrap"
        if held != f"binary {binary}":
            problems.append(f"{rid} would run {held!r}, not its own binary {binary!r}")
    # sam package names an upload by its content: functions of the same binary share one.
    binaries = len(set(wanted.values()))
    print(f"packaging: {len(wanted)} functions of {binaries} binaries, {len(artefacts)} distinct artefacts uploaded by sam package")
    if len(artefacts) < binaries:
        problems.append(f"{binaries} binaries in {len(artefacts)} artefacts: some function runs another's code")
    return problems


# The properties whose change makes CloudFormation replace a resource (a new physical
# resource: a queue's messages, a table's items, a function's name gone), by type, from each
# type's page of the CloudFormation reference ("Update requires: Replacement").
REPLACED_BY = {
    "AWS::SQS::Queue": {"QueueName", "FifoQueue"},
    "AWS::DynamoDB::Table": {"TableName", "KeySchema"},
    "AWS::Lambda::Function": {"FunctionName"},
    "AWS::Lambda::EventSourceMapping": {"EventSourceArn", "StartingPosition", "SelfManagedEventSource"},
    "AWS::Lambda::Permission": {"Action", "FunctionName", "Principal", "SourceArn", "SourceAccount", "EventSourceToken", "FunctionUrlAuthType", "PrincipalOrgID"},
    "AWS::Lambda::Url": {"TargetFunctionArn", "Qualifier"},
    "AWS::IAM::Role": {"RoleName", "Path"},
    "AWS::IAM::RolePolicy": {"PolicyName", "RoleName"},
    "AWS::IAM::ManagedPolicy": {"ManagedPolicyName", "Path"},
    "AWS::Logs::LogGroup": {"LogGroupName"},
    "AWS::CloudWatch::Alarm": {"AlarmName"},
    "AWS::CloudWatch::Dashboard": {"DashboardName"},
    "AWS::Events::EventBus": {"Name"},
    "AWS::Events::Rule": {"Name", "EventBusName"},
    "AWS::SNS::Topic": {"TopicName", "FifoTopic"},
    "AWS::SNS::Subscription": {"Endpoint", "Protocol", "TopicArn"},
    "AWS::ApiGatewayV2::Route": {"ApiId"},
    "AWS::ApiGatewayV2::Stage": {"ApiId", "StageName"},
    "AWS::ApiGatewayV2::Integration": {"ApiId"},
    "AWS::ApiGatewayV2::Authorizer": {"ApiId"},
}


def compare(before_path, after_path):
    """What deploying `after` over a stack of `before` does to the resources `before` has, both
    at their defaults: which are removed, which change, and which CloudFormation replaces (a
    replacement-forcing property changed, or a type unknown here changed). Exits 1 if any is
    removed or replaced."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    def translated(path):
        template = yaml.safe_load(open(path))
        return expand(expand_loops(template, {}), {})["Resources"]

    before, after = translated(before_path), translated(after_path)
    removed = sorted(set(before) - set(after))
    changed, replaced = [], []
    for rid in sorted(set(before) & set(after)):
        old, new = before[rid], after[rid]
        if old == new:
            continue
        changed.append(rid)
        if old["Type"] != new["Type"]:
            replaced.append(f"{rid} (its type)")
            continue
        forcing = REPLACED_BY.get(old["Type"])
        if forcing is None:
            replaced.append(f"{rid} (a {old['Type']}, whose properties are not known here)")
            continue
        props = [k for k in forcing if old.get("Properties", {}).get(k) != new.get("Properties", {}).get(k)]
        if props:
            replaced.append(f"{rid} ({', '.join(sorted(props))})")
    added = sorted(set(after) - set(before))
    print(f"update: {len(before)} resources before, {len(added)} added, {len(removed)} removed, {len(changed)} changed, {len(replaced)} replaced")
    for rid in changed:
        print(f"changed: {rid}")
    for what in removed:
        print(f"FAILED: {what} is removed")
    for what in replaced:
        print(f"FAILED: {what} is replaced")
    sys.exit(1 if removed or replaced else 0)


def put_code(session, endpoint):
    """The code every function of a template handed to moto runs (see `for_moto`)."""
    s3 = session.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="deploy-check")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("bootstrap", "")
    s3.put_object(Bucket="deploy-check", Key="code.zip", Body=code.getvalue())


def main():
    # SAM's translator fills the pseudo parameters from the session's region.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    template = yaml.safe_load(open(sys.argv[1]))
    # AGENTS=N: the template with N agents in its list, to see how far one stack goes.
    if os.environ.get("AGENTS"):
        template = with_agents(template, int(os.environ["AGENTS"]))
    session = boto3.session.Session(aws_access_key_id="deploy-check", aws_secret_access_key="local", region_name="us-east-1")
    endpoint = os.environ.get("MOTO_URL")
    if endpoint:
        put_code(session, endpoint)
        cloudformation = session.client("cloudformation", endpoint_url=endpoint)
    # The metric names the functions emit (shared/engine/src/metrics.rs), from the test.
    own_metrics = set(filter(None, os.environ.get("STACK_METRICS", "").split(",")))
    failed = False
    if not own_metrics:
        print("FAILED: STACK_METRICS (the functions' metric names) is not set")
        failed = True
    try:
        loop, agents = agent_loop(template)
        documented = choices(template)
    except Exception as e:
        print(f"FAILED: {e}")
        documented, failed = {}, True
    if endpoint and not os.environ.get("AGENTS"):
        print("packaging: sam build (the compile step replaced) and sam package into a bucket on moto")
        for p in check_packaging(sys.argv[1], template, session, endpoint):
            print(f"FAILED: {p}")
            failed = True
        for p in play_lifecycle(template, session, endpoint):
            print(f"FAILED: {p}")
            failed = True
        looped = expand_loops(template, {})
        for p in check_non_guided_deploy(expand(looped, {}), Choice(looped, {}), session, endpoint):
            print(f"FAILED: {p}")
            failed = True
    if (endpoint and not os.environ.get("AGENTS")) or os.environ.get("SAMCONFIG"):
        looped = expand_loops(template, {})
        for p in play_failed_first_create(expand(looped, {}), Choice(looped, {}), session):
            print(f"FAILED: {p}")
            failed = True
    try:
        for p in check_samconfig(expand(expand_loops(template, {}), {})):
            print(f"FAILED: {p}")
            failed = True
    except Exception as e:
        print(f"FAILED: samconfig.toml: {e}")
        failed = True
    for n, (choice_name, overrides) in enumerate(documented.items()):
        print(f"== {choice_name}: {json.dumps(overrides) if overrides else 'the defaults'}")
        problems = check_rules(template)
        try:
            looped = expand_loops(template, overrides)
        except Exception as e:  # SAM CLI's own refusal, with its reasons
            print(f"FAILED: SAM CLI's language extensions refused the template: {e}")
            failed = True
            continue
        made = sorted(set(looped["Resources"]) - set(template["Resources"]))
        print(f"loops: {loop} made {len(made)} resources for {', '.join(agents)}")
        choice = Choice(looped, overrides)
        try:
            expanded = expand(looped, overrides)
        except Exception as e:  # SAM's own refusal, with its reasons
            print(f"FAILED: SAM's translator refused the template: {e}")
            failed = True
            continue
        problems += check_reservations(expanded)
        grant_problems, read = check_grants(expanded, choice)
        problems += grant_problems
        problems += check_visibility(expanded, choice)
        problems += check_pollers(expanded, choice)
        problems += check_dashboards(expanded, choice, own_metrics)
        problems += check_retention(expanded, choice)
        problems += check_limits(expanded, choice)
        problems += check_environments(expanded, choice)
        problems += check_kept(expanded, choice)
        problems += check_vended_logs(expanded, choice)
        problems += check_buckets(expanded, choice)
        problems += check_rule_targets(expanded, choice)
        problems += check_ok_actions(expanded)
        resources = expanded["Resources"]
        expected = {rid for rid, r in resources.items() if not r.get("Condition") or choice.holds(r["Condition"])}
        print(f"expanded: {len(resources)} resources, {len(expected)} of them in this choice")
        print(f"grants: {sum(read.values())} statements read ({', '.join(f'{k} {v}' for k, v in sorted(read.items()))})")
        if endpoint:
            try:
                status, failures, created = create(cloudformation, f"deploy-check-{n}", expanded, overrides, choice)
            except Exception as e:
                status, failures, created = f"refused ({e})", [], set()
            skipped = sorted(expected - created)
            kinds = sorted({resources[rid]["Type"] for rid in skipped})
            print(f"moto: {status}, {len(created & expected)} of {len(expected)} created; not created by moto: {len(skipped)} ({', '.join(kinds) or 'none'})")
            if status != "CREATE_COMPLETE":
                problems.append(f"moto's CloudFormation ended {status}: {'; '.join(failures[:5])}")
        for p in problems:
            print(f"FAILED: {p}")
        failed |= bool(problems)
        if not problems:
            print("checks: rules, reservations, grants, visibility timeouts, pollers, dashboards, retention, limits, environments, kept names, vended logs, buckets, rule targets, alarms' OK actions: all hold")
    print("deploy check: " + ("FAILED" if failed else "passed"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        main()
