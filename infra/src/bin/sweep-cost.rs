//! `sweep-cost`: shows that the supervisor's sweep reads in proportion to what has expired, not
//! to the size of the table.
//!
//! On a moto server it starts itself, it provisions `template.yaml`, loads the state table with
//! N finished orders and a few expired ones, and runs the supervisor's index queries over every
//! shard, reporting the index entries read and the read units DynamoDB bills for them (a query
//! costs one read unit per 4 KB of entries read, halved for eventually consistent reads).
//!
//! `cargo run -p sas-infra --bin sweep-cost -- [N ...]` (default: 100 20000).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sas_aws::dynamo::{EXPIRY_INDEX, state_item};
use sas_engine::Timestamp;
use sas_engine::config::{EngineConfig, INDEX_SHARDS};
use sas_engine::workflow::{MAX_BUDGET, Workflow};
use sas_infra::emulation::aws::{Clients, Endpoints};
use sas_infra::emulation::emulator::{Moto, workspace_root};
use sas_infra::emulation::provision::{Options, provision};
use sas_infra::emulation::template::Template;
use sas_infra::tools::tables::{load, new_order, now, processed_order};

const EXPIRED: usize = 5;

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let sizes: Vec<usize> =
        std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() { vec![100, 20_000] } else { sizes };
    let moto = Moto::shared();
    let clients = Clients::new(&Endpoints::single(&moto.endpoint), "us-east-1").await;
    let template = Template::load(&workspace_root().join("template.yaml"))?;
    let client = &clients.dynamodb;
    let config = EngineConfig::default();
    let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
    let workflow = Workflow::from_json(sas_workflows::order_fulfilment(), &agents)?;

    println!(
        "| finished orders | expired orders | items in the table | index entries read | read units billed |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for n in sizes {
        let options = Options {
            stack_name: format!("sweep-{n}-{}", std::process::id()),
            region: "us-east-1".into(),
            parameters: HashMap::new(),
            attributes: HashMap::new(),
        };
        let stack = provision(&template, &clients, &options).await?;
        let table = stack.reference("StateTable").ok_or("no state table")?;
        let now = now();
        load(client, &table, &items(n, &workflow, &config, now)?).await?;
        let (read, bytes) = sweep(client, &table, now).await?;
        // One query per shard, each billed at least one unit: 0.5 read units per 4 KB, rounded up.
        let units: f64 = f64::from(INDEX_SHARDS) * 0.5 + (bytes.div_ceil(4096) as f64) * 0.5
            - if bytes > 0 { 0.5 } else { 0.0 };
        let total = count(client, &table).await?;
        println!("| {n} | {EXPIRED} | {total} | {read} | {units:.1} ({INDEX_SHARDS} queries) |");
    }
    Ok(())
}

/// The state table's items: `n` orders finished two hours before `now`, and [`EXPIRED`] ones
/// never claimed.
fn items(
    n: usize,
    workflow: &Workflow,
    config: &EngineConfig,
    now: Timestamp,
) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
    let mut items = Vec::with_capacity(n + EXPIRED);
    for i in 0..n {
        let at = now.minus(Duration::from_secs(7200));
        items.push(state_item(&processed_order(&format!("finished-{i}"), workflow, config, at))?);
    }
    for i in 0..EXPIRED {
        // Submitted an hour ago and never claimed: their deadline passed long ago.
        items.push(state_item(&new_order(
            &format!("expired-{i}"),
            workflow,
            config,
            now.minus(Duration::from_secs(3600)),
        ))?);
    }
    Ok(items)
}

/// The supervisor's sweep at `now`: its read of every shard, up to the longest a lease can
/// last, page after page. Returns the index entries read and their size in bytes.
async fn sweep(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    now: Timestamp,
) -> Result<(usize, usize), Error> {
    let config = EngineConfig::default();
    let due_by = now.plus(config.claim_grace + config.wait.max + MAX_BUDGET);
    let (mut read, mut bytes) = (0usize, 0usize);
    for shard in 0..INDEX_SHARDS {
        let mut start = None;
        loop {
            // The same query the supervisor's adapter makes.
            let out = client
                .query()
                .table_name(table)
                .index_name(EXPIRY_INDEX)
                .key_condition_expression("ExpiryShard = :s AND CompleteBy <= :due")
                .expression_attribute_values(":s", AttributeValue::N(shard.to_string()))
                .expression_attribute_values(
                    ":due",
                    AttributeValue::N(due_by.as_millis().to_string()),
                )
                .projection_expression("OrderId, CompleteBy, CreatedAt")
                .set_exclusive_start_key(start)
                .send()
                .await?;
            read += usize::try_from(out.scanned_count()).unwrap_or(0);
            bytes += out.items().iter().map(entry_size).sum::<usize>();
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
    }
    Ok((read, bytes))
}

/// The items in `table`.
async fn count(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<i32, Error> {
    let mut total = 0;
    let mut pages = client
        .scan()
        .table_name(table)
        .select(aws_sdk_dynamodb::types::Select::Count)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        total += page?.count();
    }
    Ok(total)
}

fn entry_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + v.as_s().map_or(8, String::len)).sum()
}
