//! The page's HTML, CSS and script, and the pages of single orders.

use super::data::{Record, View};

/// Text made safe inside HTML elements and quoted attributes.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A time as UTC, to the millisecond.
fn clock(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string())
}

/// An order's timeline as a table: when (and how long after it was received), what happened,
/// at which step, and what else the entry says.
pub(super) fn timeline(r: &Record) -> String {
    let entries = r.body["timeline"].as_array().cloned().unwrap_or_default();
    let first = entries.first().and_then(|e| e["at"].as_i64()).or(r.created_at);
    let mut t = String::from(
        "<table class=\"timeline\"><thead><tr><th>time</th><th>after</th><th>what happened</th><th>step</th><th>detail</th></tr></thead><tbody>\n",
    );
    for e in &entries {
        let at = e["at"].as_i64();
        let after = at.zip(first).map(|(a, f)| format!("+{:.2} s", (a - f) as f64 / 1000.0));
        let mut detail = Vec::new();
        if let Some(n) = e["attempt"].as_u64() {
            detail.push(format!("attempt {n}"));
        }
        if let Some(by) = e["by"].as_str() {
            detail.push(format!("by {by}"));
        }
        if let Some(reason) = e["reason"].as_str() {
            detail.push(reason.to_owned());
        }
        if let Some(until) = e["until"].as_i64() {
            detail.push(format!("until {}", clock(until)));
        }
        let what = e["what"].as_str().unwrap_or("?");
        t.push_str(&format!(
            "<tr data-what=\"{w}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            at.map(clock).unwrap_or_default(),
            after.unwrap_or_default(),
            escape(&what.replace('_', " ")),
            escape(e["step"].as_str().unwrap_or("")),
            escape(&detail.join("; ")),
            w = escape(what),
        ));
    }
    t.push_str("</tbody></table>");
    if entries.is_empty() {
        t.push_str("<p>No timeline recorded.</p>");
    }
    t
}

/// The live page of one order.
pub(super) fn order_page(r: &Record) -> String {
    let mut facts = vec![format!("state {}", escape(&r.state))];
    if r.stopping() {
        facts.push(
            "stopping: a step failed; what was done is undone once the steps in flight end"
                .to_owned(),
        );
    }
    if let Some(c) = r.created_at {
        facts.push(format!("accepted {}", clock(c)));
    }
    if let Some(e) = r.ended_at() {
        facts.push(format!("ended {}", clock(e)));
    }
    if let Some(o) = r.outcome() {
        facts.push(format!("outcome {}", escape(&o)));
    }
    if let Some(c) = r.cause() {
        facts.push(format!("cause: {}", escape(&c)));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Order {id}</title><style>{STYLE}</style></head><body>\n<p><a href=\"../\">&larr; all orders</a></p><h1>Order <span class=\"id\">{id}</span></h1><p class=\"facts\">{}</p>\n{}\n</body></html>\n",
        facts.join(" · "),
        timeline(r),
        id = escape(&r.order_id),
    )
}

/// The page, with `view` embedded (a report) or fetched (live), and `extra` HTML at its end.
pub(super) fn page(view: Option<&View>, extra: &str) -> String {
    let embedded = view
        .and_then(|v| serde_json::to_string(v).ok())
        // Inside a script element, only `<` could end it early; in JSON it appears only in
        // strings, where the escape means the same.
        .map(|json| {
            format!(
                "<script type=\"application/json\" id=\"view\">{}</script>",
                json.replace('<', "\\u003c")
            )
        })
        .unwrap_or_default();
    PAGE.replace("<!--STYLE-->", STYLE)
        .replace("<!--VIEW-->", &embedded)
        .replace("<!--EXTRA-->", extra)
}

