//! The admin API on a moto server: the real admin handler with the real adapters, driving
//! orders that the real submission, scheduler, agent and supervisor handlers run. Each command
//! is seen through the API as an operator sees it, and its outcome in the table, the remote
//! service's ledger and the events.

#![allow(clippy::unwrap_used)]

use sas_engine::OrderId;
use sas_engine::state::ProcessState;
use sas_tests::effects::{assert_effects_match, ended};
use sas_tests::stack::{System, order_id, order_json, statuses};
use serde_json::{Value, json};

const OPERATOR: &str = "arn:aws:iam::123456789012:user/ops-ada";

async fn submit(s: &System, key: &str) -> OrderId {
    let (status, body) = s.post(Some(key), "application/json", &order_json("c-admin")).await;
    assert_eq!(status, 202, "{body}");
    order_id(&body)
}

async fn command(s: &System, id: OrderId, verb: &str, body: Value) -> (u16, Value) {
    s.admin("POST", &format!("/admin/orders/{id}/{verb}"), Some(body), Some(OPERATOR)).await
}

fn listed(page: &Value) -> Vec<String> {
    page["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["order_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The ledger's effects of one order as `action` strings, in the order they were applied.
async fn effects(s: &System, id: OrderId) -> Vec<String> {
    let ledger = s.remote.ledger().await;
    ledger["effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["key"].as_str().unwrap_or_default().starts_with(&id.to_string()))
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_failed_order_is_found_shown_and_redriven_once_its_service_is_back() {
    let s = System::start(
        "admin-redrive",
        r#"{"actions": {"charge-payment": {"permanent_rate": 1.0}}}"#,
    )
    .await;
    let id = submit(&s, "admin-redrive-1").await;
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Error);

    let (status, page) = s.admin("GET", "/admin/orders?list=failed", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(listed(&page), [id.to_string()]);
    assert_eq!(page["orders"][0]["step"], "charge-payment");
    assert_eq!(page["orders"][0]["cause"], "step_rejected");
    let (_, page) =
        s.admin("GET", "/admin/orders?list=failed&step=ship", None, Some(OPERATOR)).await;
    assert!(listed(&page).is_empty(), "filtered out by step: {page}");
    // Each listing counted with the same filters.
    let (status, counts) = s.admin("GET", "/admin/counts", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{counts}");
    assert_eq!(counts["failed"], json!({"orders": 1, "capped": false, "exact": true}));
    assert_eq!(
        (counts["paused"]["orders"].as_u64(), counts["reported"]["orders"].as_u64()),
        (Some(0), Some(0))
    );
    let (_, counts) = s.admin("GET", "/admin/counts?step=ship", None, Some(OPERATOR)).await;
    assert_eq!(counts["failed"]["orders"], 0, "{counts}");
    let (status, _) = s.admin("GET", "/admin/counts?step=a%20b", None, Some(OPERATOR)).await;
    assert_eq!(status, 400);

    let (status, view) = s.admin("GET", &format!("/admin/orders/{id}"), None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["process_state"], "Error");
    assert_eq!(view["needs_manual_undo"], json!([]), "the reservation was released");
    assert_eq!(view["alert"], "sent");
    // The steps of the order's version, outlined for a console to draw.
    let outline = view["outline"].as_array().unwrap();
    let names: Vec<&str> = outline.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["reserve-inventory", "charge-payment", "ship"], "{view}");
    assert_eq!(outline[1]["depends_on"], json!(["reserve-inventory"]));
    assert_eq!(
        (outline[1]["kind"].as_str(), outline[1]["runs"].as_str()),
        (Some("agent"), Some("payment"))
    );
    assert_eq!(outline[0]["undo"], "release-inventory");
    // Each step's input beside the order's: the outputs of every step before it.
    let given: Vec<&Value> = outline.iter().map(|s| &s["given"]).collect();
    assert_eq!(
        given,
        [
            &json!([]),
            &json!(["reserve-inventory"]),
            &json!(["reserve-inventory", "charge-payment"])
        ]
    );
    // Its values are small, kept in the record: shown whole either way; anything else is refused.
    let whole = format!("/admin/orders/{id}?values=whole");
    let (status, shown) = s.admin("GET", &whole, None, Some(OPERATOR)).await;
    assert_eq!((status, &shown["order"], &shown["steps"]), (200, &view["order"], &view["steps"]));
    let bad = format!("/admin/orders/{id}?values=all");
    let (status, refused) = s.admin("GET", &bad, None, Some(OPERATOR)).await;
    assert_eq!(status, 400, "{refused}");

    // The card is fixed; the operator redrives. The same request sent twice is applied once.
    s.remote.set_faults("{}").await;
    let redrive = json!({"command_id": "redrive-1", "reason": "card limit raised"});
    let (status, done) = command(&s, id, "redrive", redrive.clone()).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["applied"].as_str(), done["process_state"].as_str()),
        (Some("now"), Some("Pending"))
    );
    let (status, again) = command(&s, id, "redrive", redrive).await;
    assert_eq!((status, again["applied"].as_str()), (200, Some("before")), "{again}");
    s.settle().await;

    let r = s.state(id).await;
    assert_eq!((r.process_state, r.redrives), (ProcessState::Processed, 1));
    // The undone reservation is made again under a new key; every effect applied once.
    assert_eq!(
        effects(&s, id).await,
        ["reserve-inventory", "release-inventory", "reserve-inventory", "charge-payment", "ship"]
    );
    let ledger = s.remote.ledger().await;
    assert_eq!(ledger["max_applications"], 1);
    assert_effects_match(&ledger, sas_workflows::order_fulfilment(), &ended([id], "Processed"));
    let entry = r.timeline.iter().find(|e| e.by.is_some()).unwrap();
    assert_eq!(
        (entry.by.as_deref(), entry.reason.as_deref()),
        (Some(OPERATOR), Some("card limit raised"))
    );
    let (_, page) = s.admin("GET", "/admin/orders?list=failed", None, Some(OPERATOR)).await;
    assert!(listed(&page).is_empty(), "a processed order needs nobody: {page}");

    // A redrive of a processed order is refused, naming the state, and writes nothing.
    let revision = s.state(id).await.revision;
    let (status, refused) =
        command(&s, id, "redrive", json!({"command_id": "redrive-2", "reason": "again"})).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "finished");
    assert_eq!(refused["error"]["state"], "Processed");
    assert_eq!(s.state(id).await.revision, revision);
}

#[tokio::test]
async fn a_cancel_that_meets_a_reply_on_its_way_undoes_the_step_once_the_reply_lands() {
    let s = System::start("admin-cancel", "{}").await;
    let id = submit(&s, "admin-cancel-1").await;
    // The reservation is dispatched and performed; its reply waits in the reply queue.
    assert_eq!(s.pump_queue("SchedulerQueue").await, 1);
    assert_eq!(s.pump_queue("inventoryQueue").await, 1);
    assert_eq!(s.state(id).await.process_state, ProcessState::Processing);

    let (status, done) =
        command(&s, id, "cancel", json!({"command_id": "c-1", "reason": "customer called"})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["process_state"], "Processing");
    assert_eq!(done["waiting"], "cancel", "the cancel waits for the step in flight");
    let (status, refused) =
        command(&s, id, "pause", json!({"command_id": "p-1", "reason": "x"})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("cancelling")));

    s.settle().await;
    let r = s.state(id).await;
    assert_eq!(r.process_state, ProcessState::Cancelled);
    assert_eq!(effects(&s, id).await, ["reserve-inventory", "release-inventory"]);
    let events = s.t.drain("OrderEventsQueue").await;
    assert_eq!(statuses(&events, id).last().map(String::as_str), Some("cancelled"));
    assert!(s.t.drain("AlertsQueue").await.is_empty(), "the operator asked for it: no alert");
    let (_, view) = s.admin("GET", &format!("/admin/orders/{id}"), None, Some(OPERATOR)).await;
    assert_eq!(view["commands"][0]["by"], OPERATOR);
    assert_eq!(view["commands"][0]["command"], "cancel");
}

