//! `list-cost`: shows that a page of the orders in flight, or of the orders found by a
//! customer, reads what it shows, however many orders the tables hold.
//!
//! On a moto server it starts itself, it provisions `template.yaml`, loads the state table
//! with orders in flight and orders ended (each of one of [`ORDERS_PER_CUSTOMER`]-sized
//! customers' search key), then lists and searches pages of 50 as operators do, through
//! the stack's own store, counting each call it makes to DynamoDB: the queries and the index
//! entries they read, the records read, and the read units DynamoDB bills for them (half a
//! unit per 4 KB of a query's entries, at least half a unit a query; half a unit per record
//! of under 4 KB), and how long the page took. Moto answers each query by going through its
//! whole table, so that time is an upper bound of the emulator's; on DynamoDB a page takes the
//! round trips of its queries, 16 at once, and of its one batch of records.
//!
//! `cargo run -p sas-infra --bin list-cost -- [IN_FLIGHT ENDED] ...` (default: 1000 0 50000
//! 50000).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::AfterDeserializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
use aws_sdk_dynamodb::operation::query::QueryOutput;
use aws_sdk_dynamodb::types::AttributeValue;
use sas_aws::dynamo::{DynamoStore, state_item, state_item_size};
use sas_aws::settings::Tables;
use sas_engine::Timestamp;
use sas_engine::config::{EngineConfig, INDEX_SHARDS};
use sas_engine::ports::{ListPage, ListQuery, Listing, OrderFinder};
use sas_engine::services::search::{SearchQuery, search};
use sas_engine::workflow::Workflow;
use sas_infra::emulation::aws::{Clients, Endpoints};
use sas_infra::emulation::emulator::{Moto, workspace_root};
use sas_infra::emulation::provision::{Options, provision};
use sas_infra::emulation::template::Template;
use sas_infra::tools::tables::{load, new_order, now, processed_order};

type Error = Box<dyn std::error::Error>;

/// Orders a page shows, as the console asks for.
const PAGE: usize = 50;
/// What the console's counts stop at.
const COUNT_CAP: u64 = 10_000;
/// Orders of each customer: the loaded orders take turns among `total / 100` customers.
const ORDERS_PER_CUSTOMER: usize = 100;

/// What the store asked DynamoDB for, since the last reset.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    queries: usize,
    entries: usize,
    batch_gets: usize,
    records: usize,
}

/// Counts each answer DynamoDB gives the store.
#[derive(Debug, Default, Clone)]
struct Counter(Arc<Mutex<Counts>>);

