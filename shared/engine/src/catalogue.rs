//! The workflows a stack runs: every version of every workflow deployed with it. New orders
//! take a workflow's newest version; an order keeps the version it started on to its end, its
//! compensation, its cancellation and its redrive, for as long as that version is deployed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ids::AgentName;
use crate::starts::Declared;
use crate::state::StateRecord;
use crate::workflow::{Inline, Work, Workflow};

/// The workflow an order names when it names none, if the stack runs it: the reference
/// workflow, whose clients predate the choice.
pub const REFERENCE_WORKFLOW: &str = "order-fulfilment";

#[derive(Clone, Debug)]
pub struct Catalogue {
    workflows: Vec<Arc<Workflow>>,
}

/// What a step over a list of `name` (at `version`, or the newest) runs inline, if the child
/// it would start is one call of an agent: in the version a pass starting now runs, and in
/// every other version such a pass may have started on.
fn inline_of(workflows: &[Workflow], name: &str, version: Option<u32>) -> Option<Inline> {
    let of_name = || workflows.iter().filter(move |w| w.name() == name);
    let runs = version.or_else(|| of_name().map(Workflow::version).max())?;
    let steps: BTreeMap<u32, crate::workflow::Step> = of_name()
        .filter(|w| version.is_none_or(|v| w.version() == v))
        .filter_map(|w| Some((w.version(), w.inline_step()?.clone())))
        .collect();
    steps.contains_key(&runs).then_some(Inline { version: runs, steps })
}

