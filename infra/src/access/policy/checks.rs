//! The live check of every request a function signs, what it records, and its report: the
//! denials, and the grants no request used.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::PROXY_SERVICES;
use super::needs::{Unmapped, needs, operation};
use super::read::Policies;
use super::verdict::{Decision, Effect, GrantId, Need, Origin};
use super::wire::AwsRequest;
use crate::emulation::template::LOCAL_ACCOUNT;

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// No statement allows it.
    NoAllow,
    /// A `Deny` statement refuses it.
    ExplicitDeny,
    /// The checker cannot tell what the request needs (default deny), and why.
    Unmapped(String),
}

/// A request a function's policy did not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// The function's logical id.
    pub function: String,
    /// The API operation (`TransactWriteItems`).
    pub operation: String,
    /// The first need that was not allowed.
    pub action: String,
    pub resource: String,
    /// The partition keys of the items it touched, for a DynamoDB request of one item (of the
    /// first request refused so): IAM's message does not give them, the report does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leading_keys: Option<Vec<String>>,
    pub cause: Cause,
    /// How many requests were refused so (in the records of [`Access`]).
    pub count: u64,
}

impl Denial {
    /// The role session a function's calls are made as on AWS (SAM names the role after the
    /// function).
    pub fn principal(&self) -> String {
        let f = &self.function;
        format!("arn:aws:sts::{LOCAL_ACCOUNT}:assumed-role/{f}Role/{f}")
    }

    /// The message AWS gives with its `AccessDeniedException`.
    pub fn message(&self) -> String {
        let head = format!(
            "User: {} is not authorized to perform: {} on resource: {}",
            self.principal(),
            self.action,
            self.resource
        );
        match &self.cause {
            Cause::NoAllow => {
                format!("{head} because no identity-based policy allows the {} action", self.action)
            }
            Cause::ExplicitDeny => {
                format!("{head} with an explicit deny in an identity-based policy")
            }
            Cause::Unmapped(why) => {
                format!("{head} because the local stack cannot tell what the request needs ({why})")
            }
        }
    }
}

/// A permission granted to a function: one action pattern on one resource pattern of an
/// `Allow` statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub function: String,
    pub action: String,
    pub resource: String,
    /// The resource by the logical id the template gives it (`StateTable`,
    /// `StateTable/index/ByAttention`), when it names one.
    pub resource_name: Option<String>,
    pub origin: Origin,
    /// Requests it allowed.
    pub uses: u64,
}

/// What the checks found so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessReport {
    /// Requests checked, by function.
    pub checked: BTreeMap<String, u64>,
    /// Distinct denials, in the order first seen, each with how often it happened.
    pub denials: Vec<Denial>,
    /// Grants of the template's `Policies` that no request used. Grants SAM attaches by itself
    /// are left out: the template cannot take them back.
    pub unused: Vec<Grant>,
    /// Grants of the template's `Policies` for services no local check sees (a function URL's
    /// `lambda:InvokeFunctionUrl`, unless its gateway reports its checks here): neither used nor
    /// unused as far as the local stack can tell.
    #[serde(default)]
    pub unchecked: Vec<Grant>,
}

impl AccessReport {
    /// The report in a few lines: denials in full, unused grants counted by function.
    pub fn brief(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_checks(&mut text);
        if self.unused.is_empty() {
            text.push_str("access: every permission the template grants was used\n");
        } else {
            let mut by_function: BTreeMap<&str, usize> = BTreeMap::new();
            for g in &self.unused {
                *by_function.entry(g.function.as_str()).or_default() += 1;
            }
            let counts: Vec<String> = by_function.iter().map(|(f, n)| format!("{f} {n}")).collect();
            text.push_str(&format!(
                "access: {} granted permissions no call used in this run ({}); `local-stack up` lists them when it stops\n",
                self.unused.len(),
                counts.join(", ")
            ));
        }
        text
    }

