//! One X-Ray trace per order, across every queue hop.
//!
//! An order's correlation id is an X-Ray trace id (`1-<seconds, 8 hex>-<96 random bits, 24
//! hex>`), made by [`TraceIds`] when the order is accepted. Every message of the order carries
//! it, so every sender, the supervisor included, knows the order's trace without storing
//! anything more: each send sets SQS's `AWSTraceHeader` system attribute to the trace, with
//! the segment of the hop that sent it as parent ([`header_for`]). Each consumer continues it:
//! the handling of one message is a segment ([`Hop`]) in the trace its header names, child of
//! the sender's segment, with the order and correlation ids as annotations. The segments an
//! invocation ends are sent to X-Ray's API (`PutTraceSegments`) in one call as it ends
//! ([`flush`]), not to the daemon: Lambda runs that only for invocations it samples itself,
//! and its own tracing (`Tracing: Active`) would record a trace of its own for each function
//! every second, which a batch of many orders' messages has no use for.
//!
//! Which orders are traced is decided twice. At the start, `TRACE_SAMPLE_PERCENT` of them, by
//! their trace id, so that every hop agrees without being told. Then at the first fault: a
//! message that tells of one ([`Message::tells_of_fault`]), a hop that fails, and every send
//! of a process that only acts on orders in trouble ([`keep_every_send`]) mark the trace
//! sampled from there on, and the header carries the mark to every later hop. An order that
//! goes wrong is thus traced from its first fault whatever the share; one that does not costs
//! nothing unless it was sampled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use sas_engine::message::Message;
use sas_engine::ports::Ids;
use serde::Serialize;
use serde_json::Value;

/// The system attribute SQS carries a trace header in.
pub const ATTRIBUTE: &str = "AWSTraceHeader";

/// Correlation ids that are X-Ray trace ids.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceIds;

impl Ids for TraceIds {
    fn new_id(&self) -> String {
        let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("1-{:08x}-{}", seconds & 0xffff_ffff, &random[..24])
    }
}

/// Whether `id` is an X-Ray trace id (orders accepted before correlation ids were trace ids
/// have UUIDs: they get no trace).
pub fn is_trace_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 3 && parts[0] == "1" && hex(parts[1], 8) && hex(parts[2], 24)
}

/// An `AWSTraceHeader` value's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceHeader {
    pub root: String,
    pub parent: Option<String>,
    pub sampled: bool,
}

impl TraceHeader {
    /// Reads `Root=...;Parent=...;Sampled=...`; `None` without a valid root.
    pub fn parse(value: &str) -> Option<TraceHeader> {
        let mut header = TraceHeader { root: String::new(), parent: None, sampled: true };
        for part in value.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", root)) => header.root = root.to_owned(),
                Some(("Parent", parent)) => header.parent = Some(parent.to_owned()),
                Some(("Sampled", s)) => header.sampled = s != "0",
                _ => {}
            }
        }
        is_trace_id(&header.root).then_some(header)
    }
}

impl std::fmt::Display for TraceHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Root={}", self.root)?;
        if let Some(parent) = &self.parent {
            write!(f, ";Parent={parent}")?;
        }
        write!(f, ";Sampled={}", u8::from(self.sampled))
    }
}

/// A hop being handled: its segment's id, and whether its trace is kept.
#[derive(Debug)]
struct Open {
    id: String,
    sampled: bool,
}

/// The segments open in this process, by trace: a message sent for an order while one of its
/// hops is being handled here is that hop's child. A batch's sends go out together, from
/// another task than the handlers', so this cannot be a task-local.
fn open_hops() -> &'static Mutex<HashMap<String, Open>> {
    static OPEN: OnceLock<Mutex<HashMap<String, Open>>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
}

/// Set by [`keep_every_send`].
static EVERY_SEND: AtomicBool = AtomicBool::new(false);

/// Keeps the trace of every order this process sends a message for: the supervisor's sends
/// (a lease ran out, a deadline passed, a hold ended) and the operators' commands are about
/// orders worth a look.
pub fn keep_every_send() {
    EVERY_SEND.store(true, Ordering::Relaxed);
}

/// Whether the order with trace `root` is traced, out of `percent` of all orders. Decided
/// from the trace id alone, so that every hop of an order decides the same way without
/// being told.
pub fn sampled(root: &str, percent: u8) -> bool {
    let tail = root.get(root.len().saturating_sub(6)..).unwrap_or_default();
    u32::from_str_radix(tail, 16).is_ok_and(|n| n % 100 < u32::from(percent.min(100)))
}

/// The share of orders traced: `TRACE_SAMPLE_PERCENT` (0 to 100), all of them if unset.
fn sample_percent() -> u8 {
    static PERCENT: OnceLock<u8> = OnceLock::new();
    *PERCENT.get_or_init(|| {
        std::env::var("TRACE_SAMPLE_PERCENT").ok().and_then(|p| p.parse().ok()).unwrap_or(100)
    })
}

