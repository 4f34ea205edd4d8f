//! The orders' traces as X-Ray holds them: the functions send their segments to X-Ray's API
//! (the local stack's emulator), and this reads them back by trace id, so that one order's
//! trace can be followed and checked.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most trace ids one `BatchGetTraces` takes.
const TRACES_PER_CALL: usize = 5;

/// One segment as a function sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub name: String,
    pub id: String,
    pub trace_id: String,
    #[serde(default)]
    pub parent_id: Option<String>,
    pub start_time: f64,
    pub end_time: f64,
    #[serde(default)]
    pub fault: bool,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl Segment {
    pub fn order_id(&self) -> Option<&str> {
        self.annotations.get("order_id").map(String::as_str)
    }
}

/// X-Ray's traces, read with a client of its API; cheap to clone.
#[derive(Clone, Debug)]
pub struct Traces {
    client: aws_sdk_xray::Client,
}

impl Traces {
    pub fn new(client: aws_sdk_xray::Client) -> Traces {
        Traces { client }
    }

    /// Every segment of the traces `ids`, earliest first; a trace X-Ray does not hold has
    /// none. Segments X-Ray holds but cannot be read as ours are left out.
    pub async fn segments(&self, ids: &[String]) -> Result<Vec<Segment>, String> {
        let mut found = Vec::new();
        for chunk in ids.chunks(TRACES_PER_CALL) {
            let mut next = None;
            loop {
                let page = self
                    .client
                    .batch_get_traces()
                    .set_trace_ids(Some(chunk.to_vec()))
                    .set_next_token(next)
                    .send()
                    .await
                    .map_err(|e| format!("{}", aws_sdk_xray::error::DisplayErrorContext(&e)))?;
                for trace in page.traces() {
                    found.extend(
                        trace
                            .segments()
                            .iter()
                            .filter_map(|s| serde_json::from_str::<Segment>(s.document()?).ok()),
                    );
                }
                next = page.next_token().map(str::to_owned);
                if next.is_none() {
                    break;
                }
            }
        }
        found.sort_by(|a, b| a.start_time.total_cmp(&b.start_time));
        Ok(found)
    }
}

/// What the segments say of each order: its traces and its hops.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderTraces {
    /// Order id to the trace ids its segments carry, and how many segments.
    pub by_order: BTreeMap<String, (Vec<String>, usize)>,
    /// Segments whose parent is not a segment of the same trace that arrived.
    pub orphans: usize,
}

impl OrderTraces {
    pub fn of(segments: &[Segment]) -> OrderTraces {
        let mut out = OrderTraces::default();
        let ids: std::collections::HashSet<(&str, &str)> =
            segments.iter().map(|s| (s.trace_id.as_str(), s.id.as_str())).collect();
        for s in segments {
            if let Some(parent) = &s.parent_id {
                if !ids.contains(&(s.trace_id.as_str(), parent.as_str())) {
                    out.orphans += 1;
                }
            }
            let Some(order) = s.order_id() else { continue };
            let (traces, hops) = out.by_order.entry(order.to_owned()).or_default();
            if !traces.contains(&s.trace_id) {
                traces.push(s.trace_id.clone());
            }
            *hops += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_is_whole_when_its_segments_are_one_trace_of_parents_and_children() {
        let segment = |id: &str, parent: Option<&str>| Segment {
            name: "agent".into(),
            id: id.into(),
            trace_id: "1-5759e988-bd862e3fe1be46a994272793".into(),
            parent_id: parent.map(str::to_owned),
            start_time: 2.0,
            end_time: 3.0,
            fault: false,
            annotations: BTreeMap::from([("order_id".into(), "o".into())]),
        };
        let document = r#"{"name":"SchedulerFunction","id":"a1","trace_id":"1-5759e988-bd862e3fe1be46a994272793","start_time":1.0,"end_time":2.0,"fault":false,"annotations":{"order_id":"o"}}"#;
        let first: Segment = serde_json::from_str(document).unwrap();
        assert_eq!(first, segment("a1", None).with_times(1.0, 2.0, "SchedulerFunction"));
        let traces = OrderTraces::of(&[first.clone(), segment("b2", Some("a1"))]);
        assert_eq!(
            traces.by_order["o"],
            (vec!["1-5759e988-bd862e3fe1be46a994272793".to_owned()], 2)
        );
        assert_eq!(traces.orphans, 0);
        assert_eq!(OrderTraces::of(&[segment("c3", Some("gone"))]).orphans, 1);
    }

    impl Segment {
        fn with_times(mut self, start: f64, end: f64, name: &str) -> Segment {
            (self.start_time, self.end_time, self.name) = (start, end, name.into());
            self
        }
    }
}