impl Counter {
    fn take(&self) -> Counts {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Intercept for Counter {
    fn name(&self) -> &'static str {
        "list-cost counter"
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Ok(output) = context.output_or_error() else { return Ok(()) };
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(query) = output.downcast_ref::<QueryOutput>() {
            counts.queries += 1;
            counts.entries += usize::try_from(query.scanned_count()).unwrap_or(0);
        } else if let Some(batch) = output.downcast_ref::<BatchGetItemOutput>() {
            counts.batch_gets += 1;
            counts.records += batch.responses().map_or(0, |r| r.values().map(Vec::len).sum());
        }
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let sizes: Vec<usize> =
        std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    if sizes.len() % 2 == 1 {
        return Err("give sizes in pairs: IN_FLIGHT ENDED".into());
    }
    let sizes: Vec<(usize, usize)> = if sizes.is_empty() {
        vec![(1000, 0), (50_000, 50_000)]
    } else {
        sizes.chunks(2).map(|p| (p[0], p[1])).collect()
    };
    let moto = Moto::shared();
    let clients = Clients::new(&Endpoints::single(&moto.endpoint), "us-east-1").await;
    let counter = Counter::default();
    let counted = aws_sdk_dynamodb::Client::from_conf(
        clients.dynamodb.config().to_builder().interceptor(counter.clone()).build(),
    );
    let template = Template::load(&workspace_root().join("template.yaml"))?;
    let config = EngineConfig::default();
    let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
    let workflow = Workflow::from_json(sas_workflows::order_fulfilment(), &agents)?;
    let now = now();
    let sample = new_order("sample", &workflow, &config, now);
    let entry = index_entry_size(
        &state_item(&sample)?,
        &["OrderId", "FlightShard", "CreatedAt", "Workflow"],
    );
    let mut searched = sample.clone();
    searched.search_key = Some(customer(0, 1));
    let search_entry =
        index_entry_size(&state_item(&searched)?, &["OrderId", "SearchKey", "SearchAt"]);
    let record_units = state_item_size(&sample)?.div_ceil(4096) as f64 * 0.5;

    println!(
        "| orders in flight | orders ended | page of {PAGE} | orders shown | queries | index entries read | records read | read units | on moto |"
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (in_flight, ended) in sizes {
        let options = Options {
            stack_name: format!("list-{in_flight}-{ended}-{}", std::process::id()),
            region: "us-east-1".into(),
            parameters: HashMap::new(),
            attributes: HashMap::new(),
        };
        let stack = provision(&template, &clients, &options).await?;
        let name = |logical: &str| stack.reference(logical).ok_or(format!("no {logical}"));
        let tables = Tables {
            state: name("StateTable")?,
            orders: name("OrdersTable")?,
            keys: name("KeysTable")?,
        };
        load(&clients.dynamodb, &tables.state, &items(in_flight, ended, &workflow, &config, now)?)
            .await?;
        let store = DynamoStore::new(counted.clone(), &tables);
        let query = |listing, step: Option<&str>, after| ListQuery {
            listing,
            step: step.map(str::to_owned),
            cause: None,
            workflow: None,
            now,
            shards: INDEX_SHARDS,
            limit: PAGE,
            after,
        };
        let all = Listing::InFlight { older_than: Duration::ZERO };
        let old = Listing::InFlight { older_than: Duration::from_secs(600) };
        let report_of = |entry: usize, page: &str, shown: usize, c: Counts, took: Duration| {
            // Each query is billed for its own entries, at least half a unit; spread evenly.
            let per_query = (c.entries * entry).div_ceil(c.queries.max(1));
            let query_units = c.queries as f64 * (per_query.div_ceil(4096).max(1) as f64 * 0.5);
            let units = query_units + c.records as f64 * record_units;
            println!(
                "| {in_flight} | {ended} | {page} | {shown} | {} | {} | {} | {units:.1} | {} ms |",
                c.queries,
                c.entries,
                c.records,
                took.as_millis()
            );
        };
        let report = |page: &str, shown: usize, c: Counts, took: Duration| {
            report_of(entry, page, shown, c, took);
        };
        let page = |q: ListQuery| {
            let store = &store;
            let counter = &counter;
            async move {
                counter.take();
                let started = Instant::now();
                let page = store.find(&q).await?;
                Ok::<_, Error>((page, counter.take(), started.elapsed()))
            }
        };
        let (first, c, took) = page(query(all, None, None)).await?;
        report("in flight, the first", first.orders.len(), c, took);
        let mut last: ListPage = first;
        for _ in 0..3 {
            last = page(query(all, None, last.next.clone())).await?.0;
        }
        let (fifth, c, took) = page(query(all, None, last.next.clone())).await?;
        report("in flight, the fifth", fifth.orders.len(), c, took);
        let (older, c, took) = page(query(old, None, None)).await?;
        report("in flight for over 10 minutes", older.orders.len(), c, took);
        let (at_step, c, took) = page(query(all, Some("reserve-inventory"), None)).await?;
        report("in flight at the step all are at", at_step.orders.len(), c, took);
        let (nowhere, c, took) = page(query(all, Some("ship"), None)).await?;
        let cut = if nowhere.next.is_some() { ", cut short" } else { "" };
        report(&format!("in flight at a step none is at{cut}"), nowhere.orders.len(), c, took);
        counter.take();
        let started = Instant::now();
        let counted = store.count(&query(all, None, None), COUNT_CAP).await?;
        let label = format!("the count of orders in flight, up to {COUNT_CAP}");
        report(&label, counted.orders as usize, counter.take(), started.elapsed());

        // Search pages of one customer's orders, half of them in flight and half ended on
        // the larger tables.
        let customers = (in_flight + ended).div_ceil(ORDERS_PER_CUSTOMER);
        let theirs = (in_flight + ended).div_ceil(customers);
        let find = |workflow: Option<&str>, after: Option<String>, value: String| {
            let (store, counter) = (&store, &counter);
            let workflow = workflow.map(str::to_owned);
            async move {
                counter.take();
                let started = Instant::now();
                let q = SearchQuery { value, workflow, limit: PAGE, after };
                let page = search(store, &q).await?;
                Ok::<_, Error>((page, counter.take(), started.elapsed()))
            }
        };
        let one = || customer(7, customers);
        let (first, c, took) = find(None, None, one()).await?;
        let label = format!("a customer's {theirs} orders, the first");
        report_of(search_entry, &label, first.orders.len(), c, took);
        let (second, c, took) = find(None, first.next.clone(), one()).await?;
        let label = format!("a customer's {theirs} orders, the second");
        report_of(search_entry, &label, second.orders.len(), c, took);
        let (none, c, took) = find(Some("express-fulfilment"), None, one()).await?;
        let label = format!("a customer's {theirs} orders, of a workflow none is of");
        report_of(search_entry, &label, none.orders.len(), c, took);
        let (nobody, c, took) = find(None, None, "c-nobody".into()).await?;
        report_of(search_entry, "a value no order has", nobody.orders.len(), c, took);
    }
    Ok(())
}

/// `in_flight` orders accepted over the last 20 minutes, not yet claimed, and `ended` ones
/// processed two hours ago.
fn items(
    in_flight: usize,
    ended: usize,
    workflow: &Workflow,
    config: &EngineConfig,
    now: Timestamp,
) -> Result<Vec<HashMap<String, AttributeValue>>, Error> {
    let mut items = Vec::with_capacity(in_flight + ended);
    let customers = (in_flight + ended).div_ceil(ORDERS_PER_CUSTOMER);
    for i in 0..in_flight {
        let ago = Duration::from_millis((i as u64 * 1_200_000) / in_flight.max(1) as u64);
        let mut order = new_order(&format!("flight-{i}"), workflow, config, now.minus(ago));
        order.search_key = Some(customer(i, customers));
        items.push(state_item(&order)?);
    }
    for i in 0..ended {
        let at = now.minus(Duration::from_secs(7200));
        let mut order = processed_order(&format!("ended-{i}"), workflow, config, at);
        order.search_key = Some(customer(in_flight + i, customers));
        items.push(state_item(&order)?);
    }
    Ok(items)
}

/// The customer of the `i`th order loaded, of `customers` taking turns.
fn customer(i: usize, customers: usize) -> String {
    format!("c-{}", i % customers.max(1))
}

/// The bytes of an order's entry in an index that holds the attributes `names` (its keys,
/// the table's, and what it projects), as DynamoDB sizes them.
fn index_entry_size(item: &HashMap<String, AttributeValue>, names: &[&str]) -> usize {
    names
        .iter()
        .filter_map(|name| Some((name, item.get(*name)?)))
        .map(|(name, v)| {
            name.len()
                + match v {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                    _ => 0,
                }
        })
        .sum()
}