impl Catalogue {
    /// The catalogue of `workflows`; two with one name and version are an error.
    pub fn new(workflows: Vec<Workflow>) -> Result<Catalogue> {
        if workflows.is_empty() {
            return Err(Error::InvalidWorkflow("a stack runs at least one workflow".into()));
        }
        for (i, w) in workflows.iter().enumerate() {
            if workflows[..i].iter().any(|o| o.name() == w.name() && o.version() == w.version()) {
                return Err(Error::InvalidWorkflow(format!(
                    "{} version {} is defined twice",
                    w.name(),
                    w.version()
                )));
            }
        }
        let mut workflows = workflows;
        let inline: Vec<(usize, usize, Inline)> = workflows
            .iter()
            .enumerate()
            .flat_map(|(w, workflow)| {
                workflow.steps().iter().enumerate().filter_map(move |(s, step)| match &step.work {
                    Work::Child(c) if c.fan.is_some_and(|f| !f.as_orders) => {
                        Some((w, s, c.workflow.clone(), c.version))
                    }
                    _ => None,
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|(w, s, name, version)| {
                Some((w, s, inline_of(&workflows, &name, version)?))
            })
            .collect();
        for (w, s, inline) in inline {
            workflows[w].run_inline(s, inline);
        }
        let out: Vec<Arc<Workflow>> = workflows.into_iter().map(Arc::new).collect();
        let catalogue = Catalogue { workflows: out };
        catalogue.check_children()?;
        catalogue.check_groups()?;
        Ok(catalogue)
    }

    /// Workflows that share their concurrency keys (one `group`) agree on how many orders of a
    /// key may run at once: the newest version of each, which new orders take.
    fn check_groups(&self) -> Result<()> {
        let mut limits: BTreeMap<&str, (&str, u32)> = BTreeMap::new();
        for name in self.names() {
            let Some(c) = self.current(name).and_then(|w| w.concurrency()) else { continue };
            let (first, limit) = *limits.entry(c.group.as_str()).or_insert((name, c.limit));
            if limit != c.limit {
                return Err(Error::InvalidWorkflow(format!(
                    "{name} and {first} share the concurrency group {:?} with limits {} and {limit}: one key has one limit",
                    c.group, c.limit
                )));
            }
        }
        Ok(())
    }

    /// Every child step names a workflow (and version) the stack runs, and no workflow starts
    /// itself, directly or through its children: each such order would start another forever.
    fn check_children(&self) -> Result<()> {
        let children = |w: &Workflow| -> Vec<(String, String, Option<u32>)> {
            w.steps()
                .iter()
                .filter_map(|s| match &s.work {
                    Work::Child(c) => Some((s.name.clone(), c.workflow.clone(), c.version)),
                    _ => None,
                })
                .collect()
        };
        for w in &self.workflows {
            for (step, name, version) in children(w) {
                let found = match version {
                    Some(v) => self.version(&name, v).is_some(),
                    None => self.current(&name).is_some(),
                };
                if !found {
                    let version = version.map_or(String::new(), |v| format!(" version {v}"));
                    return Err(Error::InvalidWorkflow(format!(
                        "{} step {step:?} starts {name}{version}, which the stack does not run",
                        w.name()
                    )));
                }
            }
        }
        // Depth-first over the names: a name met again on its own path is a cycle.
        fn visit<'a>(
            catalogue: &'a Catalogue,
            name: &'a str,
            path: &mut Vec<&'a str>,
        ) -> Result<()> {
            if let Some(at) = path.iter().position(|p| *p == name) {
                let cycle = path[at..].join(" -> ");
                return Err(Error::InvalidWorkflow(format!(
                    "{cycle} -> {name}: a workflow would start itself through its children"
                )));
            }
            path.push(name);
            for w in catalogue.workflows.iter().filter(|w| w.name() == name) {
                for s in w.steps() {
                    if let Work::Child(c) = &s.work {
                        visit(catalogue, &c.workflow, path)?;
                    }
                }
            }
            path.pop();
            Ok(())
        }
        for w in &self.workflows {
            visit(self, w.name(), &mut Vec::new())?;
        }
        Ok(())
    }

    /// A catalogue of one workflow.
    pub fn single(workflow: Workflow) -> Catalogue {
        Catalogue { workflows: vec![Arc::new(workflow)] }
    }

    /// Every workflow, every version.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Workflow>> {
        self.workflows.iter()
    }

    /// The newest version of the workflow `name`: what a new order takes.
    pub fn current(&self, name: &str) -> Option<&Arc<Workflow>> {
        self.workflows.iter().filter(|w| w.name() == name).max_by_key(|w| w.version())
    }

    /// The workflow an order names, or the default one when it names none: the reference
    /// workflow if the stack runs it, else the stack's only workflow. An error says which
    /// names a request may use.
    pub fn for_new_order(&self, name: Option<&str>) -> std::result::Result<&Arc<Workflow>, String> {
        let names = self.names();
        let found = match name {
            Some(name) => self.current(name),
            None => self.current(REFERENCE_WORKFLOW).or(match names.as_slice() {
                [only] => self.current(only),
                _ => None,
            }),
        };
        found.ok_or_else(|| match name {
            Some(name) => format!("no workflow {name:?}: name one of {}", names.join(", ")),
            None => format!("name the order's workflow: one of {}", names.join(", ")),
        })
    }

    /// The version of its workflow an order started on.
    pub fn version(&self, name: &str, version: u32) -> Option<&Arc<Workflow>> {
        self.workflows.iter().find(|w| w.name() == name && w.version() == version)
    }

    /// The workflow `record` runs; an error if this deployment no longer has its version.
    pub fn of(&self, record: &StateRecord) -> Result<&Arc<Workflow>> {
        self.version(&record.workflow, record.workflow_version).ok_or_else(|| Error::WorkflowGone {
            order_id: record.order_id,
            workflow: record.workflow.clone(),
            version: record.workflow_version,
        })
    }

    /// The starts each workflow declares (as its newest version does), to make its orders
    /// without a client.
    pub fn starts(&self) -> Vec<Declared> {
        let mut declared = Vec::new();
        for name in self.names() {
            let Some(workflow) = self.current(name) else { continue };
            for (index, start) in workflow.starts().iter().enumerate() {
                let start = start.clone();
                declared.push(Declared { workflow: name.to_owned(), index, start });
            }
        }
        declared
    }

    /// The workflows' names, each once, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.workflows.iter().map(|w| w.name()).collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Every agent any version of any workflow uses, each once, in order of first use.
    pub fn agents(&self) -> Vec<AgentName> {
        let mut agents: Vec<AgentName> = Vec::new();
        for agent in self.workflows.iter().flat_map(|w| w.agents()) {
            if !agents.contains(agent) {
                agents.push(agent.clone());
            }
        }
        agents
    }

    /// Every action any version of any workflow asks of each agent (its steps' and their
    /// undos'), by agent, each once, sorted: what of a service can be held.
    pub fn actions(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut actions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for step in self.workflows.iter().flat_map(|w| w.steps()) {
            let Some(agent) = step.agent() else { continue };
            let of = actions.entry(agent.as_str().to_owned()).or_default();
            of.insert(step.name.clone());
            of.extend(step.compensation.as_ref().map(|c| c.action.clone()));
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(name: &str, version: u32, agent: &str) -> Workflow {
        let json = format!(
            r#"{{"name":"{name}","version":{version},"steps":[{{"name":"a","agent":"{agent}"}}]}}"#
        );
        Workflow::from_json(&json, &[AgentName::new(agent)]).unwrap()
    }

    fn keyed(name: &str, group: &str, limit: u32) -> Workflow {
        let json = serde_json::json!({"name": name, "steps": [{"name": "a", "agent": "payment"}],
            "input_schema": {"type": "object", "properties": {"customer_id": {"type": "string"}}},
            "concurrency": {"key": "/input/customer_id", "limit": limit, "group": group}});
        Workflow::from_json(&json.to_string(), &[AgentName::new("payment")]).unwrap()
    }

    #[test]
    fn workflows_sharing_their_keys_must_give_one_limit() {
        let same = Catalogue::new(vec![keyed("a", "customer", 2), keyed("b", "customer", 2)]);
        assert!(same.is_ok());
        let apart = Catalogue::new(vec![keyed("a", "customer", 1), keyed("b", "other", 2)]);
        assert!(apart.is_ok());
        let err = Catalogue::new(vec![keyed("a", "customer", 1), keyed("b", "customer", 2)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("share the concurrency group \"customer\""), "{err}");
    }

    #[test]
    fn new_orders_take_the_newest_version_and_old_ones_keep_theirs() {
        let c = Catalogue::new(vec![
            workflow("order-fulfilment", 1, "payment"),
            workflow("order-fulfilment", 2, "shipping"),
            workflow("account-opening", 1, "ledger"),
        ])
        .unwrap();
        assert_eq!(c.for_new_order(None).unwrap().version(), 2);
        assert_eq!(c.for_new_order(Some("account-opening")).unwrap().name(), "account-opening");
        assert_eq!(c.version("order-fulfilment", 1).unwrap().agents()[0].as_str(), "payment");
        assert_eq!(c.names(), ["account-opening", "order-fulfilment"]);
        assert_eq!(c.agents().len(), 3);
        let unknown = c.for_new_order(Some("x")).unwrap_err();
        assert!(unknown.contains("account-opening, order-fulfilment"), "{unknown}");
    }

    #[test]
    fn without_the_reference_workflow_an_order_must_name_one_of_several() {
        let one = Catalogue::new(vec![workflow("account-opening", 1, "ledger")]).unwrap();
        assert_eq!(one.for_new_order(None).unwrap().name(), "account-opening");
        let two = Catalogue::new(vec![
            workflow("account-opening", 1, "ledger"),
            workflow("trip", 1, "hotel"),
        ])
        .unwrap();
        assert!(two.for_new_order(None).unwrap_err().contains("name the order's workflow"));
        let twice = Catalogue::new(vec![workflow("trip", 1, "hotel"), workflow("trip", 1, "car")]);
        assert!(twice.unwrap_err().to_string().contains("trip version 1 is defined twice"));
    }

    fn fan(name: &str, child: &str, version: Option<u32>) -> Workflow {
        let mut each = serde_json::json!({"workflow": child, "items": "/input/parcels", "max_concurrency": 10,
                "timeout_seconds": 600});
        if let Some(v) = version {
            each["version"] = v.into();
        }
        let json = serde_json::json!({"name": name, "steps": [{"name": "ship", "each": each}]});
        Workflow::from_json(&json.to_string(), &[]).unwrap()
    }

    fn inline_of<'a>(c: &'a Catalogue, name: &str) -> Option<&'a Inline> {
        match &c.current(name)?.step(0)?.work {
            Work::Child(child) => child.inline.as_ref(),
            _ => None,
        }
    }

    #[test]
    fn a_list_over_one_call_of_an_agent_runs_inline_in_every_version_a_pass_may_have_taken() {
        let two_steps = serde_json::json!({"name": "parcel", "version": 3, "steps": [
            {"name": "a", "agent": "shipping"}, {"name": "b", "agent": "shipping"}]});
        let two_steps = Workflow::from_json(&two_steps.to_string(), &[AgentName::new("shipping")]);
        let c = Catalogue::new(vec![
            workflow("parcel", 1, "shipping"),
            workflow("parcel", 2, "shipping"),
            fan("shipment", "parcel", None),
            fan("pinned", "parcel", Some(1)),
        ])
        .unwrap();
        let inline = inline_of(&c, "shipment").expect("runs inline");
        assert_eq!(inline.version, 2);
        assert_eq!(inline.steps.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(inline.step(1).unwrap().name, "a");
        let pinned = inline_of(&c, "pinned").expect("runs inline");
        assert_eq!((pinned.version, pinned.steps.len()), (1, 1));
        // A newest version of two steps runs as child orders; an older one that a pass may
        // have started on still runs inline to its end.
        let c = Catalogue::new(vec![
            workflow("parcel", 1, "shipping"),
            two_steps.unwrap(),
            fan("shipment", "parcel", None),
        ])
        .unwrap();
        assert!(inline_of(&c, "shipment").is_none());
    }

    #[test]
    fn a_child_with_a_key_or_a_reported_failure_runs_as_child_orders() {
        let reported = serde_json::json!({"name": "mail", "steps": [
            {"name": "send", "agent": "mailer", "on_failure": "report"}]});
        let reported = Workflow::from_json(&reported.to_string(), &[AgentName::new("mailer")]);
        let c = Catalogue::new(vec![
            keyed("keyed", "customer", 1),
            reported.unwrap(),
            fan("per-key", "keyed", None),
            fan("mailing", "mail", None),
        ])
        .unwrap();
        assert!(inline_of(&c, "per-key").is_none());
        assert!(inline_of(&c, "mailing").is_none());
    }
}
