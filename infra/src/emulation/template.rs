//! Parsing and evaluating a CloudFormation/SAM template.
//!
//! Only the long form of intrinsic functions is accepted (`Ref:`, `Fn::GetAtt:`, `Fn::Sub:`,
//! ...): the short `!Ref` tags are YAML tags, which a plain YAML reader would silently turn
//! into strings, so the template is checked for them and refused with a clear message.
//!
//! `Fn::ForEach` loops are expanded first ([`crate::emulation::foreach`]). Evaluation resolves parameters
//! (defaults, or overrides), pseudo parameters, conditions, `Ref`, `Fn::GetAtt`, `Fn::Sub`,
//! `Fn::If`, `Fn::Join`, `Fn::Split`, `Fn::Select`, `Fn::FindInMap`, `Fn::Equals`, `Fn::Not`, `Fn::And`,
//! `Fn::Or`, and `AWS::NoValue`, against the physical ids of the resources created so far.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

use crate::Error;

/// Account id that local emulators use by default.
pub const LOCAL_ACCOUNT: &str = "123456789012";

/// A parsed template.
#[derive(Clone, Debug)]
pub struct Template {
    pub parameters: BTreeMap<String, Value>,
    pub conditions: BTreeMap<String, Value>,
    /// Resources, in order of logical id.
    pub resources: Vec<(String, Resource)>,
    pub outputs: BTreeMap<String, Value>,
    pub globals: Value,
    pub mappings: Map<String, Value>,
}

/// One resource: its type, its (unevaluated) properties, and its condition if any.
#[derive(Clone, Debug)]
pub struct Resource {
    pub kind: String,
    pub properties: Value,
    pub condition: Option<String>,
    /// `Metadata` (for functions: how SAM builds them).
    pub metadata: Value,
}

const SHORT_TAGS: [&str; 18] = [
    "!Ref",
    "!GetAtt",
    "!Sub",
    "!If",
    "!Join",
    "!Select",
    "!Equals",
    "!Not",
    "!And",
    "!Or",
    "!FindInMap",
    "!Split",
    "!ImportValue",
    "!Base64",
    "!Cidr",
    "!GetAZs",
    "!Condition",
    "!Transform",
];