/// The `AWSTraceHeader` for `message`, if its order has a trace.
pub fn header_of(message: &Message) -> Option<TraceHeader> {
    header_for(message.correlation_id(), message.tells_of_fault())
}

/// The `AWSTraceHeader` for a message of the order with `correlation_id`, if it has a trace;
/// `fault` if the message tells of a fault, which keeps the trace from here on (the hop
/// sending it included).
pub fn header_for(correlation_id: &str, fault: bool) -> Option<TraceHeader> {
    header_at(correlation_id, fault || EVERY_SEND.load(Ordering::Relaxed), sample_percent())
}

/// [`header_for`], with `keep` if the trace is kept from here on, out of `percent` sampled.
fn header_at(correlation_id: &str, keep: bool, percent: u8) -> Option<TraceHeader> {
    if !is_trace_id(correlation_id) {
        return None;
    }
    let mut open = open_hops().lock().unwrap_or_else(|e| e.into_inner());
    let (parent, sampled) = match open.get_mut(correlation_id) {
        Some(hop) => {
            hop.sampled |= keep;
            (Some(hop.id.clone()), hop.sampled)
        }
        None => (None, keep || sampled(correlation_id, percent)),
    };
    Some(TraceHeader { root: correlation_id.to_owned(), parent, sampled })
}

/// What the body of a message says about its order, read without parsing it as a message (a
/// poison body still gets its hop).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct About {
    pub order_id: Option<String>,
    pub correlation_id: Option<String>,
    /// `start`, `request` or `reply`.
    pub kind: Option<String>,
    pub step: Option<String>,
}

impl About {
    pub fn of(body: &str) -> About {
        let Ok(v) = serde_json::from_str::<Value>(body) else { return About::default() };
        let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        About {
            order_id: text("order_id"),
            correlation_id: text("correlation_id"),
            kind: text("type"),
            step: v.pointer("/step/name").and_then(Value::as_str).map(str::to_owned),
        }
    }
}

/// The handling of one message: a segment of its order's trace.
#[derive(Debug)]
pub struct Hop {
    trace: Option<TraceHeader>,
    id: String,
    about: About,
    started: f64,
}

impl Hop {
    /// Begins the hop of a message that arrived with `header` (its `AWSTraceHeader`, if any).
    /// Without one, the order's correlation id names the trace.
    pub fn begin(header: Option<&str>, about: About) -> Hop {
        let trace = header.and_then(TraceHeader::parse).or_else(|| {
            about.correlation_id.as_deref().filter(|c| is_trace_id(c)).map(|c| TraceHeader {
                root: c.to_owned(),
                parent: None,
                sampled: sampled(c, sample_percent()),
            })
        });
        let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        if let Some(t) = &trace {
            open_hops()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(t.root.clone(), Open { id: id.clone(), sampled: t.sampled });
        }
        Hop { trace, id, about, started: now() }
    }

    /// The trace this hop belongs to.
    pub fn trace_id(&self) -> Option<&str> {
        self.trace.as_ref().map(|t| t.root.as_str())
    }

    pub fn about(&self) -> &About {
        &self.about
    }

    /// Ends the hop and sends its segment if its trace is kept; `failed` marks it as a fault,
    /// and keeps it.
    pub fn end(self, failed: bool) {
        let Some(trace) = &self.trace else { return };
        let kept_since = {
            let mut open = open_hops().lock().unwrap_or_else(|e| e.into_inner());
            match open.get(&trace.root) {
                Some(hop) if hop.id == self.id => {
                    open.remove(&trace.root).is_some_and(|h| h.sampled)
                }
                _ => false,
            }
        };
        if !(trace.sampled || kept_since || failed) {
            return;
        }
        let segment = Segment {
            name: segment_name(),
            id: &self.id,
            trace_id: &trace.root,
            parent_id: trace.parent.as_deref(),
            start_time: self.started,
            end_time: now(),
            fault: failed,
            annotations: Annotations {
                order_id: self.about.order_id.as_deref(),
                correlation_id: self.about.correlation_id.as_deref(),
                message: self.about.kind.as_deref(),
                step: self.about.step.as_deref(),
            },
        };
        emit(&segment);
    }
}

/// An X-Ray segment document, as the daemon takes it.
#[derive(Debug, Serialize)]
struct Segment<'a> {
    name: &'a str,
    id: &'a str,
    trace_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_id: Option<&'a str>,
    start_time: f64,
    end_time: f64,
    fault: bool,
    annotations: Annotations<'a>,
}

#[derive(Debug, Serialize)]
struct Annotations<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The function's name, as X-Ray shows the service.
fn segment_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "sas".to_owned())
    })
}

/// The segments ended and not yet sent, as documents.
fn pending() -> &'static Mutex<Vec<String>> {
    static PENDING: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    PENDING.get_or_init(Mutex::default)
}

/// The X-Ray client the segments are sent with ([`install`]).
static CLIENT: OnceLock<aws_sdk_xray::Client> = OnceLock::new();

/// Sends the segments with `client` from now on; without one they are dropped.
pub fn install(client: aws_sdk_xray::Client) {
    let _ = CLIENT.set(client);
}

