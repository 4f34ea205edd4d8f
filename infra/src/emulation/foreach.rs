//! `Fn::ForEach` of the `AWS::LanguageExtensions` transform, expanded before the template is
//! read, as CloudFormation expands it before SAM's transform runs: one declaration in the
//! template (an agent, say) becomes one copy of its resources per item of a literal list.
//!
//! `Fn::ForEach::Name: [Id, [a, b], {"Key${Id}": body}]` may stand wherever a map has keys
//! (under `Resources`, `Conditions`, `Outputs`, or inside properties), loops may nest, and
//! each copy's keys and body have the item in place of the identifier: `${Id}` and `&{Id}`
//! (the item without its non-alphanumeric characters) in keys and in `Fn::Sub` strings, and
//! `Ref: Id`. A collection must be a literal list: a list from a parameter would leave
//! `sam package` with local paths in the packaged template.

use serde_json::{Map, Value};

use crate::Error;

const LOOP: &str = "Fn::ForEach::";

/// `value` with every loop expanded in place.
pub fn expand(value: &Value) -> Result<Value, Error> {
    Ok(match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, item) in map {
                match key.strip_prefix(LOOP) {
                    Some(name) => {
                        for (k, v) in expand_loop(name, item)? {
                            if out.insert(k.clone(), v).is_some() {
                                return Err(bad(name, &format!("{k} is made twice")));
                            }
                        }
                    }
                    None => {
                        out.insert(key.clone(), expand(item)?);
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(expand).collect::<Result<_, _>>()?),
        other => other.clone(),
    })
}

/// The copies one loop makes, each already expanded (an inner loop included).
fn expand_loop(name: &str, spec: &Value) -> Result<Vec<(String, Value)>, Error> {
    let [id, collection, body] = spec
        .as_array()
        .and_then(|a| <&[Value; 3]>::try_from(a.as_slice()).ok())
        .ok_or_else(|| bad(name, "takes [identifier, list, {key: value}]"))?;
    let id = id.as_str().ok_or_else(|| bad(name, "its identifier must be a string"))?;
    let items = collection
        .as_array()
        .ok_or_else(|| bad(name, "its collection must be a literal list"))?
        .iter()
        .map(|i| i.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad(name, "its collection must be a list of strings"))?;
    let body = body.as_object().ok_or_else(|| bad(name, "its output must be a map"))?;
    let mut copies = Vec::new();
    for item in &items {
        let mut copy = Map::new();
        for (key, value) in body {
            // The key of an inner loop is the loop's name; the outer identifier lives in its
            // output, which the substitution below reaches.
            if !key.starts_with(LOOP) && !mentions(key, id) {
                return Err(bad(name, &format!("its output key {key} must contain ${{{id}}}")));
            }
            copy.insert(in_key(key, id, item), substitute(value, id, item));
        }
        match plain_names(expand(&Value::Object(copy))?) {
            Value::Object(expanded) => copies.extend(expanded),
            _ => unreachable!("a map expands to a map"),
        }
    }
    Ok(copies)
}

fn mentions(text: &str, id: &str) -> bool {
    text.contains(&format!("${{{id}}}")) || text.contains(&format!("&{{{id}}}"))
}

fn in_key(key: &str, id: &str, item: &str) -> String {
    let alphanumeric: String = item.chars().filter(char::is_ascii_alphanumeric).collect();
    key.replace(&format!("${{{id}}}"), item).replace(&format!("&{{{id}}}"), &alphanumeric)
}

/// `value` with `item` in place of the identifier `id`.
fn substitute(value: &Value, id: &str, item: &str) -> Value {
    match value {
        Value::Object(map) if map.len() == 1 => {
            let (key, arg) = map.iter().next().expect("one entry");
            match (key.as_str(), arg) {
                ("Ref", Value::String(target)) if target == id => Value::String(item.to_owned()),
                ("Fn::Sub", Value::String(text)) => sub(in_key(text, id, item)),
                ("Fn::Sub", Value::Array(parts)) => {
                    let mut parts = parts.clone();
                    // A variable of the Sub's own named like the identifier hides it.
                    let hidden = parts.get(1).and_then(|v| v.get(id)).is_some();
                    if let (Some(Value::String(text)), false) = (parts.first(), hidden) {
                        parts[0] = Value::String(in_key(text, id, item));
                    }
                    if let Some(vars) = parts.get_mut(1) {
                        *vars = substitute(vars, id, item);
                    }
                    Value::Object(Map::from_iter([("Fn::Sub".to_owned(), Value::Array(parts))]))
                }
                _ => Value::Object(
                    [(in_key(key, id, item), substitute(arg, id, item))].into_iter().collect(),
                ),
            }
        }
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| (in_key(k, id, item), substitute(v, id, item))).collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| substitute(v, id, item)).collect())
        }
        // Every `${id}` of the loop's output is replaced, in plain strings too (a delimiter of
        // `Fn::Split`, which takes no function), as the transform does.
        Value::String(text) => Value::String(in_key(text, id, item)),
        other => other.clone(),
    }
}

