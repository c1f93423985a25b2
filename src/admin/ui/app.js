// The admin page: same-origin fetches of the admin API, every value
// written as text (never as markup). Its actions (confirm, abort, roll
// back, preview) are the API's own calls, carrying the session's CSRF
// token and the generation the page shows as the expected one: a page
// that fell behind gets the API's 409 and says so.
"use strict";

const REFRESH_MS = 1500;
const PAGE_SIZE = 50;
let last = null;            // { at, requests, errors } of the previous status
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

function renderActions(status) {
  const box = document.getElementById("actions");
  box.hidden = !status.pending;
  if (status.pending) {
    document.getElementById("confirm").textContent = `Confirm generation ${status.pending.generation}`;
    document.getElementById("abort").textContent =
      `Abort: roll back to generation ${status.pending.rollback_to}`;
  }
}

function renderStatus(status) {
  shown = status;
  const pending = !status.pending ? "" :
    ` · PENDING: rolls back to generation ${status.pending.rollback_to} ` +
    (status.pending.seconds_left === null
      ? "if its guard fails"
      : `in ${Math.round(status.pending.seconds_left)} s unless confirmed`);
  const shadowing = status.shadow && status.shadow.verdict === "running"
    ? ` · SHADOW: candidate generation ${status.shadow.candidate_generation}, ` +
      `${status.shadow.total.compared} requests compared in ${Math.round(status.shadow.seconds)} s`
    : "";
  const summary = document.getElementById("summary");
  summary.textContent =
    `pid ${status.pid} · ${status.phase} · generation ${status.active_generation} · ` +
    `${status.config_version} · activated ${local(status.activated_at)}${pending}${shadowing}`;
  summary.title = `activated ${status.activated_at} (UTC)`;
  renderActions(status);
  renderShadow(status.shadow);
  const now = performance.now();
  if (last) {
    const seconds = Math.max((now - last.at) / 1000, 0.001);
    const requests = Math.max(status.requests_total - last.requests, 0) / seconds;
    const errors = Math.max(status.errors_total - last.errors, 0) / seconds;
    document.getElementById("rate-requests").textContent = requests.toFixed(1);
    document.getElementById("rate-errors").textContent = errors.toFixed(1);
    document.getElementById("rate-ratio").textContent =
      requests > 0 ? `${(100 * errors / requests).toFixed(2)} %` : "–";
  }
  last = { at: now, requests: status.requests_total, errors: status.errors_total };
  fill(document.querySelector("#live tbody"), status.generations.map((g) => row([
    g.generation,
    g.superseded_secs === undefined ? "active" : `superseded ${Math.round(g.superseded_secs)} s ago`,
    g.inflight_requests, g.open_connections, g.requests, g.errors,
  ], "generation")));
}

// The shadow stage running, or the last one (DESIGN §22): both
// generations' answers to the same requests, in all and per route.
function renderShadow(report) {
  const section = document.getElementById("shadow-section");
  section.hidden = !report;
  if (!report) return;
  const verdict = report.verdict.replaceAll("_", " ");
  const c = report.copies;
  document.getElementById("shadow-summary").textContent =
    `${verdict}: generation ${report.candidate_generation} against ${report.active_generation}, ` +
    `${report.percent} % of safe requests for ${Math.round(report.seconds)} s; ` +
    `${c.compared} compared, ${c.dropped} dropped, ${c.skipped} skipped, ${c.timeout} timed out` +
    (report.reason ? ` · ${report.reason}` : "");
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
      rows.push(row([
        upstream.name, b.addr,
        el("td", b.health, b.health === "unhealthy" ? "unhealthy" : "healthy"),
        el("td", b.ejected ? "yes" : "no", b.ejected ? "ejected" : ""),
        b.inflight, b.attempts, b.failures,
      ], "backend"));
    }
  }
  fill(document.querySelector("#backends tbody"), rows);
}

// Charts of the last 15 minutes (GET /admin/runtime/timeline): one line
// per generation role, told apart by dash pattern and legend text as
// well as colour; operations marked on the time axis.
// Drawn at about the size they are shown: three to a row at 1280 px.
const W = 400, H = 170, PAD_L = 40, PAD_B = 18, PAD_T = 10;

