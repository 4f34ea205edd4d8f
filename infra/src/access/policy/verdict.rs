//! IAM's verdict for identity-based policies: an explicit `Deny` wins, then any `Allow`;
//! otherwise the request is denied. Actions match case-insensitively, resources
//! case-sensitively, both with the wildcards `*` and `?`. The one condition evaluated is an
//! `Allow`'s hold on the partition keys of DynamoDB's single-item requests.

use serde::{Deserialize, Serialize};

/// Whether a statement allows or denies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    Allow,
    Deny,
}

/// Where a statement comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The function's `Policies` in the template.
    Template,
    /// Attached by SAM: the managed policy's name.
    Implied(String),
}

/// One statement, with its resources evaluated in the stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub effect: Effect,
    /// Action patterns (`sqs:SendMessage`, `dynamodb:*`).
    pub actions: Vec<String>,
    /// `NotAction`: the statement covers every action but these (only in a `Deny`).
    pub not_action: bool,
    /// Resource patterns (ARNs, possibly with wildcards, or `*`).
    pub resources: Vec<String>,
    /// `NotResource`: every resource but these (only in a `Deny`).
    pub not_resource: bool,
    /// What the statement's `Condition` asks of a request besides its action and resource.
    pub condition: Option<Condition>,
    pub origin: Origin,
}

/// The conditions evaluated locally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// `ForAllValues:StringLike` (or `StringEquals`, then `like` is false) on
    /// `dynamodb:LeadingKeys`: every partition key the request touches matches one of the
    /// patterns. Read only on actions of one item, whose key every request names.
    LeadingKeys { patterns: Vec<String>, like: bool },
}

impl Condition {
    fn holds(&self, need: &Need) -> bool {
        match self {
            // A request whose keys are unknown is not taken to match.
            Condition::LeadingKeys { patterns, like } => {
                need.leading_keys.as_ref().is_some_and(|keys| {
                    keys.iter().all(|key| {
                        patterns.iter().any(|p| if *like { wildcard(p, key) } else { p == key })
                    })
                })
            }
        }
    }
}

impl Statement {
    fn covers(&self, need: &Need) -> bool {
        let action = self.actions.iter().any(|p| action_matches(p, &need.action));
        let resource = self.resources.iter().any(|p| wildcard(p, &need.resource));
        action != self.not_action && resource != self.not_resource && self.allows_context(need)
    }

    fn allows_context(&self, need: &Need) -> bool {
        self.condition.as_ref().is_none_or(|c| c.holds(need))
    }
}

/// One (action, resource) pair a request needs allowed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Need {
    /// `service:Action`, as IAM names it.
    pub action: String,
    /// The ARN, or `*` for actions that take no resource.
    pub resource: String,
    /// The partition key values of the items a DynamoDB request of one item touches (IAM's
    /// `dynamodb:LeadingKeys`), where they are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leading_keys: Option<Vec<String>>,
}

impl Need {
    pub fn new(action: impl Into<String>, resource: impl Into<String>) -> Need {
        Need { action: action.into(), resource: resource.into(), leading_keys: None }
    }

    /// The need with the partition keys its request touches.
    pub fn with_leading_keys(mut self, keys: Vec<String>) -> Need {
        self.leading_keys = Some(keys);
        self
    }
}

/// A grant: one action pattern of one `Allow` statement on one of its resource patterns, by
/// position (statement, action, resource).
pub(super) type GrantId = (usize, usize, usize);

/// What IAM answers for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every need is allowed; these grants allowed them.
    Allowed(Vec<GrantId>),
    /// The first need not allowed, and whether a `Deny` refused it (rather than no `Allow`).
    Denied { need: Need, explicit: bool },
}

/// One function's permissions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    pub statements: Vec<Statement>,
}

impl Permissions {
    /// IAM's verdict on a request that needs every one of `needs`.
    pub fn decide(&self, needs: &[Need]) -> Decision {
        let mut used = Vec::new();
        for need in needs {
            if self.statements.iter().any(|s| s.effect == Effect::Deny && s.covers(need)) {
                return Decision::Denied { need: need.clone(), explicit: true };
            }
            let before = used.len();
            for (si, s) in self.statements.iter().enumerate() {
                if s.effect != Effect::Allow || !s.allows_context(need) {
                    continue;
                }
                for (ai, action) in s.actions.iter().enumerate() {
                    if !action_matches(action, &need.action) {
                        continue;
                    }
                    for (ri, resource) in s.resources.iter().enumerate() {
                        if wildcard(resource, &need.resource) {
                            used.push((si, ai, ri));
                        }
                    }
                }
            }
            if used.len() == before {
                return Decision::Denied { need: need.clone(), explicit: false };
            }
        }
        Decision::Allowed(used)
    }
}

/// IAM's wildcard match: `*` stands for any run of characters, `?` for any one.
pub fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and how much of the text it has taken so far.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            star = Some((sp, st + 1));
            pi = sp + 1;
            ti = st + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn action_matches(pattern: &str, action: &str) -> bool {
    wildcard(&pattern.to_ascii_lowercase(), &action.to_ascii_lowercase())
}
