// The admin page: read-only, same-origin fetches of the admin API, every
// value written as text (never as markup).
"use strict";

const REFRESH_MS = 1500;
let last = null;            // { at, requests, errors } of the previous status
let lastOperation;          // history is read again when this changes
let selected = null;        // the generation whose diff is shown
let history = [];

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
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

async function api(path) {
  const response = await fetch(path, { headers: { accept: "application/json" }, cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
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

function renderStatus(status) {
  const pending = !status.pending ? "" :
    ` · PENDING: rolls back to generation ${status.pending.rollback_to} ` +
    (status.pending.seconds_left === null
      ? "if its guard fails"
      : `in ${Math.round(status.pending.seconds_left)} s unless confirmed`);
  const shadowing = status.shadow && status.shadow.verdict === "running"
    ? ` · SHADOW: candidate generation ${status.shadow.candidate_generation}, ` +
      `${status.shadow.total.compared} requests compared in ${Math.round(status.shadow.seconds)} s`
    : "";
  document.getElementById("summary").textContent =
    `pid ${status.pid} · ${status.phase} · generation ${status.active_generation} · ` +
    `${status.config_version} · activated ${status.activated_at}${pending}${shadowing}`;
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

function renderTimeline() {
  const list = document.getElementById("timeline");
  list.replaceChildren(...history.map((g) => {
    const item = el("li", null, [
      "entry", g.status === "active" ? "active" : "", g.generation === selected ? "selected" : "",
    ].join(" ").trim());
    item.dataset.generation = g.generation;
    item.appendChild(el("span", `generation ${g.generation}`, "id"));
    const who = [g.requested_by, g.reason].filter(Boolean).join(": ");
    item.appendChild(el("span", `${g.status} · ${g.source} · ${g.activated_at}${who ? " · " + who : ""}`));
    if (g.settlement) {
      // A guarded activation: pending, or how it ended and why.
      const s = g.settlement;
      const why = [s.requested_by, s.reason].filter(Boolean).join(": ");
      item.appendChild(el("span", `${s.state.replaceAll("_", " ")}${why ? " · " + why : ""}`,
        `settlement ${s.state}`));
    }
    item.addEventListener("click", () => select(g.generation));
    return item;
  }));
}

// Unified diff text to two columns: removed lines left, added right,
// context on both sides.
function renderDiff(text) {
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
  fill(document.querySelector("#diff tbody"), rows);
}

async function select(generation) {
  selected = generation;
  renderTimeline();
  const detail = await api(`/admin/runtime/history/${generation}`);
  const title = document.getElementById("diff-title");
  const summary = document.getElementById("diff-summary");
  if (detail.diff && detail.predecessor !== null && detail.predecessor !== undefined) {
    title.textContent = `Changes from generation ${detail.predecessor} to ${generation}`;
    const s = detail.diff.summary;
    summary.textContent = `${s.added} added, ${s.removed} removed, ${s.modified} modified`;
    renderDiff(detail.diff.text || "");
  } else {
    title.textContent = `Generation ${generation}`;
    summary.textContent = "no earlier retained generation to compare with";
    renderDiff("");
  }
  renderImpact(detail.impact);
}

// What the change does to the requests sampled now (DESIGN §22).
function renderImpact(impact) {
  const summary = document.getElementById("impact-summary");
  const examples = document.getElementById("impact-examples");
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
  const pct = (kind) => `${kind.percent.toFixed(2)} %`;
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

async function refresh() {
  try {
    const [status, backends] = await Promise.all([
      api("/admin/runtime/status"), api("/admin/runtime/backends"),
    ]);
    renderStatus(status);
    renderBackends(backends);
    const operation = status.last_operation ? status.last_operation.id : null;
    if (operation !== lastOperation) {
      lastOperation = operation;
      history = (await api("/admin/runtime/history")).generations || [];
      renderTimeline();
      if (selected === null && history.length > 0) await select(history[0].generation);
    }
    showError(null);
  } catch (error) {
    showError(error);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