function chart(title, unit, series, events, t0, t1, digits) {
  const figure = el("figure", null, "chart");
  figure.appendChild(el("figcaption", title));
  const max = Math.max(...series.flatMap((s) => s.points.map((p) => p[1])), 0) || 1;
  const x = (t) => PAD_L + (W - PAD_L - 4) * (t - t0) / Math.max(t1 - t0, 1);
  const y = (v) => PAD_T + (H - PAD_T - PAD_B) * (1 - v / max);
  const summary = series.map((s) => `${s.label}: last ${s.points.length ? s.points[s.points.length - 1][1].toFixed(digits) : "–"} ${unit}`).join("; ");
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title}: ${summary || "no data"}` });
  root.appendChild(svg("line", { x1: PAD_L, y1: H - PAD_B, x2: W, y2: H - PAD_B, class: "axis" }));
  for (const v of [0, max / 2, max]) {
    root.appendChild(svg("line", { x1: PAD_L - 3, y1: y(v), x2: PAD_L, y2: y(v), class: "tick" }));
    root.appendChild(svg("text", { x: PAD_L - 5, y: y(v) + 3, "text-anchor": "end" }, `${v.toFixed(v < 10 ? digits : 0)}`));
  }
  for (let t = t1; t >= t0; t -= 180) {
    const anchor = t === t1 ? "end" : x(t) < PAD_L + 20 ? "start" : "middle";
    const label = svg("text", { x: x(t), y: H - 4, "text-anchor": anchor }, localTime(t));
    label.appendChild(svg("title", {}, utc(t)));
    root.appendChild(label);
  }
  // Newest first; a label that would overlap the one drawn after it is
  // left out (its mark and title stay).
  let labelled = Infinity;
  for (const e of [...events].sort((a, b) => b.t - a.t)) {
    const mark = svg("line", { x1: x(e.t), y1: PAD_T, x2: x(e.t), y2: H - PAD_B,
      class: `event ${/rollback|abort/.test(e.kind) ? "rollback" : ""}` });
    mark.appendChild(svg("title", {}, `${e.kind} ${e.outcome}${e.generation ? ` → generation ${e.generation}` : ""} at ${localTime(e.t)} (${utc(e.t)}): ${e.summary}`));
    root.appendChild(mark);
    if (labelled - x(e.t) < 60) continue;
    labelled = x(e.t);
    const right = x(e.t) > W - 70;
    root.appendChild(svg("text", { x: x(e.t) + (right ? -2 : 2), y: PAD_T + 8, "text-anchor": right ? "end" : "start" },
      e.kind.replaceAll("_", " ")));
  }
  for (const s of series) {
    if (s.points.length === 0) continue;
    const path = svg("polyline", {
      points: s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
      class: `series ${s.role}`, "data-role": s.role, "data-total": s.total,
    });
    path.appendChild(svg("title", {}, s.title || s.label));
    root.appendChild(path);
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

function renderCharts(timeline) {
  const points = timeline.points || [];
  const t1 = points.length ? points[points.length - 1].t : Math.floor(Date.now() / 1000);
  const t0 = t1 - timeline.window_seconds;
  const roles = new Map();
  for (const p of points) {
    for (const r of p.roles) {
      if (!roles.has(r.role)) roles.set(r.role, { role: r.role, generations: new Set(), points: [] });
      const entry = roles.get(r.role);
      entry.generations.add(r.generation);
      entry.points.push([p.t, r]);
    }
  }
  const series = (pick) => [...roles.values()].map((entry) => ({
    role: entry.role,
    // Named by the generation that has the role now; the earlier ones
    // are in the series' own title.
    label: `${entry.role} (generation ${entry.points[entry.points.length - 1][1].generation})`,
    title: `${entry.role}: generations ${[...entry.generations].join(", ")} in this window`,
    total: entry.points.reduce((n, [, r]) => n + r.requests, 0),
    points: entry.points.map(([t, r]) => [t, pick(r)]).filter(([, v]) => v !== null),
  }));
  const events = (timeline.events || []).filter((e) => e.t >= t0);
  document.getElementById("charts").replaceChildren(
    chart("requests/s", "req/s", series((r) => r.requests), events, t0, t1, 1),
    chart("5xx ratio", "%", series((r) => r.requests > 0 ? 100 * r.errors / r.requests : null), events, t0, t1, 2),
    chart("p99 (ms, upper bound)", "ms", series((r) => r.p99_ms === undefined ? null : r.p99_ms), events, t0, t1, 1),
  );
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
  const items = [];
  for (const [label, kind] of [["moved", impact.moved], ["unrouted", impact.unrouted], ["unusable", impact.unusable]]) {
    for (const e of kind.examples.slice(0, 5)) {
      items.push(el("li", `${label}: ${e.method} ${e.host}${e.path}: ${place(e.before)} ⇒ ${place(e.after)}`));
    }
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
        `${plan.diff.summary.removed} removed, ${plan.diff.summary.modified} modified (recorded as ${plan.operation_id})`
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
    const [status, backends, timeline] = await Promise.all([
      api("/admin/runtime/status"), api("/admin/runtime/backends"), api("/admin/runtime/timeline"),
    ]);
    renderStatus(status);
    renderBackends(backends);
    renderCharts(timeline);
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

document.getElementById("confirm").addEventListener("click", () => settle("confirm"));
document.getElementById("abort").addEventListener("click", () => settle("abort"));
document.getElementById("preview").addEventListener("click", preview);
document.getElementById("newer").addEventListener("click", () => { page = Math.max(page - 1, 0); renderTimeline(); });
document.getElementById("older").addEventListener("click", () => { page += 1; renderTimeline(); });
refresh();
setInterval(refresh, REFRESH_MS);
