//! The X-Ray daemon's local counterpart: a UDP listener on loopback that the functions send
//! their trace segments to (`AWS_XRAY_DAEMON_ADDRESS`), keeping them so that one order's trace
//! can be followed and checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// Largest datagram read; a segment is far smaller.
const DATAGRAM: usize = 64 * 1024;

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

/// The segments received so far; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Traces {
    segments: Arc<Mutex<Vec<Segment>>>,
    /// Datagrams that were not a segment document.
    unreadable: Arc<Mutex<u64>>,
}

impl Traces {
    /// Listens on `socket` until the returned task is aborted.
    pub fn listen(&self, socket: UdpSocket) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; DATAGRAM];
            while let Ok(n) = socket.recv(&mut buffer).await {
                this.ingest(&buffer[..n]);
            }
        })
    }

    /// Takes one datagram: the daemon's header line, then a segment document.
    fn ingest(&self, datagram: &[u8]) {
        let text = String::from_utf8_lossy(datagram);
        let segment = text
            .split_once('\n')
            .filter(|(header, _)| header.contains("\"format\""))
            .and_then(|(_, document)| serde_json::from_str::<Segment>(document).ok());
        match segment {
            Some(s) => self.segments.lock().unwrap_or_else(|e| e.into_inner()).push(s),
            None => *self.unreadable.lock().unwrap_or_else(|e| e.into_inner()) += 1,
        }
    }

    /// Every segment so far, in the order they arrived.
    pub fn segments(&self) -> Vec<Segment> {
        self.segments.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The segments annotated with `order_id`, earliest first.
    pub fn of_order(&self, order_id: &str) -> Vec<Segment> {
        let mut found: Vec<Segment> =
            self.segments().into_iter().filter(|s| s.order_id() == Some(order_id)).collect();
        found.sort_by(|a, b| a.start_time.total_cmp(&b.start_time));
        found
    }

    pub fn unreadable(&self) -> u64 {
        *self.unreadable.lock().unwrap_or_else(|e| e.into_inner())
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
    fn a_datagram_is_a_header_line_and_a_segment() {
        let t = Traces::default();
        t.ingest(br#"{"format":"json","version":1}
{"name":"SchedulerFunction","id":"a1","trace_id":"1-5759e988-bd862e3fe1be46a994272793","start_time":1.0,"end_time":2.0,"fault":false,"annotations":{"order_id":"o"}}"#);
        t.ingest(b"nonsense");
        assert_eq!(t.of_order("o").len(), 1);
        assert_eq!(t.unreadable(), 1);
        let child = Segment {
            name: "agent".into(),
            id: "b2".into(),
            trace_id: "1-5759e988-bd862e3fe1be46a994272793".into(),
            parent_id: Some("a1".into()),
            start_time: 2.0,
            end_time: 3.0,
            fault: false,
            annotations: BTreeMap::from([("order_id".into(), "o".into())]),
        };
        let mut all = t.segments();
        all.push(child);
        let traces = OrderTraces::of(&all);
        assert_eq!(
            traces.by_order["o"],
            (vec!["1-5759e988-bd862e3fe1be46a994272793".to_owned()], 2)
        );
        assert_eq!(traces.orphans, 0);
    }
}
