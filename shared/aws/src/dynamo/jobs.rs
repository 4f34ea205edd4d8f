//! The bulk commands ([`BulkJob`]), kept in `KeysTable` beside the concurrency keys and the
//! pages: one item per job under the partition `bulk`, its id after `job#` as the entry, so
//! that every job is one query and never meets a key's places or line. A job is rewritten
//! whole on the condition of its round.

use aws_sdk_dynamodb::types::AttributeValue;
use sas_engine::bulk::BulkJob;
use sas_engine::ports::{BulkBook, Saved};
use sas_engine::{Error, Result};

use super::{DynamoStore, Item, SERVICE, number, string, took};
use crate::errors::classify;

const PARTITION: &str = "bulk";
const ENTRY: &str = "job#";

impl BulkBook for DynamoStore {
    async fn create_job(&self, job: &BulkJob) -> Result<bool> {
        let result = self
            .client
            .put_item()
            .table_name(&self.keys_table)
            .set_item(Some(job_item(job)?))
            .condition_expression("attribute_not_exists(#entry)")
            .expression_attribute_names("#entry", "Entry")
            .send()
            .await;
        took(result)
    }

    async fn job(&self, id: &str) -> Result<Option<BulkJob>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.keys_table)
            .set_key(Some(job_key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.item().map(job_of).transpose()
    }

    async fn save_job(&self, job: &BulkJob, round: u64) -> Result<Saved> {
        let result = self
            .client
            .put_item()
            .table_name(&self.keys_table)
            .set_item(Some(job_item(job)?))
            .condition_expression("#round = :round")
            .expression_attribute_names("#round", "Round")
            .expression_attribute_values(":round", number(round))
            .send()
            .await;
        Ok(if took(result)? { Saved::Saved } else { Saved::Conflict })
    }

    async fn jobs(&self, limit: usize) -> Result<Vec<BulkJob>> {
        let items = self.entries(PARTITION, ENTRY).await?;
        let mut jobs = items.iter().map(job_of).collect::<Result<Vec<_>>>()?;
        jobs.sort_by_key(|j| std::cmp::Reverse((j.created_at, j.id.clone())));
        jobs.truncate(limit);
        Ok(jobs)
    }
}

fn job_key(id: &str) -> Item {
    Item::from([
        ("Key".to_owned(), AttributeValue::S(PARTITION.to_owned())),
        ("Entry".to_owned(), AttributeValue::S(format!("{ENTRY}{id}"))),
    ])
}

fn job_item(job: &BulkJob) -> Result<Item> {
    let body = serde_json::to_string(job)
        .map_err(|e| Error::rejected(SERVICE, format!("bulk job {}: {e}", job.id)))?;
    let mut item = job_key(&job.id);
    item.insert("Round".into(), number(job.round));
    item.insert("Body".into(), AttributeValue::S(body));
    Ok(item)
}

fn job_of(item: &Item) -> Result<BulkJob> {
    serde_json::from_str(string(item, "Body")?)
        .map_err(|e| Error::rejected(SERVICE, format!("a bulk job that does not read: {e}")))
}
