// The operators' console. Every read and every command goes through the stack's admin API;
// the page keeps nothing but the session it was opened with, and draws what the API answers.
// A view is redrawn every few seconds while it is shown, so that what changes shows without a
// reload; a dialog open, or a field being typed in, pauses that.
"use strict";

(() => {
  const REFRESH_MS = 3000;
  const PAGE_SIZE = 25;
  const LISTS = [
    ["failed", "Failed"],
    ["reported", "Reported"],
    ["paused", "Paused"],
    ["in-flight", "In flight"],
    ["awaiting-answer", "Awaiting an answer"],
  ];
  // The commands an order in a state may take; the API refuses any other with its reason.
  const VERBS = {
    Pending: ["pause", "cancel"],
    Processing: ["pause", "cancel"],
    Paused: ["resume", "cancel"],
    Error: ["redrive", "redrive-compensation"],
    Processed: ["acknowledge", "undo"],
    Cancelled: [],
  };
  const VERB_TEXT = {
    pause: ["Pause", "The order stops after its step in flight, until resumed."],
    resume: ["Resume", "The order goes on from where it stopped."],
    cancel: ["Cancel", "What was done is undone, the last step first; the order ends Cancelled."],
    redrive: ["Redrive", "The order runs again from the step that failed."],
    "redrive-compensation": ["Redrive the undo", "The undos that failed are tried again."],
    acknowledge: ["Acknowledge", "The failure this order only reported is taken note of."],
    undo: ["Undo", "Each step done is undone, the last first; the order ends Cancelled."],
  };

  // The commands each list may take for all it holds at once (a bulk command).
  const BULK = {
    failed: ["redrive", "redrive-compensation"],
    reported: ["acknowledge", "undo"],
    paused: ["resume", "cancel"],
    "in-flight": ["pause", "cancel"],
    "awaiting-answer": ["pause", "cancel"],
  };
  const BULK_TALLY = [
    ["applied", "applied"],
    ["before", "applied before (a retry)"],
    ["refused", "refused by the order's state"],
    ["gone", "gone (deleted)"],
    ["newer", "newer than the command: left alone"],
  ];

  const session = { config: null, caller: null };
  let shown = { route: null, draw: null };
  let timer = null;

  // ---------------------------------------------------------------- the API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // One call of the admin API (`path` begins with `admin/`). Throttling and unavailability are
  // retried: reads are safe to repeat, and every command carries its id.
  async function call(method, path, body) {
    let wait = 500;
    for (let attempt = 1; ; attempt++) {
      let response;
      const text = body === undefined ? undefined : JSON.stringify(body);
      let prepared;
      try {
        prepared = await SasAccess.prepare(session.config, method, path, text);
      } catch (e) {
        if (e instanceof SasAccess.SessionError) throw new ApiError(401, "no_session", e.message);
        throw e;
      }
      try {
        response = await fetch(prepared.url, {
          method,
          headers: prepared.headers,
          body: text,
          cache: "no-store",
          credentials: "omit",
        });
      } catch (e) {
        if (attempt < 4) { await sleep(wait); wait *= 2; continue; }
        throw new ApiError(0, "unreachable", "the API does not answer: " + e.message);
      }
      const said = await response.text();
      let answer;
      try { answer = said ? JSON.parse(said) : {}; } catch { answer = { message: said }; }
      if (response.ok) return answer;
      if ([429, 500, 503].includes(response.status) && attempt < 4) {
        await sleep(wait); wait *= 2; continue;
      }
      const error = answer.error || {};
      throw new ApiError(response.status, error.code || answer.code || "error",
        error.message || answer.message || response.statusText);
    }
  }

  function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

  // A command with a fresh id: a retry inside `call` repeats that id, so it is applied once.
  function command(path, body) {
    return call("POST", path, { ...body, command_id: crypto.randomUUID() });
  }

  // ---------------------------------------------------------------- drawing

  // An element; attributes whose name starts with `on` are listeners. Children are nodes or
  // text, never markup: nothing the API answers is read as HTML.
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function table(id, head, rows, empty) {
    if (!rows.length) return h("p", { class: "quiet", id: id && id + "-empty" }, empty || "None.");
    return h("table", { id },
      h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
      h("tbody", {}, rows));
  }

  function time(value) {
    if (!value) return "";
    const at = new Date(value);
    if (isNaN(at)) return String(value);
    return h("time", { datetime: at.toISOString(), title: at.toISOString() },
      at.toLocaleString() + " (" + ago(at) + ")");
  }

  function ago(at) {
    const s = Math.round((Date.now() - at.getTime()) / 1000);
    const span = Math.abs(s);
    const text = span < 90 ? span + " s" : span < 5400 ? Math.round(span / 60) + " min"
      : span < 172800 ? Math.round(span / 3600) + " h" : Math.round(span / 86400) + " d";
    return s >= 0 ? text + " ago" : "in " + text;
  }

  function json(value, key) {
    return h("details", { "data-key": key },
      h("summary", {}, summarise(value)),
      h("pre", {}, JSON.stringify(value, null, 2)));
  }

  function summarise(value) {
    const text = JSON.stringify(value);
    return text.length > 80 ? text.slice(0, 77) + "…" : text;
  }

  function badge(state) {
    return h("span", { class: "state state-" + String(state).toLowerCase() }, state);
  }

  function orderLink(id) {
    return h("a", { href: "#/orders/" + id, "data-order": id }, id);
  }

  function notice(text, kind, status) {
    const p = document.getElementById("notice");
    p.hidden = false;
    p.className = kind;
    p.dataset.status = status === undefined ? "" : String(status);
    p.textContent = text;
  }

  function failed(e) {
    if (e instanceof ApiError) {
      const who = e.status === 403
        ? " (your identity may not do this: the API refused it)" : "";
      notice(e.status + " " + e.code + ": " + e.message + who, "error", e.status);
    } else {
      notice(String(e), "error", 0);
    }
  }

  // Asks for a reason (and the fields given), then runs `act` with them; the answer or the
  // refusal is shown, and the view is drawn again.
  function ask(title, text, fields, act) {
    const dialog = document.getElementById("ask");
    const form = document.getElementById("ask-form");
    document.getElementById("ask-title").textContent = title;
    document.getElementById("ask-text").textContent = text;
    const box = document.getElementById("ask-fields");
    box.replaceChildren(...fields.map((f) => h("p", {},
      h("label", { for: "ask-" + f.name }, f.label),
      h(f.multiline ? "textarea" : "input",
        { id: "ask-" + f.name, name: f.name, placeholder: f.placeholder || "", rows: f.multiline ? 3 : undefined }))));
    const reason = document.getElementById("ask-reason");
    reason.value = "";
    const confirm = document.getElementById("ask-confirm");
    confirm.disabled = false;
    form.onsubmit = async (event) => {
      event.preventDefault();
      if (!reason.value.trim()) { reason.focus(); return; }
      const values = { reason: reason.value.trim() };
      for (const f of fields) values[f.name] = document.getElementById("ask-" + f.name).value.trim();
      confirm.disabled = true;
      try {
        const answer = await act(values);
        dialog.close();
        notice(answer, "done", 200);
      } catch (e) {
        dialog.close();
        failed(e);
      }
      redraw();
    };
    document.getElementById("ask-cancel").onclick = () => dialog.close();
    dialog.showModal();
    reason.focus();
  }

  // ---------------------------------------------------------------- views

  // The orders that need an operator: one list at a time, newest first, a page at a time.
  async function attention(params) {
    const list = params.get("list") || "failed";
    const query = new URLSearchParams({ list, limit: String(PAGE_SIZE) });
    for (const k of ["workflow", "step", "cause", "older_than", "after"]) {
      if (params.get(k)) query.set(k, params.get(k));
    }
    const filters = new URLSearchParams();
    for (const k of ["workflow", "step", "cause", "older_than"]) {
      if (params.get(k)) filters.set(k, params.get(k));
    }
    const [page, counts] = await Promise.all([
      call("GET", "admin/orders?" + query),
      call("GET", "admin/counts?" + filters),
    ]);
    const tabs = h("nav", { class: "tabs" }, LISTS.map(([id, label]) => {
      const counted = counts[id.replace("-", "_")];
      const next = new URLSearchParams(filters);
      next.set("list", id);
      return h("a", { href: "#/?" + next, class: id === list ? "current" : "", "data-list": id },
        label, " ", h("span", { class: "count", "data-count": counted.orders,
          title: counted.exact ? "" : "counted by the index: at most this many" },
        (counted.exact ? "" : "≤") + counted.orders.toLocaleString() + (counted.capped ? "+" : "")));
    }));
    const filter = h("form", { class: "filter", id: "filter", onsubmit: (e) => {
      e.preventDefault();
      const next = new URLSearchParams({ list });
      for (const k of ["workflow", "step", "cause", "older_than"]) {
        const v = e.target.elements[k].value.trim();
        if (v) next.set(k, v);
      }
      location.hash = "#/?" + next;
    } },
      ["workflow", "step", "cause"].map((k) =>
        h("input", { name: k, placeholder: k, value: params.get(k) || "", "aria-label": k })),
      h("input", { name: "older_than", placeholder: "older than (s)", value: params.get("older_than") || "",
        "aria-label": "older than, in seconds", inputmode: "numeric" }),
      h("button", { type: "submit" }, "Filter"));
    const rows = page.orders.map((o) => h("tr", { "data-order": o.order_id },
      h("td", {}, orderLink(o.order_id)),
      h("td", {}, o.workflow + " v" + o.workflow_version),
      h("td", {}, time(o.since)),
      h("td", {}, o.step || ""),
      h("td", {}, o.cause || "")));
    const more = [];
    if (params.get("after")) {
      const first = new URLSearchParams(params);
      first.delete("after");
      more.push(h("a", { href: "#/?" + first }, "First page"));
    }
    if (page.next) {
      const next = new URLSearchParams(params);
      next.set("list", list);
      next.set("after", page.next);
      more.push(h("a", { href: "#/?" + next, id: "next-page" }, "Next page"));
    }
    const counted = counts[list.replace("-", "_")];
    const bulk = counted.orders === 0 ? null : h("p", { class: "bulk", id: "bulk-bar" },
      "All that match: ",
      (BULK[list] || []).map((verb) => h("button", {
        type: "button", "data-bulk": verb, disabled: counted.capped,
        title: counted.capped ? "more than one command may take: narrow the filter" : "",
        onclick: () => bulkAsk(list, params, verb, counted),
      }, VERB_TEXT[verb][0] + " " + (counted.exact ? "" : "up to ") + counted.orders.toLocaleString())));
    return [
      h("h2", {}, "Orders that need attention"),
      tabs, filter, bulk,
      table("orders", ["order", "workflow", "since", "step", "cause"], rows,
        // A filter the index cannot apply may end a page before it finds any: more may follow.
        page.next ? "None on this page: the filter read as far as a page may; the next page reads on."
          : "No order in this list" + (query.has("workflow") || query.has("step") || query.has("cause")
            ? " matches the filter." : ".")),
      h("p", { class: "pages" }, more),
    ];
  }

  // A command for every order the list holds with these filters, as counted now: the API
  // refuses it if the count changed meanwhile, and says how many match now.
  function bulkAsk(list, params, verb, counted) {
    const filter = { list };
    for (const k of ["workflow", "step", "cause"]) if (params.get(k)) filter[k] = params.get(k);
    if (params.get("older_than")) filter.older_than_s = Number(params.get("older_than"));
    const [label, text] = VERB_TEXT[verb];
    const n = counted.orders.toLocaleString();
    ask(label + " all " + (counted.exact ? "" : "up to ") + n + " orders that match", text
      + " Each order of the list as it stands now gets the command, a minute's worth at a time at"
      + " the pace held orders resume; an order that joins the list later is left alone.", [],
      async ({ reason }) => {
        const compensation = verb === "redrive-compensation";
        const answer = await command("admin/bulk", {
          command: compensation ? "redrive" : verb, compensation, filter, reason, expect: counted.orders,
        });
        // Shown without a hash change, which would clear the notice of what was asked.
        history.pushState(null, "", "#/bulk/" + encodeURIComponent(answer.job.id));
        return label + ": asked for " + n + " orders; the report follows as they are reached.";
      });
  }

  function describe(filter) {
    const parts = [filter.list];
    for (const k of ["workflow", "step", "cause"]) if (filter[k]) parts.push(k + " " + filter[k]);
    if (filter.older_than_s) parts.push("older than " + filter.older_than_s + " s");
    return parts.join(", ");
  }

  function reached(job) {
    const t = job.tally;
    return t.applied + t.before + t.refused + t.gone;
  }

  async function bulkJobs() {
    const answer = await call("GET", "admin/bulk");
    const rows = answer.jobs.map((j) => h("tr", { "data-job": j.id },
      h("td", {}, h("a", { href: "#/bulk/" + encodeURIComponent(j.id) }, j.id)),
      h("td", {}, j.command.replace("_", " ")),
      h("td", {}, describe(j.filter)),
      h("td", {}, reached(j) + " of " + j.expected + (j.finished ? ", done" : "")),
      h("td", {}, j.by),
      h("td", {}, time(j.created_at))));
    return [h("h2", {}, "Bulk commands"),
      table("jobs", ["id", "command", "on", "reached", "by", "asked"], rows, "No bulk command yet.")];
  }

  // One bulk command's report: how far it went, and what each order made of it.
  async function bulkJob(id) {
    let answer;
    try {
      answer = await call("GET", "admin/bulk/" + encodeURIComponent(id));
    } catch (e) {
      if (e.status === 404) return h("p", { class: "error", id: "not-found" }, e.message + ": " + id);
      throw e;
    }
    const j = answer.job;
    const facts = [
      ["command", j.command.replace("_", " ")], ["on", describe(j.filter)],
      ["counted when asked", j.expected.toLocaleString()], ["asked by", j.by], ["why", j.reason],
      ["asked", time(j.created_at)], ["last slice", time(j.updated_at)],
    ];
    return [
      h("h2", {}, "Bulk command ", h("code", {}, j.id)),
      h("p", { id: "bulk-state", "data-finished": String(j.finished), "data-reached": reached(j) },
        j.finished ? "Done: every order listed when it was asked was reached."
          : "Going on: " + reached(j) + " of " + j.expected + " reached so far."),
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      h("table", { id: "tally" }, h("tbody", {}, BULK_TALLY.map(([k, label]) =>
        h("tr", { "data-tally": k }, h("th", {}, label), h("td", {}, String(j.tally[k])))))),
      j.refusals && j.refusals.length ? [h("h3", {}, "Refused"),
        table("refusals", ["order", "why"], j.refusals.map((r) =>
          h("tr", {}, h("td", {}, orderLink(r.order_id)), h("td", {}, r.code))))] : null,
    ];
  }

  async function order(id, whole) {
    let view;
    try {
      view = await call("GET", "admin/orders/" + encodeURIComponent(id) + (whole ? "?values=whole" : ""));
    } catch (e) {
      if (e instanceof ApiError && (e.status === 404 || e.status === 400)) {
        return [h("h2", {}, "Order " + id), h("p", { class: "error", id: "not-found" }, e.message)];
      }
      throw e;
    }
    const facts = [
      ["workflow", view.workflow + " v" + view.workflow_version],
      ["phase", view.phase],
      ["created", time(view.created_at)],
      ["updated", time(view.updated_at)],
      view.ended_at && ["ended", time(view.ended_at)],
      view.complete_by && ["complete by", time(view.complete_by)],
      view.parent && ["parent", h("span", {}, orderLink(view.parent.order_id),
        " step " + view.parent.step + (view.parent.element !== undefined ? " element " + view.parent.element : ""))],
      view.group && ["group", view.group],
      view.in_line && ["in line", view.in_line.summary],
      view.stop && ["waiting to", view.stop.command + " (" + (view.stop.by || "") + ")"],
      view.redrives && ["redrives", String(view.redrives)],
      ["submitted by", typeof view.owner === "string" ? view.owner : JSON.stringify(view.owner)],
      ["correlation id", view.correlation_id || ""],
    ].filter(Boolean);
    const parts = [
      h("h2", {}, "Order ", h("span", { class: "id", id: "order-id" }, view.order_id), " ",
        h("span", { id: "order-state", "data-state": view.process_state }, badge(view.process_state))),
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    ];
    if (view.cause) parts.push(h("p", { class: "cause", id: "cause" }, "Why: ", because(view.cause, view.steps)));
    if (view.stopping) parts.push(h("p", { class: "cause" }, "A step failed while others were in flight: nothing new starts, and what was done will be undone."));
    if (view.needs_manual_undo && view.needs_manual_undo.length) {
      parts.push(h("p", { class: "cause", id: "manual-undo" },
        "Left in place, to undo by hand: " + view.needs_manual_undo.join(", ")));
    }
    parts.push(h("div", { class: "actions", id: "actions" },
      (VERBS[view.process_state] || []).map((verb) => h("button", {
        type: "button", "data-verb": verb,
        onclick: () => ask(VERB_TEXT[verb][0] + " order " + view.order_id, VERB_TEXT[verb][1], [],
          async ({ reason }) => {
            const [name, compensation] = verb === "redrive-compensation" ? ["redrive", true] : [verb, false];
            const done = await command("admin/orders/" + view.order_id + "/" + name, { reason, compensation });
            return VERB_TEXT[verb][0] + ": " + (done.applied === "before" ? "given before" : "done")
              + "; the order is " + done.process_state + ".";
          }),
      }, VERB_TEXT[verb][0]))));
    parts.push(h("h3", {}, "Steps"));
    if (view.outline) parts.push(graph(view));
    parts.push(steps(view));
    // Large values are kept in the payload bucket and shown as references until asked for.
    const stored = JSON.stringify([view.order, view.steps.map((s) => s.output)]).includes('"$stored"');
    if (stored || whole) {
      parts.push(h("p", { class: "pages" }, whole
        ? h("a", { href: "#/orders/" + view.order_id, id: "values-references" }, "Show stored values as references")
        : h("a", { href: "#/orders/" + view.order_id + "?values=whole", id: "values-whole" }, "Show stored values whole")));
    }
    parts.push(h("h3", {}, "Timeline"), timeline(view.timeline || []));
    if (view.commands && view.commands.length) {
      parts.push(h("h3", {}, "Commands"), table("commands", ["at", "command", "by", "why", "id"],
        view.commands.map((c) => h("tr", {}, h("td", {}, time(c.at)), h("td", {}, c.command),
          h("td", {}, c.by), h("td", {}, c.reason), h("td", { class: "quiet" }, c.id)))));
    }
    parts.push(h("h3", {}, "Order"), json(view.order, "order-input"));
    return parts;
  }

  function because(cause, steps) {
    const step = cause.step ? " at " + cause.step : "";
    const detail = (steps || []).find((s) => s.name === cause.step);
    const said = cause.reason || (detail && detail.detail) || "";
    return cause.kind + step + (said ? ": " + said : "");
  }

  function steps(view) {
    // How many times each step was tried forward: the attempts (fencing tokens) its timeline
    // entries name, undos left out.
    const FORWARD = ["claimed", "step_done", "step_failed", "step_reported", "lease_expired"];
    const tried = new Map();
    for (const e of view.timeline || []) {
      if (!e.step || !FORWARD.includes(e.what)) continue;
      if (!tried.has(e.step)) tried.set(e.step, new Set());
      tried.get(e.step).add(e.attempt);
    }
    const given = new Map((view.outline || []).map((o) => [o.name, o.given || []]));
    const rows = view.steps.map((s) => {
      const now = [];
      if (s.waiting) now.push("waits for " + s.waiting.for + " until ", time(s.waiting.until));
      else if (s.lease) now.push((s.lease.sent ? "sent, " : "to send, ") + "lease to ", time(s.lease.complete_by),
        s.lease.failures ? " (" + s.lease.failures + " expired)" : "");
      if (s.held) now.push(h("span", { class: "held" }, " held: " + s.held.service
        + (s.held.action ? "/" + s.held.action : "") + " since ", time(s.held.since), " " + (s.held.reason || "")));
      if (s.fan) now.push(" " + fan(s.fan));
      const answer = s.waiting && s.waiting.for === "answer" ? ["complete", "refuse"].map((verb) =>
        h("button", { type: "button", "data-answer": verb, "data-step": s.name,
          onclick: () => ask((verb === "complete" ? "Complete" : "Refuse") + " step " + s.name,
            "Answers the step for the party outside that did not.",
            verb === "complete" ? [{ name: "output", label: "Output (JSON, optional)", multiline: true }] : [],
            async ({ reason, output }) => {
              const body = { reason };
              if (output) {
                try { body.output = JSON.parse(output); } catch (e) { throw new Error("the output is not JSON: " + e.message); }
              }
              await call("POST", "admin/orders/" + view.order_id + "/steps/" + encodeURIComponent(s.name) + "/" + verb, body);
              return "Step " + s.name + " " + (verb === "complete" ? "completed" : "refused") + ".";
            }) }, verb)) : [];
      // What its request carried beside the order: the outputs of the steps before it.
      const input = given.has(s.name) ? (given.get(s.name).length
        ? "the order, and the outputs of " + given.get(s.name).join(", ") : "the order") : "";
      return h("tr", { "data-step": s.name, "data-status": s.status },
        h("td", {}, s.name),
        h("td", { class: "quiet" }, input),
        h("td", {}, badge(s.status)),
        h("td", {}, String(tried.has(s.name) ? tried.get(s.name).size : 0)),
        h("td", {}, now, answer),
        h("td", {}, s.child ? orderLink(s.child) : ""),
        h("td", {}, s.output !== undefined ? json(s.output, "output-" + s.name) : ""),
        h("td", {}, s.reported ? "reported: " + because(s.reported, view.steps) : s.detail || ""));
    });
    return table("steps", ["step", "given", "status", "attempts", "now", "child", "output", "detail"], rows);
  }

  // The order's steps drawn as its workflow declares them: a column per depth of
  // dependency, an arrow from each step to those that wait for it, each box coloured by the
  // step's state. A box leads to its row of the table below.
  function graph(view) {
    const NS = "http://www.w3.org/2000/svg";
    const W = 190, H = 46, GAP_X = 50, GAP_Y = 14, PAD = 8;
    const byName = new Map(view.outline.map((s) => [s.name, s]));
    const status = new Map(view.steps.map((s) => [s.name, s.status]));
    const depth = new Map();
    const depthOf = (name, seen = new Set()) => {
      if (depth.has(name)) return depth.get(name);
      if (seen.has(name)) return 0;
      seen.add(name);
      const deps = (byName.get(name) || { depends_on: [] }).depends_on;
      const d = deps.length ? 1 + Math.max(...deps.map((x) => depthOf(x, seen))) : 0;
      depth.set(name, d);
      return d;
    };
    const columns = [];
    for (const s of view.outline) (columns[depthOf(s.name)] ||= []).push(s.name);
    const at = new Map();
    columns.forEach((names, c) => names.forEach((n, r) =>
      at.set(n, { x: PAD + c * (W + GAP_X), y: PAD + r * (H + GAP_Y) })));
    const rows = Math.max(...columns.map((c) => c.length));
    const svg = document.createElementNS(NS, "svg");
    const width = PAD * 2 + columns.length * W + (columns.length - 1) * GAP_X;
    const height = PAD * 2 + rows * H + (rows - 1) * GAP_Y;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("width", String(width));
    svg.setAttribute("class", "graph");
    svg.setAttribute("id", "graph");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "the workflow's steps and what each waits for");
    const el = (tag, attrs, text) => {
      const e = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
      if (text !== undefined) e.textContent = text;
      svg.append(e);
      return e;
    };
    const marker = el("marker", { id: "arrow", viewBox: "0 0 8 8", refX: 8, refY: 4,
      markerWidth: 8, markerHeight: 8, orient: "auto" });
    const tip = document.createElementNS(NS, "path");
    tip.setAttribute("d", "M0,0 L8,4 L0,8 z");
    tip.setAttribute("class", "tip");
    marker.append(tip);
    for (const s of view.outline) {
      for (const d of s.depends_on) {
        const from = at.get(d), to = at.get(s.name);
        if (!from || !to) continue;
        el("path", { class: "edge", "data-from": d, "data-to": s.name, "marker-end": "url(#arrow)",
          d: "M" + (from.x + W) + "," + (from.y + H / 2) + " C" + (from.x + W + GAP_X / 2) + "," + (from.y + H / 2)
            + " " + (to.x - GAP_X / 2) + "," + (to.y + H / 2) + " " + to.x + "," + (to.y + H / 2) });
      }
    }
    for (const s of view.outline) {
      const p = at.get(s.name);
      const state = status.get(s.name) || "not_started";
      const box = el("g", { class: "node state-" + state, "data-node": s.name, "data-status": state,
        tabindex: 0, transform: "translate(" + p.x + "," + p.y + ")" });
      box.addEventListener("click", () => {
        const row = document.querySelector("#steps tr[data-step=\"" + CSS.escape(s.name) + "\"]");
        if (row) { row.scrollIntoView({ block: "center" }); row.classList.add("flash"); }
      });
      const rect = document.createElementNS(NS, "rect");
      for (const [k, v] of Object.entries({ width: W, height: H, rx: 5 })) rect.setAttribute(k, String(v));
      const name = document.createElementNS(NS, "text");
      name.setAttribute("x", "10"); name.setAttribute("y", "19"); name.setAttribute("class", "name");
      name.textContent = s.name;
      const what = document.createElementNS(NS, "text");
      what.setAttribute("x", "10"); what.setAttribute("y", "36"); what.setAttribute("class", "what");
      what.textContent = state.replace(/_/g, " ") + " · " + s.kind + (s.runs ? " " + s.runs : "")
        + (s.on_failure === "report" ? " · report" : "");
      const title = document.createElementNS(NS, "title");
      title.textContent = s.name + ": " + s.kind + (s.runs ? " " + s.runs : "")
        + (s.undo ? ", undone by " + s.undo : ", nothing to undo")
        + (s.depends_on.length ? ", after " + s.depends_on.join(", ") : "");
      box.append(title, rect, name, what);
    }
    return h("div", { class: "graph-box" }, svg);
  }

  function fan(f) {
    const parts = [];
    if (f.items !== undefined) parts.push(f.items + " elements");
    if (f.inline !== undefined) parts.push("inline (v" + f.inline + ")");
    if (f.settled) parts.push("settled " + f.settled);
    if (f.dirty) parts.push("to clean " + f.dirty);
    if (f.strikes && Object.keys(f.strikes).length) parts.push("strikes " + JSON.stringify(f.strikes));
    return parts.join(", ");
  }

  function timeline(entries) {
    const rows = entries.map((e) => h("tr", { "data-what": e.what },
      h("td", {}, time(e.at)),
      h("td", {}, e.what),
      h("td", {}, e.step || ""),
      h("td", {}, String(e.attempt)),
      h("td", {}, e.by || ""),
      h("td", {}, [e.reason || "", e.until ? [" until ", time(e.until)] : ""])));
    return table("timeline", ["at", "what", "step", "attempt", "by", "why"], rows);
  }

  // Orders found by a value of their input (a customer), as each workflow's search_key reads
  // it, ended ones included, newest first; and the order a submitter's idempotency key made: a
  // key is its submitter's own, so both are asked for.
  async function find(params) {
    const key = params.get("key") || "";
    const submitter = params.get("submitter") || sessionStorage.getItem("sas-console-submitter") || "";
    const parts = [];
    if (key) {
      const query = new URLSearchParams({ key, limit: String(PAGE_SIZE) });
      if (params.get("after")) query.set("after", params.get("after"));
      try {
        const page = await call("GET", "admin/search?" + query);
        const declared = Object.entries(page.search_keys || {});
        const rows = page.orders.map((o) => h("tr", { "data-order": o.order_id },
          h("td", {}, orderLink(o.order_id)),
          h("td", {}, o.workflow + " v" + o.workflow_version),
          h("td", { "data-state": o.process_state }, o.process_state),
          h("td", {}, time(o.accepted_at)),
          h("td", {}, time(o.ended_at)),
          h("td", {}, o.step || ""),
          h("td", {}, o.cause || "")));
        const more = [];
        if (page.next) {
          const next = new URLSearchParams({ key, after: page.next });
          more.push(h("a", { href: "#/find?" + next, id: "next-found" }, "Next page"));
        }
        parts.push(h("h2", {}, "Orders found by ", h("code", {}, key)),
          h("p", { class: "quiet", id: "search-keys" }, declared.length
            ? "Searched: " + declared.map(([w, k]) => w + " by " + k).join(", ") + "."
            : "No workflow of the stack declares a search_key: orders are found by their id or idempotency key."),
          table("found-orders", ["order", "workflow", "state", "accepted", "ended", "step", "cause"], rows,
            page.next ? "None on this page; the next page reads on." : "No order has this value."),
          h("p", { class: "more" }, more));
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 400) throw e;
        parts.push(h("p", { class: "error", id: "search-refused" }, e.message));
      }
    }
    const form = h("form", { class: "filter", id: "find", onsubmit: (e) => {
      e.preventDefault();
      const next = { key: e.target.elements.key.value.trim(), submitter: e.target.elements.submitter.value.trim() };
      sessionStorage.setItem("sas-console-submitter", next.submitter);
      location.hash = "#/find?" + new URLSearchParams(next);
    } },
      h("input", { name: "key", value: key, placeholder: "idempotency key", "aria-label": "idempotency key" }),
      h("input", { name: "submitter", value: submitter, size: 60,
        placeholder: "submitter (as an order shows it: arn:aws:iam::…)", "aria-label": "submitter" }),
      h("button", { type: "submit" }, "Find"));
    parts.push(h("h2", {}, "Find an order by its idempotency key"), form);
    if (key && submitter) {
      try {
        const found = await call("GET", "admin/lookup?" + new URLSearchParams({ idempotency_key: key, submitter }));
        parts.push(h("p", { id: "found" }, "The key made ", orderLink(found.order_id), "."));
      } catch (e) {
        if (!(e instanceof ApiError) || ![400, 404].includes(e.status)) throw e;
        parts.push(h("p", { class: "error", id: "not-found" }, e.message));
      }
    }
    return parts;
  }

  async function services() {
    const answer = await call("GET", "admin/services");
    const rows = answer.services.map((s) => {
      const holds = (s.holds || []).filter((x) => x.state === "held");
      const limits = [];
      if (s.limits && s.limits.per_second) limits.push(s.limits.per_second + "/s");
      if (s.learned_per_second) limits.push(s.learned_per_second + "/s learned");
      if (s.limits && s.limits.in_flight) limits.push(((s.in_use && s.in_use.in_flight) || 0) + "/" + s.limits.in_flight + " in flight");
      return h("tr", { "data-service": s.agent || s.service },
        h("td", {}, s.agent || s.service),
        h("td", {}, holds.length ? badge("Held") : badge("Open")),
        h("td", {}, holds.map((x) => h("div", { class: "hold", "data-hold": x.action || "" },
          (x.action ? x.action : "whole service") + ": since ", time(x.held_since), ", by " + (x.held_by || "its agent")
          + (x.reason ? ", " + x.reason : "") + (x.last_probe ? ", probes: " + x.last_probe : "") + ", ",
          h("a", { href: "#/services/" + encodeURIComponent(s.agent || s.service) + "/waiting"
            + (x.action ? "?" + new URLSearchParams({ action: x.action }) : ""), "data-waiting": x.action || "" },
          (x.waiting || 0) + " waiting"), " ",
          h("button", { type: "button", "data-release": x.action || "",
            onclick: () => ask("Release " + (s.agent || s.service) + (x.action ? "/" + x.action : ""),
              "Its agent calls it again; the orders that waited go on at the stack's pace.", [],
              ({ reason }) => serviceCommand(s, "release", reason, x.action)) }, "Release")))),
        h("td", {}, limits.join(", ")),
        h("td", {}, String(s.waiting || 0)),
        h("td", {}, h("button", { type: "button", "data-hold-service": s.agent || s.service,
          onclick: () => ask("Hold " + (s.agent || s.service),
            "Its agent calls it no more, not even to probe; its orders wait without failing.",
            [{ name: "action", label: "Only this action (empty: the whole service)" }],
            ({ reason, action }) => serviceCommand(s, "hold", reason, action || undefined)) }, "Hold")));
    });
    return [h("h2", {}, "Services"),
      table("services", ["service", "state", "holds", "rate", "waiting", ""], rows, "No service.")];
  }

  // The orders waiting for a hold, the longest waiting first.
  async function waiting(service, action) {
    const query = action ? "?" + new URLSearchParams({ action }) : "";
    const answer = await call("GET", "admin/services/" + encodeURIComponent(service) + "/waiting" + query);
    const name = service + (action ? "/" + action : "");
    return [h("h2", {}, "Waiting for " + name),
      h("p", { id: "waiting-count", "data-count": answer.waiting },
        answer.waiting + " order" + (answer.waiting === 1 ? "" : "s") + " wait"
        + (answer.waiting > answer.orders.length ? "; the " + answer.orders.length + " longest waiting:" : ":")),
      table("waiting", ["#", "order"], answer.orders.map((id, i) =>
        h("tr", {}, h("td", {}, String(i + 1)), h("td", {}, orderLink(id)))), "None waits.")];
  }

  async function serviceCommand(s, verb, reason, action) {
    const body = { reason };
    if (action) body.action = action;
    await call("POST", "admin/services/" + encodeURIComponent(s.agent || s.service) + "/" + verb, body);
    return (verb === "hold" ? "Held " : "Released ") + (s.agent || s.service) + (action ? "/" + action : "") + ".";
  }

  async function keys(key) {
    if (key) {
      const view = await call("GET", "admin/keys?key=" + encodeURIComponent(key));
      const placed = (list) => list.map((p, i) => h("tr", {}, h("td", {}, String(i + 1)),
        h("td", {}, orderLink(p.order_id)), h("td", {}, time(p.since))));
      return [h("h2", {}, "Key " + view.key), h("p", {}, "limit " + view.limit),
        h("h3", {}, "Running"), table("running", ["#", "order", "since"], placed(view.running)),
        h("h3", {}, "Waiting"), table("waiting", ["#", "order", "since"], placed(view.waiting)),
        view.more_waiting ? h("p", { class: "quiet" }, "More wait than listed.") : ""];
    }
    const answer = await call("GET", "admin/keys");
    const rows = answer.keys.map((k) => h("tr", {},
      h("td", {}, h("a", { href: "#/keys/" + encodeURIComponent(k.key) }, k.key)),
      h("td", {}, k.limit ? k.running + "/" + k.limit : String(k.running)),
      h("td", {}, String(k.waiting)),
      h("td", {}, time(k.busy_since)),
      h("td", {}, time(k.oldest_waiting_since))));
    return [h("h2", {}, "Concurrency keys"),
      table("keys", ["key", "running", "waiting", "busy since", "first in line since"], rows, "No key has orders running.")];
  }

  async function deadLetters(queue) {
    const answer = await call("GET", "admin/dead-letters");
    const rows = answer.queues.map((q) => h("tr", { "data-queue": q.queue },
      h("td", {}, h("a", { href: "#/dead-letters/" + encodeURIComponent(q.queue) }, q.queue)),
      h("td", {}, String(q.messages)),
      h("td", {}, String(q.in_flight)),
      h("td", {}, q.move_task ? q.move_task.status + ", " + q.move_task.moved + " moved" : ""),
      h("td", {}, h("button", { type: "button", "data-redrive-queue": q.queue, disabled: !q.messages,
        onclick: () => ask("Move back the dead letters of " + q.queue,
          "Its messages go back to the queue they came from, to be handled again.", [],
          async ({ reason }) => {
            const moved = await call("POST", "admin/dead-letters/" + encodeURIComponent(q.queue) + "/redrive", { reason });
            return moved.method === "copy" ? moved.moved + " moved back" + (moved.more ? "; more are left" : "") + "."
              : "SQS moves them back (task " + moved.task_handle + ").";
          }) }, "Move back"))));
    const parts = [h("h2", {}, "Dead-letter queues"),
      table("queues", ["queue", "messages", "hidden", "move", ""], rows)];
    if (queue) {
      const peek = await call("GET", "admin/dead-letters/" + encodeURIComponent(queue) + "?limit=10");
      parts.push(h("h3", {}, "In " + queue + " (up to 10, left in place)"),
        table("letters", ["message", "kind", "order", "step", "receives", "sent", "note"],
          peek.messages.map((m) => h("tr", {},
            h("td", {}, m.message_id), h("td", {}, m.kind || ""),
            h("td", {}, m.order_id ? orderLink(m.order_id) : ""),
            h("td", {}, (m.step || "") + (m.direction ? " (" + m.direction + ")" : "")),
            h("td", {}, String(m.receive_count)), h("td", {}, time(m.sent_at)),
            h("td", {}, m.undecodable || ""))), "No message."));
    }
    return parts;
  }

  // ---------------------------------------------------------------- routing and refresh

  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const params = new URLSearchParams(query || "");
    switch (parts[0]) {
      case undefined: return ["attention", () => attention(params)];
      case "orders": return ["attention", () => order(parts[1] || "", params.get("values") === "whole")];
      case "services": return ["services", parts[2] === "waiting" ? () => waiting(parts[1], params.get("action")) : services];
      case "keys": return ["keys", () => keys(parts[1])];
      case "dead-letters": return ["dead-letters", () => deadLetters(parts[1])];
      case "find": return ["attention", () => find(params)];
      case "bulk": return ["bulk", parts[1] ? () => bulkJob(parts[1]) : bulkJobs];
      default: return ["attention", async () => [h("p", { class: "error" }, "No such view: " + hash)]];
    }
  }

  async function redraw() {
    const [nav, draw] = route();
    const key = location.hash;
    const view = document.getElementById("view");
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("current", a.dataset.nav === nav);
    try {
      const parts = await draw();
      if (key !== location.hash) return;
      const open = new Set([...view.querySelectorAll("details[open]")].map((d) => d.dataset.key));
      view.replaceChildren(...[parts].flat(Infinity).filter(Boolean));
      for (const d of view.querySelectorAll("details")) if (open.has(d.dataset.key)) d.open = true;
      view.dataset.drawn = key;
      document.getElementById("live").textContent = "Live: drawn " + new Date().toLocaleTimeString();
    } catch (e) {
      if (e.status === 401 && session.config.mode === "signed") signInPage(e.message);
      else failed(e);
    }
  }

  function busy() {
    const active = document.activeElement;
    return document.getElementById("ask").open || document.hidden
      || (active && ["INPUT", "TEXTAREA"].includes(active.tagName));
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      if (!busy()) await redraw();
      schedule();
    }, REFRESH_MS);
  }

  async function start() {
    document.getElementById("search").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = document.getElementById("search-id").value.trim();
      if (!text) return;
      // An order id opens the order; anything else is searched for as a customer (a workflow's
      // search_key) and as an idempotency key.
      location.hash = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text)
        ? "#/orders/" + encodeURIComponent(text)
        : "#/find?" + new URLSearchParams({ key: text });
    });
    window.addEventListener("hashchange", () => {
      document.getElementById("notice").hidden = true;
      redraw();
    });
    try {
      session.config = await SasAccess.begin();
    } catch (e) {
      failed(e instanceof SasAccess.SessionError ? new ApiError(401, "no_session", e.message) : e);
    }
    if (!session.config) return;
    try {
      const me = await call("GET", "admin/me");
      session.caller = me.caller;
      const who = document.getElementById("who");
      who.replaceChildren("Signed in as " + me.caller);
      who.dataset.caller = me.caller;
      if (session.config.mode === "signed") {
        who.append(" ", h("button", { type: "button", id: "sign-out",
          onclick: () => { if (!SasAccess.signOut(session.config)) location.reload(); } }, "Sign out"));
      }
    } catch (e) {
      if (e.status === 401 && session.config.mode === "signed") return signInPage(e.message);
      failed(e);
    }
    await redraw();
    schedule();
  }

  // What a page served by the stack shows to someone not signed in, or whose session ended.
  function signInPage(why) {
    clearTimeout(timer);
    document.getElementById("view").replaceChildren(
      h("h2", {}, "Sign in"),
      h("p", { id: "signed-out" }, why === "not signed in" ? "Sign in to see the orders." : why + "."),
      h("button", { type: "button", id: "sign-in", onclick: () => SasAccess.signIn(session.config) },
        "Sign in"));
  }

  start();
})();
