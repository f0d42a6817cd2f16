// tarry's browser console: plain JavaScript over the public HTTP API (api.md), nothing else.
// The bearer token lives in this tab's sessionStorage only and goes out as
// "Authorization: Bearer"; every value from the server is put into the page as text.
"use strict";

const TOKEN_KEY = "tarry-console-token";
const REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);

// --- the API -------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(method, path, { query, body } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || "http_" + response.status,
      error.message || response.statusText);
  }
  return data;
}

// --- small helpers ---------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fill(tbody, rows, emptyText, columns) {
  tbody.replaceChildren(...rows);
  if (!rows.length) {
    tbody.append(el("tr", {}, el("td", { colspan: columns, class: "muted", text: emptyText })));
  }
}

function iso(ms) {
  return ms === null || ms === undefined ? "—" : new Date(ms).toISOString();
}

function num(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

function ms(n) {
  return n === null || n === undefined ? "—" : n + " ms";
}

const UNITS = { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 };

// "10m" → { delay_ms }, a time → { deliver_at } (api.md: RFC 3339 or epoch ms).
function whenBody(text) {
  const value = text.trim();
  const duration = /^(\d+)\s*(ms|s|m|h|d)$/.exec(value);
  if (duration) return { delay_ms: Number(duration[1]) * UNITS[duration[2]] };
  if (/^\d+$/.test(value)) return { deliver_at: Number(value) };
  return { deliver_at: value };
}

function delayMs(text) {
  const value = text.trim();
  if (!value) return undefined;
  const duration = /^(\d+)\s*(ms|s|m|h|d)$/.exec(value);
  if (!duration) throw new ApiError(0, "invalid_argument",
    `the delay ${JSON.stringify(value)} is not a duration such as 250ms, 5s, 10m, 2h or 3d`);
  return Number(duration[1]) * UNITS[duration[2]];
}

function showError(error) {
  const banner = $("banner");
  banner.className = "banner";
  banner.textContent = error instanceof ApiError ? `${error.code}: ${error.message}` : String(error);
  banner.hidden = false;
}

function showInfo(text) {
  const banner = $("banner");
  banner.className = "banner info";
  banner.textContent = text;
  banner.hidden = false;
}

function clearBanner() {
  $("banner").hidden = true;
}

// Run an action; its errors go to the banner, never to the browser's console.
function guarded(action) {
  return async (...args) => {
    try {
      await action(...args);
    } catch (error) {
      showError(error);
    }
  };
}

// --- charts (plain SVG) --------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

const W = 600, H = 160, PAD_L = 44, PAD_B = 18, PAD_T = 8;

function frame(top, labels) {
  const nodes = [
    svg("line", { class: "axis", x1: PAD_L, y1: H - PAD_B, x2: W, y2: H - PAD_B }),
    svg("line", { class: "axis", x1: PAD_L, y1: PAD_T, x2: PAD_L, y2: H - PAD_B }),
    svg("text", { x: PAD_L - 4, y: PAD_T + 8, "text-anchor": "end", text: num(top) }),
    svg("text", { x: PAD_L - 4, y: H - PAD_B, "text-anchor": "end", text: "0" }),
  ];
  for (const [at, text] of labels) {
    nodes.push(svg("text", { x: at, y: H - 4, "text-anchor": "middle", text }));
  }
  return nodes;
}

function barChart(container, values, labelEvery, labelOf, kinds) {
  const top = Math.max(1, ...values.flat());
  const width = (W - PAD_L) / values.length;
  const bars = [];
  values.forEach((value, i) => {
    const stack = Array.isArray(value) ? value : [value];
    stack.forEach((v, k) => {
      const h = ((H - PAD_B - PAD_T) * v) / top;
      const w = Math.max(1, width / stack.length - 1);
      bars.push(svg("rect", {
        class: "bar" + (kinds ? " " + kinds[k] : ""),
        x: PAD_L + i * width + k * (width / stack.length), y: H - PAD_B - h, width: w, height: h,
      }, svg("title", { text: `${labelOf(i)}: ${num(v)}` })));
    });
  });
  const labels = [];
  for (let i = 0; i < values.length; i += labelEvery) {
    labels.push([PAD_L + i * width + width / 2, labelOf(i)]);
  }
  container.replaceChildren(svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" },
    ...frame(top, labels), ...bars));
}