#[tokio::test]
async fn a_paused_order_is_listed_waits_and_finishes_once_resumed() {
    let s = System::start("admin-pause", "{}").await;
    let id = submit(&s, "admin-pause-1").await;
    let (status, in_flight) =
        s.admin("GET", "/admin/orders?list=in-flight", None, Some(OPERATOR)).await;
    assert_eq!((status, listed(&in_flight)), (200, vec![id.to_string()]), "{in_flight}");
    let (_, old) =
        s.admin("GET", "/admin/orders?list=in-flight&older_than=3600", None, Some(OPERATOR)).await;
    assert!(listed(&old).is_empty(), "accepted a moment ago: {old}");

    let (status, done) =
        command(&s, id, "pause", json!({"command_id": "p-1", "reason": "stock check"})).await;
    assert_eq!((status, done["process_state"].as_str()), (200, Some("Paused")), "{done}");
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Paused, "its start message is void");
    let (_, paused) = s.admin("GET", "/admin/orders?list=paused", None, Some(OPERATOR)).await;
    assert_eq!(listed(&paused), [id.to_string()]);

    let (status, done) =
        command(&s, id, "resume", json!({"command_id": "r-1", "reason": "stock ok"})).await;
    assert_eq!((status, done["process_state"].as_str()), (200, Some("Pending")), "{done}");
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
    assert_eq!(effects(&s, id).await, ["reserve-inventory", "charge-payment", "ship"]);
}