impl Template {
    pub fn load(path: &std::path::Path) -> Result<Template, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        Template::parse(&text)
    }

    /// The template at `path` as CloudFormation would have it once `AWS::LanguageExtensions`
    /// ran: its loops expanded, that transform taken off, and every relative `CodeUri` made
    /// absolute (the file may be written anywhere). For tools that take no loops: `sam local
    /// start-api`, which SAM CLI 1.170 cannot run on this template with its language
    /// extensions on.
    pub fn expanded_document(path: &std::path::Path) -> Result<Value, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        let docs = YamlLoader::load_from_str(&text).map_err(|e| Error::Template(e.to_string()))?;
        let root = docs.into_iter().next().map(to_json).transpose()?.unwrap_or(Value::Null);
        let mut root = crate::emulation::foreach::expand(&root)?;
        if let Some(Value::Array(transforms)) = root.get_mut("Transform") {
            transforms.retain(|t| t != "AWS::LanguageExtensions");
        }
        let base = path.parent().unwrap_or(std::path::Path::new("."));
        let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_owned());
        let absolute = |uri: &mut Value| {
            if let Some(relative) = uri.as_str().filter(|u| !u.contains("://")) {
                *uri = Value::String(base.join(relative).display().to_string());
            }
        };
        if let Some(uri) = root.pointer_mut("/Globals/Function/CodeUri") {
            absolute(uri);
        }
        // A binary or a CodeUri found in a mapping with a default is the transform's to
        // resolve too.
        let mappings = root.get("Mappings").cloned().unwrap_or(Value::Null);
        let from_mapping = |value: &mut Value| {
            if let Some([map, key, attribute, default]) =
                value.get("Fn::FindInMap").and_then(Value::as_array).map(Vec::as_slice)
            {
                let found = [map, key, attribute]
                    .iter()
                    .try_fold(&mappings, |at, k| at.get(k.as_str()?))
                    .cloned();
                *value = found.unwrap_or_else(|| default["DefaultValue"].clone());
            }
        };
        if let Some(Value::Object(resources)) = root.get_mut("Resources") {
            for r in resources.values_mut() {
                if let Some(uri) = r.pointer_mut("/Properties/CodeUri") {
                    from_mapping(uri);
                    absolute(uri);
                }
                if let Some(binary) = r.pointer_mut("/Metadata/BuildProperties/Binary") {
                    from_mapping(binary);
                }
            }
        }
        Ok(root)
    }

    pub fn parse(text: &str) -> Result<Template, Error> {
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or_default();
            if let Some(tag) = SHORT_TAGS.iter().find(|t| code.split_whitespace().any(|w| w == **t))
            {
                return Err(Error::Template(format!(
                    "line {}: short-form intrinsic {tag} is not supported; write it in long form (e.g. `Ref:` or `Fn::GetAtt:`)",
                    n + 1
                )));
            }
        }
        let docs = YamlLoader::load_from_str(text).map_err(|e| Error::Template(e.to_string()))?;
        let root = docs.into_iter().next().map(to_json).transpose()?.unwrap_or(Value::Null);
        let root = crate::emulation::foreach::expand(&root)?;
        let section =
            |name: &str| root.get(name).and_then(Value::as_object).cloned().unwrap_or_default();
        let mut resources = Vec::new();
        for (id, r) in section("Resources") {
            let kind = r
                .get("Type")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Template(format!("{id} has no Type")))?;
            resources.push((
                id.clone(),
                Resource {
                    kind: kind.to_owned(),
                    properties: r.get("Properties").cloned().unwrap_or(Value::Object(Map::new())),
                    condition: r.get("Condition").and_then(Value::as_str).map(str::to_owned),
                    metadata: r.get("Metadata").cloned().unwrap_or(Value::Null),
                },
            ));
        }
        Ok(Template {
            parameters: section("Parameters").into_iter().collect(),
            conditions: section("Conditions").into_iter().collect(),
            resources,
            outputs: section("Outputs").into_iter().collect(),
            globals: root.get("Globals").cloned().unwrap_or(Value::Null),
            mappings: section("Mappings"),
        })
    }

    pub fn resource(&self, id: &str) -> Option<&Resource> {
        self.resources.iter().find(|(r, _)| r == id).map(|(_, r)| r)
    }

    /// Resources of one type, in template order.
    pub fn of_kind<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Resource)> + 'a {
        self.resources.iter().filter(move |(_, r)| r.kind == kind).map(|(id, r)| (id.as_str(), r))
    }
}

fn to_json(y: Yaml) -> Result<Value, Error> {
    Ok(match y {
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::String(r), Value::Number),
        Yaml::Integer(i) => Value::from(i),
        Yaml::String(s) => Value::String(s),
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Array(a) => Value::Array(a.into_iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut map = Map::new();
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s,
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => {
                        return Err(Error::Template(format!("unsupported mapping key {other:?}")));
                    }
                };
                map.insert(key, to_json(v)?);
            }
            Value::Object(map)
        }
        Yaml::Null => Value::Null,
        other => return Err(Error::Template(format!("unsupported YAML value {other:?}"))),
    })
}

/// What `Ref` and `Fn::GetAtt` resolve to: parameter values and created resources.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub stack_name: String,
    pub region: String,
    pub parameters: HashMap<String, Value>,
    /// `Ref` of each resource created so far.
    pub refs: HashMap<String, Value>,
    /// `Fn::GetAtt` values: (resource, attribute) → value.
    pub attributes: HashMap<(String, String), Value>,
    conditions: HashMap<String, bool>,
    mappings: Map<String, Value>,
}

/// Marks a value to drop (`AWS::NoValue`).
const NO_VALUE: &str = "\u{0}no-value";

