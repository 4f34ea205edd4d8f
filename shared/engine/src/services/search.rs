//! Orders found by a value of their input: the one their workflow declares as its
//! `search_key` (a customer, an account), ended orders included, the newest first. The store's
//! search index gives the orders of a value; each page then reads their records, for what
//! became of them and to keep only one workflow's when asked.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::ports::{OrderFinder, Read, StateStore, cursor_at, cursor_start};
use crate::state::{ProcessState, StateRecord};
use crate::time::Timestamp;
use crate::workflow::MAX_SEARCH_VALUE_LEN;

/// Most orders of other workflows one page reads past when it asks for one workflow's: then
/// it ends short, and its `next` reads on.
pub const MAX_PASSED: usize = 500;

/// What an operator looks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    /// The value of the search key, exactly as the input holds it (an integer as its digits).
    pub value: String,
    /// Only orders of this workflow (any version).
    pub workflow: Option<String>,
    /// At most this many orders, within 1 to 1,000.
    pub limit: usize,
    /// Where the previous page ended (its `next`).
    pub after: Option<String>,
}

/// One order found: what it runs and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Found {
    pub order_id: OrderId,
    pub workflow: String,
    pub workflow_version: u32,
    pub process_state: ProcessState,
    pub accepted_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// The step it is at (in flight or paused), or the step that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Why it failed or was cancelled (`step_rejected`, `cancelled`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
}

/// A page of orders found, and where the next one starts if there may be more.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SearchPage {
    pub orders: Vec<Found>,
    pub next: Option<String>,
}

/// The page of orders `query` asks for. A value no order has finds an empty page; a value no
/// order could have (empty, or longer than an indexed one) is refused.
pub async fn search<S>(store: &S, query: &SearchQuery) -> Result<SearchPage>
where
    S: StateStore + OrderFinder,
{
    let value = query.value.as_str();
    if value.is_empty() {
        return Err(Error::InvalidCommand("the value to search for is empty".into()));
    }
    if value.len() > MAX_SEARCH_VALUE_LEN {
        return Err(Error::InvalidCommand(format!(
            "no order is found by a value longer than {MAX_SEARCH_VALUE_LEN} bytes"
        )));
    }
    let mut after = cursor_start(query.after.as_deref())?;
    let size = query.limit.clamp(1, 1000);
    let mut rows: Vec<((Timestamp, OrderId), Found)> = Vec::new();
    let mut passed = 0;
    loop {
        // One more than the page, to tell whether another follows; a filtered page reads
        // ahead, since some of what it reads is passed over.
        let want = size + 1 - rows.len();
        let ask = match &query.workflow {
            Some(_) => want.max(50).min(MAX_PASSED - passed + want),
            None => want,
        };
        let entries = store.searched(value, after, ask).await?;
        // Unfiltered, each record read is shown (or was forgotten): the entry past the page
        // only says that another follows, and its record is not read.
        let read = match &query.workflow {
            Some(_) => entries.len(),
            None => entries.len().min(size - rows.len()),
        };
        let ids: Vec<OrderId> = entries[..read].iter().map(|&(_, id)| id).collect();
        let records = store.load_many(&ids, Read::Eventual).await?;
        for (&entry, record) in entries[..read].iter().zip(records) {
            after = Some(entry);
            // Forgotten since the index was read, or not yet readable: not shown.
            let Some(record) = record.filter(|r| r.search_key.as_deref() == Some(value)) else {
                continue;
            };
            if query.workflow.as_ref().is_some_and(|w| *w != record.workflow) {
                passed += 1;
                continue;
            }
            rows.push((entry, found(&record)));
            if rows.len() > size {
                rows.truncate(size);
                let next = rows.last().map(|(entry, _)| cursor_at(*entry));
                return Ok(page(rows, next));
            }
        }
        if read < entries.len() {
            return Ok(page(rows, after.map(cursor_at)));
        }
        if entries.len() < ask {
            return Ok(page(rows, None));
        }
        if passed >= MAX_PASSED {
            return Ok(page(rows, after.map(cursor_at)));
        }
    }
}

/// The page of `rows` (each with its index entry), followed by `next`.
fn page(rows: Vec<((Timestamp, OrderId), Found)>, next: Option<String>) -> SearchPage {
    SearchPage { orders: rows.into_iter().map(|(_, found)| found).collect(), next }
}

/// What the search shows of `record`.
fn found(record: &StateRecord) -> Found {
    let step = match &record.cause {
        Some(cause) => cause.step().map(str::to_owned),
        None => record.current_step().map(|s| s.name.clone()),
    };
    Found {
        order_id: record.order_id,
        workflow: record.workflow.clone(),
        workflow_version: record.workflow_version,
        process_state: record.process_state,
        accepted_at: record.created_at.to_rfc3339(),
        ended_at: record.ended_at.map(Timestamp::to_rfc3339),
        step,
        cause: record.cause.as_ref().map(|c| c.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::ids::IdempotencyKey;
    use crate::machine::{self, Ctx};
    use crate::memory::{ManualClock, MemoryStore};
    use crate::workflow::Workflow;

    /// `n` orders of customer `c-1` accepted a second apart from `from`, of workflow `name`.
    async fn accept(store: &MemoryStore<ManualClock>, name: &str, from: i64, n: i64) {
        let json = sas_workflows::order_fulfilment();
        let workflow = Workflow::from_json(json, &Workflow::agents_in(json)).unwrap();
        let config = EngineConfig::default();
        for i in from..from + n {
            let now = Timestamp::from_millis(i * 1000);
            let ctx = Ctx { now, config: &config, workflow: &workflow, seed: 0 };
            let id = OrderId::for_key(&IdempotencyKey::parse(&format!("{name}-{i}")).unwrap());
            let mut record = machine::create(id, "corr".into(), &ctx).next;
            record.workflow = name.into();
            record.search_key = Some("c-1".into());
            store.create_state(&record).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_page_of_one_workflow_s_orders_reads_past_a_bounded_number_of_others() {
        let store = MemoryStore::new(ManualClock::default());
        accept(&store, "rare", 0, 2).await;
        accept(&store, "common", 2, MAX_PASSED as i64 + 20).await;
        let mut query = SearchQuery {
            value: "c-1".into(),
            workflow: Some("rare".into()),
            limit: 10,
            after: None,
        };
        // The newest 500 are another workflow's: the page ends short, with where to read on.
        let short = search(&store, &query).await.unwrap();
        assert!(short.orders.is_empty());
        query.after = Some(short.next.expect("more may follow"));
        let rest = search(&store, &query).await.unwrap();
        assert_eq!(rest.orders.len(), 2);
        assert!(rest.orders.iter().all(|f| f.workflow == "rare"));
        assert_eq!(rest.next, None);
    }
}
