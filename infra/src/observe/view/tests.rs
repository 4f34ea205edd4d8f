//! The view's reading of records, and the page's rendering of them.

use serde_json::{Value, json};

use super::*;

fn record(state: &str, body: Value) -> Record {
    Record { order_id: "o-1".into(), state: state.into(), created_at: Some(1_000), body }
}

#[test]
fn an_ended_order_has_its_outcome_end_and_cause_from_its_record() {
    let r = record(
        "Error",
        json!({"timeline": [
                {"at": 1_000, "what": "received", "attempt": 0},
                {"at": 3_500, "what": "compensated", "attempt": 1},
                {"at": 3_600, "what": "alert_sent", "attempt": 1}],
              "cause": {"kind": "step_rejected", "step": "charge-payment", "reason": "declined"}}),
    );
    let row = r.row();
    assert_eq!(row.outcome.as_deref(), Some("compensated"));
    assert_eq!(row.ended_at, Some(3_500), "the end entry, with no ended_at");
    assert_eq!(row.cause.as_deref(), Some("charge-payment was refused: declined"));
    let with_end = record("Processed", json!({"ended_at": 2_000, "timeline": []}));
    assert_eq!(
        (with_end.outcome().as_deref(), with_end.ended_at()),
        (Some("processed"), Some(2_000))
    );
    let late = json!({"cause": {"kind": "step_timed_out", "step": "approval", "failures": 1}});
    assert_eq!(
        record("Error", late.clone()).cause().as_deref(),
        Some("approval did not finish in time: its lease expired once")
    );
    let mut unanswered = late;
    unanswered["steps"] = json!([{"name": "approval", "detail": "no answer within 20 s"}]);
    assert_eq!(
        record("Error", unanswered).cause().as_deref(),
        Some("approval did not finish in time: no answer within 20 s")
    );
    let running = record("Processing", json!({"timeline": [{"at": 1_000, "what": "claimed"}]}));
    assert_eq!((running.outcome(), running.ended_at()), (None, None));
}

#[test]
fn an_order_stopping_and_a_wait_are_shown_as_such() {
    let r = record(
        "Processing",
        json!({"phase": "forward",
               "cause": {"kind": "step_rejected", "step": "charge", "reason": "declined"},
               "timeline": [
                {"at": 1_000, "what": "received", "attempt": 0},
                {"at": 2_000, "what": "waiting", "attempt": 2, "step": "approval",
                 "reason": "waits for an answer from outside", "until": 62_000}]}),
    );
    assert_eq!(r.row().state, "Processing (stopping)");
    let html = order_page(&r);
    assert!(html.contains("stopping: a step failed"), "{html}");
    assert!(html.contains("waits for an answer from outside; until "), "{html}");
    let going = record("Processing", json!({"phase": "forward", "timeline": []}));
    assert_eq!(going.row().state, "Processing");
}

#[test]
fn the_report_embeds_its_view_where_no_text_can_close_the_script() {
    let view = View {
        started_at: 0,
        elapsed: 1.0,
        states: vec!["Error".into()],
        queues: vec![],
        samples: vec![],
        ended: vec![],
        order_count: 1,
        orders: vec![],
        alerts: vec![Alert {
            order_id: "o-1".into(),
            at: None,
            outcome: "failed".into(),
            cause: "</script><b>".into(),
            sent: false,
        }],
        alert_count: 1,
        dead_letters: vec![],
        dead_letter_count: 0,
        metrics: MetricsSummary::default(),
    };
    let html = page(Some(&view), "");
    let start = html.find("<script type=\"application/json\" id=\"view\">").unwrap();
    let end = start + html[start..].find("</script>").unwrap();
    let json = &html[start..end].split_once('>').unwrap().1;
    let back: Value = serde_json::from_str(json).unwrap();
    assert_eq!(back["alerts"][0]["cause"], "</script><b>");
    assert!(!page(None, "").contains("id=\"view\""), "the live page fetches its view");
}

#[test]
fn a_timeline_shows_each_entry_escaped_with_its_step_and_detail() {
    let r = record(
        "Processing",
        json!({"timeline": [
                {"at": 1_000, "what": "received", "attempt": 0},
                {"at": 1_250, "what": "step_failed", "attempt": 1, "step": "ship", "reason": "<down>"}]}),
    );
    let t = timeline(&r);
    assert!(t.contains("<tr data-what=\"received\">"));
    assert!(t.contains("+0.25 s") && t.contains("step failed") && t.contains("ship"));
    assert!(t.contains("&lt;down&gt;") && !t.contains("<down>"));
}
