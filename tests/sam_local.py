"""What `sam local` makes of the template, worked out with SAM CLI's own code, which needs no
Docker for this part. Prints JSON.

    sam_local.py env TEMPLATE ENV_VARS_FILE   the environment `sam local invoke --env-vars`
                                              gives each function (and the names it declares)
    sam_local.py routes TEMPLATE              the routes `sam local start-api` serves
    sam_local.py expand TEMPLATE STACK        the template with its `Fn::ForEach` loops
                                              expanded by SAM CLI's language extensions

`env` and `routes` read the template as `sam local invoke` and `sam local start-api` read it,
run from the template's folder: the `--language-extensions` flag is taken from the
`samconfig.toml` there (through SAM CLI's own config reader, as the commands' click options
take it), and the stacks come from SAM CLI's `InvokeContext`, which expands the template's
`Fn::ForEach` loops when that flag is on, before SAM's transform reads the functions and APIs.
"""

import json
import os
import sys

from samcli.cli.cli_config_file import ConfigProvider
from samcli.commands.local.cli_common.invoke_context import InvokeContext
from samcli.commands.local.lib.local_lambda import LocalLambdaRunner
from samcli.lib.cfn_language_extensions.api import process_template
from samcli.lib.cfn_language_extensions.models import PseudoParameterValues
from samcli.lib.config.samconfig import DEFAULT_ENV, SamConfig
from samcli.lib.providers.api_provider import ApiProvider
from samcli.lib.providers.sam_function_provider import SamFunctionProvider

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


class LocalContext(InvokeContext):
    """SAM CLI's context of `sam local invoke` and `sam local start-api`, but for the account id
    it asks STS for when it starts: here none is asked, as in a shell where STS cannot be
    reached, and SAM CLI keeps its default account id (it then warns of no current session)."""

    def _add_account_id_to_global(self):
        pass


def options(template, command):
    """The options `sam local <command>` takes from the samconfig.toml beside `template` (the
    default config env), as its `configuration_option` decorator reads them."""
    folder = os.path.dirname(os.path.abspath(template))
    config = os.path.join(folder, SamConfig.get_default_file(config_dir=folder))
    provider = ConfigProvider(section="parameters")
    return provider(config, DEFAULT_ENV, ["local", command])


def stacks(template, command):
    """The stacks `sam local <command> --template TEMPLATE` works on."""
    flag = options(template, command).get("language_extensions")
    context = LocalContext(template_file=template, language_extensions=flag)
    if not context.language_extensions_enabled:
        sys.exit(f"sam local {command} would not expand the template's language extensions")
    return context._get_stacks()


def environments(template, env_vars_path):
    provider = SamFunctionProvider(stacks(template, "invoke"), ignore_code_extraction_warnings=True)
    invoker = Invoker(InvokeContext._get_env_vars_value(env_vars_path))
    out = {}
    for function in provider.get_all():
        variables = (function.environment or {}).get("Variables", {})
        env = LocalLambdaRunner._make_env_vars(invoker, function).resolve()
        out[function.name] = {"declared": sorted(variables), "environment": env}
    return out


def routes(template):
    out = []
    for api in ApiProvider(stacks(template, "start-api")).get_all():
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
