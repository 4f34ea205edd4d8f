//! The services' health records on DynamoDB: one item per service in the services table, key
//! `Service` (S), with `Version` (N), the condition of every write, and the record as JSON in
//! `Body` (S). The table holds one small item per agent, so reading it whole is a one-page
//! scan; an agent reads its own item at most once a second per execution, and writes it only
//! when something changes.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use sas_engine::health::ServiceRecord;
use sas_engine::ports::{Saved, ServiceBook};
use sas_engine::{Error, Result};

use crate::dynamo::Item;
use crate::errors::classify;

const SERVICE: &str = "dynamodb";

/// The services table.
#[derive(Clone, Debug)]
pub struct DynamoServiceBook {
    client: Client,
    table: String,
}

impl DynamoServiceBook {
    pub fn new(client: Client, table: String) -> Self {
        DynamoServiceBook { client, table }
    }
}

impl ServiceBook for DynamoServiceBook {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("Service", AttributeValue::S(service.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.item.as_ref().map(record_of).transpose()
    }

    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        let mut records = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                records.push(record_of(item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                records.sort_by(|a, b| a.service.cmp(&b.service));
                return Ok(records);
            }
        }
    }

    async fn save(&self, next: &ServiceRecord) -> Result<Saved> {
        let body = serde_json::to_string(next).map_err(|e| Error::rejected(SERVICE, e))?;
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("Service", AttributeValue::S(next.service.clone()))
            .item("Version", AttributeValue::N(next.version.to_string()))
            .item("Body", AttributeValue::S(body))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None);
        let put = match next.version {
            0 => {
                return Err(Error::rejected(SERVICE, "a service record is written from version 1"));
            }
            1 => put.condition_expression("attribute_not_exists(Service)"),
            v => put
                .condition_expression("Version = :v")
                .expression_attribute_values(":v", AttributeValue::N((v - 1).to_string())),
        };
        match put.send().await {
            Ok(_) => Ok(Saved::Saved),
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(Saved::Conflict)
            }
            Err(e) => Err(classify(SERVICE, e)),
        }
    }
}

fn record_of(item: &Item) -> Result<ServiceRecord> {
    let body = item
        .get("Body")
        .and_then(|v| v.as_s().ok())
        .ok_or_else(|| Error::rejected(SERVICE, "a service item without Body"))?;
    serde_json::from_str(body).map_err(|e| Error::rejected(SERVICE, format!("service record: {e}")))
}
