"""What `sam local` makes of the template, worked out with SAM CLI's own code, which needs no
Docker for this part. Prints JSON.

    sam_local.py env TEMPLATE ENV_VARS_FILE   the environment `sam local invoke --env-vars`
                                              gives each function (and the names it declares)
    sam_local.py routes TEMPLATE              the routes `sam local start-api` serves
    sam_local.py expand TEMPLATE STACK        the template with its `Fn::ForEach` loops
                                              expanded by SAM CLI's language extensions
"""

import json
import sys

from samcli.commands.local.lib.local_lambda import LocalLambdaRunner
from samcli.lib.cfn_language_extensions.api import process_template
from samcli.lib.cfn_language_extensions.models import PseudoParameterValues
from samcli.lib.providers.api_provider import ApiProvider
from samcli.lib.providers.sam_function_provider import SamFunctionProvider
from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider

# The credentials and region of the shell `sam local` would run in.
SHELL_CREDENTIALS = {"region": "us-east-1", "key": "sam-local", "secret": "local"}


class Invoker:
    """What LocalLambdaRunner's environment code reads of its runner."""

    def __init__(self, env_vars):
        self.env_vars_values = env_vars

    def get_aws_creds(self):
        return dict(SHELL_CREDENTIALS)

    def is_debugging(self):
        return False


def environments(template, env_vars_path):
    stacks, _ = SamLocalStackProvider.get_stacks(template)
    provider = SamFunctionProvider(stacks, ignore_code_extraction_warnings=True)
    with open(env_vars_path) as f:
        invoker = Invoker(json.load(f))
    out = {}
    for function in provider.get_all():
        variables = (function.environment or {}).get("Variables", {})
        env = LocalLambdaRunner._make_env_vars(invoker, function).resolve()
        out[function.name] = {"declared": sorted(variables), "environment": env}
    return out


def routes(template):
    stacks, _ = SamLocalStackProvider.get_stacks(template)
    out = []
    for api in ApiProvider(stacks).get_all():
        for route in api.routes:
            for method in sorted(set(route.methods)):
                out.append(
                    {
                        "function": route.function_name,
                        "route": f"{method} {route.path}",
                        "payload": route.payload_format_version,
                    }
                )
    return sorted(out, key=lambda r: r["route"])


def expand(template, stack_name):
    with open(template) as f:
        parsed = json.load(f)
    pseudo = PseudoParameterValues(
        region="us-east-1", account_id="123456789012", stack_name=stack_name
    )
    return process_template(parsed, pseudo_parameters=pseudo)


if __name__ == "__main__":
    command, template, *rest = sys.argv[1:]
    if command == "env":
        result = environments(template, rest[0])
    elif command == "routes":
        result = routes(template)
    elif command == "expand":
        result = expand(template, rest[0])
    else:
        sys.exit(f"unknown command {command}")
    json.dump(result, sys.stdout, indent=1, default=str)