/// `value` with each `Ref` or `Fn::GetAtt` whose name is a `Fn::Sub` with nothing left to
/// substitute (as a loop writes `{Fn::Sub: "${Agent}Queue"}`) naming it plainly, as
/// CloudFormation reads it: whoever reads the expanded template finds `Ref: paymentQueue`.
fn plain_names(value: Value) -> Value {
    let plain = |v: &Value| {
        v.get("Fn::Sub").and_then(Value::as_str).filter(|s| !s.contains("${")).map(str::to_owned)
    };
    match value {
        Value::Object(mut map) => {
            if let Some(name) = map.get("Ref").and_then(plain) {
                map.insert("Ref".into(), Value::String(name));
            }
            if let Some(Value::Array(target)) = map.get_mut("Fn::GetAtt")
                && let Some(name) = target.first().and_then(plain)
            {
                target[0] = Value::String(name);
            }
            Value::Object(map.into_iter().map(|(k, v)| (k, plain_names(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(plain_names).collect()),
        other => other,
    }
}

fn sub(text: String) -> Value {
    Value::Object(Map::from_iter([("Fn::Sub".to_owned(), Value::String(text))]))
}

fn bad(name: &str, what: &str) -> Error {
    Error::Template(format!("Fn::ForEach::{name}: {what}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_loop_makes_one_copy_per_item_with_the_item_in_keys_refs_and_subs() {
        let template = json!({
            "Resources": {
                "Bus": {"Type": "AWS::Events::EventBus"},
                "Fn::ForEach::Agents": ["Agent", ["inventory", "payment"], {
                    "${Agent}Queue": {"Type": "AWS::SQS::Queue", "Properties": {
                        "QueueName": {"Fn::Sub": "${AWS::StackName}-${Agent}"},
                        "Tags": [{"Key": "agent", "Value": {"Ref": "Agent"}}],
                        "Url": {"Fn::FindInMap": ["Agents", {"Ref": "Agent"}, "Url"]},
                        "Bus": {"Fn::GetAtt": [{"Fn::Sub": "${Agent}Bus"}, "Arn"]},
                        "Own": {"Ref": {"Fn::Sub": "${Agent}Queue"}}
                    }},
                    "&{Agent}Alarm": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
                        "Fn::ForEach::Levels": ["Level", ["warn", "page"], {
                            "Threshold${Level}": {"Fn::Sub": "${Agent}-${Level}"}
                        }]
                    }}
                }]
            }
        });
        let expanded = expand(&template).unwrap();
        let resources = expanded["Resources"].as_object().unwrap();
        let ids: Vec<&str> = resources.keys().map(String::as_str).collect();
        // Keys are kept in order of name, as everywhere in the template's maps.
        assert_eq!(
            ids,
            ["Bus", "inventoryAlarm", "inventoryQueue", "paymentAlarm", "paymentQueue"]
        );
        let queue = &resources["paymentQueue"]["Properties"];
        assert_eq!(queue["QueueName"], json!({"Fn::Sub": "${AWS::StackName}-payment"}));
        assert_eq!(queue["Tags"][0]["Value"], "payment");
        assert_eq!(queue["Url"], json!({"Fn::FindInMap": ["Agents", "payment", "Url"]}));
        assert_eq!(queue["Bus"], json!({"Fn::GetAtt": ["paymentBus", "Arn"]}), "named plainly");
        assert_eq!(queue["Own"], json!({"Ref": "paymentQueue"}));
        let alarm = &resources["inventoryAlarm"]["Properties"];
        assert_eq!(alarm["Thresholdpage"], json!({"Fn::Sub": "inventory-page"}));
        assert_eq!(alarm.as_object().unwrap().len(), 2);
    }

    #[test]
    fn a_malformed_loop_is_named_with_what_is_wrong() {
        let cases = [
            (json!({"Fn::ForEach::A": ["X", {"Ref": "List"}, {"${X}": 1}]}), "literal list"),
            (json!({"Fn::ForEach::A": ["X", ["a"], {"Fixed": 1}]}), "must contain ${X}"),
            (json!({"Fn::ForEach::A": ["X", ["a", "a"], {"${X}": 1}]}), "a is made twice"),
            (json!({"Fn::ForEach::A": ["X", ["a"]]}), "takes [identifier"),
        ];
        for (template, expected) in cases {
            let err = expand(&template).unwrap_err().to_string();
            assert!(err.contains("Fn::ForEach::A") && err.contains(expected), "{err}");
        }
    }
}
