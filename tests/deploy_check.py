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
  printed as throttled at times, which delays messages and fails none.

Then the expanded template is created in moto's CloudFormation (at `MOTO_URL`), and what moto
did not create is listed: moto skips several resource types, so the creation checks the wiring
(references, conditions, the parameters), not a deploy.

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


def choices(template):
    """The defaults, and each choice the README documents. The agents are the entries of the
    template's agent loop, so an agent added there is covered without a change here."""
    _, agents = agent_loop(template)
    own_urls = {"ServiceUrls": ",".join(f"{a}=https://{a}.example.com" for a in agents)}
    secrets = dict(own_urls)
    secrets["ServiceAuth"] = ",".join(f"{a}={['BEARER', 'API_KEY'][n % 2]}" for n, a in enumerate(agents))
    return {
        "defaults": {},
        "ApiAuth JWT": {"ApiAuth": "JWT", "JwtIssuer": "https://issuer.example.com", "JwtAudience": "orders"},
        "ApiAuth NONE": {"ApiAuth": "NONE"},
        "own service URLs": own_urls,
        "secrets": secrets,
        "lean and reserved": {
            "CreateDashboard": "false",
            "KeepOrdersOnDelete": "false",
            "RemoteSimReservedConcurrency": "true",
            "SchedulerBatchingWindowSeconds": "10",
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
        for arn in props.get("ManagedPolicyArns", []):
            problems.append(f"{rid} has the managed policy {json.dumps(arn)}: its grants are not the stack's to scope")
        roles = {"AWS::IAM::RolePolicy": [props.get("RoleName")], "AWS::IAM::Policy": props.get("Roles", [])}.get(r["Type"], [])
        for role in roles:
            if not names_role_of_stack(role, expanded, choice):
                problems.append(f"{rid} grants to the role {json.dumps(role)}, which is not a role of the stack")
        for other in ("Users", "Groups"):
            if props.get(other):
                problems.append(f"{rid} grants to {other.lower()} {json.dumps(props[other])}, which are not the stack's")
        documents = [p.get("PolicyDocument", {}) for p in props.get("Policies", [])]
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
        s3 = session.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="deploy-check")
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as z:
            z.writestr("bootstrap", "")
        s3.put_object(Bucket="deploy-check", Key="code.zip", Body=code.getvalue())
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
            print("checks: rules, reservations, grants, visibility timeouts, pollers, dashboards, retention, limits: all hold")
    print("deploy check: " + ("FAILED" if failed else "passed"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        main()