impl Context {
    /// Parameter defaults, overridden by `overrides`, and the template's conditions.
    pub fn new(
        template: &Template,
        stack_name: &str,
        region: &str,
        overrides: &HashMap<String, String>,
    ) -> Result<Self, Error> {
        let mut ctx = Context {
            stack_name: stack_name.to_owned(),
            region: region.to_owned(),
            mappings: template.mappings.clone(),
            ..Context::default()
        };
        for (name, spec) in &template.parameters {
            let value = match overrides.get(name) {
                Some(v) => Value::String(v.clone()),
                None => spec.get("Default").cloned().ok_or_else(|| {
                    Error::Template(format!("parameter {name} has no default and no value"))
                })?,
            };
            // CloudFormation passes every parameter as a string, and a list parameter as the
            // list of its comma-separated parts.
            let value = match value {
                Value::Number(n) => Value::String(n.to_string()),
                v => v,
            };
            let value = match (spec.get("Type").and_then(Value::as_str), value) {
                (Some("CommaDelimitedList"), Value::String(s)) => {
                    Value::Array(s.split(',').map(|p| Value::String(p.trim().to_owned())).collect())
                }
                (_, v) => v,
            };
            ctx.parameters.insert(name.clone(), value);
        }
        for name in template.conditions.keys() {
            let value = ctx.condition(template, name)?;
            ctx.conditions.insert(name.clone(), value);
        }
        Ok(ctx)
    }

    /// Whether a resource with this condition exists.
    pub fn holds(&self, condition: Option<&str>) -> bool {
        condition.is_none_or(|c| self.conditions.get(c).copied().unwrap_or(false))
    }

    fn condition(&self, template: &Template, name: &str) -> Result<bool, Error> {
        let expr = template
            .conditions
            .get(name)
            .ok_or_else(|| Error::Template(format!("unknown condition {name}")))?;
        let v = self.eval_condition(template, expr)?;
        Ok(v)
    }

    fn eval_condition(&self, template: &Template, expr: &Value) -> Result<bool, Error> {
        let (name, arg) =
            single_key(expr).ok_or_else(|| Error::Template(format!("not a condition: {expr}")))?;
        match name {
            "Fn::Equals" => {
                let [a, b] = pair(arg)?;
                Ok(self.eval(a)? == self.eval(b)?)
            }
            "Fn::Not" => Ok(!self.eval_condition(template, first(arg)?)?),
            "Fn::And" => list(arg)?
                .iter()
                .try_fold(true, |acc, c| Ok(acc && self.eval_condition(template, c)?)),
            "Fn::Or" => list(arg)?
                .iter()
                .try_fold(false, |acc, c| Ok(acc || self.eval_condition(template, c)?)),
            "Condition" => {
                let c =
                    arg.as_str().ok_or_else(|| Error::Template("Condition takes a name".into()))?;
                match self.conditions.get(c) {
                    Some(v) => Ok(*v),
                    None => self.condition(template, c),
                }
            }
            other => Err(Error::Template(format!("unsupported condition function {other}"))),
        }
    }

    /// Evaluates every intrinsic function in `value`.
    pub fn eval(&self, value: &Value) -> Result<Value, Error> {
        let v = self.eval_inner(value)?;
        Ok(v)
    }