#[tokio::test]
async fn a_processed_order_is_undone_by_its_compensations_and_what_has_none_is_listed() {
    let s = System::start("admin-undo", "{}").await;
    let id = submit(&s, "admin-undo-1").await;
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
    let (status, refused) =
        command(&s, id, "cancel", json!({"command_id": "c-1", "reason": "returned"})).await;
    assert_eq!(status, 409, "a processed order is not cancelled: {refused}");

    let (status, done) =
        command(&s, id, "undo", json!({"command_id": "u-1", "reason": "returned"})).await;
    assert_eq!((status, done["process_state"].as_str()), (200, Some("Pending")), "{done}");
    s.settle().await;
    // The charge refunded, then the stock released; the parcel shipped has no undo.
    assert_eq!(
        effects(&s, id).await,
        ["reserve-inventory", "charge-payment", "ship", "refund-payment", "release-inventory"]
    );
    let r = s.state(id).await;
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.needs_manual_undo(), ["ship"]);
    let (status, failed) = s.admin("GET", "/admin/orders?list=failed", None, Some(OPERATOR)).await;
    assert_eq!((status, listed(&failed)), (200, vec![id.to_string()]), "{failed}");
    // Found by its customer, as the workflow's search_key reads it, ended as it is.
    let (status, found) = s.admin("GET", "/admin/search?key=c-admin", None, Some(OPERATOR)).await;
    assert_eq!((status, listed(&found)), (200, vec![id.to_string()]), "{found}");
    assert_eq!(found["orders"][0]["process_state"], "Error", "{found}");
    assert_eq!(found["search_keys"]["order-fulfilment"], "/input/customer_id", "{found}");
    assert_eq!(found["next"], Value::Null, "{found}");
    let (status, again) =
        command(&s, id, "undo", json!({"command_id": "u-2", "reason": "again"})).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(again["error"]["code"], "not_processed", "{again}");
}