function lineChart(container, series, labelEvery, labelOf) {
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const top = Math.max(1, ...values);
  const n = Math.max(1, ...series.map((s) => s.values.length));
  const x = (i) => PAD_L + ((W - PAD_L) * (i + 0.5)) / n;
  const y = (v) => H - PAD_B - ((H - PAD_B - PAD_T) * v) / top;
  const paths = series.map((s) => {
    let d = "";
    s.values.forEach((v, i) => {
      if (v === null) return;
      d += (d && s.values[i - 1] !== null ? " L" : " M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
    });
    return svg("path", { class: s.kind, d: d.trim() || "M0 0" });
  });
  // A window with its neighbours empty has no line to draw: a dot shows it.
  series.forEach((s) => s.values.forEach((v, i) => {
    if (v !== null && s.values[i - 1] == null && s.values[i + 1] == null) {
      paths.push(svg("circle", { class: s.kind, cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2 }));
    }
  }));
  const labels = [];
  for (let i = 0; i < n; i += labelEvery) labels.push([x(i), labelOf(i)]);
  container.replaceChildren(
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, ...frame(top, labels), ...paths),
    el("div", { class: "legend" }, ...series.map((s) => el("span", { class: "k-" + s.kind, text: "— " + s.name }))),
  );
}

// --- overview --------------------------------------------------------------------------------
async function loadHealth() {
  const health = await api("GET", "/healthz");
  const badge = $("health");
  badge.textContent = health.status === "ok" ? "healthy" : "degraded: " + health.open.join(", ");
  badge.className = "badge " + health.status;
  return health;
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "n", text: num(value) }),
    el("div", { class: "l", text: label }));
}

