//! What the CLI prints in a terminal: aligned tables and an order's timeline. Scripts ask
//! for `-o json` instead, which prints the API's answers as they are.

use serde_json::Value;

/// Left-aligned columns, each as wide as its widest cell, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A cell for an optional string field.
pub fn cell(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or("-").to_owned()
}

/// A bulk command in one line: its id, command, listing and filters, how far it went, who.
pub fn bulk_job(job: &Value) -> String {
    let filter = &job["filter"];
    let mut listing = vec![cell(filter, "list")];
    for name in ["workflow", "step", "cause"] {
        if let Some(v) = filter[name].as_str() {
            listing.push(format!("{name} {v}"));
        }
    }
    if let Some(age) = filter["older_than_s"].as_u64().filter(|a| *a > 0) {
        listing.push(format!("older than {age} s"));
    }
    let t = &job["tally"];
    let reached: u64 =
        ["applied", "before", "refused", "gone"].iter().filter_map(|k| t[*k].as_u64()).sum();
    let done = if job["finished"] == true { ", done" } else { "" };
    format!(
        "{}  {}  {}  {reached} of {}{done}  by {}",
        cell(job, "id"),
        cell(job, "command"),
        listing.join(", "),
        job["expected"].as_u64().unwrap_or(0),
        cell(job, "by")
    )
}

/// A bulk command's report: what each order made of it, and why the refused refused.
pub fn bulk_report(job: &Value) -> String {
    let t = &job["tally"];
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    let mut out = format!("{}\n", bulk_job(job));
    out.push_str(&format!(
        "applied {}, applied before {}, refused {}, gone {}, newer than the ask {}\n",
        n("applied"),
        n("before"),
        n("refused"),
        n("gone"),
        n("newer")
    ));
    for refusal in job["refusals"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {}  refused: {}\n",
            cell(refusal, "order_id"),
            cell(refusal, "code")
        ));
    }
    out
}

/// `sas services`: one line per service that nothing of is held, and one per hold (of the
/// whole service, or of one action: `payment/charge-payment`) for the others, saying why it
/// goes on (`probes: <what the last met>`).
pub fn services(answer: &Value) -> String {
    let services = answer["services"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for s in services {
        let service = cell(s, "service");
        let holds = s["holds"].as_array().map(Vec::as_slice).unwrap_or_default();
        let held: Vec<&Value> = holds.iter().filter(|h| h["state"] == "held").collect();
        if held.is_empty() {
            let waiting = s["waiting"].to_string();
            let row = [service, "open".into(), "-".into(), "-".into(), "-".into(), waiting];
            rows.push(row.into_iter().chain([rate(s), in_flight(s)]).collect());
            continue;
        }
        for h in held {
            let name = match h["action"].as_str() {
                Some(action) => format!("{service}/{action}"),
                None => service.clone(),
            };
            let probing = h["probing"].as_bool() == Some(true);
            let state = if probing { "held, probing" } else { "held" };
            let by = h["held_by"].as_str().unwrap_or("its agent").to_owned();
            let why = match h["last_probe"].as_str() {
                Some(probe) => format!("{}; probes: {probe}", cell(h, "reason")),
                None => cell(h, "reason"),
            };
            let waiting = h["waiting"].to_string();
            let row = [name, state.into(), time(&h["held_since"]), by, why, waiting];
            rows.push(row.into_iter().chain([rate(s), in_flight(s)]).collect());
        }
    }
    let header = ["service", "state", "since", "by", "why", "waiting", "calls/s", "in flight"];
    table(&header, &rows)
}

/// `sas keys`: one line per concurrency key with orders running.
pub fn keys(answer: &Value) -> String {
    let keys = answer["keys"].as_array().map(Vec::as_slice).unwrap_or_default();
    if keys.is_empty() {
        return "no key has orders running\n".to_owned();
    }
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            let running = match k["limit"].as_u64() {
                Some(limit) if limit > 0 => format!("{}/{limit}", k["running"]),
                _ => k["running"].to_string(),
            };
            let first = k.get("oldest_waiting_since").map_or_else(|| "-".to_owned(), time);
            vec![cell(k, "key"), running, k["waiting"].to_string(), cell(k, "busy_since"), first]
        })
        .collect();
    table(&["key", "running", "waiting", "busy since", "first waiting since"], &rows)
}

