//! The state table's records as the demo reads them: straight from the emulator, so that the
//! demo's own reads are not counted as the system's cost.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use crate::Error;

pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) async fn scan(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<Vec<Item>, Error> {
    let mut out = Vec::new();
    let mut pages = client.scan().table_name(table).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| {
            Error::Local(format!("scan: {}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
        })?;
        out.extend(page.items.unwrap_or_default());
    }
    Ok(out)
}

pub(super) fn state_of(r: &Item) -> String {
    r.get("ProcessState").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

/// Terminal, and out of the expiry index (its alert, if any, confirmed).
pub(super) fn settled(r: &Item) -> bool {
    matches!(state_of(r).as_str(), "Processed" | "Error") && !r.contains_key("CompleteBy")
}

pub(super) fn body(r: &Item) -> Value {
    sas_aws::dynamo::body_text(r)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}
