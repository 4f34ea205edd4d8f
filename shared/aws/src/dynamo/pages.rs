//! The pages of the passes over lists run inline ([`Page`]), kept in `KeysTable` beside the
//! concurrency keys: an item per page, its pass as the partition key and `page#<id>` as the
//! entry, so that a pass's pages are one query and never meet a key's places or line.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use sas_engine::ports::Page;
use sas_engine::{Error, Result};
use serde_json::Value;

use super::{DynamoStore, Item, SERVICE, string};
use crate::errors::classify;

const PAGE: &str = "page#";

impl DynamoStore {
    pub(super) async fn write_page(&self, page: &Page) -> Result<()> {
        let outputs = serde_json::to_string(&page.outputs)
            .map_err(|e| Error::rejected(SERVICE, format!("page {}: {e}", page.id)))?;
        let mut item = Self::page_key(&page.pass, &page.id);
        item.insert("Outputs".into(), AttributeValue::S(outputs));
        self.client
            .put_item()
            .table_name(&self.keys_table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        Ok(())
    }

    pub(super) async fn read_pages(&self, pass: &str) -> Result<Vec<Page>> {
        let items = self.entries(pass, PAGE).await?;
        items.iter().map(|item| page_from_item(pass, item)).collect()
    }

    pub(super) async fn delete_pages(&self, pass: &str) -> Result<()> {
        for page in self.read_pages(pass).await? {
            self.client
                .delete_item()
                .table_name(&self.keys_table)
                .set_key(Some(Self::page_key(pass, &page.id)))
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
        }
        Ok(())
    }

    fn page_key(pass: &str, id: &str) -> Item {
        Item::from([
            ("Key".to_owned(), AttributeValue::S(pass.to_owned())),
            ("Entry".to_owned(), AttributeValue::S(format!("{PAGE}{id}"))),
        ])
    }
}

fn page_from_item(pass: &str, item: &Item) -> Result<Page> {
    let corrupt = |why: String| Error::rejected(SERVICE, format!("a page of {pass}: {why}"));
    let id = string(item, "Entry")?
        .strip_prefix(PAGE)
        .ok_or_else(|| corrupt("an entry that is not a page".into()))?
        .to_owned();
    let outputs: BTreeMap<u32, Value> =
        serde_json::from_str(string(item, "Outputs")?).map_err(|e| corrupt(e.to_string()))?;
    Ok(Page { pass: pass.to_owned(), id, outputs })
}