/// `sas keys <key>`: its running orders, then its line, first to start first.
pub fn key(view: &Value) -> String {
    let list = |name: &str| view[name].as_array().map(Vec::as_slice).unwrap_or_default().to_vec();
    let (running, waiting) = (list("running"), list("waiting"));
    let mut out = format!(
        "key       {}\nrunning   {} of {}\n",
        cell(view, "key"),
        running.len(),
        view["limit"]
    );
    let mut rows: Vec<Vec<String>> = running
        .iter()
        .map(|p| vec!["running".into(), cell(p, "order_id"), cell(p, "since")])
        .collect();
    rows.extend(
        waiting
            .iter()
            .enumerate()
            .map(|(n, p)| vec![format!("{}", n + 1), cell(p, "order_id"), cell(p, "since")]),
    );
    out.push_str(&table(&["", "order", "since"], &rows));
    if view["more_waiting"].as_bool() == Some(true) {
        out.push_str("(more wait behind these: raise --limit)\n");
    }
    out
}

/// What `sas hold` and `sas release` print: what is held now, or that it is open.
pub fn service_change(service: &Value, action: Option<&str>, verb: &str) -> String {
    let name = cell(service, "service");
    let named = match action {
        Some(action) => format!("{name}/{action}"),
        None => name,
    };
    let holds = service["holds"].as_array().map(Vec::as_slice).unwrap_or_default();
    let hold = holds.iter().find(|h| h["action"].as_str() == action);
    let waiting = hold.and_then(|h| h["waiting"].as_u64()).unwrap_or(0);
    match verb {
        "hold" => format!("{named}: held; {waiting} orders wait for it\n"),
        _ => format!("{named}: open; the {waiting} orders that waited go on\n"),
    }
}

/// The rate a service's calls keep to, and how far ahead its turns are taken: `5, booked 3.2 s
/// ahead`, or `3 learned (5 declared)` when the rate learned from its throttling is lower.
fn rate(service: &Value) -> String {
    let declared = service["limits"]["per_second"].as_u64();
    let learned = service["learned_per_second"].as_u64();
    let rate = match (declared, learned) {
        (Some(d), Some(l)) if l < d => format!("{l} learned ({d} declared)"),
        (Some(d), _) => d.to_string(),
        (None, Some(l)) => format!("{l} learned"),
        (None, None) => return "-".to_owned(),
    };
    match service["in_use"]["booked_ahead_ms"].as_u64().unwrap_or(0) {
        0 => rate,
        ms => format!("{rate}, booked {:.1} s ahead", ms as f64 / 1000.0),
    }
}

/// A service's declared concurrency, and the calls in flight now: `2/4`.
fn in_flight(service: &Value) -> String {
    match service["limits"]["in_flight"].as_u64() {
        Some(limit) => format!("{}/{limit}", service["in_use"]["in_flight"].as_u64().unwrap_or(0)),
        None => "-".to_owned(),
    }
}

/// Orders found by a search: what each runs, what became of it, and when.
pub fn found(orders: &[Value]) -> String {
    let rows: Vec<Vec<String>> = orders
        .iter()
        .map(|o| {
            vec![
                cell(o, "order_id"),
                workflow(o),
                cell(o, "process_state"),
                cell(o, "accepted_at"),
                cell(o, "ended_at"),
                cell(o, "step"),
                cell(o, "cause"),
            ]
        })
        .collect();
    table(&["order", "workflow", "state", "accepted", "ended", "step", "cause"], &rows)
}