    /// The calls checked, and every denial.
    fn write_checks(&self, f: &mut impl fmt::Write) -> fmt::Result {
        let checked: u64 = self.checked.values().sum();
        let denied: u64 = self.denials.iter().map(|d| d.count).sum();
        writeln!(
            f,
            "access: {checked} AWS calls checked against the functions' policies, {denied} denied"
        )?;
        for d in &self.denials {
            let cause = match &d.cause {
                Cause::NoAllow => "no statement allows it".to_owned(),
                Cause::ExplicitDeny => "a Deny statement refuses it".to_owned(),
                Cause::Unmapped(why) => format!("not mapped: {why}"),
            };
            let keys = match &d.leading_keys {
                Some(keys) => format!(" (partition key {})", keys.join(", ")),
                None => String::new(),
            };
            writeln!(
                f,
                "  DENIED {}: {} on {}{keys} ({}: {cause}), {} time(s)",
                d.function, d.action, d.resource, d.operation, d.count
            )?;
        }
        Ok(())
    }
}

/// A heading with the number of `grants`, then one grant a line.
fn write_grants(f: &mut fmt::Formatter<'_>, heading: &str, grants: &[Grant]) -> fmt::Result {
    writeln!(f, "access: {} {heading}:", grants.len())?;
    grants.iter().try_for_each(|g| writeln!(f, "  {g}"))
}

impl fmt::Display for AccessReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_checks(f)?;
        if self.unused.is_empty() {
            writeln!(f, "access: every permission the template grants was used")?;
        } else {
            write_grants(f, "permissions the template grants were not used", &self.unused)?;
        }
        if !self.unchecked.is_empty() {
            write_grants(
                f,
                "permissions of services the local checks do not see",
                &self.unchecked,
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.resource_name.as_deref().unwrap_or(&self.resource);
        write!(f, "{}: {} on {resource}", self.function, self.action)
    }
}

/// The live check: every request signed with a function's access key id is decided against
/// that function's permissions; other keys (the stack's own clients) are not checked. Clones
/// share their records. The permissions can be replaced while it runs (a reload that read the
/// template again): each request is decided on those in force when it comes.
#[derive(Clone, Debug)]
pub struct Access(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    policies: std::sync::RwLock<Arc<Policies>>,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    checked: BTreeMap<String, u64>,
    denials: Vec<Denial>,
    uses: HashMap<(String, GrantId), u64>,
    /// The services whose calls are checked: those the proxy maps, and any other reported.
    services: BTreeSet<String>,
}

impl Access {
    pub fn new(policies: Policies) -> Access {
        let records =
            Records { services: PROXY_SERVICES.map(str::to_owned).into(), ..Records::default() };
        let policies = std::sync::RwLock::new(Arc::new(policies));
        Access(Arc::new(Shared { policies, records: Mutex::new(records) }))
    }

    /// The permissions in force.
    pub fn policies(&self) -> Arc<Policies> {
        self.0.policies.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `policies` in force from now on; returns the functions whose permissions changed
    /// (added or dropped included), whose grants' uses are counted afresh.
    pub fn replace(&self, policies: Policies) -> Vec<String> {
        let before = self.policies();
        let ids: BTreeSet<&String> =
            before.functions.keys().chain(policies.functions.keys()).collect();
        let changed: Vec<String> = ids
            .into_iter()
            .filter(|id| before.functions.get(*id) != policies.functions.get(*id))
            .cloned()
            .collect();
        lock(&self.0.records).uses.retain(|(function, _), _| !changed.contains(function));
        *self.0.policies.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policies);
        changed
    }

    /// Whether a request to an AWS API may go on: `Ok` if it is allowed or not signed by a
    /// function, otherwise the denial, which is recorded and logged.
    pub fn authorize(
        &self,
        access_key_id: &str,
        request: &AwsRequest<'_>,
    ) -> Result<(), Box<Denial>> {
        let policies = self.policies();
        if !policies.functions.contains_key(access_key_id) {
            return Ok(());
        }
        let operation = operation(request);
        match needs(request, &policies.scope) {
            Ok(needs) => self.authorize_needs(access_key_id, &operation, &needs),
            Err(Unmapped { action, reason }) => {
                let mut records = lock(&self.0.records);
                *records.checked.entry(access_key_id.to_owned()).or_default() += 1;
                Err(refuse(
                    &mut records,
                    Denial {
                        function: access_key_id.to_owned(),
                        operation: operation.to_owned(),
                        action,
                        resource: "*".into(),
                        leading_keys: None,
                        cause: Cause::Unmapped(reason),
                        count: 1,
                    },
                ))
            }
        }
    }