async function loadOverview() {
  // Only calls that cost the same with millions pending (not /v1/stats, which counts every
  // message by state): the forecast brings the scheduled total.
  const [health, recent, forecast, queues, routes, dead] = await Promise.all([
    loadHealth(),
    api("GET", "/v1/stats/recent"),
    api("GET", "/v1/stats/forecast"),
    api("GET", "/v1/queues"),
    api("GET", "/v1/routes"),
    api("GET", "/v1/dead-letters"),
  ]);
  const deadTotal = dead.items.reduce(
    (sum, q) => sum + q.groups.reduce((s, g) => s + g.count, 0), 0);
  $("totals").replaceChildren(
    card("scheduled", forecast.scheduled, "total-scheduled"),
    card("in queues", queues.items.reduce((s, q) => s + q.ready, 0), "total-ready"),
    card("in flight", queues.items.reduce((s, q) => s + q.in_flight, 0), "total-in-flight"),
    card("dead letters waiting", deadTotal, "total-dead"),
    card("queues", queues.items.length), card("routes", routes.items.length),
  );

  // Rates and lateness, window by window.
  const windows = recent.windows;
  const seconds = recent.window_ms / 1000;
  const minuteAgo = windows.slice(-Math.round(60 / seconds));
  const rate = (key) => minuteAgo.reduce((s, w) => s + w[key], 0) / 60;
  $("rates-summary").textContent =
    `last minute: ${rate("in").toFixed(1)}/s in, ${rate("out").toFixed(1)}/s out`;
  $("lateness-summary").textContent =
    `p50 ${ms(recent.lateness_p50_ms)}, p99 ${ms(recent.lateness_p99_ms)}, max ${ms(recent.lateness_max_ms)}`;
  const ago = (i) => `-${Math.round(((windows.length - i) * recent.window_ms) / 60000)}m`;
  lineChart($("lateness-chart"), [
    { name: "p50", kind: "p50", values: windows.map((w) => w.lateness_p50_ms) },
    { name: "p99", kind: "p99", values: windows.map((w) => w.lateness_p99_ms) },
    { name: "max", kind: "max", values: windows.map((w) => w.lateness_max_ms) },
  ], 24, ago);
  barChart($("rates-chart"), windows.map((w) => [w.in, w.out]), 24, ago, ["in", "out"]);

  // The forecast.
  const at = (series, i, fmt) => fmt(new Date(series.start + i * series.width_ms));
  const hhmm = (d) => d.toISOString().slice(11, 16);
  const day = (d) => d.toISOString().slice(5, 10);
  // A series still being counted (a SQL store with millions pending) comes on a later refresh.
  const plot = (id, series, every, fmt) => {
    if (series) barChart($(id), series.counts, every, (i) => at(series, i, fmt));
    else $(id).replaceChildren(el("p", { class: "muted", text: "counting…" }));
  };
  plot("forecast-hour", forecast.next_hour, 10, hhmm);
  plot("forecast-day", forecast.next_day, 4, hhmm);
  plot("forecast-month", forecast.next_30_days, 5, day);

  // Destinations: queues (their counts) and routes, with the dead letters each produced.
  const deadBy = {};
  for (const q of dead.items) {
    for (const g of q.groups) {
      deadBy[g.original_destination] = (deadBy[g.original_destination] || 0) + g.count;
    }
  }
  const rows = queues.items.map((q) => el("tr", { "data-name": q.name },
    el("td", { text: q.name }), el("td", { text: "queue" }),
    el("td", { class: "num", text: num(q.scheduled) }), el("td", { class: "num", text: num(q.ready) }),
    el("td", { class: "num", text: num(q.in_flight) }), el("td", { class: "num", text: num(deadBy[q.name] || 0) })));
  for (const r of routes.items) {
    rows.push(el("tr", { "data-name": r.name }, el("td", { text: r.name }),
      el("td", { text: "route (" + r.transport + ")" }), el("td", { class: "num", text: "—" }),
      el("td", { class: "num", text: "—" }), el("td", { class: "num", text: "—" }),
      el("td", { class: "num", text: num(deadBy[r.name] || 0) })));
  }
  fill($("destinations").tBodies[0], rows, "no destinations", 6);

  fill($("breakers").tBodies[0], Object.entries(health.breakers).map(([name, state]) =>
    el("tr", {}, el("td", { text: name }), el("td", { text: state }),
      el("td", { text: (health.reasons || {})[name] || "" }))), "no breakers", 3);
  $("damaged").textContent = health.damaged.length ? "damaged: " + health.damaged.join(", ") : "";
}

// --- scheduled messages ----------------------------------------------------------------------
const paging = { cursor: null, before: [], next: null };

function filters() {
  const form = new FormData($("filters"));
  const query = {};
  for (const [key, value] of form.entries()) query[key] = String(value).trim();
  return query;
}

async function loadMessages() {
  const page = await api("GET", "/v1/messages", { query: { ...filters(), cursor: paging.cursor } });
  paging.next = page.next_cursor;
  fill($("messages").tBodies[0], page.items.map((m) => el("tr", {
    "data-id": m.id, onclick: () => guarded(openDetail)(m.id, loadMessages),
  },
  el("td", { text: iso(m.deliver_at) }), el("td", { class: "id", text: m.id }),
  el("td", { text: m.destination }), el("td", { text: m.state }),
  el("td", { text: m.correlation_id || "" }), el("td", { text: m.message_id || "" }),
  el("td", { class: "num", text: m.size === null ? "—" : num(m.size) }))),
  "no messages match", 7);
  const limit = Number(filters().limit || 50);
  // A page may end early (the server reads a bounded stretch per page): Next reads on.
  const early = page.next_cursor && page.items.length < limit;
  $("page-info").textContent = `page ${paging.before.length + 1} · ${page.items.length} shown` +
    (early ? " · searched part of the range: Next searches on" : page.next_cursor ? " · more follow" : " · last page");
  $("page-next").disabled = !page.next_cursor;
  $("page-prev").disabled = paging.before.length === 0;
}

function firstPage() {
  paging.cursor = null;
  paging.before = [];
  return loadMessages();
}

// --- a message's detail ----------------------------------------------------------------------
const detail = { id: null, bytes: new Uint8Array(), format: "text", after: null };

function decodeBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function hexDump(bytes) {
  const lines = [];
  for (let at = 0; at < bytes.length; at += 16) {
    const row = Array.from(bytes.slice(at, at + 16));
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const text = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(at.toString(16).padStart(8, "0") + "  " + hex.padEnd(48) + " " + text);
  }
  return lines.join("\n");
}

function renderBody() {
  const text = new TextDecoder("utf-8").decode(detail.bytes);
  let shown = text;
  if (detail.format === "json") {
    try {
      shown = JSON.stringify(JSON.parse(text), null, 2);
    } catch (error) {
      shown = "(not JSON: " + error.message + ")\n\n" + text;
    }
  } else if (detail.format === "hex") {
    shown = hexDump(detail.bytes);
  }
  $("detail-body").textContent = shown;
  for (const button of document.querySelectorAll(".tabs button")) {
    button.classList.toggle("active", button.dataset.format === detail.format);
  }
}

function metaRow(name, value) {
  return el("tr", {}, el("th", { text: name }), el("td", { text: value }));
}

async function openDetail(id, after) {
  detail.id = id;
  detail.after = after || null;
  $("detail-result").textContent = "";
  const [m, body] = await Promise.all([
    api("GET", "/v1/messages/" + encodeURIComponent(id)),
    api("GET", "/v1/messages/" + encodeURIComponent(id) + "/body", { query: { max_bytes: 65536 } }),
  ]);
  $("detail-title").textContent = "Message " + m.id;
  $("detail").dataset.state = m.state;
  $("detail-meta").tBodies[0].replaceChildren(
    metaRow("id", m.id), metaRow("state", m.state), metaRow("destination", m.destination),
    metaRow("topic", m.topic || "—"), metaRow("queue", m.queue || "—"),
    metaRow("due", iso(m.deliver_at)), metaRow("expires", iso(m.expires_at)),
    metaRow("sent", iso(m.sent_at)), metaRow("message id", m.message_id || "—"),
    metaRow("correlation id", m.correlation_id || "—"), metaRow("reply to", m.reply_to || "—"),
    metaRow("failures", String(m.failures) + (m.last_error ? " (" + m.last_error + ")" : "")),
  );
  fill($("detail-headers").tBodies[0], Object.entries(m.headers).map(([k, v]) => metaRow(k, v)),
    "no headers", 2);
  fill($("detail-deaths").tBodies[0], m.deaths.map((d) => el("tr", {},
    el("td", { text: d.reason }), el("td", { text: d.queue }), el("td", { text: iso(d.time) }),
    el("td", { class: "num", text: num(d.count) }), el("td", { text: d.destination }))),
  "never dead-lettered", 5);
  detail.bytes = decodeBase64(body.body_base64);
  $("detail-size").textContent = body.size === null ? "(finished: the body is gone)"
    : `${num(body.size)} bytes` + (body.truncated ? `, first ${num(detail.bytes.length)} shown` : "");
  detail.format = "text";
  renderBody();
  $("detail-actions").hidden = m.state !== "scheduled";
  if (!$("detail").open) $("detail").showModal();
}

async function cancelShown() {
  const result = await api("DELETE", "/v1/messages/" + encodeURIComponent(detail.id));
  await openDetail(detail.id, detail.after);
  $("detail-result").textContent = `${result.id} is ${result.state}`;
  if (detail.after) await detail.after();
}

async function rescheduleShown() {
  const text = $("reschedule-to").value;
  if (!text.trim()) throw new ApiError(0, "invalid_argument", "say when: a delay such as 10m, or a time");
  const m = await api("POST", "/v1/messages/" + encodeURIComponent(detail.id) + "/reschedule",
    { body: whenBody(text) });
  await openDetail(detail.id, detail.after);
  $("detail-result").textContent = `${m.id} now due ${iso(m.deliver_at)}`;
  if (detail.after) await detail.after();
}

// --- queues, topics, policies ---------------------------------------------------------------
function args(values) {
  return Object.entries(values)
    .filter(([key, value]) => value !== null && key !== "policy" && key !== "operator_policy")
    .map(([key, value]) => `${key}=${value}`).join(", ") || "—";
}

