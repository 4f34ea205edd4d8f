//! Publishing status events and alerts on an EventBridge bus. `PutEvents` can accept some
//! entries of a call and refuse others; the refused ones are reported to the engine, which
//! treats a refused alert as an error, never as a log line.

use aws_sdk_eventbridge::Client;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use sas_engine::events::{BusEvent, PublishReport};
use sas_engine::ports::EventBus;
use sas_engine::{Error, Result};

use crate::errors::classify;

const SERVICE: &str = "eventbridge";
/// `source` of every event the system publishes; rules match on it.
pub const EVENT_SOURCE: &str = sas_engine::starts::OWN_SOURCE;

/// The [`EventBus`] port on EventBridge.
#[derive(Clone, Debug)]
pub struct EventBridgeBus {
    client: Client,
    bus_name: String,
}

impl EventBridgeBus {
    pub fn new(client: Client, bus_name: String) -> Self {
        EventBridgeBus { client, bus_name }
    }
}

impl EventBus for EventBridgeBus {
    async fn publish(&self, events: &[BusEvent]) -> Result<PublishReport> {
        if events.is_empty() {
            return Ok(PublishReport::default());
        }
        let entries = events
            .iter()
            .map(|e| {
                PutEventsRequestEntry::builder()
                    .event_bus_name(&self.bus_name)
                    .source(EVENT_SOURCE)
                    .detail_type(e.detail_type)
                    .detail(&e.detail)
                    // Lets an operator find every event of one order in CloudTrail or a log.
                    .resources(format!("order:{}", e.id))
                    .build()
            })
            .collect();
        let out = self
            .client
            .put_events()
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        let failed: Vec<(usize, String)> = out
            .entries()
            .iter()
            .enumerate()
            .filter_map(|(i, entry)| {
                entry.error_code().map(|code| {
                    (i, format!("{code}: {}", entry.error_message().unwrap_or_default()))
                })
            })
            .collect();
        // The count and the entries must agree; if they do not, trust the count and blame the
        // whole batch rather than miss a failure.
        if failed.is_empty() && out.failed_entry_count() > 0 {
            return Err(Error::PublishFailed {
                failed: usize::try_from(out.failed_entry_count()).unwrap_or(events.len()),
                total: events.len(),
                first_reason: "failure count without failed entries".into(),
            });
        }
        Ok(PublishReport { failed })
    }
}
