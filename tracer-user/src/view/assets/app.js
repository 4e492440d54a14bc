// tracer's viewer. Every string from the trace reaches the page through textContent or an
// attribute, never as markup: names, parameters and payloads are text.
"use strict";

const ROW = 18;           // pixels per flame graph level
const MIN_WIDTH = 0.002;  // frames narrower than this share of the view are not drawn
const RECONNECT_MS = 1000; // a stream the browser gave up on is opened again after this

let state = null;
let zoom = null;          // {key, path: [names]} of the zoomed frame
let sort = { column: "total_ns", descending: true };
let callsPage = 0;
let previous = null;      // {events, at} of the last state, for the event rate

function el(tag, props, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "data") Object.assign(e.dataset, v); else e.setAttribute(k, v);
  }
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function ns(v) {
  if (v >= 1e9) return (v / 1e9).toFixed(2) + " s";
  if (v >= 1e6) return (v / 1e6).toFixed(2) + " ms";
  if (v >= 1e3) return (v / 1e3).toFixed(2) + " µs";
  return v + " ns";
}

function bytes(v) {
  if (v >= 1 << 20) return (v / (1 << 20)).toFixed(1) + " MiB";
  if (v >= 1024) return (v / 1024).toFixed(1) + " KiB";
  return v + " B";
}

// --- tabs -------------------------------------------------------------------------------

// The open tab is the address's fragment (`#functions`), so that a tab can be linked to and
// reloading or going back keeps it.
const TABS = Array.from(document.querySelectorAll("nav button"), b => b.dataset.tab);

function showTab() {
  const wanted = location.hash.slice(1);
  const tab = TABS.includes(wanted) ? wanted : TABS[0];
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.tab === tab);
  for (const t of TABS) document.getElementById(t).classList.toggle("active", t === tab);
}

for (const b of document.querySelectorAll("nav button")) {
  b.addEventListener("click", () => { location.hash = b.dataset.tab; });
}
window.addEventListener("hashchange", showTab);
showTab();

// --- status -----------------------------------------------------------------------------

function renderStatus() {
  const s = [];
  const now = Date.now();
  s.push(state.live ? "recording" : "recorded");
  s.push(state.events.toLocaleString("en-US") + " events");
  if (state.live && previous && now > previous.at) {
    s.push(Math.round((state.events - previous.events) * 1000 / (now - previous.at)) + " events/s");
  }
  previous = { events: state.events, at: now };
  if (state.written !== null && state.written !== undefined) s.push("written " + state.written);
  let lost = state.lost;
  if (state.end) lost = Object.values(state.end.lost_events || {}).reduce((a, b) => a + b, 0);
  if (lost !== null && lost !== undefined) s.push("lost " + lost);
  if (state.end) s.push("ended: " + state.end.reason);
  document.getElementById("status").textContent = s.join(" · ");
}

// --- flame graph ------------------------------------------------------------------------

// Whether the trace has several hosts: then processes are named with their host.
function severalHosts() {
  return state.host_functions.length > 0 || new Set(state.processes.map(p => p.host)).size > 1;
}

// A process is its host and pid: two hosts can have the same pid.
function processKey(host, pid) {
  return JSON.stringify([host, pid]);
}

function callsOf(host, pid, name) {
  const f = state.functions.find(f => f.host === host && f.pid === pid && f.function === name);
  return f ? f.calls : 0;
}

function renderFlames() {
  const box = document.getElementById("flames");
  box.replaceChildren();
  const query = document.getElementById("search").value;
  const withHost = severalHosts();
  for (const root of state.flame) {
    const pid = root.pid, key = processKey(root.host, pid);
    let top = root, path = [];
    if (zoom && zoom.key === key) {
      for (const name of zoom.path) {
        const next = top.children.find(c => c.name === name);
        if (!next) break;
        top = next;
        path.push(name);
      }
    }
    const section = el("div", { class: "process", data: { pid: String(pid), host: root.host } });
    section.append(el("h3", {}, root.name + (withHost ? " on " + root.host : "") + " · " + ns(root.value)));
    const flame = el("div", { class: "flame" });
    let depth = 0;
    const draw = (node, x, width, level, parent, nodePath) => {
      if (width < MIN_WIDTH) return;
      depth = Math.max(depth, level + 1);
      const own = node.value - node.children.reduce((a, c) => a + c.value, 0);
      const f = el("div", { class: level === 0 && node === root ? "frame root" : "frame",
                            data: { parent: parent, name: node.name } }, node.name);
      if (query && node.name.includes(query)) f.classList.add("match");
      f.style.left = (x * 100) + "%";
      f.style.width = (width * 100) + "%";
      f.style.top = (level * ROW) + "px";
      const calls = node === root ? null : callsOf(root.host, pid, node.name);
      const tip = node.name + "\ntotal " + ns(node.value) + " · self " + ns(own) +
        (calls === null ? "" : " · calls of " + node.name + ": " + calls);
      f.title = tip;
      f.addEventListener("mouseenter", () => { document.getElementById("hover").textContent = tip; });
      f.addEventListener("click", () => {
        zoom = node === root ? null : { key: key, path: nodePath };
        renderFlames();
      });
      flame.append(f);
      // Children by time, biggest first.
      const children = [...node.children].sort((a, b) => b.value - a.value);
      let cx = x;
      for (const c of children) {
        const w = node.value > 0 ? width * c.value / node.value : 0;
        draw(c, cx, w, level + 1, node.name, nodePath.concat([c.name]));
        cx += w;
      }
    };
    if (top === root) {
      draw(root, 0, 1, 0, "", []);
    } else {
      draw(top, 0, 1, 0, path.length > 1 ? path[path.length - 2] : root.name, path);
    }
    flame.style.height = (depth * ROW) + "px";
    section.append(flame);
    box.append(section);
  }
  if (state.flame.length === 0) box.append(el("p", {}, "No call has returned yet."));
}

