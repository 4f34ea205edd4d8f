//! The workflow files of the repository against the template: every file loads (an error names
//! the file, the field and what to do), every agent a step names is deployed, and every
//! deployed agent is used by some workflow. `check-workflows` runs it for a workflow's author
//! before a build; the suite runs it on every change; the functions check again at cold start.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use sas_aws::settings::load_workflow;
use sas_engine::AgentName;
use serde_json::Value;

use crate::Error;
use crate::emulation::functions::functions;
use crate::emulation::provision::{Options, dry_run};
use crate::emulation::template::Template;

/// A workflow file as read from disk.
#[derive(Clone, Debug)]
pub struct Source {
    pub path: String,
    pub json: String,
}

impl Source {
    /// Every `*.json` file of `dir`, in order of name.
    pub fn all_in(dir: &Path) -> std::io::Result<Vec<Source>> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths.iter().map(|p| Source::read(p)).collect()
    }

    pub fn read(path: &Path) -> std::io::Result<Source> {
        Ok(Source { path: path.display().to_string(), json: std::fs::read_to_string(path)? })
    }

    /// The file's name without `.json`: the name its workflow must have.
    fn name(&self) -> &str {
        let file = self.path.rsplit('/').next().unwrap_or(&self.path);
        file.strip_suffix(".json").unwrap_or(file)
    }
}

/// The agents the template deploys at its defaults: each agent function's `AGENT_NAME`.
pub fn deployed_agents(template: &Template) -> Result<Vec<AgentName>, Error> {
    let options = Options {
        stack_name: "check".into(),
        region: "us-east-1".into(),
        parameters: HashMap::new(),
        // The simulated service's URL is only known once it runs; any stands in for it.
        attributes: HashMap::from([(
            ("RemoteSimFunctionUrl".into(), "FunctionUrl".into()),
            Value::String("http://127.0.0.1/".into()),
        )]),
    };
    let stack = dry_run(template, &options)?;
    let names: BTreeSet<String> = functions(template, &stack)?
        .into_iter()
        .filter_map(|f| f.environment.get("AGENT_NAME").cloned())
        .collect();
    Ok(names.iter().map(AgentName::new).collect())
}

/// What is wrong with `sources` against the deployed `agents`, one line each; empty if nothing.
pub fn problems(sources: &[Source], agents: &[AgentName]) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut used = BTreeSet::new();
    if sources.is_empty() {
        wrong.push("no workflow file: a stack needs one in shared/workflows/".to_owned());
    }
    let mut loaded = Vec::new();
    for source in sources {
        match load_workflow(&source.path, source.name(), &source.json, agents) {
            Ok(workflow) => {
                used.extend(workflow.agents().into_iter().cloned());
                loaded.push((source, workflow));
            }
            // The message starts with the file, as a compiler's does.
            Err(sas_engine::Error::InvalidWorkflow(why)) => wrong.push(why),
            Err(e) => wrong.push(format!("{}: {e}", source.path)),
        }
    }
    // A version kept for the orders that started on it is older than the one new orders take.
    for (source, kept) in loaded.iter().filter(|(s, w)| s.name() != w.name()) {
        let current = loaded.iter().find(|(s, w)| s.name() == w.name() && w.name() == kept.name());
        match current {
            None => wrong.push(format!(
                "{}: keeps version {} of {}, but there is no {}.json with the version new orders take",
                source.path,
                kept.version(),
                kept.name(),
                kept.name()
            )),
            Some((current_source, current)) if current.version() <= kept.version() => {
                wrong.push(format!(
                    "{}: keeps version {} of {}, which is not older than the version {} of {}: give the current file a higher version",
                    source.path,
                    kept.version(),
                    kept.name(),
                    current.version(),
                    current_source.path
                ))
            }
            Some(_) => {}
        }
    }
    // An agent nobody uses still costs its function, queues and alarms, and usually means a
    // step was renamed in one place only.
    if wrong.is_empty() {
        for agent in agents.iter().filter(|a| !used.contains(*a)) {
            wrong.push(format!(
                "agent {:?} is deployed by template.yaml but no workflow uses it: give a step to it, or take it out of the template",
                agent.as_str()
            ));
        }
    }
    wrong
}