    /// Whether a call that needs every one of `needs` may go on, as [`Access::authorize`]: for
    /// calls that do not go through the proxy (a signed request to a function URL, checked by
    /// the gateway that serves it), so that they are recorded with the rest.
    pub fn authorize_needs(
        &self,
        access_key_id: &str,
        operation: &str,
        needs: &[Need],
    ) -> Result<(), Box<Denial>> {
        let policies = self.policies();
        let Some(permissions) = policies.functions.get(access_key_id) else {
            return Ok(());
        };
        let decision = permissions.decide(needs);
        let mut records = lock(&self.0.records);
        *records.checked.entry(access_key_id.to_owned()).or_default() += 1;
        for need in needs {
            if let Some((service, _)) = need.action.split_once(':') {
                if !records.services.contains(service) {
                    records.services.insert(service.to_owned());
                }
            }
        }
        match decision {
            Decision::Allowed(grants) => {
                for grant in grants {
                    *records.uses.entry((access_key_id.to_owned(), grant)).or_default() += 1;
                }
                Ok(())
            }
            Decision::Denied { need, explicit } => Err(refuse(
                &mut records,
                Denial {
                    function: access_key_id.to_owned(),
                    operation: operation.to_owned(),
                    action: need.action,
                    resource: need.resource,
                    leading_keys: need.leading_keys,
                    cause: if explicit { Cause::ExplicitDeny } else { Cause::NoAllow },
                    count: 1,
                },
            )),
        }
    }

    /// Every grant of every function, with how many requests it allowed.
    pub fn grants(&self) -> Vec<Grant> {
        let policies = self.policies();
        let records = lock(&self.0.records);
        let mut out = Vec::new();
        for (function, permissions) in &policies.functions {
            for (si, s) in permissions.statements.iter().enumerate() {
                if s.effect != Effect::Allow {
                    continue;
                }
                for (ai, action) in s.actions.iter().enumerate() {
                    for (ri, resource) in s.resources.iter().enumerate() {
                        out.push(Grant {
                            function: function.clone(),
                            action: action.clone(),
                            resource: resource.clone(),
                            resource_name: policies.name(resource),
                            origin: s.origin.clone(),
                            uses: records
                                .uses
                                .get(&(function.clone(), (si, ai, ri)))
                                .copied()
                                .unwrap_or(0),
                        });
                    }
                }
            }
        }
        out
    }

    /// What the checks found so far.
    pub fn report(&self) -> AccessReport {
        let grants = self.grants();
        let records = lock(&self.0.records);
        // A pattern whose service is a wildcard may be used by any checked service.
        let seen = |action: &str| {
            let service = action.split_once(':').map_or(action, |(s, _)| s).to_ascii_lowercase();
            service.contains(['*', '?']) || records.services.contains(&service)
        };
        let (unused, unchecked) = grants
            .into_iter()
            .filter(|g| g.uses == 0 && g.origin == Origin::Template)
            .partition(|g| seen(&g.action));
        AccessReport {
            checked: records.checked.clone(),
            denials: records.denials.clone(),
            unused,
            unchecked,
        }
    }
}

/// Records a denial (one more of the same, or a new one) and logs it.
fn refuse(records: &mut Records, denial: Denial) -> Box<Denial> {
    tracing::warn!(
        function = %denial.function,
        action = %denial.action,
        resource = %denial.resource,
        operation = %denial.operation,
        "access denied: the function's policy does not allow this call"
    );
    fn key(d: &Denial) -> (&str, &str, &str, &str, &Cause) {
        (&d.function, &d.operation, &d.action, &d.resource, &d.cause)
    }
    if let Some(seen) = records.denials.iter_mut().find(|d| key(d) == key(&denial)) {
        seen.count += 1;
    } else {
        records.denials.push(denial.clone());
    }
    Box::new(denial)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