/// What a search looked at: each workflow's search key, or that none declares one.
pub fn search_keys(keys: &Value) -> String {
    match keys.as_object().filter(|k| !k.is_empty()) {
        Some(keys) => {
            let each: Vec<String> =
                keys.iter().map(|(w, k)| format!("{w} by {}", k.as_str().unwrap_or("?"))).collect();
            format!("searched: {}", each.join(", "))
        }
        None => "no workflow of the stack declares a search_key".to_owned(),
    }
}

/// An order's workflow and the version it runs: `order-fulfilment v2`.
pub fn workflow(value: &Value) -> String {
    match value.get("workflow_version").and_then(Value::as_u64) {
        Some(version) => format!("{} v{version}", cell(value, "workflow")),
        None => cell(value, "workflow"),
    }
}

/// An order as `show` prints it: state, cause, steps, what is left to undo, the commands
/// given, and the timeline.
pub fn order(view: &Value) -> String {
    let text = |key: &str| view.get(key).and_then(Value::as_str).unwrap_or("-");
    // A step failed while others ran: the order waits for them, then undoes what was done.
    let stopping = if view.get("stopping").and_then(Value::as_bool).unwrap_or(false) {
        ", stopping: nothing new starts, and what was done is undone once the steps in flight end"
    } else {
        ""
    };
    let mut out = format!(
        "order     {}\nworkflow  {}\nstate     {} ({}{stopping})\naccepted  {}\n",
        text("order_id"),
        workflow(view),
        text("process_state"),
        text("phase"),
        text("created_at")
    );
    if let Some(ended) = view.get("ended_at").and_then(Value::as_str) {
        out.push_str(&format!("ended     {ended}\n"));
    }
    if let Some(parent) = view.get("parent") {
        let element = match parent.get("element").and_then(Value::as_u64) {
            Some(k) => format!(", element {k}"),
            None => String::new(),
        };
        out.push_str(&format!(
            "parent    {} (its step {}{element})\n",
            cell(parent, "order_id"),
            cell(parent, "step")
        ));
    }
    if let Some(group) = view.get("group").and_then(Value::as_str) {
        let tenant = match group.strip_suffix("#priority") {
            Some(tenant) => format!("{tenant} (a priority order)"),
            None => group.to_owned(),
        };
        out.push_str(&format!("tenant    {tenant}\n"));
    }
    if let Some(line) = view.get("in_line") {
        out.push_str(&format!(
            "in line   {} (waiting since {})\n",
            cell(line, "summary"),
            time(&line["since"])
        ));
    }
    if let Some(cause) = view.get("cause") {
        out.push_str(&format!("cause     {}\n", describe_cause(cause, view)));
    }
    if let Some(stop) = view.get("stop") {
        out.push_str(&format!(
            "waiting   {} by {}: {}\n",
            cell(stop, "command"),
            cell(stop, "by"),
            cell(stop, "reason")
        ));
    }
    let redrives = view.get("redrives").and_then(Value::as_u64).unwrap_or(0);
    if redrives > 0 {
        out.push_str(&format!("redrives  {redrives}\n"));
    }
    for step in list(view, "steps") {
        if let Some(cause) = step.get("reported") {
            out.push_str(&format!(
                "reported  {} (the order went on)\n",
                describe_cause(cause, view)
            ));
        }
    }
    let manual: Vec<&str> =
        list(view, "needs_manual_undo").iter().filter_map(|v| v.as_str()).collect();
    out.push_str(&format!(
        "undo by hand  {}\n",
        if manual.is_empty() { "nothing".to_owned() } else { manual.join(", ") }
    ));

    out.push_str("\nsteps\n");
    let steps: Vec<Vec<String>> = list(view, "steps")
        .iter()
        .map(|s| {
            let generation = s.get("generation").and_then(Value::as_u64).unwrap_or(0);
            vec![
                format!("  {}", cell(s, "name")),
                match (s.get("reported"), s.get("waiting")) {
                    (Some(_), _) => format!("{} (reported)", cell(s, "status")),
                    (None, Some(_)) => "waiting".to_owned(),
                    (None, None) => cell(s, "status"),
                },
                lease(s),
                if generation > 0 { format!("run {}", generation + 1) } else { String::new() },
                match (s.get("child").and_then(Value::as_str), s.get("detail")) {
                    _ if s.get("fan").is_some() => fan(s),
                    (Some(child), Some(detail)) => {
                        format!("child {child}: {}", detail.as_str().unwrap_or_default())
                    }
                    (Some(child), None) => format!("child {child}"),
                    (None, _) => {
                        s.get("detail").and_then(Value::as_str).unwrap_or_default().to_owned()
                    }
                },
            ]
        })
        .collect();
    out.push_str(&table(&["  step", "status", "lease", "", "detail"], &steps));

    out.push_str("\ntimeline\n");
    let entries: Vec<Vec<String>> = list(view, "timeline")
        .iter()
        .map(|e| {
            let mut what = cell(e, "what").replace('_', " ");
            if let Some(step) = e.get("step").and_then(Value::as_str) {
                what = format!("{what} {step}");
            }
            let mut note = String::new();
            if let Some(by) = e.get("by").and_then(Value::as_str) {
                note = format!("by {by}");
            }
            if let Some(reason) = e.get("reason").and_then(Value::as_str) {
                note = format!("{note}: {reason:?}");
            }
            if e.get("what").and_then(Value::as_str) == Some("waiting") {
                // Not a caller's words: what the step waits for, and until when.
                note = format!("{} until {}", cell(e, "reason"), time(&e["until"]));
            }
            vec![format!("  {}", time(&e["at"])), what, note]
        })
        .collect();
    out.push_str(&table(&["  at", "what", ""], &entries));
    out
}