    fn eval_inner(&self, value: &Value) -> Result<Value, Error> {
        if let Some((name, arg)) = single_key(value) {
            if name == "Ref" || name.starts_with("Fn::") || name == "Condition" {
                return self.intrinsic(name, arg);
            }
        }
        Ok(match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    let v = self.eval_inner(v)?;
                    if v != Value::String(NO_VALUE.into()) {
                        out.insert(k.clone(), v);
                    }
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| self.eval_inner(v))
                    .filter(|v| !matches!(v, Ok(Value::String(s)) if s == NO_VALUE))
                    .collect::<Result<_, _>>()?,
            ),
            other => other.clone(),
        })
    }

    fn intrinsic(&self, name: &str, arg: &Value) -> Result<Value, Error> {
        match name {
            "Ref" => {
                // A loop writes a name made from its item as `{Fn::Sub: ...}`.
                let target = match arg {
                    Value::String(s) => s.clone(),
                    Value::Object(_) => str_of(&self.eval_inner(arg)?)?,
                    _ => return Err(Error::Template("Ref takes a name".into())),
                };
                self.reference(&target)
            }
            "Fn::GetAtt" => self.get_att(arg),
            "Fn::Sub" => {
                let (text, vars) = match arg {
                    Value::String(s) => (s.clone(), Map::new()),
                    Value::Array(a) if a.len() == 2 => {
                        (str_of(&a[0])?, a[1].as_object().cloned().unwrap_or_default())
                    }
                    _ => return Err(Error::Template(format!("malformed Fn::Sub {arg}"))),
                };
                self.substitute(&text, &vars).map(Value::String)
            }
            "Fn::If" => {
                let a = list(arg)?;
                let [c, yes, no] = a.as_slice() else {
                    return Err(Error::Template("Fn::If takes three items".into()));
                };
                let c = c
                    .as_str()
                    .ok_or_else(|| Error::Template("Fn::If needs a condition name".into()))?;
                let holds = *self
                    .conditions
                    .get(c)
                    .ok_or_else(|| Error::Template(format!("unknown condition {c}")))?;
                self.eval_inner(if holds { yes } else { no })
            }
            "Fn::Join" => {
                let [sep, items] = pair(arg)?;
                let sep = str_of(sep)?;
                let items = self.eval_inner(items)?;
                let parts = items
                    .as_array()
                    .ok_or_else(|| Error::Template("Fn::Join needs a list".into()))?;
                Ok(Value::String(
                    parts.iter().map(scalar_string).collect::<Result<Vec<_>, _>>()?.join(&sep),
                ))
            }
            "Fn::Select" => {
                let [index, items] = pair(arg)?;
                let index: usize = scalar_string(&self.eval_inner(index)?)?
                    .parse()
                    .map_err(|_| Error::Template("Fn::Select index".into()))?;
                let items = self.eval_inner(items)?;
                items
                    .get(index)
                    .cloned()
                    .ok_or_else(|| Error::Template("Fn::Select out of range".into()))
            }
            "Fn::Split" => {
                let [sep, text] = pair(arg)?;
                let sep = str_of(sep)?;
                let text = str_of(&self.eval_inner(text)?)?;
                if sep.is_empty() {
                    return Err(Error::Template("Fn::Split needs a delimiter".into()));
                }
                Ok(Value::Array(text.split(&sep).map(|p| Value::String(p.to_owned())).collect()))
            }
            "Fn::FindInMap" => self.find_in_map(arg),
            other => Err(Error::Template(format!("unsupported intrinsic function {other}"))),
        }
    }

    fn get_att(&self, arg: &Value) -> Result<Value, Error> {
        let (resource, attribute) = match arg {
            Value::String(s) => s.split_once('.').map(|(a, b)| (a.to_owned(), b.to_owned())),
            Value::Array(a) if a.len() == 2 => {
                Some((str_of(&self.eval_inner(&a[0])?)?, str_of(&self.eval_inner(&a[1])?)?))
            }
            _ => None,
        }
        .ok_or_else(|| Error::Template(format!("malformed Fn::GetAtt {arg}")))?;
        self.attributes
            .get(&(resource.clone(), attribute.clone()))
            .cloned()
            .ok_or_else(|| Error::Template(format!("{resource}.{attribute} is not known (yet)")))
    }

    fn find_in_map(&self, arg: &Value) -> Result<Value, Error> {
        // Three keys, and with AWS::LanguageExtensions a fourth item
        // `{DefaultValue: ...}` for keys the map does not hold.
        let items = list(arg)?;
        let (keys, default) = match items.as_slice() {
            [keys @ .., last] if last.get("DefaultValue").is_some() => {
                (keys, Some(&last["DefaultValue"]))
            }
            keys => (keys, None),
        };
        let keys =
            keys.iter().map(|k| str_of(&self.eval_inner(k)?)).collect::<Result<Vec<_>, _>>()?;
        let [map, top, second] = keys.as_slice() else {
            return Err(Error::Template("Fn::FindInMap takes three keys".into()));
        };
        let found = self
            .mappings
            .get(map)
            .ok_or_else(|| Error::Template(format!("no mapping {map} in Mappings")))?;
        match (found.get(top).and_then(|m| m.get(second)), default) {
            (Some(value), _) => Ok(value.clone()),
            (None, Some(default)) => self.eval_inner(default),
            (None, None) => Err(Error::Template(format!("no {map}.{top}.{second} in Mappings"))),
        }
    }

    /// The stack's ARN, as CloudFormation gives it: its last part is a UUID of the stack's
    /// own, here derived from its name so that a stack started again has the same one.
    fn stack_id(&self) -> String {
        let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, self.stack_name.as_bytes());
        format!(
            "arn:aws:cloudformation:{}:{LOCAL_ACCOUNT}:stack/{}/{id}",
            self.region, self.stack_name
        )
    }

    fn reference(&self, target: &str) -> Result<Value, Error> {
        let pseudo = match target {
            "AWS::StackName" => Some(self.stack_name.clone()),
            "AWS::Region" => Some(self.region.clone()),
            "AWS::StackId" => Some(self.stack_id()),
            "AWS::AccountId" => Some(LOCAL_ACCOUNT.to_owned()),
            "AWS::Partition" => Some("aws".to_owned()),
            "AWS::URLSuffix" => Some("amazonaws.com".to_owned()),
            "AWS::NoValue" => Some(NO_VALUE.to_owned()),
            _ => None,
        };
        if let Some(p) = pseudo {
            return Ok(Value::String(p));
        }
        self.parameters
            .get(target)
            .or_else(|| self.refs.get(target))
            .cloned()
            .ok_or_else(|| Error::Template(format!("Ref {target} is not known (yet)")))
    }

    fn substitute(&self, text: &str, vars: &Map<String, Value>) -> Result<String, Error> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or_else(|| Error::Template(format!("unclosed ${{ in {text:?}")))?;
            let name = &after[..end];
            let value = if let Some(v) = vars.get(name) {
                self.eval_inner(v)?
            } else if let Some(literal) = name.strip_prefix('!') {
                Value::String(format!("${{{literal}}}"))
            } else if let Some((resource, attribute)) = name.split_once('.') {
                self.intrinsic(
                    "Fn::GetAtt",
                    &Value::Array(vec![resource.into(), attribute.into()]),
                )?
            } else {
                self.reference(name)?
            };
            out.push_str(&scalar_string(&value)?);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

fn single_key(v: &Value) -> Option<(&str, &Value)> {
    let map = v.as_object()?;
    if map.len() != 1 {
        return None;
    }
    map.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn list(v: &Value) -> Result<&Vec<Value>, Error> {
    v.as_array().ok_or_else(|| Error::Template(format!("expected a list, found {v}")))
}

fn first(v: &Value) -> Result<&Value, Error> {
    list(v)?.first().ok_or_else(|| Error::Template("empty list".into()))
}

fn pair(v: &Value) -> Result<[&Value; 2], Error> {
    match list(v)?.as_slice() {
        [a, b] => Ok([a, b]),
        _ => Err(Error::Template(format!("expected two items, found {v}"))),
    }
}

fn str_of(v: &Value) -> Result<String, Error> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Template(format!("expected a string, found {v}")))
}

/// A scalar as CloudFormation would write it into a string.
pub fn scalar_string(v: &Value) -> Result<String, Error> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(Error::Template(format!("expected a scalar, found {other}"))),
    }
}

#[cfg(test)]
mod tests;