document.getElementById("search").addEventListener("input", () => state && renderFlames());
document.getElementById("reset").addEventListener("click", () => { zoom = null; state && renderFlames(); });

// --- function table ---------------------------------------------------------------------

const COLUMNS = [
  ["function", "function", "text"], ["process", "process", "text"], ["calls", "calls", "count"],
  ["total_ns", "total", "ns"], ["self_ns", "self", "ns"], ["mean_ns", "mean", "ns"],
  ["p50_ns", "p50", "ns"], ["p90_ns", "p90", "ns"], ["p99_ns", "p99", "ns"], ["max_ns", "max", "ns"],
  ["unfinished", "unfinished", "count"],
];

// A sortable table of function statistics: `columns` are [key, title, kind].
function renderTable(table, columns, rows) {
  const head = el("tr");
  for (const [key, title, kind] of columns) {
    const th = el("th", { class: kind === "text" ? "text" : "" },
      title + (sort.column === key ? (sort.descending ? " ▼" : " ▲") : ""));
    th.addEventListener("click", () => {
      sort = { column: key, descending: sort.column === key ? !sort.descending : kind !== "text" };
      renderFunctions();
    });
    head.append(th);
  }
  table.tHead.replaceChildren(head);
  rows = rows.slice();
  rows.sort((a, b) => {
    const x = a[sort.column], y = b[sort.column];
    if (x === undefined || y === undefined) return 0;
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return sort.descending ? -c : c;
  });
  const body = el("tbody");
  for (const f of rows) {
    const tr = el("tr");
    for (const [key, , kind] of columns) {
      const v = f[key];
      tr.append(el("td", { class: kind === "text" ? "text" : "", data: { col: key } },
        kind === "ns" ? ns(v) : v));
    }
    body.append(tr);
  }
  table.replaceChild(body, table.tBodies[0]);
}

function renderFunctions() {
  const select = document.getElementById("process-filter");
  const chosen = select.value;
  const withHost = severalHosts();
  const processes = new Map();
  for (const f of state.functions) {
    const key = processKey(f.host, f.pid);
    if (!processes.has(key)) {
      processes.set(key, (f.process || "pid") + " (" + f.pid + ")" + (withHost ? " on " + f.host : ""));
    }
  }
  select.replaceChildren(el("option", { value: "" }, "all"));
  for (const key of [...processes.keys()].sort()) {
    const o = el("option", { value: key }, processes.get(key));
    if (key === chosen) o.selected = true;
    select.append(o);
  }
  const host = [["host", "host", "text"]];
  const rows = state.functions
    .filter(f => chosen === "" || processKey(f.host, f.pid) === chosen)
    .map(f => Object.assign({}, f, { process: (f.process || "pid") + " (" + f.pid + ")" }));
  renderTable(document.getElementById("function-table"), withHost ? host.concat(COLUMNS) : COLUMNS, rows);
  // Per host: every process of a host together (the report of that host's events).
  document.getElementById("per-host").hidden = state.host_functions.length === 0;
  renderTable(document.getElementById("host-function-table"),
    host.concat(COLUMNS.filter(([key]) => key !== "process")), state.host_functions);
}

document.getElementById("process-filter").addEventListener("change", () => state && renderFunctions());

// --- call tree --------------------------------------------------------------------------

function renderThreads() {
  const select = document.getElementById("thread");
  const chosen = select.value;
  select.replaceChildren();
  for (const t of state.threads) {
    const key = JSON.stringify([t.host, t.tid]);
    const o = el("option", { value: key }, "tid " + t.tid + " (pid " + t.pid + ", " + t.host + ")");
    if (key === chosen) o.selected = true;
    select.append(o);
  }
  if (state.threads_not_listed > 0) {
    select.append(el("option", { disabled: "" }, state.threads_not_listed + " more threads not listed"));
  }
  if (!chosen && state.threads.length > 0) loadCalls();
}