#[tokio::test]
async fn bad_requests_are_refused_and_write_nothing() {
    let s = System::start("admin-bad", "{}").await;
    let id = submit(&s, "admin-bad-1").await;
    let before = s.state(id).await;
    // The console says who the API takes its caller for; an anonymous caller is refused.
    let (status, me) = s.admin("GET", "/admin/me", None, Some(OPERATOR)).await;
    assert_eq!((status, me["caller"].as_str()), (200, Some(OPERATOR)), "{me}");
    assert_eq!(s.admin("GET", "/admin/me", None, None).await.0, 403);
    // An order is found by its submitter's idempotency key; a key is its submitter's own.
    let (_, view) = s.admin("GET", &format!("/admin/orders/{id}"), None, Some(OPERATOR)).await;
    let submitter = view["owner"].as_str().unwrap();
    let lookup =
        |key: &str, who: &str| format!("/admin/lookup?idempotency_key={key}&submitter={who}");
    let (status, found) =
        s.admin("GET", &lookup("admin-bad-1", submitter), None, Some(OPERATOR)).await;
    assert_eq!(
        (status, found["order_id"].as_str()),
        (200, Some(id.to_string().as_str())),
        "{found}"
    );
    let other = "arn:aws:iam::123456789012:user/someone-else";
    let (status, _) = s.admin("GET", &lookup("admin-bad-1", other), None, Some(OPERATOR)).await;
    assert_eq!(status, 404, "another submitter's key names another order");
    let (status, refused) =
        s.admin("GET", "/admin/lookup?idempotency_key=x", None, Some(OPERATOR)).await;
    assert_eq!(status, 400, "{refused}");
    // A search finds the customer's order, or nothing; a search that cannot be made is refused.
    let (status, found) = s.admin("GET", "/admin/search?key=c-admin", None, Some(OPERATOR)).await;
    assert_eq!((status, listed(&found)), (200, vec![id.to_string()]), "{found}");
    let (status, none) = s.admin("GET", "/admin/search?key=c-nobody", None, Some(OPERATOR)).await;
    assert_eq!((status, listed(&none)), (200, vec![]), "{none}");
    for bad in [
        "",
        "?key=",
        "?key=c-admin&workflow=a%20b",
        "?key=c-admin&after=here",
        "?key=c-admin&limit=0",
    ] {
        let (status, refused) =
            s.admin("GET", &format!("/admin/search{bad}"), None, Some(OPERATOR)).await;
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {refused}"
        );
    }
    let path = format!("/admin/orders/{id}/cancel");
    let good = json!({"command_id": "c-1", "reason": "test"});
    // (what, path, body, caller, status, error code)
    type Case<'a> = (&'a str, String, Option<Value>, Option<&'a str>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("no caller", path.clone(), Some(good.clone()), None, 403, "forbidden"),
        ("no body", path.clone(), None, Some(OPERATOR), 400, "invalid_request"),
        (
            "no reason",
            path.clone(),
            Some(json!({"command_id": "c-1"})),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "blank reason",
            path.clone(),
            Some(json!({"command_id": "c-1", "reason": " "})),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "bad command id",
            path.clone(),
            Some(json!({"command_id": "a b", "reason": "x"})),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            path.clone(),
            Some(json!({"command_id": "c", "reason": "x", "force": true})),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "compensation on cancel",
            path.clone(),
            Some(json!({"command_id": "c", "reason": "x", "compensation": true})),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "unknown verb",
            format!("/admin/orders/{id}/terminate"),
            Some(good.clone()),
            Some(OPERATOR),
            404,
            "not_found",
        ),
        (
            "malformed id",
            "/admin/orders/not-a-uuid/cancel".into(),
            Some(good.clone()),
            Some(OPERATOR),
            400,
            "invalid_request",
        ),
        (
            "unknown order",
            format!("/admin/orders/{}/cancel", "7b0a4c2e-3f55-4a9e-9d0e-2b8f1c6d5e4a"),
            Some(good.clone()),
            Some(OPERATOR),
            404,
            "not_found",
        ),
        (
            "redrive in flight",
            format!("/admin/orders/{id}/redrive"),
            Some(good.clone()),
            Some(OPERATOR),
            409,
            "not_failed",
        ),
    ];
    for (name, path, body, caller, status, code) in cases {
        let (got, answer) = s.admin("POST", &path, body, caller).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{name}: {answer}"
        );
    }
    for (path, code) in [
        ("/admin/orders?list=everything", "invalid_request"),
        ("/admin/orders?list=failed&limit=0", "invalid_request"),
        ("/admin/orders?list=failed&after=garbage", "invalid_request"),
        ("/admin/orders?list=failed&step=a%20b", "invalid_request"),
        ("/admin/dead-letters/nowhere", "not_found"),
    ] {
        let (status, answer) = s.admin("GET", path, None, Some(OPERATOR)).await;
        assert!(status == 400 || status == 404, "{path}: {status} {answer}");
        assert_eq!(answer["error"]["code"], code, "{path}");
    }
    assert_eq!(s.state(id).await, before, "nothing was written");
}

