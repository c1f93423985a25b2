// The admin page: same-origin fetches of the admin API, every value
// written as text (never as markup). Its actions (confirm, abort, roll
// back, preview) are the API's own calls, carrying the session's CSRF
// token and the generation the page shows as the expected one: a page
// that fell behind gets the API's 409 and says so.
"use strict";

const REFRESH_MS = 1500;
const PAGE_SIZE = 50;
let span = "fit";           // the charts' window: "fit" (the data) or seconds
let lastTimeline = null;    // [timeline, status] last drawn (a new window redraws them)
let lastOperation;          // history is read again when this changes
let selected = null;        // the generation whose diff is shown
let history = [];
let page = 0;               // of the history, PAGE_SIZE entries each
let shown = null;           // the status the page shows (what actions expect)
let csrf = null;            // the session's token for writes
let busy = false;           // one action at a time (a double click is one)

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const cell of cells) {
    tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// Local time, to the second; the UTC instant on hover.
function localTime(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

function utc(seconds) {
  return new Date(seconds * 1000).toISOString().replace(".000", "");
}

// An RFC 3339 instant from the API in the viewer's zone (date and time).
function local(rfc3339) {
  const at = new Date(rfc3339);
  return Number.isNaN(at.getTime()) ? rfc3339 : at.toLocaleString([], { hour12: false });
}

async function api(path) {
  const response = await fetch(path, { headers: { accept: "application/json" }, cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

// A write through the API: the session's CSRF token in its header.
async function write(path, body, contentType) {
  if (!csrf) csrf = (await api("/admin/ui/session")).csrf;
  const response = await fetch(path, {
    method: "POST",
    headers: { "content-type": contentType || "application/json", "x-cutover-csrf": csrf, accept: "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    cache: "no-store",
  });
  let answer = null;
  try { answer = await response.json(); } catch (_) { answer = null; }
  return { status: response.status, answer };
}

function showError(error) {
  const box = document.getElementById("error");
  if (error) {
    box.textContent = `cannot read the admin API: ${error.message}`;
    box.hidden = false;
  } else {
    box.hidden = true;
  }
}

function say(text, ok) {
  const box = document.getElementById("action-result");
  box.textContent = text;
  box.className = `action-result ${ok ? "done" : "failed"}`;
}

// What an answer that is not a success means to the person who clicked.
function refusal(result) {
  const a = result.answer || {};
  const message = a.message ? `: ${a.message}` : "";
  if (result.status === 409) return `refused (409 ${a.error || "conflict"}): the gateway changed since this page read it${message}`;
  if (result.status === 403 && a.missing_scope) return `refused (403): this login lacks the '${a.missing_scope}' scope`;
  if (result.status === 403 && a.error && a.error !== "forbidden") return `refused (403 ${a.error})${message}`;
  if (result.status === 403) return "refused (403): the session is no longer valid (the token changed or the page is stale); reload the page";
  if (result.status === 401) return "refused (401): the admin token is needed; reload the page to log in again";
  return `refused (${result.status} ${a.error || ""})${message}`;
}

// Runs one action at a time: the button is disabled until it is answered.
async function act(button, label, call) {
  if (busy) return;
  busy = true;
  button.disabled = true;
  say(`${label}…`, true);
  try {
    const result = await call();
    if (result.status >= 200 && result.status < 300) {
      say(`${label}: ${result.answer && result.answer.outcome ? result.answer.outcome.replaceAll("_", " ") : "done"}` +
        (result.answer && result.answer.generation !== undefined ? ` (generation ${result.answer.generation} active)` : ""), true);
    } else {
      say(refusal(result), false);
    }
  } catch (error) {
    say(`${label} failed: ${error.message}`, false);
  } finally {
    busy = false;
    button.disabled = false;
    lastOperation = undefined;
    await refresh();
  }
}

function settle(how) {
  const pending = shown && shown.pending;
  if (!pending) return;
  const button = document.getElementById(how);
  act(button, `${how} generation ${pending.generation}`, () => write(`/admin/runtime/${how}`, {
    generation: pending.generation,
    expected_active_generation: shown.active_generation,
    requested_by: "admin page",
  }));
}

// Open proposals (DESIGN §23), each with what it would change and its
// Approve and Reject (a reason is asked for) buttons. The table is rebuilt
// on every refresh: a reason being typed is carried into the new row, with
// the focus and the caret, so that no refresh takes it from the approver.
function renderProposals(proposals) {
  const open = (proposals || []).filter((p) => p.state === "open");
  document.getElementById("proposals-section").hidden = open.length === 0;
  const body = document.querySelector("#proposals tbody");
  const typed = new Map();
  for (const input of body.querySelectorAll("tr[data-proposal] input.reject-reason")) {
    typed.set(input.closest("tr").dataset.proposal, input.value);
  }
  const active = document.activeElement;
  const focused = active && active.classList.contains("reject-reason") && body.contains(active)
    ? { id: active.closest("tr").dataset.proposal, start: active.selectionStart, end: active.selectionEnd }
    : null;
  body.replaceChildren(...open.map((p) => {
    const row = el("tr");
    row.dataset.proposal = p.id;
    const summary = p.plan && p.plan.diff ? p.plan.diff.summary : null;
    const moved = p.plan && p.plan.impact && p.plan.impact.moved ? p.plan.impact.moved.percent : null;
    const target = p.change && p.change.target_generation !== undefined ? ` to ${p.change.target_generation}` : "";
    row.append(
      el("td", p.id),
      el("td", `${p.operation}${target}${p.reason ? ` (${p.reason})` : ""}`),
      el("td", p.proposer),
      el("td", p.expected_generation),
      el("td", summary ? `+${summary.added} −${summary.removed} ~${summary.modified}` : "–"),
      el("td", moved === null ? "–" : `${moved.toFixed(2)} %`),
      el("td", `${p.approvals.length}/${p.approvers}${p.approvals.length ? ` (${p.approvals.map((a) => a.caller).join(", ")})` : ""}`),
      el("td", local(p.expires_at)),
    );
    const cell = el("td");
    const approve = el("button", "Approve");
    approve.type = "button";
    approve.className = "approve";
    approve.addEventListener("click", () => decide(approve, p.id, "approve", "approved on the admin page"));
    const reason = document.createElement("input");
    reason.type = "text";
    reason.placeholder = "reason to reject";
    reason.className = "reject-reason";
    reason.value = typed.get(p.id) || "";
    const reject = el("button", "Reject");
    reject.type = "button";
    reject.className = "reject";
    reject.addEventListener("click", () => {
      if (!reason.value.trim()) {
        say(`rejecting ${p.id} takes a reason`, false);
        return;
      }
      decide(reject, p.id, "reject", reason.value.trim());
    });
    cell.append(approve, reason, reject);
    row.append(cell);
    return row;
  }));
  const again = focused && body.querySelector(`tr[data-proposal="${CSS.escape(focused.id)}"] input.reject-reason`);
  if (again) {
    again.focus();
    again.setSelectionRange(focused.start, focused.end);
  }
}

function decide(button, id, how, reason) {
  act(button, `${how} ${id}`, async () => {
    const result = await write(`/admin/runtime/proposals/${id}/${how}`, { reason });
    const a = result.answer || {};
    if (result.status >= 200 && result.status < 300 && a.proposal) {
      const generation = a.result && a.result.generation;
      return { status: result.status, answer: { outcome: a.proposal.state, generation } };
    }
    return result;
  });
}

function renderActions(status) {
  const box = document.getElementById("actions");
  box.hidden = !status.pending;
  if (status.pending) {
    document.getElementById("confirm").textContent = `Confirm generation ${status.pending.generation}`;
    document.getElementById("abort").textContent =
      `Abort: roll back to generation ${status.pending.rollback_to}`;
  }
}

// The canary's place, in words: "generation 7 takes 10 % of new
// requests, generation 6 takes 90 % (step 2 of 4; next: 50 % in 25 s)".
function canaryText(pending) {
  const c = pending && pending.canary;
  if (!c) return "";
  const next = c.next_percent === null || c.next_percent === undefined ? "" :
    `; next: ${c.next_percent} %` +
    (c.seconds_to_next_step === null || c.seconds_to_next_step === undefined ? "" :
      ` in ${Math.round(c.seconds_to_next_step)} s` + (pending.guarded ? " unless its guard ends it" : ""));
  return `generation ${pending.generation} takes ${c.percent} % of new requests, ` +
    `generation ${pending.rollback_to} takes ${100 - c.percent} % ` +
    `(step ${c.step} of ${c.steps.length}: ${c.steps.map((p) => `${p} %`).join(", ")}${next})`;
}

// What a live generation does now, in words: a canary's previous
// generation still takes most new requests; only a generation no request
// is sent to any more is draining.
function role(status, g) {
  const p = status.pending;
  const c = p && p.canary;
  if (p && g.generation === p.generation) return c ? `canary: takes ${c.percent} % of new requests` : "pending (takes every new request)";
  if (p && c && g.generation === p.rollback_to) return `previous: takes ${100 - c.percent} % of new requests`;
  if (g.superseded_secs === undefined) return "active (takes every new request)";
  return `draining for ${Math.round(g.superseded_secs)} s (takes no new request)`;
}

function renderStatus(status) {
  shown = status;
  const pending = !status.pending ? "" :
    ` · PENDING: generation ${status.pending.generation} rolls back to generation ${status.pending.rollback_to} ` +
    (status.pending.seconds_left === null || status.pending.seconds_left === undefined
      ? (status.pending.guarded ? "if its guard fails" : "if aborted (its last canary step confirms it)")
      : `in ${Math.round(status.pending.seconds_left)} s unless confirmed`);
  const canary = canaryText(status.pending);
  const shadowing = status.shadow && status.shadow.verdict === "running"
    ? ` · ${status.shadow.waf ? "WAF SHADOW" : "SHADOW"}: candidate generation ${status.shadow.candidate_generation}, ` +
      (status.shadow.waf
        ? `${status.shadow.waf.evaluated} requests judged, would refuse ${(100 * status.shadow.waf.total.candidate_ratio).toFixed(2)} %`
        : `${status.shadow.total.compared} requests compared`) +
      ` in ${Math.round(status.shadow.seconds)} s`
    : "";
  const summary = document.getElementById("summary");
  summary.textContent =
    `pid ${status.pid} · ${status.phase} · generation ${status.active_generation} · ` +
    `${status.config_version} · activated ${local(status.activated_at)}${pending}${shadowing}`;
  summary.title = `activated ${status.activated_at} (UTC)`;
  const share = document.getElementById("canary");
  share.hidden = !canary;
  share.textContent = canary ? `CANARY: ${canary}` : "";
  renderActions(status);
  renderShadow(status.shadow, status);
  fill(document.querySelector("#live tbody"), status.generations.map((g) => row([
    g.generation, role(status, g),
    g.inflight_requests, g.open_connections, g.requests, g.errors,
  ], "generation")));
}

// The headline, from the gateway's own seconds (the timeline's last
// points), never from the page's clock: a page under virtual time (a
// headless screenshot) or in a background tab shows what was answered.
function renderRates(timeline) {
  const points = (timeline.points || []).slice(-5);
  const interval = timeline.interval_seconds || 1;
  const set = (id, text) => { document.getElementById(id).textContent = text; };
  if (points.length === 0) {
    for (const id of ["rate-requests", "rate-errors", "rate-ratio"]) set(id, "–");
    set("rate-span", "no second measured yet");
    return;
  }
  const seconds = points[points.length - 1].t - points[0].t + interval;
  let requests = 0, errors = 0;
  for (const p of points) for (const r of p.roles) { requests += r.requests; errors += r.errors; }
  set("rate-requests", (requests / seconds).toFixed(1));
  // Which seconds: a reader (or a test) can check them against the API.
  const headline = document.getElementById("rate-requests");
  headline.dataset.to = points[points.length - 1].t;
  headline.dataset.seconds = seconds;
  set("rate-errors", (errors / seconds).toFixed(1));
  set("rate-ratio", requests > 0 ? `${(100 * errors / requests).toFixed(2)} %` : "–");
  set("rate-span", `over the gateway's last ${seconds} s, to ${localTime(points[points.length - 1].t)}`);
}

// The shadow stage running, or the last one (DESIGN §22): both
// generations' answers to the same requests, in all and per route.
function renderShadow(report, status) {
  const section = document.getElementById("shadow-section");
  section.hidden = !report;
  if (!report) return;
  const running = report.verdict === "running";
  const verdict = report.verdict.replaceAll("_", " ");
  const c = report.copies;
  // A stage that ended is dated, and a refused candidate's number (which
  // the next activation takes) is not mistaken for the generation serving.
  const when = report.started_at ? ` at ${local(report.started_at)}` : "";
  let scope = running ? "running now" : `the last shadow stage, started${when}, ended`;
  if (!running && report.verdict !== "passed") {
    scope += `; its candidate was refused and never served` +
      (status.active_generation >= report.candidate_generation
        ? ` (generation ${status.active_generation} now serving is another configuration)` : "");
  }
  const waf = report.waf;
  const kind = waf ? "WAF shadow stage" : "shadow stage";
  document.getElementById("shadow-title").textContent = running
    ? `${kind[0].toUpperCase()}${kind.slice(1)} (running)` : `Last ${kind}`;
  document.getElementById("shadow-summary").textContent =
    `${scope} · ${verdict}: candidate numbered ${report.candidate_generation} against generation ${report.active_generation}, ` +
    (waf
      ? `${report.percent} % of requests judged by the candidate's firewall for ${Math.round(report.seconds)} s; ` +
        `${waf.evaluated} judged, ${waf.dropped} dropped, ${waf.skipped} skipped`
      : `${report.percent} % of safe requests for ${Math.round(report.seconds)} s; ` +
        `${c.compared} compared, ${c.dropped} dropped, ${c.skipped} skipped, ${c.timeout} timed out`) +
    (report.reason ? ` · ${report.reason}` : "");
  document.getElementById("shadow").hidden = !!waf;
  document.getElementById("shadow-waf").hidden = !waf;
  if (waf) {
    // Would-block per route: what only the candidate refuses is the risk.
    const share = (v) => `${(100 * v).toFixed(2)} %`;
    fill(document.querySelector("#shadow-waf tbody"), [waf.total, ...waf.routes].map((r) => row([
      r.route, r.evaluated, share(r.active_ratio), share(r.candidate_ratio),
      `${share(r.candidate_interval[0])}–${share(r.candidate_interval[1])}`,
      `${r.increase >= 0 ? "+" : ""}${(100 * r.increase).toFixed(2)} pt`,
      r.top_rules.slice(0, 5).map((x) => `${x.rule} (${x.count})`).join(", ") || "–",
    ], r.increase > 0 ? "shadow worse" : "shadow")));
    return;
  }
  const pct = (side) => `${(100 * side.error_ratio).toFixed(2)} %`;
  const ms = (v) => v === null || v === undefined ? "–" : `${v.toFixed(2)} ms`;
  fill(document.querySelector("#shadow tbody"), [report.total, ...report.routes].map((r) => row([
    r.route, r.compared, pct(r.active), pct(r.candidate), ms(r.active.p99_ms), ms(r.candidate.p99_ms),
    r.changed_class,
  ], r.candidate.error_ratio > r.active.error_ratio ? "shadow worse" : "shadow")));
}

function renderBackends(view) {
  const rows = [];
  for (const upstream of view.upstreams || []) {
    for (const b of upstream.backends || []) {
      // Coloured by what its requests met, not only by its checks: a
      // backend whose checks pass while its answers fail is failing.
      const ratio = b.attempts > 0 ? b.failures / b.attempts : 0;
      const failing = ratio >= 0.05;
      const health = b.health === "unhealthy" || failing ? "unhealthy" : "healthy";
      rows.push(row([
        upstream.name, b.addr,
        el("td", failing ? `${b.health}, failing ${(100 * ratio).toFixed(0)} % of requests` : b.health, health),
        el("td", b.ejected ? "yes" : "no", b.ejected ? "ejected" : ""),
        b.inflight, b.attempts,
        el("td", b.attempts > 0 ? `${b.failures} (${(100 * ratio).toFixed(1)} %)` : `${b.failures}`, failing ? "unhealthy" : ""),
      ], failing ? "backend failing" : "backend"));
    }
  }
  fill(document.querySelector("#backends tbody"), rows);
}

// Charts of the gateway's last seconds (GET /admin/runtime/timeline):
// one series per generation role, told apart by dash pattern and legend
// text as well as colour. A line joins only consecutive points that both
// measured the same generation in that role: a second without it (before
// a canary, between two, a ratio of no requests) is a gap, and a change
// of generation starts a new line. Operations are marked on the time
// axis: refused ones dashed with a cross, rollbacks red; their labels are
// stacked in up to three rows, and every mark says it all on hover.
// Drawn at about the size they are shown: three to a row at 1280 px.
const W = 400, H = 196, PAD_L = 40, PAD_B = 18, PAD_T = 44;
const LABEL_ROWS = 3;
const REFUSED = new Set(["rejected", "conflict", "failed"]);

// Time-axis ticks: at most five, on round seconds or minutes.
function ticksFor(t0, t1) {
  const spanS = Math.max(t1 - t0, 1);
  const step = [5, 10, 15, 30, 60, 120, 300, 600].find((s) => spanS / s <= 4) || 900;
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}

function chart(title, unit, series, events, t0, t1, digits) {
  const figure = el("figure", null, "chart");
  figure.appendChild(el("figcaption", `${title}, ${unit}`));
  const values = series.flatMap((s) => s.runs.flatMap((r) => r.points.map((p) => p[1])));
  const max = Math.max(...values, 0) || 1;
  const x = (t) => PAD_L + (W - PAD_L - 4) * (t - t0) / Math.max(t1 - t0, 1);
  const y = (v) => PAD_T + (H - PAD_T - PAD_B) * (1 - v / max);
  const suffix = unit === "%" ? " %" : "";
  const lastOf = (s) => {
    const run = s.runs[s.runs.length - 1];
    return run ? run.points[run.points.length - 1][1].toFixed(digits) : "–";
  };
  const summary = series.map((s) => `${s.label}: last ${lastOf(s)} ${unit}`).join("; ");
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title} (${unit}): ${summary || "no data"}` });
  root.appendChild(svg("line", { x1: PAD_L, y1: H - PAD_B, x2: W, y2: H - PAD_B, class: "axis" }));
  root.appendChild(svg("text", { x: PAD_L - 5, y: PAD_T - 14, "text-anchor": "end", class: "unit" }, unit));
  for (const v of [0, max / 2, max]) {
    root.appendChild(svg("line", { x1: PAD_L - 3, y1: y(v), x2: PAD_L, y2: y(v), class: "tick" }));
    root.appendChild(svg("text", { x: PAD_L - 5, y: y(v) + 3, "text-anchor": "end" }, `${v.toFixed(v < 10 ? digits : 0)}${suffix}`));
  }
  for (const t of ticksFor(t0, t1)) {
    const anchor = x(t) > W - 24 ? "end" : x(t) < PAD_L + 20 ? "start" : "middle";
    const label = svg("text", { x: x(t), y: H - 4, "text-anchor": anchor }, localTime(t));
    label.appendChild(svg("title", {}, utc(t)));
    root.appendChild(label);
  }
  // Oldest first; each label takes the first row where it fits, and one
  // that fits in none is left out (its mark and its title stay).
  const rows = new Array(LABEL_ROWS).fill(-Infinity);
  for (const e of [...events].sort((a, b) => a.t - b.t)) {
    const refused = REFUSED.has(e.outcome);
    const rollback = /rollback|abort/.test(e.kind);
    const at = x(e.t);
    const what = `${e.kind.replaceAll("_", " ")}${refused ? ` ${e.outcome}` : ""}`;
    const mark = svg("line", { x1: at, y1: PAD_T - 4, x2: at, y2: H - PAD_B,
      class: `event ${refused ? "refused" : "done"}${rollback ? " rollback" : ""}`,
      "data-kind": e.kind, "data-outcome": e.outcome });
    mark.appendChild(svg("title", {}, `${what}${e.generation ? ` → generation ${e.generation}` : ""} at ${localTime(e.t)} (${utc(e.t)}): ${e.summary}`));
    root.appendChild(mark);
    if (refused) {
      root.appendChild(svg("path", { d: `M${at - 3},${PAD_T - 7} l6,6 m0,-6 l-6,6`, class: "event-cross" }));
    }
    const text = `${refused ? "✕ " : ""}${what}`;
    const width = text.length * 6.2 + 2;
    const right = at + 2 + width > W;
    const left = right ? at - 2 - width : at + 2;
    const slot = rows.findIndex((end) => end < left - 3);
    if (slot < 0) continue;
    rows[slot] = left + width;
    const label = svg("text", { x: right ? at - 2 : at + 2, y: 10 + slot * 12, "text-anchor": right ? "end" : "start",
      class: `event-label ${refused ? "refused" : "done"}` }, text);
    label.appendChild(svg("title", {}, mark.textContent));
    root.appendChild(label);
  }
  for (const s of series) {
    for (const run of s.runs) {
      // One point is a dot: a line needs two.
      const points = run.points.length === 1
        ? [run.points[0], [run.points[0][0] + 0.3, run.points[0][1]]] : run.points;
      const path = svg("polyline", {
        points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
        class: `series ${s.role}`, "data-role": s.role, "data-generation": run.generation,
        "data-total": run.total, "data-times": run.points.map(([t]) => t).join(","),
      });
      path.appendChild(svg("title", {}, `${s.role}: generation ${run.generation}, ${localTime(run.points[0][0])}–${localTime(run.points[run.points.length - 1][0])}`));
      root.appendChild(path);
    }
  }
  figure.appendChild(root);
  const legend = el("div", null, "legend");
  for (const s of series) {
    const item = el("span");
    item.appendChild(el("span", null, `swatch ${s.role}`));
    item.appendChild(document.createTextNode(s.label));
    legend.appendChild(item);
  }
  figure.appendChild(legend);
  return figure;
}

// Each role's runs: consecutive points (at most two intervals apart: a
// late sample is not a gap) that measured the same generation in it. A
// second can list a role twice (a rollback's second: the generation that
// left it, and the one that took it): each goes on its own run.
function runsOf(points, interval, role, pick) {
  const runs = [];
  let open = new Map();
  let before = null;
  for (const p of points) {
    const seconds = before === null ? interval : Math.max(p.t - before, interval);
    const next = new Map();
    for (const r of p.roles.filter((q) => q.role === role)) {
      const value = pick(r, seconds);
      if (value === null) continue;
      let run = open.get(r.generation);
      if (run && p.t - run.last <= 2 * interval) {
        run.points.push([p.t, value]);
        run.total += r.requests;
        run.last = p.t;
      } else {
        run = { generation: r.generation, points: [[p.t, value]], total: r.requests, last: p.t };
        runs.push(run);
      }
      next.set(r.generation, run);
    }
    open = next;
    before = p.t;
  }
  return runs;
}

function renderCharts(timeline, status) {
  const all = timeline.points || [];
  const interval = timeline.interval_seconds || 1;
  const t1 = all.length ? all[all.length - 1].t : Math.floor(Date.now() / 1000);
  // The window fits the data (ten seconds at least) unless one is chosen.
  const fit = all.length ? Math.max(t1 - all[0].t + interval, 10) : 10;
  const t0 = t1 - (span === "fit" ? fit : Math.min(Number(span), timeline.window_seconds));
  const points = all.filter((p) => p.t > t0);
  const roles = [...new Set(points.flatMap((p) => p.roles.map((r) => r.role)))];
  const pending = status && status.pending;
  const canary = pending && pending.canary;
  const labelOf = (role, generation) => {
    if (canary && role === "pending") return `pending (generation ${generation}, canary ${canary.percent} %)`;
    if (canary && role === "previous" && generation === pending.rollback_to) return `previous (generation ${generation}, takes ${100 - canary.percent} %)`;
    return `${role} (generation ${generation})`;
  };
  const series = (pick) => roles.map((role) => {
    const runs = runsOf(points, interval, role, pick);
    const last = runs.length ? runs[runs.length - 1].generation : "–";
    return { role, runs, label: labelOf(role, last) };
  }).filter((s) => s.runs.length > 0);
  const events = (timeline.events || []).filter((e) => e.t > t0);
  document.getElementById("charts").replaceChildren(
    chart("requests", "req/s", series((r, seconds) => r.requests / seconds), events, t0, t1, 1),
    chart("5xx ratio", "%", series((r) => r.requests > 0 ? 100 * r.errors / r.requests : null), events, t0, t1, 2),
    chart("p99 (upper bound)", "ms", series((r) => r.p99_ms === undefined ? null : r.p99_ms), events, t0, t1, 1),
    // Only where a firewall refused something in the window.
    ...(points.some((p) => p.roles.some((r) => r.blocked > 0))
      ? [chart("refused by the WAF", "%", series((r) => r.requests > 0 ? 100 * (r.blocked || 0) / r.requests : null), events, t0, t1, 2)]
      : []),
  );
  document.getElementById("chart-window").textContent =
    `${localTime(t0)}–${localTime(t1)} (${Math.round(t1 - t0)} s, the gateway's clock)`;
  renderHealth(timeline.backends || [], t0, t1);
}

// Each backend's health over the window: a row of segments, each with
// its state as text on hover, and the current state written out.
function renderHealth(backends, t0, t1) {
  const box = document.getElementById("health-chart");
  if (backends.length === 0) {
    box.replaceChildren(el("div", "no backend followed yet", "muted"));
    return;
  }
  // As wide as the page shows it: text at its own size.
  const width = Math.max(box.clientWidth || 600, 320);
  const ROW = 18, LABEL = Math.min(220, width / 3), height = backends.length * ROW + 4;
  const x = (t) => LABEL + (width - LABEL - 80) * (Math.max(t, t0) - t0) / Math.max(t1 - t0, 1);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "backend health over the last 15 minutes" });
  backends.forEach((b, i) => {
    const top = 2 + i * ROW;
    root.appendChild(svg("text", { x: 0, y: top + 12 }, `${b.upstream} ${b.addr}`));
    b.changes.forEach((c, k) => {
      const end = k + 1 < b.changes.length ? b.changes[k + 1].t : t1;
      const segment = svg("rect", { x: x(c.t), y: top + 3, width: Math.max(x(end) - x(c.t), 1), height: ROW - 6, class: `state-${c.state}` });
      segment.appendChild(svg("title", {}, `${c.state} from ${localTime(c.t)} (${utc(c.t)})`));
      root.appendChild(segment);
    });
    const now = b.changes.length ? b.changes[b.changes.length - 1].state : "–";
    root.appendChild(svg("text", { x: width - 74, y: top + 12 }, now));
  });
  box.replaceChildren(root);
}

function renderTimeline() {
  const list = document.getElementById("timeline");
  const pages = Math.max(Math.ceil(history.length / PAGE_SIZE), 1);
  page = Math.min(page, pages - 1);
  const entries = history.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
  list.replaceChildren(...entries.map((g) => {
    const item = el("li", null, [
      "entry", g.status === "active" ? "active" : "", g.generation === selected ? "selected" : "",
    ].join(" ").trim());
    item.dataset.generation = g.generation;
    item.tabIndex = 0;
    item.appendChild(el("span", `generation ${g.generation}`, "id"));
    const who = [g.requested_by, g.reason].filter(Boolean).join(": ");
    const line = el("span", `${g.status} · ${g.source} · ${local(g.activated_at)}${who ? " · " + who : ""}`);
    line.title = `${g.activated_at} (UTC)`;
    item.appendChild(line);
    if (g.settlement) {
      // A guarded activation: pending, or how it ended and why.
      const s = g.settlement;
      const why = [s.requested_by, s.reason].filter(Boolean).join(": ");
      item.appendChild(el("span", `${s.state.replaceAll("_", " ")}${why ? " · " + why : ""}`,
        `settlement ${s.state}`));
    }
    item.addEventListener("click", () => select(g.generation));
    item.addEventListener("keydown", (e) => { if (e.key === "Enter") select(g.generation); });
    return item;
  }));
  document.getElementById("page").textContent =
    `${history.length} retained · page ${page + 1} of ${pages}`;
  document.getElementById("newer").disabled = page === 0;
  document.getElementById("older").disabled = page >= pages - 1;
}

// Unified diff text to two columns: removed lines left, added right,
// context on both sides.
function renderDiff(text, tbody) {
  const rows = [];
  let left = [], right = [];
  let oldNo = 0, newNo = 0;
  const flush = () => {
    const n = Math.max(left.length, right.length);
    for (let i = 0; i < n; i++) {
      const l = left[i], r = right[i];
      rows.push(row([
        el("td", l ? l[0] : "", "num"), el("td", l ? l[1] : "", l ? "del" : ""),
        el("td", r ? r[0] : "", "num"), el("td", r ? r[1] : "", r ? "add" : ""),
      ], "change"));
    }
    left = []; right = [];
  };
  for (const line of text.split("\n")) {
    if (line.startsWith("--- ") || line.startsWith("+++ ")) continue;
    const hunk = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/.exec(line);
    if (hunk) {
      flush();
      oldNo = Number(hunk[1]); newNo = Number(hunk[2]);
      const cell = el("td", line); cell.colSpan = 4;
      rows.push(row([cell], "hunk"));
    } else if (line.startsWith("-")) {
      left.push([oldNo++, line.slice(1)]);
    } else if (line.startsWith("+")) {
      right.push([newNo++, line.slice(1)]);
    } else if (line.startsWith(" ")) {
      flush();
      rows.push(row([el("td", oldNo++, "num"), line.slice(1), el("td", newNo++, "num"), line.slice(1)], "context"));
    }
  }
  flush();
  fill(tbody, rows);
}

async function select(generation) {
  selected = generation;
  renderTimeline();
  const detail = await api(`/admin/runtime/history/${generation}`);
  const title = document.getElementById("diff-title");
  const summary = document.getElementById("diff-summary");
  const tbody = document.querySelector("#diff tbody");
  if (detail.diff && detail.predecessor !== null && detail.predecessor !== undefined) {
    title.textContent = `Changes from generation ${detail.predecessor} to ${generation}`;
    const s = detail.diff.summary;
    summary.textContent = `${s.added} added, ${s.removed} removed, ${s.modified} modified`;
    renderDiff(detail.diff.text || "", tbody);
  } else {
    title.textContent = `Generation ${generation}`;
    summary.textContent = "no earlier retained generation to compare with";
    renderDiff("", tbody);
  }
  renderImpact(detail.impact, document.getElementById("impact-summary"), document.getElementById("impact-examples"));
  renderRollback(detail);
}

// Rolling back takes two clicks: the first arms the button for 5 s.
let armed = null;
function renderRollback(summary) {
  const button = document.getElementById("rollback");
  const can = summary && summary.rollback_candidate && summary.status !== "active";
  button.hidden = !can;
  if (!can) return;
  armed = null;
  button.className = "danger";
  button.textContent = `Roll back to generation ${summary.generation}`;
  button.onclick = () => {
    if (armed !== summary.generation) {
      armed = summary.generation;
      button.textContent = `Click again to roll back to generation ${summary.generation}`;
      setTimeout(() => { if (armed === summary.generation) renderRollback(summary); }, 5000);
      return;
    }
    armed = null;
    act(button, `roll back to generation ${summary.generation}`, () => write("/admin/runtime/rollback", {
      target_generation: summary.generation,
      expected_active_generation: shown ? shown.active_generation : null,
      requested_by: "admin page",
    }));
  };
}

// What a change does to the requests sampled now (DESIGN §22).
function renderImpact(impact, summary, examples) {
  if (!impact) {
    summary.textContent = "";
    examples.replaceChildren();
    return;
  }
  if (impact.sample_size === 0) {
    summary.textContent = "impact: no data (no request sampled yet)";
    examples.replaceChildren();
    return;
  }
  // The share, and the 95 % interval of the traffic it was drawn from.
  const pct = (kind) => `${kind.percent.toFixed(2)} % (95 %: ${kind.interval[0].toFixed(2)}–${kind.interval[1].toFixed(2)} %)`;
  summary.textContent = `impact on the ${impact.sample_size} requests sampled now: ` +
    `${pct(impact.moved)} moved, ${pct(impact.unrouted)} unrouted (404), ` +
    `${pct(impact.unusable)} to an unusable upstream`;
  const place = (d) => d ? (d.upstream ? `${d.route} → ${d.upstream}` : d.route) : "404";
  // One line per distinct request, with how many of the examples it is.
  const items = [];
  for (const [label, kind] of [["moved", impact.moved], ["unrouted", impact.unrouted], ["unusable", impact.unusable]]) {
    const counted = new Map();
    for (const e of kind.examples) {
      const line = `${label}: ${e.method} ${e.host}${e.path}: ${place(e.before)} ⇒ ${place(e.after)}`;
      counted.set(line, (counted.get(line) || 0) + 1);
    }
    for (const [line, n] of [...counted].slice(0, 5)) items.push(el("li", n > 1 ? `${line} (×${n})` : line));
  }
  examples.replaceChildren(...items);
}

async function preview() {
  const button = document.getElementById("preview");
  const text = document.getElementById("candidate").value;
  if (busy || !text.trim()) return;
  busy = true;
  button.disabled = true;
  const summary = document.getElementById("preview-summary");
  const errors = document.getElementById("preview-errors");
  try {
    const { status, answer } = await write("/admin/runtime/preview?requested_by=admin%20page", text, "application/toml");
    const plan = answer || {};
    if (status === 403 || status === 401) {
      summary.textContent = refusal({ status, answer });
      return;
    }
    summary.textContent = plan.activatable
      ? `activatable against generation ${plan.active_generation}: ${plan.diff.summary.added} added, ` +
        `${plan.diff.summary.removed} removed, ${plan.diff.summary.modified} modified; ` +
        `candidate config_version ${plan.config_version} (recorded as ${plan.operation_id})`
      : `not activatable (${status})${plan.message ? ": " + plan.message : ""}`;
    errors.replaceChildren(
      ...(plan.errors || []).map((e) => el("li", `line ${e.line ?? "?"}, column ${e.column ?? "?"}: ${e.code}: ${e.message}`)),
      ...(plan.rejected || []).map((r) => el("li", `restart required: ${r.path} (${r.from} → ${r.to})`)),
    );
    renderDiff(plan.diff ? plan.diff.text || "" : "", document.querySelector("#preview-diff tbody"));
    renderImpact(plan.impact, document.getElementById("preview-impact"), document.getElementById("preview-impact-examples"));
  } catch (error) {
    summary.textContent = `preview failed: ${error.message}`;
  } finally {
    busy = false;
    button.disabled = false;
  }
}

async function refresh() {
  try {
    const [status, backends, timeline, proposals] = await Promise.all([
      api("/admin/runtime/status"), api("/admin/runtime/backends"), api("/admin/runtime/timeline"),
      api("/admin/runtime/proposals"),
    ]);
    renderProposals(proposals.proposals);
    renderStatus(status);
    renderBackends(backends);
    renderRates(timeline);
    renderCharts(timeline, status);
    lastTimeline = [timeline, status];
    const operation = status.last_operation ? status.last_operation.id : null;
    if (operation !== lastOperation) {
      lastOperation = operation;
      history = (await api("/admin/runtime/history")).generations || [];
      renderTimeline();
      if (selected === null && history.length > 0) await select(history[0].generation);
      else if (selected !== null) await select(selected);
    }
    showError(null);
  } catch (error) {
    showError(error);
  }
}

document.getElementById("window").addEventListener("change", (e) => {
  span = e.target.value;
  if (lastTimeline) renderCharts(...lastTimeline);
});
document.getElementById("confirm").addEventListener("click", () => settle("confirm"));
document.getElementById("abort").addEventListener("click", () => settle("abort"));
document.getElementById("preview").addEventListener("click", preview);
document.getElementById("newer").addEventListener("click", () => { page = Math.max(page - 1, 0); renderTimeline(); });
document.getElementById("older").addEventListener("click", () => { page += 1; renderTimeline(); });
refresh();
setInterval(refresh, REFRESH_MS);
// A change shows the moment it is recorded (the event stream), not at the
// next refresh; the charts' figures still come once every REFRESH_MS.
// `?poll` keeps to polling (a proxy that cuts long-lived responses, a
// headless snapshot that waits for every request to end).
if (window.EventSource && !new URLSearchParams(location.search).has("poll")) {
  const changes = new EventSource("/admin/events");
  const kinds = [
    "activation", "pending", "confirmed", "aborted", "auto_rolled_back", "rollback",
    "canary_step", "shadow_verdict", "freeze_entered", "freeze_left", "reload_certs",
    "certificate", "cache_purge", "drain", "upgrade", "fleet_ack", "fleet_nack", "proposal_made",
    "proposal_approved", "proposal_rejected", "proposal_expired", "reset",
  ];
  for (const kind of kinds) changes.addEventListener(kind, () => refresh());
}
