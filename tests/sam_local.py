"""What `sam local` makes of the template, worked out with SAM CLI's own code, which needs no
Docker for this part. Prints JSON.

    sam_local.py env TEMPLATE ENV_VARS_FILE   the environment `sam local invoke --env-vars`
                                              gives each function (and the names it declares)
    sam_local.py routes TEMPLATE              the routes `sam local start-api` serves
    sam_local.py expand TEMPLATE STACK        the template with its `Fn::ForEach` loops
                                              expanded by SAM CLI's language extensions

`env` and `routes` go the way `sam local invoke --template TEMPLATE` and `sam local start-api
--template TEMPLATE` go: the command's own click options parse those arguments, taking what is
not given (`language_extensions` among it) from the samconfig.toml beside the template; SAM
CLI's `InvokeContext` is made of them as the command makes it, and reads the template into its
stacks (expanding the `Fn::ForEach` loops first when language extensions are on) and its
function provider. Only what needs Docker or AWS is left out: the containers and STS.
"""

import contextlib
import json
import os
import sys

import click
from samcli.cli.context import Context
from samcli.cli.main import cli as sam
from samcli.commands.exceptions import UserException
from samcli.commands.local.cli_common.invoke_context import InvokeContext
from samcli.commands.local.lib.local_lambda import LocalLambdaRunner
from samcli.commands.local.local import cli as local
from samcli.lib.cfn_language_extensions.api import process_template
from samcli.lib.cfn_language_extensions.models import PseudoParameterValues
from samcli.lib.providers.api_provider import ApiProvider

# The credentials and region of the shell `sam local` would run in.
SHELL = {
    "AWS_ACCESS_KEY_ID": "sam-local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    # No profile files: the variables above are all the shell has.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


class LocalContext(InvokeContext):
    """SAM CLI's context of the `sam local` commands, less what needs Docker or AWS."""

    def _add_account_id_to_global(self):
        # SAM CLI asks STS for the account id; none is asked here, so SAM CLI keeps its default
        # one, as when STS cannot be reached.
        pass

    @staticmethod
    def _get_container_manager(docker_network, skip_pull_image, shutdown):
        # Nothing is run in a container here (and no container is started on entry, as no
        # warm containers are asked for).
        return None


@contextlib.contextmanager
def local_context(command, args):
    """The `InvokeContext` that `sam local <command> ARGS` makes and enters (reading its stacks
    and its function provider), from the parameters the command's click options give it; and
    those parameters."""
    root = click.Context(sam, info_name="sam", obj=Context())
    with root:
        group = click.Context(local, info_name="local", parent=root)
        ctx = local.get_command(group, command).make_context(command, list(args), parent=group)
        params = ctx.params
        cli_context = ctx.find_object(Context)
    with open(params["template_file"]) as f:
        has_loops = "Fn::ForEach::" in f.read()
    if has_loops and not params["language_extensions"]:
        sys.exit(f"sam local {command} would not expand the loops: no samconfig.toml beside it?")
    with LocalContext(
        template_file=params["template_file"],
        env_vars_file=params["env_vars"],
        parameter_overrides=params["parameter_overrides"],
        layer_cache_basedir=params["layer_cache_basedir"],
        aws_region=cli_context.region,
        aws_profile=cli_context.profile,
        language_extensions=params["language_extensions"],
    ) as context:
        yield context, params


def environments(template, env_vars_path):
    os.environ.update(SHELL)
    args = ["--template", template, "--env-vars", env_vars_path]
    with local_context("invoke", args) as (context, _):
        # The runner `context.local_lambda_runner` makes, less its container runtime.
        runner = LocalLambdaRunner(
            local_runtime=None,
            function_provider=context._function_provider,
            cwd=context.get_cwd(),
            real_path=os.path.dirname(os.path.abspath(template)),
            aws_region=context._aws_region,
            aws_profile=context._aws_profile,
            env_vars_values=context._env_vars_value,
            debug_context=context._debug_context,
        )
        out = {}
        for function in context._function_provider.get_all():
            variables = (function.environment or {}).get("Variables", {})
            env = runner._make_env_vars(function).resolve()
            out[function.name] = {"declared": sorted(variables), "environment": env}
    return out


def routes(template):
    out = []
    with local_context("start-api", ["--template", template]) as (context, params):
        # As `LocalApiService` reads them from the context.
        provider = ApiProvider(
            context.stacks, cwd=context.get_cwd(), disable_authorizer=params["disable_authorizer"]
        )
    for api in provider.get_all():
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
    try:
        if command == "env":
            result = environments(template, rest[0])
        elif command == "routes":
            result = routes(template)
        elif command == "expand":
            result = expand(template, rest[0])
        else:
            sys.exit(f"unknown command {command}")
    except UserException as e:
        # What the command itself would stop with, as `Error: ...`.
        names = {"env": "sam local invoke", "routes": "sam local start-api"}
        sys.exit(f"{names.get(command, 'SAM CLI')} stops on {template}: Error: {e.message}")
    json.dump(result, sys.stdout, indent=1, default=str)