async function loadCalls() {
  const chosen = document.getElementById("thread").value;
  if (!chosen) return;
  const [host, tid] = JSON.parse(chosen);
  const r = await fetch("/api/calls?host=" + encodeURIComponent(host) + "&tid=" + tid + "&page=" + callsPage);
  const pre = document.getElementById("call-lines");
  if (!r.ok) { pre.textContent = await r.text(); return; }
  const page = await r.json();
  pre.textContent = page.note ? page.note : page.lines.join("\n");
  document.getElementById("page").textContent = "page " + (page.page + 1);
  document.getElementById("prev").disabled = page.page === 0;
  document.getElementById("next").disabled = !page.has_next;
}

document.getElementById("thread").addEventListener("change", () => { callsPage = 0; loadCalls(); });
document.getElementById("prev").addEventListener("click", () => { callsPage = Math.max(0, callsPage - 1); loadCalls(); });
document.getElementById("next").addEventListener("click", () => { callsPage += 1; loadCalls(); });

// --- processes and messages -------------------------------------------------------------

function renderProcesses() {
  // Parents are on their child's host.
  const byParent = new Map();
  const known = new Set(state.processes.map(p => processKey(p.host, p.pid)));
  for (const p of state.processes) {
    const parentKey = p.parent !== null ? processKey(p.host, p.parent) : null;
    const parent = parentKey !== null && known.has(parentKey) && p.parent !== p.pid ? parentKey : null;
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(p);
  }
  const item = p => {
    const how = p.end_ns === null ? "running at the end" :
      p.signal !== null ? "killed by signal " + p.signal : "exit " + p.exit_code;
    const li = el("li", { data: { pid: String(p.pid), host: p.host } },
      (p.name || "pid") + " (" + p.pid + ")" + (severalHosts() ? " on " + p.host : "") + ": " + how +
      ", lived " + ns(p.lifetime_ns) +
      (p.threads ? ", started " + p.threads + (p.threads === 1 ? " thread" : " threads") : "") +
      ", sent " + bytes(p.bytes_sent) +
      ", received " + bytes(p.bytes_received));
    const kids = byParent.get(processKey(p.host, p.pid)) || [];
    if (kids.length) {
      const ul = el("ul");
      for (const k of kids) ul.append(item(k));
      li.append(ul);
    }
    return li;
  };
  const tree = document.getElementById("process-tree");
  tree.replaceChildren(...(byParent.get(null) || []).map(item));

  document.getElementById("message-count").textContent = state.messages_total === 0 ? "No linked message." :
    state.messages_total + (state.messages_total === 1 ? " send → receive link" : " send → receive links") +
      (state.messages_total > state.messages.length ? ", the first " + state.messages.length + " shown" : "");
  const table = document.getElementById("message-table");
  const head = el("tr");
  for (const h of ["send", "receive", "bytes", "channel", "latency"]) head.append(el("th", { class: "text" }, h));
  table.tHead.replaceChildren(head);
  const body = el("tbody");
  // Named as `tracer calls` names them: `comm (pid) thread tid`, with the host when there are several.
  const names = new Map(state.processes.map(p => [processKey(p.host, p.pid), p.name]));
  const end = e => (names.get(processKey(e.host, e.pid)) || "pid") + " (" + e.pid + ")" +
    (severalHosts() ? " on " + e.host : "") + " thread " + e.tid;
  for (const m of state.messages) {
    const tr = el("tr");
    tr.append(el("td", { class: "text" }, end(m.send)), el("td", { class: "text" }, end(m.recv)),
      el("td", {}, m.bytes), el("td", { class: "text" }, m.channel), el("td", {}, ns(m.latency_ns)));
    body.append(tr);
  }
  table.replaceChild(body, table.tBodies[0]);
}

// --- the state --------------------------------------------------------------------------

// The server sends the state at least twice a second while the trace runs (`state` messages),
// and once more when it ends (`end`), over one stream (`/api/events`, server-sent events).
function show(next) {
  state = next;
  renderStatus();
  renderFlames();
  renderFunctions();
  renderThreads();
  renderProcesses();
  document.body.dataset.events = String(state.events);
}

function listen() {
  const source = new EventSource("/api/events");
  source.addEventListener("state", m => show(JSON.parse(m.data)));
  source.addEventListener("end", m => { source.close(); show(JSON.parse(m.data)); });
  source.addEventListener("error", () => {
    // The browser reopens a dropped stream by itself; one it closed (an error answer) is
    // opened again here while the trace still runs.
    const note = state ? "the server stopped" : "cannot load the trace";
    document.getElementById("status").textContent = note + "; reconnecting…";
    if (source.readyState === EventSource.CLOSED) setTimeout(listen, RECONNECT_MS);
  });
}

listen();