/// Shared by the page and the order pages.
const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1em 2em; }
.grid > figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: .3em; }
svg { width: 100%; height: auto; background: #fafafa; border: 1px solid #ddd; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.legend { list-style: none; padding: 0; margin: .3em 0; display: flex; flex-wrap: wrap; gap: .3em 1.2em; font-size: 12px; }
.legend svg { width: 28px; height: 12px; border: 0; background: none; vertical-align: middle; margin-right: .3em; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #e4e4e4; vertical-align: top; }
th { background: #f0f0f0; }
.facts { color: #555; } .id { font-family: ui-monospace, monospace; white-space: nowrap; }
.scroll { max-height: 420px; overflow: auto; }
details { margin: .4em 0; } details summary { cursor: pointer; font-family: ui-monospace, monospace; }
details:target { outline: 2px solid #0072b2; }
"#;

/// The page: charts and tables drawn from a [`View`], with no external resource. Every chart
/// is an `<svg data-chart=...>` whose series and bars carry what they show in data attributes;
/// series differ by dash and hatching as well as colour, and each is labelled.
pub const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Local stack: the run</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style><!--STYLE--></style></head>
<body>
<h1>Local stack: the run</h1>
<p id="status" class="facts">Loading&hellip;</p>
<div class="grid">
<figure><figcaption>Orders by state over time</figcaption><svg data-chart="states" viewBox="0 0 560 300" role="img" aria-label="Orders by state over time"></svg><ul class="legend" id="states-legend"></ul></figure>
<figure><figcaption>Time to terminal (seconds from acceptance to end)</figcaption><svg data-chart="time-to-terminal" viewBox="0 0 560 300" role="img" aria-label="Distribution of time to terminal"></svg><ul class="legend" id="ttt-legend"></ul></figure>
<figure><figcaption>Queue depths over time (visible and in flight)</figcaption><svg data-chart="queues" viewBox="0 0 560 300" role="img" aria-label="Queue depths over time"></svg><ul class="legend" id="queues-legend"></ul></figure>
<figure><figcaption>Functions' metrics</figcaption><div id="metrics"></div></figure>
</div>
<h2>Alerts <span id="alert-count"></span></h2>
<div class="scroll"><table id="alerts"><thead><tr><th>ended</th><th>order</th><th>outcome</th><th>cause</th><th>alert sent</th></tr></thead><tbody></tbody></table></div>
<h2>Dead letters <span id="dead-letter-count"></span></h2>
<div class="scroll"><table id="dead-letters"><thead><tr><th>arrived</th><th>queue</th><th>dead-letter queue</th><th>kind</th><th>order</th><th>receives</th><th>reason</th></tr></thead><tbody></tbody></table></div>
<h2>Orders <span id="order-count"></span></h2>
<div class="scroll"><table id="orders"><thead><tr><th>order</th><th>state</th><th>accepted</th><th>ended</th><th>outcome / cause</th></tr></thead><tbody></tbody></table></div>
<!--VIEW-->
<!--EXTRA-->
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
// Okabe and Ito's palette, told apart by most colour-blind readers; dashes tell the rest.
const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"];
const DASHES = ["", "6 3", "2 2", "8 3 2 3", "1 3", "10 4", "4 4 1 4", "12 2"];
const OUTCOMES = ["processed", "compensated", "failed", "cancelled"];
const W = 560, H = 300, M = {l: 46, r: 12, t: 12, b: 34};
const embedded = document.getElementById("view");

function el(name, attrs, parent, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function html(tag, text, parent) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
function time(ms) { return ms == null ? "" : new Date(ms).toISOString().slice(11, 23); }
function link(id) {
  const a = document.createElement("a");
  a.textContent = id;
  a.className = "id order-link";
  a.href = embedded ? "#order-" + id : "orders/" + encodeURIComponent(id);
  return a;
}
function axes(svg, xMax, yMax, xLabel) {
  const pw = W - M.l - M.r, ph = H - M.t - M.b;
  for (let i = 0; i <= 4; i++) {
    const y = M.t + ph - ph * i / 4;
    el("line", {x1: M.l, x2: W - M.r, y1: y, y2: y, stroke: "#e2e2e2"}, svg);
    el("text", {x: M.l - 4, y: y + 4, "text-anchor": "end"}, svg, String(Math.round(yMax * i / 4 * 100) / 100));
  }
  for (let i = 0; i <= 5; i++) {
    const x = M.l + pw * i / 5;
    el("text", {x: x, y: H - M.b + 14, "text-anchor": "middle"}, svg, String(Math.round(xMax * i / 5 * 10) / 10));
  }
  el("text", {x: M.l + pw / 2, y: H - 4, "text-anchor": "middle"}, svg, xLabel);
  el("line", {x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph, stroke: "#888"}, svg);
  el("line", {x1: M.l, x2: W - M.r, y1: M.t + ph, y2: M.t + ph, stroke: "#888"}, svg);
}
// A colour and a dash per series; past eight series the colours come back, with other dashes.
function colour(i) { return COLOURS[i % COLOURS.length]; }
function dash(i) { return DASHES[(i + Math.floor(i / COLOURS.length)) % DASHES.length]; }
function swatch(legend, i, label, kind) {
  const li = html("li", undefined, legend);
  const s = el("svg", {viewBox: "0 0 28 12", "aria-hidden": "true"}, li);
  if (kind === "bar") el("rect", {x: 2, y: 1, width: 24, height: 10, fill: "url(#hatch-" + i + ")", stroke: COLOURS[i]}, s);
  else el("line", {x1: 1, x2: 27, y1: 6, y2: 6, stroke: colour(i), "stroke-width": 2.5, "stroke-dasharray": dash(i)}, s);
  li.appendChild(document.createTextNode(label));
}
// One line per series over the samples' times; each line carries its name and last value.
function lineChart(svg, legend, samples, names, pick, xLabel) {
  clear(svg); clear(legend);
  const xMax = niceMax(samples.length ? samples[samples.length - 1].t : 1);
  let top = 0;
  for (const s of samples) for (const n of names) top = Math.max(top, pick(s, n) || 0);
  const yMax = niceMax(top);
  axes(svg, xMax, yMax, xLabel);
  const pw = W - M.l - M.r, ph = H - M.t - M.b;
  names.forEach((n, i) => {
    const points = samples.filter(s => pick(s, n) !== undefined)
      .map(s => (M.l + pw * s.t / xMax).toFixed(1) + "," + (M.t + ph - ph * pick(s, n) / yMax).toFixed(1));
    const last = samples.length ? (pick(samples[samples.length - 1], n) || 0) : 0;
    el("polyline", {"data-series": n, "data-last": last, points: points.join(" "), fill: "none",
      stroke: colour(i), "stroke-width": 2, "stroke-dasharray": dash(i)}, svg,
      undefined).appendChild(el("title", {}, null, n + ": " + last));
    swatch(legend, i, n + " (" + last + ")");
  });
}
function hatches(svg) {
  const defs = el("defs", {}, svg);
  OUTCOMES.forEach((o, i) => {
    const p = el("pattern", {id: "hatch-" + i, width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(" + [0, 45, -45, 90][i] + ")"}, defs);
    el("rect", {width: 6, height: 6, fill: COLOURS[i], "fill-opacity": i === 0 ? 1 : 0.35}, p);
    if (i > 0) el("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: COLOURS[i], "stroke-width": 3}, p);
  });
}
// Stacked bars of ended orders by how long they took, one colour and hatching per outcome.
function histogram(svg, legend, ended) {
  clear(svg); clear(legend);
  hatches(svg);
  const longest = ended.reduce((m, e) => Math.max(m, e.seconds), 0);
  const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600];
  const width = steps.find(s => longest / s <= 20) || Math.ceil(longest / 20);
  const bins = Math.max(1, Math.floor(longest / width) + 1);
  const counts = Array.from({length: bins}, () => OUTCOMES.map(() => 0));
  for (const e of ended) {
    const o = OUTCOMES.indexOf(e.outcome);
    counts[Math.min(bins - 1, Math.floor(e.seconds / width))][o < 0 ? 2 : o] += 1;
  }
  const yMax = niceMax(Math.max(1, ...counts.map(c => c.reduce((a, b) => a + b, 0))));
  const xMax = bins * width;
  axes(svg, xMax, yMax, "seconds to terminal");
  const pw = W - M.l - M.r, ph = H - M.t - M.b, bw = pw / bins;
  counts.forEach((c, b) => {
    let base = 0;
    c.forEach((n, o) => {
      if (n === 0) return;
      const h = ph * n / yMax;
      const lo = +(b * width).toFixed(2), hi = +((b + 1) * width).toFixed(2);
      el("rect", {"data-bin": lo + "-" + hi, "data-outcome": OUTCOMES[o], "data-count": n,
        x: (M.l + b * bw + 1).toFixed(1), y: (M.t + ph - base - h).toFixed(1), width: Math.max(1, bw - 2).toFixed(1),
        height: h.toFixed(1), fill: "url(#hatch-" + o + ")", stroke: COLOURS[o]}, svg)
        .appendChild(el("title", {}, null, n + " " + OUTCOMES[o] + " in " + lo + " to " + hi + " s"));
      base += h;
    });
  });
  OUTCOMES.forEach((o, i) => {
    const n = ended.filter(e => e.outcome === o).length;
    if (n > 0 || i < 3) swatch(legend, i, o + " (" + n + ")", "bar");
  });
}
function rows(table, items, cells) {
  const body = table.tBodies[0];
  clear(body);
  for (const item of items) {
    const tr = html("tr", undefined, body);
    for (const c of cells(item)) {
      const td = html("td", undefined, tr);
      if (c instanceof Node) td.appendChild(c); else td.textContent = c == null ? "" : String(c);
    }
  }
}
function draw(v) {
  const last = v.samples.length ? v.samples[v.samples.length - 1] : {states: {}, queues: {}};
  document.getElementById("status").textContent = (embedded ? "Report of a run: " : "Live, every 2 s: ") +
    v.elapsed.toFixed(0) + " s observed, " + v.order_count + " orders (" +
    v.states.map(s => s + " " + (last.states[s] || 0)).join(", ") + ")";
  lineChart(document.querySelector('[data-chart="states"]'), document.getElementById("states-legend"),
    v.samples, v.states, (s, n) => s.states[n] || 0, "seconds since start");
  histogram(document.querySelector('[data-chart="time-to-terminal"]'), document.getElementById("ttt-legend"), v.ended);
  lineChart(document.querySelector('[data-chart="queues"]'), document.getElementById("queues-legend"),
    v.samples, v.queues, (s, n) => s.queues[n], "seconds since start");
  const m = v.metrics, metrics = document.getElementById("metrics");
  clear(metrics);
  const ul = html("ul", undefined, metrics);
  html("li", "orders ended: " + (Object.entries(m.ended).map(([k, n]) => k + " " + n).join(", ") || "none yet"), ul);
  for (const [k, [n, p50, p95]] of Object.entries(m.time_to_terminal))
    html("li", k + " in p50 " + p50.toFixed(2) + " s, p95 " + p95.toFixed(2) + " s (" + n + ")", ul);
  html("li", "lease expiries " + m.lease_expiries + ", supervisor resets " + m.supervisor_resets + ", " + m.lines + " metric lines", ul);
  document.getElementById("alert-count").textContent = "(" + v.alert_count + ")";
  rows(document.getElementById("alerts"), v.alerts, a => [time(a.at), link(a.order_id), a.outcome, a.cause, a.sent ? "yes" : "not yet"]);
  document.getElementById("dead-letter-count").textContent = "(" + v.dead_letter_count + ")";
  rows(document.getElementById("dead-letters"), v.dead_letters, d => [time(d.at * 1000), d.queue, d.dead_letter_queue,
    d.kind, d.order_id ? link(d.order_id) : "", d.receives, d.reason]);
  document.getElementById("order-count").textContent = "(" + v.orders.length + " latest of " + v.order_count + ")";
  rows(document.getElementById("orders"), v.orders, o => [link(o.order_id), o.state, time(o.created_at), time(o.ended_at),
    [o.outcome, o.cause].filter(Boolean).join(": ")]);
}
function openTarget() {
  const t = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (t && t.tagName === "DETAILS") t.open = true;
}
if (embedded) {
  draw(JSON.parse(embedded.textContent));
  openTarget();
  window.addEventListener("hashchange", openTarget);
} else {
  const refresh = () => fetch("view.json", {cache: "no-store"}).then(r => r.json()).then(draw)
    .catch(e => { document.getElementById("status").textContent = "Cannot reach the stack: " + e; });
  refresh();
  setInterval(refresh, 2000);
}
</script>
</body></html>
"##;