async function loadTopology() {
  const [queues, topics, policies, routes] = await Promise.all([
    api("GET", "/v1/queues"), api("GET", "/v1/topics"),
    api("GET", "/v1/policies"), api("GET", "/v1/routes"),
  ]);
  fill($("queues").tBodies[0], queues.items.map((q) => el("tr", { "data-name": q.name },
    el("td", { text: q.name }), el("td", { class: "num", text: num(q.ready) }),
    el("td", { class: "num", text: num(q.in_flight) }), el("td", { class: "num", text: num(q.scheduled) }),
    el("td", { class: "num", text: num(q.consumers_waiting) }), el("td", { text: args(q.arguments) }),
    el("td", { text: args(q.effective) }),
    el("td", { text: [q.effective.policy, q.effective.operator_policy && "operator: " + q.effective.operator_policy]
      .filter(Boolean).join("; ") || "—" }))), "no queues", 8);
  fill($("topics").tBodies[0], topics.items.map((t) => el("tr", { "data-name": t.name },
    el("td", { text: t.name }), el("td", { text: t.subscriptions.join(", ") || "—" }))), "no topics", 2);
  fill($("routes").tBodies[0], routes.items.map((r) => el("tr", {},
    el("td", { text: r.name }), el("td", { text: r.transport }), el("td", { text: r.url }))), "no routes", 3);
  fill($("policies").tBodies[0], policies.items.map((p) => el("tr", { "data-name": p.name },
    el("td", { text: p.name }), el("td", { text: p.pattern }), el("td", { class: "num", text: String(p.priority) }),
    el("td", { text: p.operator ? "operator" : "user" }), el("td", { text: args(p.definition) }))),
  "no policies", 5);
}

// --- dead letters ----------------------------------------------------------------------------
const deadPaging = { cursor: null, next: null };

// POST /v1/queues/{name}/redrive, page after page (next_cursor) until every match is moved.
async function redrive(queue, body) {
  const delay = delayMs($("redrive-delay").value);
  const total = { moved: 0, skipped: 0 };
  let cursor = null;
  do {
    const result = await api("POST", "/v1/queues/" + encodeURIComponent(queue) + "/redrive", {
      body: { ...body, ...(delay === undefined ? {} : { delay_ms: delay }), ...(cursor ? { cursor } : {}) },
    });
    total.moved += result.moved;
    total.skipped += result.skipped;
    cursor = result.next_cursor || null;
    $("redrive-result").textContent = `moved ${num(total.moved)}, skipped ${num(total.skipped)}` +
      (cursor ? " … going on" : "");
  } while (cursor);
  await loadDead();
}

async function loadDead() {
  const dead = await api("GET", "/v1/dead-letters");
  const rows = [];
  for (const q of dead.items) {
    for (const g of q.groups) {
      rows.push(el("tr", {}, el("td", { text: q.queue }), el("td", { text: g.reason || "—" }),
        el("td", { text: g.original_destination || "—" }), el("td", { class: "num", text: num(g.count) }),
        el("td", { text: iso(g.oldest) }), el("td", { text: iso(g.newest) }),
        el("td", {}, g.reason ? el("button", {
          type: "button", class: "redrive-group",
          onclick: guarded(() => redrive(q.queue, { reason: g.reason, original_destination: g.original_destination })),
        }, "Redrive these") : "")));
    }
  }
  fill($("dead-groups").tBodies[0], rows, "no dead letters", 7);
  const select = $("dead-queue");
  const chosen = select.value;
  select.replaceChildren(...dead.items.map((q) => el("option", { value: q.queue, text: q.queue })));
  if (chosen && dead.items.some((q) => q.queue === chosen)) select.value = chosen;
  await loadDeadMessages();
}