/// What a step's lease says: sent and due by a time, waiting for the scheduler, or waiting
/// for a time; empty without one.
fn lease(step: &Value) -> String {
    if let Some(waiting) = step.get("waiting") {
        let until = time(&waiting["until"]);
        return match waiting.get("for").and_then(Value::as_str) {
            Some("answer") => format!("for an answer from outside, due {until}"),
            Some("service") => format!("for its service, which is held; fails at {until}"),
            _ => format!("waits until {until}"),
        };
    }
    let Some(lease) = step.get("lease") else { return String::new() };
    let due = time(&lease["complete_by"]);
    let failures = lease.get("failures").and_then(Value::as_u64).unwrap_or(0);
    let expired = if failures > 0 { format!(", {failures} expired") } else { String::new() };
    if lease.get("timer").and_then(Value::as_bool).unwrap_or(false) {
        format!("waits until {due}")
    } else if lease.get("sent").and_then(Value::as_bool).unwrap_or(false) {
        format!("in flight, due {due}{expired}")
    } else {
        format!("queued, due {due}{expired}")
    }
}

/// A time as the API gives it (RFC 3339, or milliseconds since the epoch), in UTC.
fn time(value: &Value) -> String {
    match value {
        Value::Number(n) => n
            .as_i64()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map_or_else(|| n.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()),
        Value::String(s) => s.clone(),
        _ => "-".into(),
    }
}

/// `cause` as a sentence, with what `view` (the order) says of its step.
fn describe_cause(cause: &Value, view: &Value) -> String {
    let step = cause.get("step").and_then(Value::as_str).unwrap_or("-");
    match cause.get("kind").and_then(Value::as_str).unwrap_or_default() {
        "step_rejected" => format!("{step} was refused: {}", cell(cause, "reason")),
        "step_timed_out" => {
            // The step's own detail says how: no answer within its timeout, or its leases.
            let detail = list(view, "steps")
                .iter()
                .find(|s| s.get("name").and_then(Value::as_str) == Some(step))
                .and_then(|s| s.get("detail").and_then(Value::as_str));
            match (detail, cause.get("failures").and_then(Value::as_u64).unwrap_or(0)) {
                (Some(detail), _) => format!("{step} did not finish in time: {detail}"),
                (None, 1) => format!("{step} did not finish in time: its lease expired once"),
                (None, n) => format!("{step} did not finish in time: its lease expired {n} times"),
            }
        }
        "output_too_large" => format!(
            "{step} answered {} bytes, more than the {} a step may return",
            cause.get("bytes").and_then(Value::as_u64).unwrap_or(0),
            cause.get("limit").and_then(Value::as_u64).unwrap_or(0)
        ),
        "unknown_step" => format!("the workflow no longer has step {step}"),
        "cancelled" => format!("cancelled by {}: {}", cell(cause, "by"), cell(cause, "reason")),
        "service_held_too_long" => format!(
            "{step} waited {} min for {}, which stayed held",
            cause.get("held_s").and_then(Value::as_u64).unwrap_or(0) / 60,
            cell(cause, "service")
        ),
        other => other.to_owned(),
    }
}

fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// How far a step over a list went: its children forward (and back, once it is undone), then
/// its detail.
fn fan(step: &Value) -> String {
    let fan = &step["fan"];
    let count = |w: &Value, key: &str| w.get(key).and_then(Value::as_u64).unwrap_or(0);
    let pass = |w: &Value, ok: &str, failed: &str| {
        let running = w.get("running").and_then(Value::as_array).map_or(0, Vec::len);
        format!(
            "{} started, {running} running, {} {ok}, {} {failed}",
            count(w, "next"),
            count(w, "ok"),
            count(w, "failed")
        )
    };
    let mut out = match fan.get("items").and_then(Value::as_u64) {
        Some(items) => {
            format!("{items} elements: {}", pass(&fan["forward"], "processed", "failed"))
        }
        None => "reading its list".to_owned(),
    };
    if let Some(back) = fan.get("back") {
        out.push_str(&format!("; undo: {}", pass(back, "undone", "not undone")));
    }
    if let Some(detail) = step.get("detail").and_then(Value::as_str) {
        out.push_str(&format!(" ({detail})"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let t = table(
            &["id", "state"],
            &[vec!["a".into(), "Error".into()], vec!["bbb".into(), "-".into()]],
        );
        assert_eq!(t, "id   state\na    Error\nbbb  -\n");
    }

    #[test]
    fn an_order_reads_as_a_timeline() {
        let view = serde_json::json!({
            "order_id": "o-1", "workflow": "trip", "workflow_version": 3,
            "process_state": "Error", "phase": "compensating",
            "created_at": "2026-11-22T10:00:00Z",
            "cause": {"kind": "step_rejected", "step": "charge-payment", "reason": "card declined"},
            "needs_manual_undo": [],
            "steps": [{"name": "reserve-inventory", "status": "undone"}],
            "timeline": [{"at": 1795370898424_i64, "what": "redriven", "attempt": 4,
                          "by": "arn:aws:iam::1:user/ada", "reason": "fixed"}]
        });
        let text = order(&view);
        assert!(text.contains("workflow  trip v3\n"), "{text}");
        assert!(text.contains("charge-payment was refused: card declined"), "{text}");
        assert!(text.contains("undo by hand  nothing"), "{text}");
        assert!(text.contains("2026-11-22 18:08:18.424  redriven"), "{text}");
        assert!(text.contains("redriven  by arn:aws:iam::1:user/ada: \"fixed\""), "{text}");
    }

    #[test]
    fn a_timeout_reads_as_a_sentence_with_its_step_s_detail() {
        let cause =
            serde_json::json!({"kind": "step_timed_out", "step": "approval", "failures": 1});
        let view = |detail: Option<&str>| serde_json::json!({"steps": [{"name": "approval", "status": "failed", "detail": detail}]});
        assert_eq!(
            describe_cause(&cause, &view(Some("no answer within 20 s"))),
            "approval did not finish in time: no answer within 20 s"
        );
        assert_eq!(
            describe_cause(&cause, &view(None)),
            "approval did not finish in time: its lease expired once"
        );
    }

    #[test]
    fn a_step_whose_failure_was_only_reported_says_so() {
        let view = serde_json::json!({
            "order_id": "o-2", "process_state": "Processed", "phase": "forward",
            "steps": [
                {"name": "open-account", "status": "done"},
                {"name": "send-welcome", "status": "failed",
                 "reported": {"kind": "step_rejected", "step": "send-welcome", "reason": "bounced"}},
                {"name": "statement", "status": "done",
                 "reported": {"kind": "output_too_large", "step": "statement", "bytes": 900, "limit": 512}}
            ]
        });
        let text = order(&view);
        assert!(
            text.contains("reported  send-welcome was refused: bounced (the order went on)"),
            "{text}"
        );
        assert!(text.contains("statement answered 900 bytes, more than the 512"), "{text}");
        assert!(text.contains("send-welcome  failed (reported)"), "{text}");
    }

    #[test]
    fn a_waiting_order_says_where_it_stands_and_keys_read_as_lines() {
        let view = serde_json::json!({
            "order_id": "o-4", "process_state": "Pending", "phase": "forward", "steps": [],
            "in_line": {"key": "order-fulfilment/c-1", "limit": 1, "running": 1, "position": 2,
                        "since": 1_772_360_142_000_i64,
                        "summary": "order-fulfilment/c-1: 1 running of 1, this order 2nd in line"},
            "group": "acme#priority"
        });
        let text = order(&view);
        assert!(text.contains("tenant    acme (a priority order)\n"), "{text}");
        assert!(
            text.contains("in line   order-fulfilment/c-1: 1 running of 1, this order 2nd in line (waiting since 2026-03-01 10:15:42.000)"),
            "{text}"
        );
        let listed = keys(&serde_json::json!({"keys": [
            {"key": "order-fulfilment/c-1", "limit": 1, "running": 1, "waiting": 3,
             "busy_since": "2026-03-01T10:15:40Z", "oldest_waiting_since": "2026-03-01T10:15:41Z"},
            {"key": "order-fulfilment/c-2", "limit": 0, "running": 2, "waiting": 0,
             "busy_since": "2026-03-01T10:15:41Z"}]}));
        let lines: Vec<&str> = listed.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>()[..3],
            ["order-fulfilment/c-1", "1/1", "3"]
        );
        assert!(lines[2].ends_with("-") && lines[2].contains(" 2 "), "{listed}");
        assert_eq!(keys(&serde_json::json!({"keys": []})), "no key has orders running\n");
        let one = key(&serde_json::json!({"key": "order-fulfilment/c-1", "limit": 1,
            "running": [{"order_id": "o-1", "since": "2026-03-01T10:15:40Z"}],
            "waiting": [{"order_id": "o-2", "since": "2026-03-01T10:15:41Z"},
                        {"order_id": "o-3", "since": "2026-03-01T10:15:42Z"}],
            "more_waiting": true}));
        assert!(one.contains("running   1 of 1"), "{one}");
        let rows: Vec<&str> = one.lines().filter(|l| l.contains("o-")).collect();
        assert!(
            rows[0].starts_with("running")
                && rows[1].starts_with("1 ")
                && rows[2].starts_with("2 "),
            "{one}"
        );
        assert!(one.contains("more wait behind these"), "{one}");
    }

    #[test]
    fn steps_in_flight_side_by_side_and_a_wait_show_their_leases() {
        let view = serde_json::json!({
            "order_id": "o-3", "process_state": "Processing", "phase": "forward",
            "steps": [
                {"name": "flight", "status": "in_progress",
                 "lease": {"attempt": 2, "complete_by": 1_772_360_142_000_i64, "sent": true}},
                {"name": "hotel", "status": "in_progress",
                 "lease": {"attempt": 3, "complete_by": 1_772_360_142_000_i64, "failures": 1}},
                {"name": "cooling-off", "status": "in_progress",
                 "lease": {"attempt": 4, "complete_by": 1_772_446_542_000_i64, "timer": true}}
            ]
        });
        let text = order(&view);
        assert!(text.contains("in flight, due 2026-03-01 10:15:42.000"), "{text}");
        assert!(text.contains("queued, due 2026-03-01 10:15:42.000, 1 expired"), "{text}");
        assert!(text.contains("waits until 2026-03-02 10:15:42.000"), "{text}");
    }

    #[test]
    fn a_step_waiting_for_an_answer_and_an_order_stopping_say_so() {
        let view = serde_json::json!({
            "order_id": "o-4", "process_state": "Processing", "phase": "forward",
            "stopping": true,
            "cause": {"kind": "step_rejected", "step": "charge", "reason": "card declined"},
            "steps": [
                {"name": "charge", "status": "failed", "detail": "card declined"},
                {"name": "approval", "status": "in_progress",
                 "lease": {"attempt": 2, "complete_by": 1_772_360_142_000_i64, "sent": true},
                 "answer_by": 1_772_360_142_000_i64,
                 "waiting": {"for": "answer", "until": 1_772_360_142_000_i64}}
            ],
            "timeline": [
                {"at": 1_772_356_542_000_i64, "what": "waiting", "attempt": 2, "step": "approval",
                 "reason": "waits for an answer from outside", "until": 1_772_360_142_000_i64}
            ]
        });
        let text = order(&view);
        assert!(
            text.contains("state     Processing (forward, stopping: nothing new starts"),
            "{text}"
        );
        assert!(
            text.contains(
                "approval  waiting  for an answer from outside, due 2026-03-01 10:15:42.000"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "waiting approval  waits for an answer from outside until 2026-03-01 10:15:42.000"
            ),
            "{text}"
        );
    }

    #[test]
    fn services_read_as_one_line_each_or_one_per_hold_with_who_held_them() {
        let answer = serde_json::json!({"services": [
            {"service": "payment", "state": "actions_held", "waiting": 61, "holds": [
                {"action": "charge-payment", "state": "held", "probing": true,
                 "held_since": 1_772_359_200_000_i64, "last_probe": "403 Forbidden",
                 "reason": "5 passing faults in a row, the last: 503", "waiting": 61},
                {"action": "refund-payment", "state": "open", "probing": false, "waiting": 0}]},
            {"service": "shipping", "state": "held", "waiting": 3, "holds": [
                {"state": "held", "probing": false, "held_since": "2026-03-01T09:00:00Z",
                 "held_by": "arn:ops", "reason": "carrier maintenance", "waiting": 3}]},
            {"service": "inventory", "state": "open", "waiting": 0,
             "limits": {"per_second": 5, "in_flight": 4},
             "in_use": {"booked_ahead_ms": 3_200, "in_flight": 2}},
            {"service": "shipping-rates", "state": "open", "waiting": 0,
             "learned_per_second": 3, "in_use": {"booked_ahead_ms": 0, "in_flight": 0}},
            {"service": "tax", "state": "open", "waiting": 0,
             "limits": {"per_second": 10}, "learned_per_second": 4,
             "in_use": {"booked_ahead_ms": 0, "in_flight": 0}}
        ]});
        let printed = services(&answer);
        let lines: Vec<&str> = printed.lines().collect();
        assert!(
            lines[1].contains("payment/charge-payment") && lines[1].contains("held, probing"),
            "{printed}"
        );
        assert!(lines[1].contains("its agent") && lines[1].contains("61"), "{printed}");
        assert!(lines[1].contains("probes: 403 Forbidden"), "{printed}");
        assert!(lines[1].contains("2026-03-01 10:00:00"), "{printed}");
        assert!(
            lines[2].contains("arn:ops") && lines[2].contains("carrier maintenance"),
            "{printed}"
        );
        assert!(
            lines[3].contains("open") && lines[3].contains("5, booked 3.2 s ahead"),
            "{printed}"
        );
        assert!(lines[3].contains("2/4"), "{printed}");
        assert!(lines[4].contains("3 learned"), "{printed}");
        assert!(lines[5].contains("4 learned (10 declared)"), "{printed}");
        assert!(lines[0].contains("calls/s") && lines[1].contains('-'), "{printed}");
    }
}
