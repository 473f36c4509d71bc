// The gearhorn console: renders the snapshots /api/events sends every second.
// No library and nothing from the internet; text goes in with textContent only.
"use strict";

const WINDOW_SECONDS = 300;
const history = {};  // topic -> [[epoch seconds, copies/s], ...]
let me = { name: "", admin: false };
let openDlq = null;  // the queue whose dead letters are shown

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("data-") || key === "class") node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function num(n) { return Math.round(Number(n) || 0).toLocaleString("en"); }

function since(epoch) {
  const seconds = Date.now() / 1000 - Number(epoch);
  if (!isFinite(seconds)) return "?";
  if (seconds < 120) return `${Math.round(seconds)} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

// What each table shows now, as HTML: a table whose rows did not change
// keeps its nodes. Replacing them every second lost clicks: a button
// replaced between its mousedown and mouseup gets no click.
const shown = new Map();

function fill(id, rows) {
  const html = rows.map((row) => row.outerHTML).join("");
  if (shown.get(id) === html) return;
  shown.set(id, html);
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
}

function cell(text, numeric = false, cls = "") {
  return el("td", { class: `${numeric ? "n" : ""} ${cls}`.trim() }, text);
}

function sparkline(points) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 160 28");
  const now = Date.now() / 1000;
  const recent = points.filter(([t]) => t > now - WINDOW_SECONDS);
  const top = Math.max(1, ...recent.map(([, r]) => r));
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", recent.map(([t, r]) =>
    `${(160 * (1 - (now - t) / WINDOW_SECONDS)).toFixed(1)},${(26 - 24 * r / top).toFixed(1)}`)
    .join(" "));
  svg.append(line);
  const title = document.createElementNS(ns, "title");
  title.textContent = `peak ${top.toFixed(1)} copies/s`;
  svg.append(title);
  return svg;
}

function renderOverview(s) {
  const totals = s.totals || {};
  const cards = [
    ["copies", num(totals.copies)], ["messages", num(totals.fanouts)],
    ["topics", num(s.topic_count)], ["queued jobs", num(s.queued_total)],
    ["delayed", num(s.delayed)], ["dead letters", num(totals.dead_letters)],
    ["copies dropped", num(Object.entries(totals).filter(([k]) => k.startsWith("dropped:"))
      .reduce((n, [, v]) => n + Number(v), 0))],
    ["workers", num((s.workers || []).length)], ["bridges", num((s.bridges || []).length)],
    ["STOMP connections",
     num((s.bridges || []).reduce((n, b) => n + Number(b.connections || 0), 0))],
  ];
  document.getElementById("overview").replaceChildren(...cards.map(([label, value]) =>
    el("div", { class: "card", "data-card": label }, el("b", {}, value), label)));
  const servers = [el("li", { class: s.redis.up ? "up" : "down" },
                      `redis ${s.redis.up ? "up" : "DOWN: " + s.redis.error}`)];
  for (const g of s.gearmand) {
    servers.push(el("li", { class: g.up ? "up" : "down" },
                    `gearmand ${g.server} ${g.up ? "up" : "DOWN: " + g.error}`));
  }
  document.getElementById("servers").replaceChildren(...servers);
}

function renderTopics(s) {
  const topics = s.topics || [];
  document.getElementById("topic-count").textContent =
    `(${num(s.topic_count)} topics, ${num(s.pattern_count)} prefix patterns; top ${topics.length})`;
  fill("topics", topics.map((t) => {
    const points = history[t.topic] || (history[t.topic] = []);
    points.push([s.at, (s.rates || {})[t.topic] || 0]);
    while (points.length && points[0][0] < s.at - WINDOW_SECONDS) points.shift();
    const name = el("td", {}, el("button", { class: "link", onclick: () => showPresence(t.topic) },
                                 t.topic));
    return el("tr", { "data-topic": t.topic }, name,
              cell(num(t.subscribers), true, "subscribers"), cell(num(t.copies), true, "copies"),
              cell(num(t.fanouts), true), cell(((s.rates || {})[t.topic] || 0).toFixed(1), true),
              el("td", {}, sparkline(points)));
  }));
}

const QUEUE_ROWS = 25;

function renderQueues(s) {
  const queues = (s.queues || []).slice(0, QUEUE_ROWS);
  document.getElementById("queue-count").textContent =
    `(${num(s.queue_count)} functions, ${num(s.queued_total)} jobs queued; deepest ${queues.length})`;
  fill("queues", queues.map((q) => el("tr", { "data-queue": q.queue }, cell(q.queue),
    cell(num(q.queued), true, "queued"), cell(num(q.running), true), cell(num(q.workers), true))));
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// The warden's largest backlogs; one nobody consumes is marked (it grows
// until its limits drop copies).
function renderBacklogs(s) {
  const store = s.store || {};
  const refusing = document.getElementById("refusing");
  refusing.hidden = !store.over;
  refusing.textContent = store.over ? `Refusing fanouts: ${store.over}` : "";
  document.getElementById("store").textContent = Number(store.max) ?
    `(queue store ${num(store.used / 1048576)} of ${num(store.max / 1048576)} MiB, ` +
    `fanouts refused from ${num(store.guard / 1048576)} MiB)` : "";
  fill("backlogs", (s.backlogs || []).map((b) => el("tr",
    { "data-backlog": b.queue, class: b.consumers ? "" : "unread" },
    cell(b.consumers ? b.queue : `${b.queue} (no consumer)`), cell(num(b.depth), true, "queued"),
    cell(age(b.oldest_age), true, "oldest"), cell(num(b.consumers), true, "consumers"),
    cell(b.limits, false, "limits"))));
}

function renderProcesses(s) {
  fill("workers", (s.workers || []).map((w) => el("tr", {}, cell(w.id), cell(w.pid, true),
    cell(num(w.jobs), true), cell(since(w.started)))));
  fill("bridges", (s.bridges || []).map((b) => el("tr", {}, cell(b.id), cell(b.pid, true),
    cell(num(b.connections), true, "connections"), cell(since(b.started)))));
}

function renderDeadLetters(s) {
  fill("dead-letters", (s.dead_letters || []).map((d) => {
    const actions = el("td", {}, el("button", { onclick: () => showDlq(d.queue) }, "Show"));
    if (me.admin) {
      actions.append(
        el("button", { class: "requeue", onclick: () => act("requeue", d.queue, d.queued) },
           "Requeue"),
        el("button", { class: "purge", onclick: () => act("purge", d.queue, d.queued) },
           "Purge"));
    }
    return el("tr", { "data-dlq": d.queue }, cell(d.queue), cell(num(d.queued), true, "queued"),
              cell(num(d.total), true, "total"), actions);
  }));
}

function renderReport(report) {
  const node = document.getElementById("report");
  if (!report) return;
  const problems = Object.values(report.reconciliation || {}).reduce((a, b) => a + b, 0);
  const unaccounted = Object.values(report.unaccounted || {}).reduce((a, b) => a + b, 0);
  const verdict = problems ? `${num(problems)} problems: ${JSON.stringify(report.reconciliation)}`
    : unaccounted ? `${num(unaccounted)} copies of untracked Gearman subscribers unaccounted`
    : "nothing lost";
  node.replaceChildren(
    el("span", { class: problems || unaccounted ? "verdict-bad" : "verdict-ok" }, verdict),
    ` - ${num(report.events)} events, ${since(report.finished)}, report at ${report.report}`);
}

function renderAudit(audit) {
  const node = document.getElementById("audit");
  if (!audit) return;
  const found = audit.line.includes("FINDINGS");
  const latest = (audit.recent || []).slice(-3).reverse().map((f) =>
    el("li", {}, `${f.kind}: message ${f.message_id || "-"} for ${f.subscriber} - ${f.detail}`));
  node.replaceChildren(
    el("span", { class: found ? "verdict-bad" : "verdict-ok" }, audit.line),
    ` - updated ${since(audit.updated_ms / 1000)}`, el("ul", {}, ...latest));
}

function render(s) {
  renderOverview(s);
  renderTopics(s);
  renderQueues(s);
  renderBacklogs(s);
  renderProcesses(s);
  renderDeadLetters(s);
  renderAudit(s.audit);
  renderReport(s.report);
  document.getElementById("updated").textContent =
    `updated ${new Date(s.at * 1000).toLocaleTimeString()}`;
}

// Who is subscribed to a topic, and where (GET /api/presence, topic_presence's answer).
async function showPresence(topic) {
  const response = await fetch(`/api/presence?topic=${encodeURIComponent(topic)}`);
  const data = await response.json();
  const node = document.getElementById("presence");
  if (!response.ok) {
    node.replaceChildren(el("p", { class: "action-result" }, `presence: ${data.error}`));
    return;
  }
  const rows = data.clients.map((c) => el("tr", { "data-client": c.client_id },
    cell(c.client_id), cell(c.via === "stomp" ? `stomp, bridge ${c.bridge}` : c.via, false, "via"),
    cell(c.durable ? "yes" : "no"), cell(c.since ? since(c.since) : "?")));
  const patterns = data.patterns.map((p) => `${p.pattern}: ${num(p.subscribers)}`).join(", ");
  const more = data.cursor ? ` (the first ${data.clients.length})` : "";
  node.replaceChildren(
    el("h3", {}, `${topic}: ${num(data.subscribers)} subscribers${more}` +
       (patterns ? `; by prefix ${patterns}` : "")),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "client"), el("th", {}, "via"),
      el("th", {}, "durable"), el("th", {}, "since"))), el("tbody", {}, ...rows)));
}

async function showDlq(queue) {
  openDlq = queue;
  const response = await fetch(`/api/dlq?queue=${encodeURIComponent(queue)}`);
  const data = await response.json();
  const rows = data.letters.map((d) => el("tr", {}, cell(new Date(d.at * 1000).toLocaleString()),
    cell(d.reason), cell(d.deliveries, true), cell(num(d.size), true), cell(d.preview)));
  const table = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "when"),
    el("th", {}, "reason"), el("th", {}, "deliveries"), el("th", {}, "bytes"),
    el("th", {}, "body"))), el("tbody", {}, ...rows));
  document.getElementById("dlq-detail").replaceChildren(
    el("h3", {}, `${queue}.dlq: ${num(data.queued)} queued`), table);
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

async function act(action, queue, queued) {
  const what = action === "requeue" ? `Move the ${num(queued)} dead letters of ${queue} back `
    + `to ${queue}?` : `Drop the ${num(queued)} dead letters of ${queue} for good?`;
  if (!(await confirmAction(what))) return;
  const response = await fetch(`/api/dlq/${action}`, {
    method: "POST", body: JSON.stringify({ queue }),
    headers: { "Content-Type": "application/json", "X-Requested-With": "gearhorn" },
  });
  const result = await response.json();
  document.getElementById("dlq-detail").replaceChildren(el("p", { class: "action-result" },
    response.ok ? `${action}: ${result.moved} dead letters of ${queue}` : `refused: ${result.error}`));
  if (response.ok && openDlq === queue) openDlq = null;
}

function connect() {
  const link = document.getElementById("link");
  const events = new EventSource("/api/events");
  events.addEventListener("history", (e) => {
    for (const [topic, points] of Object.entries(JSON.parse(e.data))) history[topic] = points;
  });
  events.addEventListener("snapshot", (e) => {
    link.textContent = "live";
    link.className = "state live";
    render(JSON.parse(e.data));
  });
  events.onerror = () => {  // EventSource reconnects by itself
    link.textContent = "reconnecting...";
    link.className = "state down";
  };
}

async function start() {
  const response = await fetch("/api/whoami");
  if (response.ok) me = await response.json();
  document.getElementById("user").textContent =
    `${me.name}${me.admin ? " (admin)" : " (read only)"}`;
  connect();
}

start();