async function loadDeadMessages() {
  const queue = $("dead-queue").value;
  $("dead-select-all").checked = false;
  if (!queue) {
    fill($("dead-messages").tBodies[0], [], "no dead-letter queue", 7);
    return;
  }
  const page = await api("GET", "/v1/messages",
    { query: { destination: queue, state: "ready", limit: 50, cursor: deadPaging.cursor } });
  deadPaging.next = page.next_cursor;
  $("dead-next").disabled = !page.next_cursor;
  fill($("dead-messages").tBodies[0], page.items.map((m) => {
    const first = m.deaths[0] || {};
    return el("tr", { "data-id": m.id, onclick: (event) => {
      if (event.target.tagName !== "INPUT") guarded(openDetail)(m.id, loadDead);
    } },
    el("td", {}, el("input", { type: "checkbox", class: "pick", value: m.id, "aria-label": "select " + m.id })),
    el("td", { text: iso(first.time) }), el("td", { class: "id", text: m.id }),
    el("td", { text: first.reason || "—" }), el("td", { text: first.destination || "—" }),
    el("td", { class: "num", text: num(m.deaths.reduce((s, d) => s + d.count, 0)) }),
    el("td", { class: "num", text: m.size === null ? "—" : num(m.size) }));
  }), "no messages in this queue", 7);
}

function picked() {
  return Array.from(document.querySelectorAll("#dead-messages input.pick:checked")).map((box) => box.value);
}

// --- wiring ----------------------------------------------------------------------------------
const VIEWS = {
  overview: loadOverview,
  scheduled: loadMessages,
  topology: loadTopology,
  dead: loadDead,
};
let timer = null;

async function show() {
  const name = (window.location.hash || "#overview").slice(1);
  const view = VIEWS[name] ? name : "overview";
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== "view-" + view;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === view);
  document.body.dataset.view = view;
  clearInterval(timer);
  timer = null;
  await guarded(async () => {
    await VIEWS[view]();
    document.body.dataset.loaded = view;
  })();
  if (view === "overview") {
    // The live chart: refreshed while the overview is shown.
    timer = setInterval(guarded(loadOverview), REFRESH_MS);
  }
}

function wire() {
  $("token").value = token();
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    clearBanner();
    showInfo("token set for this tab");
    show();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    showInfo("token forgotten");
  });
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    clearBanner();
    guarded(firstPage)();
  });
  $("f-clear").addEventListener("click", () => {
    $("filters").reset();
    guarded(firstPage)();
  });
  $("page-first").addEventListener("click", guarded(firstPage));
  $("page-next").addEventListener("click", guarded(async () => {
    if (!paging.next) return;
    paging.before.push(paging.cursor);
    paging.cursor = paging.next;
    await loadMessages();
  }));
  $("page-prev").addEventListener("click", guarded(async () => {
    if (!paging.before.length) return;
    paging.cursor = paging.before.pop();
    await loadMessages();
  }));
  for (const button of document.querySelectorAll(".tabs button")) {
    button.addEventListener("click", () => {
      detail.format = button.dataset.format;
      renderBody();
    });
  }
  $("detail-cancel").addEventListener("click", guarded(cancelShown));
  $("detail-reschedule").addEventListener("click", guarded(rescheduleShown));
  $("dead-queue").addEventListener("change", guarded(() => {
    deadPaging.cursor = null;
    return loadDeadMessages();
  }));
  $("dead-first").addEventListener("click", guarded(() => {
    deadPaging.cursor = null;
    return loadDeadMessages();
  }));
  $("dead-next").addEventListener("click", guarded(() => {
    deadPaging.cursor = deadPaging.next;
    return loadDeadMessages();
  }));
  $("dead-select-all").addEventListener("change", (event) => {
    for (const box of document.querySelectorAll("#dead-messages input.pick")) box.checked = event.target.checked;
  });
  $("redrive-selected").addEventListener("click", guarded(async () => {
    const ids = picked();
    if (!ids.length) throw new ApiError(0, "invalid_argument", "select the dead letters to redrive first");
    await redrive($("dead-queue").value, { ids });
  }));
  $("redrive-all").addEventListener("click", guarded(async () => {
    if (!$("dead-queue").value) return;
    await redrive($("dead-queue").value, {});
  }));
  window.addEventListener("hashchange", show);
  show();
}

document.addEventListener("DOMContentLoaded", wire);