#[tokio::test]
async fn dead_letters_are_described_and_moved_back_to_their_queue() {
    let s = System::start("admin-dlq", "{}").await;
    let id = submit(&s, "admin-dlq-1").await;
    // The start message, parked as if its consumer had failed it five times, and a poison one.
    let start = s.t.drain_raw("SchedulerQueue").await;
    assert_eq!(start.len(), 1);
    s.t.send_raw("SchedulerDeadLetterQueue", &start[0]).await;
    s.t.send_raw("SchedulerDeadLetterQueue", "{not json").await;

    let (status, queues) = s.admin("GET", "/admin/dead-letters", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{queues}");
    let scheduler =
        queues["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "scheduler").unwrap();
    assert_eq!(scheduler["messages"], 2, "{queues}");

    let (status, peek) =
        s.admin("GET", "/admin/dead-letters/scheduler", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{peek}");
    let messages = peek["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{peek}");
    let start_letter = messages.iter().find(|m| m["kind"] == "start").unwrap();
    assert_eq!(start_letter["order_id"], id.to_string());
    assert!(start_letter["receive_count"].as_u64().unwrap() >= 1);
    let poison = messages.iter().find(|m| m.get("kind").is_none()).unwrap();
    assert!(poison["undecodable"].as_str().unwrap().contains("not JSON"), "{poison}");

    // A move needs a reason, which is logged with who gave it; without one nothing moves.
    let path = "/admin/dead-letters/scheduler/redrive";
    let (status, refused) = s.admin("POST", path, None, Some(OPERATOR)).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_request")));
    let no_reason = Some(json!({ "reason": "  " }));
    let (status, refused) = s.admin("POST", path, no_reason, Some(OPERATOR)).await;
    assert!(refused["error"]["message"].as_str().unwrap().contains("reason"), "{refused}");
    assert_eq!(status, 400);
    let reason = Some(json!({ "reason": "the scheduler's bug is fixed" }));
    let (status, moved) = s.admin("POST", path, reason, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{moved}");
    // moto has no message move task: the messages are copied back.
    assert_eq!(
        (moved["method"].as_str(), moved["moved"].as_u64()),
        (Some("copy"), Some(2)),
        "{moved}"
    );
    assert_eq!(moved["more"], false);
    let (_, queues) = s.admin("GET", "/admin/dead-letters", None, Some(OPERATOR)).await;
    let scheduler =
        queues["queues"].as_array().unwrap().iter().find(|q| q["queue"] == "scheduler").unwrap();
    assert_eq!(
        (scheduler["messages"].as_u64(), scheduler["in_flight"].as_u64()),
        (Some(0), Some(0))
    );

    // Back in its queue, the start message runs the order; the poison one is dead-lettered
    // again by the scheduler (its handler's verdict, not the redrive's).
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
}

#[tokio::test]
async fn an_operator_holds_one_action_and_a_wrong_action_is_refused_with_nothing_written() {
    use sas_engine::ports::ServiceBook;
    let s = System::start("admin-hold-action", "{}").await;
    let hold =
        |body: Value| s.admin("POST", "/admin/services/payment/hold", Some(body), Some(OPERATOR));
    // An action no workflow asks of the agent, or one that is not a string: nothing written.
    let (status, body) = hold(json!({"reason": "x", "action": "fly-to-the-moon"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_action")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("charge-payment"), "{body}");
    let (status, body) = hold(json!({"reason": "x", "action": null})).await;
    assert_eq!(status, 400, "{body}");
    assert!(s.book.load("payment").await.unwrap().is_none(), "nothing was written");

    // The refunds frozen by hand: the charges go on, and the service says which is held.
    let (status, body) =
        hold(json!({"reason": "refunds frozen", "action": "refund-payment"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["service"]["state"], "actions_held", "{body}");
    assert_eq!(body["service"]["holds"][0]["action"], "refund-payment", "{body}");
    assert_eq!(body["service"]["holds"][0]["held_by"], OPERATOR, "{body}");
    let id = submit(&s, "held-refunds").await;
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
    let release = json!({"reason": "thawed", "action": "refund-payment"});
    let path = "/admin/services/payment/release";
    let (status, body) = s.admin("POST", path, Some(release.clone()), Some(OPERATOR)).await;
    assert_eq!((status, body["service"]["state"].as_str()), (200, Some("open")), "{body}");
    let (status, body) = s.admin("POST", path, Some(release), Some(OPERATOR)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("not_held")), "{body}");

    // The whole service held: an order waits for it, and is listed as waiting.
    let (status, body) = hold(json!({"reason": "bank maintenance"})).await;
    assert_eq!(status, 200, "{body}");
    // An agent's view of its service is at most a second old.
    s.clock.advance(sas_engine::services::FRESH + std::time::Duration::from_millis(100));
    let waits = submit(&s, "held-charge").await;
    s.settle().await;
    let (status, body) =
        s.admin("GET", "/admin/services/payment/waiting", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["waiting"].as_u64(), &body["orders"]), (Some(1), &json!([waits])), "{body}");
    let by_action = "/admin/services/payment/waiting?action=charge-payment";
    let (_, body) = s.admin("GET", by_action, None, Some(OPERATOR)).await;
    assert_eq!(body["waiting"], 0, "no hold of the action alone: {body}");
    let (status, _) = s.admin("GET", "/admin/services/ufo/waiting", None, Some(OPERATOR)).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_bulk_redrive_is_asked_with_the_count_shown_driven_by_the_supervisor_and_reported() {
    let s =
        System::start("admin-bulk", r#"{"actions": {"charge-payment": {"permanent_rate": 1.0}}}"#)
            .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(submit(&s, &format!("admin-bulk-{i}")).await);
    }
    s.settle().await;
    let (_, counts) = s.admin("GET", "/admin/counts", None, Some(OPERATOR)).await;
    assert_eq!(counts["failed"]["orders"], 3, "{counts}");
    let body = |expect: u64| {
        json!({"command": "redrive", "filter": {"list": "failed"}, "reason": "the bank is back",
               "command_id": "bulk-redrive-1", "expect": expect})
    };
    // Shown 2 while 3 fail: refused with the count of now, and nothing is made.
    let (status, refused) = s.admin("POST", "/admin/bulk", Some(body(2)), Some(OPERATOR)).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("filter_changed")),
        "{refused}"
    );
    assert_eq!(refused["error"]["count"]["orders"], 3, "{refused}");
    let (status, _) = s.admin("GET", "/admin/bulk/bulk-redrive-1", None, Some(OPERATOR)).await;
    assert_eq!(status, 404);
    // A filter that names nothing, or an age past a year, is refused, and nothing is made.
    for filter in [
        json!({"list": "failed", "step": ""}),
        json!({"list": "failed", "cause": null}),
        json!({"list": "failed", "workflow": "no such/name"}),
        json!({"list": "in-flight", "older_than_s": 40_000_000}),
        json!({"list": "everything"}),
    ] {
        let bad = json!({"command": "redrive", "filter": filter, "reason": "r",
                         "command_id": "bulk-bad", "expect": 3});
        let (status, refused) = s.admin("POST", "/admin/bulk", Some(bad), Some(OPERATOR)).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("invalid_request")));
    }
    let (_, jobs) = s.admin("GET", "/admin/bulk", None, Some(OPERATOR)).await;
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");

    s.remote.set_faults("{}").await;
    let (status, asked) = s.admin("POST", "/admin/bulk", Some(body(3)), Some(OPERATOR)).await;
    assert_eq!(status, 202, "{asked}");
    assert_eq!(asked["job"]["by"], OPERATOR);
    // Sent again (a retry), it is the same job.
    let (status, again) = s.admin("POST", "/admin/bulk", Some(body(3)), Some(OPERATOR)).await;
    assert_eq!((status, &again["job"]["id"]), (200, &json!("bulk-redrive-1")), "{again}");

    let driven = s.drive_bulk().await;
    assert_eq!(driven.len(), 1);
    s.settle().await;
    for id in &ids {
        assert_eq!(s.state(*id).await.process_state, ProcessState::Processed, "{id}");
    }
    let (status, report) = s.admin("GET", "/admin/bulk/bulk-redrive-1", None, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["job"]["tally"]["applied"], 3, "{report}");
    assert_eq!(report["job"]["finished"], true, "{report}");
    let (_, jobs) = s.admin("GET", "/admin/bulk", None, Some(OPERATOR)).await;
    assert_eq!(jobs["jobs"][0]["id"], "bulk-redrive-1", "{jobs}");
    let bad = json!({"command": "fly", "filter": {"list": "failed"}, "reason": "x", "command_id": "b-2", "expect": 0});
    let (status, _) = s.admin("POST", "/admin/bulk", Some(bad), Some(OPERATOR)).await;
    assert_eq!(status, 400);
}
