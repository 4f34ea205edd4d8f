//! What `sam local invoke` and `sam local start-api` need to run the functions against a
//! running local stack: an `--env-vars` file. SAM CLI gives a function only the variables the
//! template declares for it, each overridden by the file if the file names it; so the file gives
//! every declared variable the value the local stack gives it: resources by their local names,
//! the simulated service's URL, and the AWS endpoint (the stack's proxy).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::Error;
use crate::emulation::local::LocalStack;
use crate::emulation::template::Template;

/// The variable that points the SDK at another endpoint; the template declares it for this.
pub const ENDPOINT_VARIABLE: &str = "AWS_ENDPOINT_URL";

/// The names of the variables `template` declares for each function (globals included),
/// whatever their conditions: the ones SAM CLI lets a file override.
pub fn declared_variables(template: &Template) -> BTreeMap<String, Vec<String>> {
    let names = |environment: Option<&Value>| -> Vec<String> {
        environment
            .and_then(|e| e.pointer("/Variables"))
            .and_then(Value::as_object)
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default()
    };
    let globals = names(template.globals.pointer("/Function/Environment"));
    template
        .of_kind("AWS::Serverless::Function")
        .map(|(id, resource)| {
            let mut all = globals.clone();
            all.extend(names(resource.properties.get("Environment")));
            all.sort();
            all.dedup();
            (id.to_owned(), all)
        })
        .collect()
}

/// The `--env-vars` document for `stack`: `{ "<FunctionLogicalId>": { "NAME": "value" } }`,
/// every variable declared in `template` that the local stack sets for that function.
pub fn env_vars(template: &Template, stack: &LocalStack) -> Value {
    let declared = declared_variables(template);
    let mut document = serde_json::Map::new();
    for f in &stack.functions {
        let Some(names) = declared.get(&f.spec.logical_id) else { continue };
        let mut variables = serde_json::Map::new();
        for name in names {
            let value = if name == ENDPOINT_VARIABLE {
                Some(stack.endpoint.clone())
            } else {
                f.spec.environment.get(name).cloned()
            };
            if let Some(value) = value {
                variables.insert(name.clone(), Value::String(value));
            }
        }
        document.insert(f.spec.logical_id.clone(), Value::Object(variables));
    }
    Value::Object(document)
}

/// Writes [`env_vars`] to `path`.
pub fn write_env_vars(template_path: &Path, stack: &LocalStack, path: &Path) -> Result<(), Error> {
    let template = Template::load(template_path)?;
    let text = serde_json::to_string_pretty(&env_vars(&template, stack))
        .map_err(|e| Error::Local(format!("env vars: {e}")))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| Error::Local(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_declared_for_every_function_and_the_rest_is_their_own() {
        let template = crate::emulation::provision::project_template();
        let declared = declared_variables(&template);
        // The six functions of the stack, and one per agent.
        let agents = crate::tools::workflows::deployed_agents(&template).unwrap();
        assert_eq!(declared.len(), 6 + agents.len(), "{declared:?}");
        for (function, names) in &declared {
            assert!(names.iter().any(|n| n == ENDPOINT_VARIABLE), "{function}: {names:?}");
        }
        assert!(declared["SchedulerFunction"].iter().any(|n| n == "STATE_TABLE"));
        assert!(!declared["RemoteSimFunction"].iter().any(|n| n == "STATE_TABLE"));
    }
}
