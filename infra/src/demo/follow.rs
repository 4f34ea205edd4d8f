//! Following the demo's run: the orders submitted, then read from the state table every two
//! seconds (less often once a read takes long), with their progress printed, until every
//! accepted order has settled or the time given is up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::Summary;
use super::clients::{Door, submit_all};
use super::records::{Item, scan, settled, state_of};
use super::summary::{Ran, summarise};
use crate::Error;
use crate::emulation::aws::Clients;
use crate::emulation::local::LocalStack;

/// How often the demo reads the state table, at least.
const FOLLOW_EVERY: Duration = Duration::from_secs(2);

/// Submits the orders and follows them to their end or the limit, as [`super::run`] says, then
/// summarises the run.
pub(super) async fn follow(
    stack: &LocalStack,
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    accepted_at: &OnceLock<Instant>,
    kills: &AtomicU64,
) -> Result<Summary, Error> {
    let started = Instant::now();
    let deadline = started + limit;
    let http = reqwest::Client::new();
    let door = Arc::new(Door::default());
    let submitting = submit_all(stack, &http, orders, rate, deadline, &door);

    // Straight to the emulators: the demo's own reads are not the system's cost.
    let clients = Clients::new(&stack.emulators, "us-east-1").await;
    let table =
        stack.stack.reference("StateTable").ok_or_else(|| Error::Local("no StateTable".into()))?;
    let mut ids: Option<Vec<String>> = None;
    let mut submitting = Some(submitting);
    let mut records;
    loop {
        if let Some(accepted) = accepted(&mut submitting).await {
            let _ = accepted_at.set(Instant::now());
            println!(
                "demo: {} orders accepted in {:.1} s ({} refused at the door and sent again later, {} throttled)",
                accepted.len(),
                started.elapsed().as_secs_f64(),
                door.refused.load(Ordering::Relaxed),
                door.throttled.load(Ordering::Relaxed)
            );
            ids = Some(accepted);
        }
        let read = Instant::now();
        records = scan(&clients.dynamodb, &table).await?;
        let reading = read.elapsed();
        print_progress(&records, started, ids.is_none(), &door);
        // Every order accepted is there, and every record (theirs and their children's) settled.
        let seen: std::collections::HashSet<&str> = records
            .iter()
            .filter_map(|r| r.get("OrderId").and_then(|v| v.as_s().ok()))
            .map(String::as_str)
            .collect();
        let done = ids.as_ref().is_some_and(|ids| ids.iter().all(|id| seen.contains(id.as_str())))
            && records.iter().all(settled);
        // Orders accepted late (a run paced slower than its door, or held back by kills) get the
        // whole limit after the last acceptance to end, as the first ones did.
        let ending_by = accepted_at.get().map_or(deadline, |at| *at + limit);
        if done || Instant::now() > ending_by {
            break;
        }
        // A scan of the whole table grows with the orders: the demo reads it no more than a
        // fifth of the time, so that following the run does not become the emulator's work.
        tokio::time::sleep(FOLLOW_EVERY.max(reading * 4)).await;
    }
    let ids = match (ids, submitting) {
        (Some(ids), _) => ids,
        (None, Some(s)) => {
            s.abort();
            records
                .iter()
                .filter_map(|r| r.get("OrderId").and_then(|v| v.as_s().ok()).cloned())
                .collect()
        }
        (None, None) => Vec::new(),
    };
    let ran = Ran {
        records: &records,
        accepted: ids.len(),
        elapsed: started.elapsed(),
        door: &door,
        kills,
    };
    let mut summary = summarise(stack, &clients, &http, ran).await?;
    summary.kills = u32::try_from(kills.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
    Ok(summary)
}

/// The ids of the orders accepted, once submitting has finished (which takes it), if it has.
async fn accepted(submitting: &mut Option<JoinHandle<Vec<String>>>) -> Option<Vec<String>> {
    if !submitting.as_ref().is_some_and(|s| s.is_finished()) {
        return None;
    }
    let submitted = submitting.take()?;
    Some(submitted.await.unwrap_or_default())
}

/// Prints the orders by state, and, while still `submitting`, how many the door refused.
fn print_progress(records: &[Item], started: Instant, submitting: bool, door: &Door) {
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for r in records {
        *by_state.entry(state_of(r)).or_default() += 1;
    }
    let refused = door.refused.load(Ordering::Relaxed);
    println!(
        "demo: {:>5.1} s  {}{}",
        started.elapsed().as_secs_f64(),
        if by_state.is_empty() {
            "no order yet".to_owned()
        } else {
            by_state.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join("  ")
        },
        if submitting && refused > 0 {
            format!("  (door: {refused} refused)")
        } else {
            String::new()
        }
    );
}