/// What an event on the bus starts, as the scheduler will decide it: for each workflow whose
/// start matches it (once per workflow), the order it starts, or why its input is refused (the
/// event then ends in the scheduler's dead-letter queue, and no order is made).
pub fn started_by(
    catalogue: &sas_engine::catalogue::Catalogue,
    event: &Value,
) -> Vec<(String, Result<sas_engine::OrderId, String>)> {
    use sas_engine::starts::{Start, event_key};
    let id = event["id"].as_str().unwrap_or_default();
    let mut started: Vec<(String, Result<sas_engine::OrderId, String>)> = Vec::new();
    for declared in catalogue.starts() {
        let Start::Event { pattern, input } = &declared.start else { continue };
        if !pattern.matches(event) || started.iter().any(|(w, _)| *w == declared.workflow) {
            continue;
        }
        let body = event.pointer(input).cloned().unwrap_or(Value::Null);
        let refused = catalogue
            .current(&declared.workflow)
            .map(|w| w.input(body.to_string().as_bytes()))
            .and_then(Result::err);
        let key = sas_engine::IdempotencyKey::parse(&event_key(&declared.workflow, id));
        let outcome = match (refused, key) {
            (Some(rejection), _) => Err(format!("its input is refused: {rejection}")),
            (None, Err(e)) => Err(format!("the event's id makes no key: {e}")),
            (None, Ok(key)) => {
                Ok(sas_engine::OrderId::for_owner_key(&sas_engine::Owner::starts(), &key))
            }
        };
        started.push((declared.workflow.clone(), outcome));
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulation::emulator::workspace_root;

    fn template() -> Template {
        Template::load(&workspace_root().join("template.yaml")).unwrap()
    }

    #[test]
    fn the_repository_s_workflows_fit_the_template() {
        let agents = deployed_agents(&template()).unwrap();
        assert!(!agents.is_empty(), "the template deploys no agent");
        let sources = Source::all_in(&workspace_root().join("shared/workflows")).unwrap();
        assert_eq!(
            sources.len(),
            sas_workflows::FILES.len(),
            "the built-in files are the folder's"
        );
        assert_eq!(problems(&sources, &agents), Vec::<String>::new());
    }

    #[test]
    fn an_event_starts_an_order_only_where_its_input_is_taken() {
        let catalogue = sas_aws::settings::built_in_catalogue().unwrap();
        let signed_up = |detail: Value| {
            serde_json::json!({"id": "ev-1", "source": "shop.web",
                               "detail-type": "CustomerSignedUp", "detail": detail})
        };
        let good = signed_up(serde_json::json!({
            "customer": {"name": "Ada", "email": "ada@example.com"}, "plan": "basic"}));
        let started = started_by(&catalogue, &good);
        assert_eq!(started.len(), 1, "{started:?}");
        assert_eq!(started[0].0, "account-opening");
        assert!(started[0].1.is_ok(), "{started:?}");
        // The same event, its input refused: no order is named.
        let refused = started_by(&catalogue, &signed_up(serde_json::json!({"plan": "basic"})));
        let why = refused[0].1.as_ref().unwrap_err();
        assert!(why.contains("its input is refused") && why.contains("customer"), "{why}");
        let other = serde_json::json!({"id": "ev-2", "source": "billing", "detail-type": "X"});
        assert!(started_by(&catalogue, &other).is_empty());
    }

    #[test]
    fn a_wrong_file_or_an_unused_agent_is_named_with_what_to_do() {
        let agents = ["inventory", "payment", "shipping"].map(AgentName::new);
        let source = |path: &str, json: &str| Source { path: path.into(), json: json.into() };
        let broken = source(
            "shared/workflows/w.json",
            r#"{"name":"w","steps":[{"name":"a","agent":"payment","budget_seconds":-1}]}"#,
        );
        let wrong = problems(&[broken], &agents);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(
            wrong[0].starts_with("shared/workflows/w.json: steps[0].budget_seconds: "),
            "{wrong:?}"
        );

        let partial = source(
            "shared/workflows/w.json",
            r#"{"name":"w","steps":[{"name":"a","agent":"payment"}]}"#,
        );
        let wrong = problems(&[partial], &agents);
        assert_eq!(wrong.len(), 2, "{wrong:?}");
        assert!(
            wrong[0].contains(
                "agent \"inventory\" is deployed by template.yaml but no workflow uses it"
            )
        );
        assert!(problems(&[], &agents)[0].contains("no workflow file"));

        let keyed = source(
            "shared/workflows/w.json",
            r#"{"name":"w","steps":[{"name":"a","agent":"payment"}],
                "input_schema":{"type":"object","properties":{"customer_id":{"type":"string"}}},
                "concurrency":{"key":"/input/customer_id","limit":1}}"#,
        );
        assert_eq!(problems(&[keyed], &[AgentName::new("payment")]), Vec::<String>::new());
    }
}

#[cfg(test)]
mod versions {
    use super::*;

    fn source(path: &str, json: &str) -> Source {
        Source { path: path.into(), json: json.into() }
    }

    fn workflow(version: u32) -> String {
        format!(r#"{{"name":"w","version":{version},"steps":[{{"name":"a","agent":"payment"}}]}}"#)
    }

    #[test]
    fn a_kept_version_must_be_older_than_the_current_one_and_have_one() {
        let agents = [AgentName::new("payment")];
        let current = source("shared/workflows/w.json", &workflow(2));
        let kept = source("shared/workflows/w.v1.json", &workflow(1));
        assert_eq!(problems(&[current.clone(), kept.clone()], &agents), Vec::<String>::new());
        let newer = source("shared/workflows/w.v3.json", &workflow(3));
        let wrong = problems(&[current, newer], &agents);
        assert!(
            wrong[0].contains("w.v3.json: keeps version 3 of w, which is not older"),
            "{wrong:?}"
        );
        let wrong = problems(&[kept], &agents);
        assert!(wrong[0].contains("but there is no w.json"), "{wrong:?}");
    }
}