/// Most documents in one `PutTraceSegments` call.
const SEGMENTS_PER_CALL: usize = 50;

fn emit(segment: &Segment<'_>) {
    if CLIENT.get().is_none() {
        return;
    }
    if let Ok(document) = serde_json::to_string(segment) {
        pending().lock().unwrap_or_else(|e| e.into_inner()).push(document);
    }
}

/// Sends the segments ended since the last call: done at the end of each invocation, before
/// Lambda freezes the process. Most invocations have none (their orders were not sampled,
/// and met no fault) and call nothing. A segment that cannot be sent is not worth failing an
/// invocation for: it is logged and dropped.
pub async fn flush() {
    let Some(client) = CLIENT.get() else { return };
    let documents = std::mem::take(&mut *pending().lock().unwrap_or_else(|e| e.into_inner()));
    for chunk in documents.chunks(SEGMENTS_PER_CALL) {
        let sent = client
            .put_trace_segments()
            .set_trace_segment_documents(Some(chunk.to_vec()))
            .send()
            .await;
        match sent {
            Ok(out) if !out.unprocessed_trace_segments().is_empty() => {
                let refused = out.unprocessed_trace_segments().len();
                tracing::warn!(refused, "X-Ray refused trace segments");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %aws_sdk_xray::error::DisplayErrorContext(&e), segments = chunk.len(), "trace segments not sent")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correlation_id_is_a_trace_id() {
        let id = TraceIds.new_id();
        assert!(is_trace_id(&id), "{id}");
        assert_ne!(id, TraceIds.new_id());
        assert!(!is_trace_id("98f0c25b-d07c-4996-8a28-a93fbfee6967"), "a UUID is not one");
    }

    #[test]
    fn a_header_is_read_and_written_back() {
        let text = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let header = TraceHeader::parse(text).unwrap();
        assert_eq!(header.parent.as_deref(), Some("53995c3f42cd8ad8"));
        assert_eq!(header.to_string(), text);
        assert!(
            !TraceHeader::parse("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=0")
                .unwrap()
                .sampled
        );
        assert_eq!(TraceHeader::parse("Root=nonsense"), None);
    }

    #[test]
    fn a_send_during_a_hop_is_its_child_and_continues_its_trace() {
        let root = TraceIds.new_id();
        assert_eq!(header_for(&root, false).unwrap().parent, None, "no hop of this order is open");
        let incoming = format!("Root={root};Parent=1111222233334444;Sampled=1");
        let hop = Hop::begin(Some(&incoming), About::default());
        assert_eq!(hop.trace_id(), Some(root.as_str()));
        let sent = header_for(&root, false).unwrap();
        assert_eq!(
            (sent.root.as_str(), sent.parent.as_deref()),
            (root.as_str(), Some(hop.id.as_str()))
        );
        hop.end(false);
        assert_eq!(header_for(&root, false).unwrap().parent, None, "closed");
        assert!(header_for("98f0c25b-d07c-4996-8a28-a93fbfee6967", false).is_none());
    }

    #[test]
    fn a_fault_keeps_a_trace_that_was_not_sampled_from_that_hop_on() {
        let root = TraceIds.new_id();
        assert!(!header_at(&root, false, 0).unwrap().sampled, "none sampled at the start");
        let hop = Hop::begin(Some(&format!("Root={root};Sampled=0")), About::default());
        assert!(!header_at(&root, false, 0).unwrap().sampled);
        let fault = header_at(&root, true, 0).unwrap();
        assert_eq!((fault.sampled, fault.parent.as_deref()), (true, Some(hop.id.as_str())));
        assert!(header_at(&root, false, 0).unwrap().sampled, "the rest of the hop's sends too");
        let kept = open_hops().lock().unwrap().get(&root).is_some_and(|h| h.sampled);
        assert!(kept, "and the hop's own segment");
        hop.end(false);
        // The next hop reads the mark from the header its message carries.
        let next = Hop::begin(Some(&fault.to_string()), About::default());
        assert!(header_at(&root, false, 0).unwrap().sampled);
        next.end(false);
    }

    #[test]
    fn sampling_is_decided_by_the_trace_id_alone() {
        let ids: Vec<String> = (0..2000).map(|_| TraceIds.new_id()).collect();
        let share = |p| ids.iter().filter(|id| sampled(id, p)).count();
        assert_eq!((share(0), share(100)), (0, 2000));
        let tenth = share(10);
        assert!((100..300).contains(&tenth), "about a tenth: {tenth}");
        assert!(ids.iter().all(|id| sampled(id, 10) == sampled(id, 10)));
    }

    #[test]
    fn a_body_tells_its_order_even_when_it_is_not_a_message() {
        let about = About::of(
            r#"{"type":"reply","order_id":"o","correlation_id":"c","step":{"name":"ship"}}"#,
        );
        assert_eq!(about.order_id.as_deref(), Some("o"));
        assert_eq!(about.step.as_deref(), Some("ship"));
        assert_eq!(About::of("not json"), About::default());
    }
}
