// The eggtimer dashboard: one page per hash route (#/overview, #/tasks, ...), each a render
// function that builds its layout once and a refresh function the timer calls every 2 s. It
// speaks the /v1 API only; with a token it asks once for a key (or the admin token) and keeps it
// in sessionStorage: the API shows only what that key's plugins cover.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const REFRESH_MS = 2000;

// ---- talking to the API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body, contentType) {
  const headers = {};
  const token = sessionStorage.getItem("eggtimer-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  let payload;
  if (body instanceof Blob || body instanceof ArrayBuffer) { payload = body; headers["Content-Type"] = contentType; }
  else if (body !== undefined) { payload = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
  const r = await fetch(path, { method, headers, body: payload });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (r.status === 401) { askToken(); throw new ApiError(401, "unauthorized", "a token is needed"); }
  if (!r.ok) {
    const e = (data && data.error) || {};
    throw new ApiError(r.status, e.code || "error", e.message || (r.status + " " + r.statusText));
  }
  return { data, headers: r.headers };
}
const get = async (path) => (await api("GET", path)).data;
const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const t = s.toString();
  return t ? "?" + t : "";
};
const enc = encodeURIComponent;

function askToken() {
  const d = $("#token-dialog");
  if (!d.hidden) return;
  d.hidden = false;
  $("#token-input").value = "";
  $("#token-input").focus();
}
$("#token-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("#token-input").value.trim();
  sessionStorage.setItem("eggtimer-token", token);
  try {
    const r = await fetch("/v1/runners", { headers: { Authorization: "Bearer " + token } });
    if (r.status === 401) throw new Error("That key or token is not one this runner knows (or it was revoked). Try again.");
    $("#token-error").hidden = true;
    $("#token-dialog").hidden = true;
    route();
  } catch (e) {
    sessionStorage.removeItem("eggtimer-token");
    $("#token-error").textContent = e.message;
    $("#token-error").hidden = false;
  }
});

// ---- small helpers ------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const pad = (n) => String(n).padStart(2, "0");
function fmtTime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function fmtAgo(ms) {
  if (ms === null || ms === undefined) return "";
  const d = ms - Date.now(), a = Math.abs(d);
  const t = a < 1000 ? "now" : a < 60e3 ? Math.round(a / 1e3) + "s" : a < 3600e3 ? Math.round(a / 60e3) + "m" : a < 86400e3 ? (a / 3600e3).toFixed(1) + "h" : (a / 86400e3).toFixed(1) + "d";
  return t === "now" ? "now" : d > 0 ? "in " + t : t + " ago";
}
const fmtNum = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const pill = (state) => h("span", { class: "pill " + state }, state);
function flash(text) {
  const f = $("#flash");
  f.textContent = text;
  f.hidden = false;
  clearTimeout(flash.t);
  flash.t = setTimeout(() => (f.hidden = true), 3000);
}
function showError(el, e) {
  if (!el) return;
  el.textContent = e ? (e.message || String(e)) : "";
  el.hidden = !e;
}
// A button that does `fn`; a dangerous one asks for a second click within 3 s.
function action(label, fn, { danger = false, ghost = false, id, errorEl } = {}) {
  const b = h("button", { type: "button", id, class: danger ? "danger" : ghost ? "ghost" : "" }, label);
  b.addEventListener("click", async () => {
    if (danger && !b.classList.contains("armed")) {
      b.classList.add("armed");
      b.textContent = "Click again: " + label;
      setTimeout(() => { b.classList.remove("armed"); b.textContent = label; }, 3000);
      return;
    }
    b.classList.remove("armed");
    b.textContent = label;
    b.disabled = true;
    try { await fn(); showError(errorEl, null); }
    catch (e) { if (errorEl) showError(errorEl, e); else flash(e.message); }
    finally { b.disabled = false; }
  });
  return b;
}
function table(cols, rows, { empty, pick, id } = {}) {
  if (!rows.length) return h("div", { class: "empty", id }, empty || "Nothing here.");
  return h("table", { id },
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", { class: c.num ? "num" : "" }, c.label)))),
    h("tbody", {}, rows.map((r) => {
      const tr = h("tr", { class: pick ? "pick" : "", "data-id": r.id ?? r.name ?? r.plugin ?? "" },
        cols.map((c) => h("td", { class: (c.num ? "num " : "") + (c.nowrap ? "nowrap" : "") }, c.get(r))));
      if (pick) tr.addEventListener("click", () => pick(r, tr));
      return tr;
    })));
}
function replace(el, child) { el.replaceChildren(child); }

// ---- charts (uPlot) ----------------------------------------------------------------------

function chart(el, series, data, opts = {}) {
  const width = Math.max(300, el.clientWidth || 560);
  const colors = ["#2f6fde", "#178a4c", "#c4322c", "#b7791f"];
  const o = {
    width, height: 210,
    scales: { x: { time: opts.time !== false } },
    series: [{}].concat(series.map((s, i) => ({
      label: s, stroke: colors[i % colors.length], width: 2, spanGaps: true,
      fill: opts.bars ? colors[i % colors.length] + "55" : undefined,
      paths: opts.bars ? uPlot.paths.bars({ size: [0.8] }) : undefined,
      points: opts.bars ? { show: false } : undefined,
    }))),
    axes: [{}, { size: 56 }],
    legend: { show: true },
  };
  if (el._plot && el._plot.width === width) { el._plot.setData(data); return; }
  if (el._plot) el._plot.destroy();
  el.replaceChildren();
  el._plot = new uPlot(o, data, el);
}

// ---- pages --------------------------------------------------------------------------------

const pages = {};
let current = null; // { name, refresh }

pages.overview = () => {
  const root = h("div", {},
    h("h1", {}, "Overview"),
    h("div", { class: "row five" },
      stat("Runners", "ov-runners"), stat("Scheduled", "ov-scheduled"), stat("Due now", "ov-due"),
      stat("Running", "ov-running"), stat("Dead", "ov-dead")),
    h("div", { class: "row two" },
      h("div", { class: "card" }, h("h2", {}, "Throughput (tasks/s, all runners)"), h("div", { id: "chart-throughput", class: "chart" })),
      h("div", { class: "card" }, h("h2", {}, "Firing lateness (ms, start − due)"), h("div", { id: "chart-lateness", class: "chart" }))),
    h("div", { class: "card" }, h("h2", {}, "Falling due in the next hour (per minute)"), h("div", { id: "chart-due", class: "chart" })),
    h("div", { class: "card" }, h("h2", {}, "Runners"), h("div", { id: "runners" })),
    h("div", { class: "row two" },
      h("div", { class: "card" }, h("h2", {}, "Per plugin"), h("div", { id: "per-plugin" })),
      h("div", { class: "card" }, h("h2", {}, "Per shard"), h("div", { id: "per-shard" }))),
    h("p", { id: "ov-error", class: "error", hidden: true }));
  function stat(label, id) {
    return h("div", { class: "card stat" }, h("div", { class: "label" }, label), h("div", { class: "value", id }, "…"));
  }
  async function refresh() {
    const [stats, runners, hist] = await Promise.all([get("/v1/stats"), get("/v1/runners"), get("/v1/stats/history?minutes=15")]);
    $("#ov-runners").textContent = fmtNum(runners.length);
    $("#ov-scheduled").textContent = fmtNum(stats.scheduled);
    $("#ov-due").textContent = fmtNum(stats.due_now);
    $("#ov-running").textContent = fmtNum(stats.running);
    $("#ov-dead").textContent = fmtNum(stats.dead);
    replace($("#runners"), table([
      { label: "id", get: (r) => h("span", { class: "mono" }, r.id) },
      { label: "address", get: (r) => r.address || "—" },
      { label: "shards", get: (r) => r.shards.length ? r.shards.join(", ") : "none" },
      { label: "last seen", get: (r) => fmtAgo(r.last_seen) },
      { label: "up since", get: (r) => fmtTime(r.started_at) },
    ], runners, { empty: "No live runner: start one with `eggtimer serve`." }));
    const runs = new Map(hist.plugins.map((p) => [p.plugin, p]));
    replace($("#per-plugin"), table([
      { label: "plugin", get: (p) => h("a", { href: "#/tasks?plugin=" + enc(p.plugin) }, p.plugin) },
      { label: "scheduled", num: true, get: (p) => fmtNum(p.scheduled) },
      { label: "dead", num: true, get: (p) => fmtNum(p.dead) },
      { label: "ok / failed (15 min)", num: true, get: (p) => { const r = runs.get(p.plugin); return r ? `${fmtNum(r.succeeded)} / ${fmtNum(r.retried + r.dead)}` : "—"; } },
    ], stats.plugins, { empty: "No plugins yet: upload one on the Plugins page." }));
    replace($("#per-shard"), table([
      { label: "shard", get: (s) => s.shard },
      { label: "scheduled", num: true, get: (s) => fmtNum(s.scheduled) },
      { label: "due now", num: true, get: (s) => fmtNum(s.due_now) },
      { label: "running", num: true, get: (s) => fmtNum(s.running) },
      { label: "dead", num: true, get: (s) => fmtNum(s.dead) },
    ], stats.shards));
    const xs = hist.points.map((p) => p.at / 1000);
    chart($("#chart-throughput"), ["started", "succeeded", "failed"],
      [xs, hist.points.map((p) => p.fired_per_s), hist.points.map((p) => p.succeeded_per_s), hist.points.map((p) => p.failed_per_s)]);
    chart($("#chart-lateness"), ["p50", "p99"],
      [xs, hist.points.map((p) => p.lateness_p50_ms), hist.points.map((p) => p.lateness_p99_ms)]);
    const d = stats.due_next_hour;
    chart($("#chart-due"), ["tasks due"],
      [d.counts.map((_, i) => (d.from + i * d.bucket_ms) / 1000), d.counts], { bars: true });
  }
  return { root, refresh, errorEl: () => $("#ov-error") };
};

pages.tasks = (params) => {
  // a task id belongs to its plugin: the selected task is named by both
  let lastQuery = null, selected = null, selectedPlugin = null, cursor = null, asked = 0;
  const err = h("p", { class: "error", id: "find-error", hidden: true });
  const form = h("form", { class: "inline", id: "find-form" },
    h("label", {}, "id", h("input", { id: "find-id", placeholder: "task id" })),
    h("label", {}, "owner", h("input", { id: "find-owner", placeholder: "owner" })),
    h("label", {}, "plugin", h("input", { id: "find-plugin", placeholder: "plugin", value: params.get("plugin") || "" })),
    h("label", {}, "state", h("select", { id: "find-state" }, ["", "scheduled", "running", "done", "dead"].map((s) => h("option", { value: s }, s || "any")))),
    h("label", {}, "due after", h("input", { id: "find-after", type: "datetime-local", step: "1" })),
    h("label", {}, "due before", h("input", { id: "find-before", type: "datetime-local", step: "1" })),
    h("button", { id: "find-go", type: "submit" }, "Find"));
  const ownerBar = h("div", { id: "owner-bar", class: "card", hidden: true });
  const root = h("div", {},
    h("h1", {}, "Tasks"),
    h("div", { class: "card" }, form, err),
    ownerBar,
    h("div", { class: "split" },
      h("div", { class: "card" }, h("h2", {}, "Results"), h("div", { id: "task-rows" }, h("div", { class: "empty" }, "Find tasks by id, owner, plugin, state or due time.")), h("div", { id: "task-more" })),
      h("div", { class: "card", id: "task-detail" }, h("div", { class: "empty" }, "Pick a task to see its payload and act on it."))));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); search(); });

  function dt(id) {
    const v = $(id).value;
    return v ? String(new Date(v).getTime()) : "";
  }
  async function search() {
    const id = $("#find-id").value.trim();
    const owner = $("#find-owner").value.trim();
    lastQuery = { id, owner, plugin: $("#find-plugin").value.trim(), state: $("#find-state").value, due_after: dt("#find-after"), due_before: dt("#find-before") };
    cursor = null;
    try { await load(); showError(err, null); } catch (e) { showError(err, e); }
  }
  async function load() {
    if (!lastQuery) return;
    const mine = ++asked; // an answer to an older search that comes late is dropped
    const { id, owner, ...rest } = lastQuery;
    let tasks, next = null;
    if (id) {
      try { tasks = [await get("/v1/tasks/" + enc(id) + q({ plugin: rest.plugin }))]; } catch (e) { if (e.status === 404) tasks = []; else throw e; }
    } else {
      // a filter no index serves (scheduled tasks of one plugin, say) can leave a page short, even
      // empty, with more to come: read on until the page is full or 20 pages were read
      tasks = [];
      let at = cursor;
      for (let pages = 0; pages < 20; pages++) {
        const r = await get("/v1/tasks" + q({ owner, ...rest, limit: 100, cursor: at }));
        tasks = tasks.concat(r.tasks); next = at = r.next_cursor;
        if (!next || tasks.length >= 100) break;
      }
    }
    if (mine !== asked) return;
    replace($("#task-rows"), table([
      { label: "id", nowrap: true, get: (t) => h("span", { class: "mono" }, t.id) },
      { label: "plugin", nowrap: true, get: (t) => t.plugin },
      { label: "owner", get: (t) => t.owner || "—" },
      { label: "state", get: (t) => pill(t.state) },
      { label: "due", get: (t) => h("span", { title: fmtTime(t.run_at) }, fmtAgo(t.run_at)) },
      { label: "attempts", num: true, get: (t) => `${t.attempts}/${t.max_attempts}` },
    ], tasks, { pick: (t) => { selected = t.id; selectedPlugin = t.plugin; detail(); }, empty: next ? "No task matches yet among those read: the next page reads on." : "No task matches. Widen the filters (no state, no time range) or check the id." }));
    $$("#task-rows tr[data-id]").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === selected));
    replace($("#task-more"), next ? action("Next page", async () => { cursor = next; await load(); }, { ghost: true }) : h("span"));
    ownerBar.hidden = !owner;
    if (owner) renderOwnerBar(owner, rest.plugin);
  }
  // The owner's counts per plugin (GET /v1/owners/{owner}/stats) and whether each is paused.
  async function ownerStats(owner) {
    const s = await get(`/v1/owners/${enc(owner)}/stats`);
    const paused = (p) => s.paused.all || s.paused.plugins.includes(p);
    const rows = s.plugins.concat([{ plugin: "(all)", scheduled: s.scheduled, running: s.running, dead: s.dead, all: true }]);
    replace($("#owner-stats"), table([
      { label: "plugin", get: (c) => c.plugin },
      { label: "scheduled", num: true, get: (c) => fmtNum(c.scheduled) },
      { label: "running", num: true, get: (c) => fmtNum(c.running) },
      { label: "dead", num: true, get: (c) => fmtNum(c.dead) },
      { label: "state", get: (c) => (c.all ? s.paused.all : paused(c.plugin)) ? pill("paused") : "" },
    ], rows, { id: "owner-counts" }));
  }
  function renderOwnerBar(owner, plugin) {
    if (ownerBar.dataset.owner === owner + "/" + plugin) { ownerStats(owner).catch(() => {}); return; }
    ownerBar.dataset.owner = owner + "/" + plugin;
    const e = h("p", { class: "error", hidden: true });
    const body = plugin ? { plugin } : {};
    ownerBar.replaceChildren(
      h("h2", {}, `Owner ${owner}` + (plugin ? ` (plugin ${plugin})` : "")),
      h("div", { id: "owner-stats" }),
      h("div", { class: "actions" },
        action(plugin ? "Pause the owner's tasks of this plugin" : "Pause all of the owner's tasks", async () => {
          await api("POST", `/v1/owners/${enc(owner)}/pause`, body);
          flash("Paused"); await ownerStats(owner);
        }, { id: "owner-pause", errorEl: e }),
        action("Resume", async () => {
          const r = await api("POST", `/v1/owners/${enc(owner)}/resume`, body);
          flash(`Resumed: ${r.data.resumed} task(s) due again`); await ownerStats(owner);
        }, { id: "owner-resume", errorEl: e, ghost: true })),
      h("div", { class: "actions" },
        h("label", {}, "shift by (ms, ±)", h("input", { id: "shift-ms", type: "number", value: "-7200000" })),
        action("Shift all", async () => {
          const r = await api("POST", `/v1/owners/${enc(owner)}/shift`, plugin ? { shift_ms: Number($("#shift-ms").value), plugin } : { shift_ms: Number($("#shift-ms").value) });
          flash(`Shifted ${r.data.shifted} task(s)`); await load();
        }, { id: "owner-shift", errorEl: e }),
        action("Cancel all of the owner's tasks", async () => {
          const r = await api("DELETE", `/v1/owners/${enc(owner)}/tasks` + q({ plugin }));
          flash(`Cancelled ${r.data.cancelled} task(s)`); await load();
        }, { danger: true, id: "owner-cancel", errorEl: e })),
      e);
    ownerStats(owner).catch((x) => showError(e, x));
  }
  async function detail() {
    const box = $("#task-detail");
    if (!selected) return;
    $$("#task-rows tr[data-id]").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === selected));
    let t;
    try { t = await get("/v1/tasks/" + enc(selected) + q({ plugin: selectedPlugin })); }
    catch (e) {
      if (e.status === 404) { replace(box, h("div", { class: "empty" }, `Task ${selected} is gone (cancelled, or done longer ago than the retention window).`)); return; }
      throw e;
    }
    if (box.dataset.shown === JSON.stringify(t)) return; // unchanged: keep what the user typed
    box.dataset.shown = JSON.stringify(t);
    const e = h("p", { class: "error", id: "act-error", hidden: true });
    const done = async (msg) => { flash(msg); box.dataset.shown = ""; await load(); await detail(); };
    let payload;
    try { payload = JSON.stringify(t.payload, null, 2); } catch { payload = String(t.payload); }
    box.replaceChildren(
      h("h2", {}, "Task ", h("span", { class: "mono" }, t.id), " ", pill(t.state)),
      h("dl", { class: "kv" },
        h("dt", {}, "plugin"), h("dd", {}, t.plugin),
        h("dt", {}, "owner"), h("dd", {}, t.owner || "—"),
        h("dt", {}, "due"), h("dd", {}, `${fmtTime(t.run_at)} (${fmtAgo(t.run_at)})`),
        h("dt", {}, "attempts"), h("dd", {}, `${t.attempts} of ${t.max_attempts}`),
        h("dt", {}, "created"), h("dd", {}, fmtTime(t.created_at)),
        t.finished_at ? [h("dt", {}, "finished"), h("dd", {}, fmtTime(t.finished_at))] : null,
        t.traceparent ? [h("dt", {}, "traceparent"), h("dd", { class: "mono" }, t.traceparent)] : null,
        t.start_by ? [h("dt", {}, "start by"), h("dd", {}, fmtTime(t.start_by))] : null,
        t.last_error ? [h("dt", {}, "last error"), h("dd", { class: "error", id: "task-last-error" }, t.last_error)] : null,
        t.debounce ? [h("dt", {}, "debounced"), h("dd", { id: "task-debounce" },
          `quiet ${t.debounce.quiet_ms} ms, at most ${t.debounce.max_wait_ms} ms after its first payload (${fmtTime(t.debounce.first_at)}); ` +
          `${(t.batch || []).length + (t.batch_dropped || 0)} payloads` + (t.next_batch ? `, ${t.next_batch} for its next window` : ""))] : null),
      ...(t.on && t.on.length ? [h("h2", {}, "Listens for"),
        h("div", { id: "task-listeners" }, table([
          { label: "topic", get: (l) => h("span", { class: "mono" }, l.topic) },
          { label: "key", get: (l) => h("span", { class: "mono" }, l.key) },
          { label: "then", nowrap: true, get: (l) => l.then === "run" ? "run it now, with the event" : "cancel it" },
        ], t.on, { empty: "" })),
        h("p", { class: "muted" }, t.event ? "An event reached it: it listens no more." :
          `An event up to ${t.lookback_ms ?? 60000} ms before it was scheduled matched too.`)] : []),
      ...(t.event ? [h("h2", {}, "The event that reached it"), h("pre", { id: "task-event" }, JSON.stringify(t.event, null, 2))] : []),
      h("h2", {}, "Payload"), h("pre", { id: "task-payload" }, payload),
      ...(t.log && t.log.length ? [h("h2", {}, "Log of its last attempts"),
        h("div", { id: "task-log" }, table([
          { label: "attempt", num: true, get: (l) => l.attempt },
          { label: "time", nowrap: true, get: (l) => fmtTime(l.time) },
          { label: "level", nowrap: true, get: (l) => l.level },
          { label: "message", get: (l) => h("span", { class: "mono" + (l.level === "error" || l.level === "stderr" ? " error" : "") }, l.message) },
        ], t.log, { empty: "" }))] : []),
      t.state === "scheduled" ? h("div", { class: "actions" },
        action("Run now", async () => { await api("POST", `/v1/tasks/${enc(t.id)}/run${q({ plugin: t.plugin })}`); await done("Runs now"); }, { id: "act-run", errorEl: e }),
        h("label", {}, "move to", h("input", { id: "move-at", type: "datetime-local", step: "1" })),
        action("Move", async () => {
          const v = $("#move-at").value;
          if (!v) throw new Error("Pick a date and time to move it to.");
          await api("PATCH", `/v1/tasks/${enc(t.id)}${q({ plugin: t.plugin })}`, { run_at: new Date(v).getTime() }); await done("Moved");
        }, { id: "act-move", ghost: true, errorEl: e }),
        h("label", {}, "or by (ms, ±)", h("input", { id: "move-by", type: "number", placeholder: "-7200000" })),
        action("Shift", async () => {
          const v = $("#move-by").value;
          if (!v) throw new Error("Enter how many ms to move it by (negative: earlier).");
          await api("PATCH", `/v1/tasks/${enc(t.id)}${q({ plugin: t.plugin })}`, { shift_ms: Number(v) }); await done("Moved");
        }, { id: "act-shift", ghost: true, errorEl: e }),
        action("Cancel", async () => { await api("DELETE", `/v1/tasks/${enc(t.id)}${q({ plugin: t.plugin })}`); await done("Cancelled"); }, { id: "act-cancel", danger: true, errorEl: e }))
        : t.state === "dead" ? h("div", {}, h("div", { class: "actions" },
          action("Retry", async () => { await api("POST", `/v1/dead/${enc(t.id)}/retry${q({ plugin: t.plugin })}`); await done("Put back"); }, { id: "act-retry", errorEl: e }),
          h("label", {}, "version", h("input", { id: "dry-version", type: "number", min: "1", placeholder: "current" })),
          action("Dry run", async () => {
            // runs it through a version (a candidate, say) with nothing applied: what it would do
            const v = $("#dry-version").value;
            const r = await api("POST", `/v1/tasks/${enc(t.id)}/dry-run${q({ plugin: t.plugin })}`, v ? { version: Number(v) } : {});
            const d = r.data;
            const [word] = Object.keys(d.outcome);
            $("#dry-run-result").replaceChildren(h("h2", {}, `Dry run on v${d.version}: ${word} (${d.took_ms.toFixed(1)} ms, nothing applied)`),
              h("pre", { id: "dry-run-json" }, JSON.stringify({ outcome: d.outcome, effects: d.effects, log: d.log }, null, 2)));
          }, { id: "act-dry-run", ghost: true, errorEl: e })),
          h("div", { id: "dry-run-result" }))
          : h("p", { class: "muted" }, t.state === "running" ? "Running: it can't be changed until it finishes." : "Done."),
      e);
  }
  // the page lists tasks as it opens, with the filters of its link:
  // #/tasks?state=scheduled&plugin=y&owner=x&id=z&due_after=<ms>&due_before=<ms>
  for (const [k, sel] of [["owner", "#find-owner"], ["id", "#find-id"], ["state", "#find-state"]]) {
    if (params.get(k)) $(sel, form).value = params.get(k);
  }
  for (const [k, sel] of [["due_after", "#find-after"], ["due_before", "#find-before"]]) {
    const ms = Number(params.get(k));
    if (params.get(k) && Number.isFinite(ms)) {
      // datetime-local shows local time: the instant moved by the zone's offset, in ISO form
      $(sel, form).value = new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 19);
    }
  }
  setTimeout(search, 0);
  return { root, refresh: async () => { await load(); await detail(); }, errorEl: () => err };
};

pages.dead = () => {
  const err = h("p", { class: "error", id: "dead-error", hidden: true });
  const root = h("div", {},
    h("h1", {}, "Dead letters"),
    h("div", { class: "card" },
      h("div", { class: "actions" },
        h("label", {}, "plugin", h("input", { id: "dead-plugin", placeholder: "all plugins" })),
        action("Retry all", async () => { const r = await api("POST", "/v1/dead/retry", plugin() ? { plugin: plugin() } : {}); flash(`Retried ${r.data.retried}`); await refresh(); }, { id: "dead-retry-all", ghost: true, errorEl: err }),
        action("Drop all", async () => { const r = await api("DELETE", "/v1/dead" + q({ plugin: plugin() })); flash(`Dropped ${r.data.dropped}`); await refresh(); }, { id: "dead-drop-all", danger: true, errorEl: err })),
      err),
    h("div", { class: "card" }, h("div", { id: "dead-rows" }, h("div", { class: "empty" }, "Loading…"))));
  const plugin = () => $("#dead-plugin").value.trim();
  $("#dead-plugin", root).addEventListener("change", () => refresh().catch((e) => showError(err, e)));
  async function refresh() {
    const r = await get("/v1/tasks" + q({ state: "dead", plugin: plugin(), limit: 200 }));
    replace($("#dead-rows"), table([
      { label: "id", nowrap: true, get: (t) => h("a", { class: "mono", href: "#/tasks?id=" + enc(t.id) }, t.id) },
      { label: "plugin", nowrap: true, get: (t) => t.plugin },
      { label: "died", nowrap: true, get: (t) => h("span", { title: fmtTime(t.finished_at) }, fmtAgo(t.finished_at)) },
      { label: "attempts", num: true, get: (t) => t.attempts },
      { label: "error", get: (t) => h("span", { class: "error" }, t.last_error || "") },
      { label: "", get: (t) => h("div", { class: "actions" },
        action("Retry", async () => { await api("POST", `/v1/dead/${enc(t.id)}/retry${q({ plugin: t.plugin })}`); flash(`${t.id} put back`); await refresh(); }, { errorEl: err }),
        action("Drop", async () => { await api("DELETE", `/v1/dead/${enc(t.id)}${q({ plugin: t.plugin })}`); flash(`${t.id} dropped`); await refresh(); }, { danger: true, errorEl: err })) },
    ], r.tasks, { empty: "No dead letters" + (plugin() ? " of " + plugin() : "") + ". Tasks land here after their last attempt fails." }));
  }
  return { root, refresh, errorEl: () => err };
};

pages.plugins = () => {
  let selected = null;
  const err = h("p", { class: "error", id: "plugins-error", hidden: true });
  const upErr = h("p", { class: "error", id: "upload-error", hidden: true });
  const root = h("div", {},
    h("h1", {}, "Plugins"),
    h("div", { class: "card" },
      h("h2", {}, "Upload a version"),
      h("form", { class: "inline", id: "upload-form" },
        h("label", {}, "name", h("input", { id: "up-name", placeholder: "e.g. coupon-expiry", pattern: "[a-z0-9][a-z0-9-]{0,63}", required: true })),
        h("label", {}, "wasm component", h("input", { id: "up-file", type: "file", accept: ".wasm,application/wasm", required: true })),
        h("button", { id: "up-go", type: "submit" }, "Upload")),
      upErr),
    h("div", { class: "split" },
      h("div", { class: "card" }, h("div", { id: "plugin-rows" }, h("div", { class: "empty" }, "Loading…")), err),
      h("div", { class: "card", id: "plugin-detail" }, h("div", { class: "empty" }, "Pick a plugin to see its versions and settings."))));
  $("#upload-form", root).addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const name = $("#up-name").value.trim();
    const file = $("#up-file").files[0];
    try {
      if (!file) throw new Error("Choose a .wasm file.");
      const r = await api("PUT", "/v1/plugins/" + enc(name), await file.arrayBuffer(), "application/wasm");
      flash(`${r.data.name} version ${r.data.version} uploaded`);
      showError(upErr, null);
      selected = name; $("#plugin-detail").dataset.shown = "";
      await refresh();
    } catch (e) { showError(upErr, e); }
  });
  async function refresh() {
    const [list, hist] = await Promise.all([get("/v1/plugins"), get("/v1/stats/history?minutes=60")]);
    const runs = new Map(hist.plugins.map((p) => [p.plugin, p]));
    replace($("#plugin-rows"), table([
      { label: "name", get: (p) => p.name },
      { label: "version", num: true, get: (p) => p.version },
      { label: "size", num: true, get: (p) => (p.size / 1024).toFixed(0) + " KiB" },
      { label: "uploaded", get: (p) => fmtAgo(p.uploaded_at) },
      { label: "state", get: (p) => p.paused ? pill("paused") : h("span", { class: "muted" }, p.max_concurrency ? `active, ≤ ${p.max_concurrency} at once` : "active") },
      { label: "ok / failed (1 h)", num: true, get: (p) => { const r = runs.get(p.name); return r ? `${fmtNum(r.succeeded)} / ${fmtNum(r.retried + r.dead)}` : "—"; } },
      { label: "handler avg", num: true, get: (p) => { const r = runs.get(p.name); return r && r.handler_avg_ms !== null ? r.handler_avg_ms.toFixed(2) + " ms" : "—"; } },
    ], list, { pick: (p) => { selected = p.name; $("#plugin-detail").dataset.shown = ""; detail(); }, empty: "No plugins yet. Build one (sdk/README.md) and upload it above." }));
    $$("#plugin-rows tr[data-id]").forEach((tr) => tr.classList.toggle("selected", tr.dataset.id === selected));
    await detail();
  }
  async function detail() {
    if (!selected) return;
    const box = $("#plugin-detail");
    let p;
    let secrets;
    try { p = await get("/v1/plugins/" + enc(selected)); secrets = await get(`/v1/plugins/${enc(selected)}/secrets`); }
    catch (e) { if (e.status === 404) { replace(box, h("div", { class: "empty" }, `Plugin ${selected} was deleted.`)); return; } throw e; }
    if (box.dataset.shown === JSON.stringify([p, secrets])) return;
    box.dataset.shown = JSON.stringify([p, secrets]);
    const e = h("p", { class: "error", id: "plugin-action-error", hidden: true });
    const done = async (msg) => { flash(msg); box.dataset.shown = ""; await refresh(); };
    box.replaceChildren(
      h("h2", {}, p.name, " ", p.paused ? pill("paused") : null),
      h("dl", { class: "kv" },
        h("dt", {}, "current"), h("dd", {}, `version ${p.version}`),
        h("dt", {}, "digest"), h("dd", { class: "mono" }, p.digest),
        h("dt", {}, "max at once"), h("dd", {}, p.max_concurrency ?? "no limit"),
        h("dt", {}, "max at once per owner"), h("dd", { id: "pl-per-owner" }, p.max_concurrency_per_owner ?? "no limit"),
        h("dt", {}, "rate limit"), h("dd", { id: "pl-rate" }, p.rate_limit ? `${fmtNum(p.rate_limit.max)} starts per ${fmtNum(p.rate_limit.per_ms)} ms` : "no limit"),
        h("dt", {}, "weight"), h("dd", { id: "pl-weight" }, String(p.weight ?? 1)),
        h("dt", {}, "time limit"), h("dd", { id: "pl-time-limit" }, p.time_limit_ms == null ? "the runner's" : `${fmtNum(p.time_limit_ms)} ms`),
        h("dt", {}, "memory cap"), h("dd", { id: "pl-memory" }, p.memory_bytes == null ? "the runner's" : `${fmtNum(p.memory_bytes / 1048576)} MiB`),
        h("dt", {}, "max pending"), h("dd", { id: "pl-max-pending" }, fmtNum(p.max_pending)),
        h("dt", {}, "may call"), h("dd", { id: "pl-hosts", class: "mono" }, (p.allowed_hosts || []).length ? p.allowed_hosts.join(", ") : "no network"),
        h("dt", {}, "config"), h("dd", { id: "pl-config", class: "mono" }, Object.entries(p.config || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none"),
        h("dt", {}, "payloads"), h("dd", { id: "pl-check" }, p.check ? "checked when scheduled" : p.check === false ? "not checked (no check export)" : "—")),
      p.payload_schema ? [h("h2", {}, "Payload schema"), h("pre", { id: "pl-schema" }, JSON.stringify(p.payload_schema, null, 2))] : null,
      h("div", { class: "actions" },
        p.paused
          ? action("Resume", async () => { await api("POST", `/v1/plugins/${enc(p.name)}/resume`); await done("Resumed"); }, { id: "pl-resume", errorEl: e })
          : action("Pause", async () => { await api("POST", `/v1/plugins/${enc(p.name)}/pause`); await done("Paused"); }, { id: "pl-pause", ghost: true, errorEl: e }),
        h("label", {}, "max concurrency", h("input", { id: "mc-value", type: "number", min: "1", placeholder: "none", value: p.max_concurrency ?? "" })),
        action("Set", async () => {
          const v = $("#mc-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { max_concurrency: v === "" ? null : Number(v) }); await done("Limit set");
        }, { id: "mc-set", ghost: true, errorEl: e }),
        h("label", {}, "per owner", h("input", { id: "po-value", type: "number", min: "1", placeholder: "none", value: p.max_concurrency_per_owner ?? "" })),
        action("Set", async () => {
          const v = $("#po-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { max_concurrency_per_owner: v === "" ? null : Number(v) }); await done("Per-owner limit set");
        }, { id: "po-set", ghost: true, errorEl: e }),
        h("label", {}, "starts", h("input", { id: "rl-max", type: "number", min: "1", placeholder: "none", value: p.rate_limit?.max ?? "" })),
        h("label", {}, "per ms", h("input", { id: "rl-per", type: "number", min: "1", placeholder: "1000", value: p.rate_limit?.per_ms ?? "" })),
        action("Set", async () => {
          const max = $("#rl-max").value, per = $("#rl-per").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { rate_limit: max === "" ? null : { max: Number(max), per_ms: Number(per || 1000) } }); await done("Rate limit set");
        }, { id: "rl-set", ghost: true, errorEl: e }),
        h("label", {}, "weight", h("input", { id: "w-value", type: "number", min: "1", max: "1000", placeholder: "1", value: p.weight ?? "" })),
        action("Set", async () => {
          const v = $("#w-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { weight: v === "" ? null : Number(v) }); await done("Weight set");
        }, { id: "w-set", ghost: true, errorEl: e }),
        h("label", {}, "time limit (ms)", h("input", { id: "tl-value", type: "number", min: "1", placeholder: "runner's", value: p.time_limit_ms ?? "" })),
        action("Set", async () => {
          const v = $("#tl-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { time_limit_ms: v === "" ? null : Number(v) }); await done("Time limit set");
        }, { id: "tl-set", ghost: true, errorEl: e }),
        h("label", {}, "memory cap (MiB)", h("input", { id: "mem-value", type: "number", min: "1", max: "4096", placeholder: "runner's", value: p.memory_bytes == null ? "" : p.memory_bytes / 1048576 })),
        action("Set", async () => {
          const v = $("#mem-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { memory_bytes: v === "" ? null : Math.round(Number(v) * 1048576) }); await done("Memory cap set");
        }, { id: "mem-set", ghost: true, errorEl: e }),
        h("label", {}, "max pending", h("input", { id: "mp-value", type: "number", min: "1", placeholder: "1000000", value: p.max_pending ?? "" })),
        action("Set", async () => {
          const v = $("#mp-value").value;
          await api("PATCH", `/v1/plugins/${enc(p.name)}`, { max_pending: v === "" ? null : Number(v) }); await done("Max pending set");
        }, { id: "mp-set", ghost: true, errorEl: e }),
        action("Roll back", async () => { await api("POST", `/v1/plugins/${enc(p.name)}/rollback`); await done("Rolled back"); }, { id: "pl-rollback", ghost: true, errorEl: e }),
        action("Delete", async () => { await api("DELETE", `/v1/plugins/${enc(p.name)}`); selected = null; await done("Deleted"); replace(box, h("div", { class: "empty" }, "Deleted.")); }, { id: "pl-delete", danger: true, errorEl: e })),
      e,
      h("h2", {}, "Secrets"),
      table([
        { label: "name", get: (x) => h("span", { class: "mono" }, x.name) },
        { label: "set", get: (x) => fmtTime(x.updated_at) },
      ], secrets, { id: "plugin-secrets", empty: "No secrets. Set one with `eggtimer plugin secret set`; values are never shown." }),
      h("h2", {}, "Versions"),
      table([
        { label: "version", num: true, get: (v) => v.version },
        { label: "digest", get: (v) => h("span", { class: "mono" }, v.digest.slice(0, 16) + "…") },
        { label: "size", num: true, get: (v) => (v.size / 1024).toFixed(0) + " KiB" },
        { label: "uploaded", get: (v) => fmtTime(v.uploaded_at) },
        { label: "", get: (v) => v.candidate ? pill("candidate") : v.version === p.version ? pill("current") : "" },
      ], (p.history || []).slice().reverse(), { id: "plugin-versions" }));
  }
  return { root, refresh, errorEl: () => err };
};

pages.schedules = () => {
  const err = h("p", { class: "error", id: "schedules-error", hidden: true });
  const root = h("div", {}, h("h1", {}, "Schedules"), h("div", { class: "card" }, h("div", { id: "schedule-rows" }, h("div", { class: "empty" }, "Loading…")), err));
  async function refresh() {
    const list = await get("/v1/schedules");
    replace($("#schedule-rows"), table([
      { label: "id", get: (s) => h("span", { class: "mono" }, s.id) },
      { label: "plugin", get: (s) => s.plugin },
      { label: "when", get: (s) => s.cron ? `cron ${s.cron} (${s.tz})` : `every ${fmtNum(s.every_ms)} ms` },
      { label: "next run", get: (s) => s.paused ? pill("paused") : h("span", { title: fmtTime(s.next_run_at) }, `${fmtTime(s.next_run_at)} (${fmtAgo(s.next_run_at)})`) },
      { label: "", get: (s) => h("div", { class: "actions" },
        s.paused
          ? action("Resume", async () => { await api("POST", `/v1/schedules/${enc(s.id)}/resume`); await refresh(); }, { errorEl: err })
          : action("Pause", async () => { await api("POST", `/v1/schedules/${enc(s.id)}/pause`); await refresh(); }, { ghost: true, errorEl: err }),
        action("Delete", async () => { await api("DELETE", `/v1/schedules/${enc(s.id)}`); flash(`${s.id} deleted`); await refresh(); }, { danger: true, errorEl: err })) },
    ], list, { empty: "No recurring schedules. Create one with PUT /v1/schedules/{id} or `eggtimer schedule put`." }));
  }
  return { root, refresh, errorEl: () => err };
};

pages.events = (params) => {
  const err = h("p", { class: "error", id: "events-error", hidden: true });
  const form = h("form", { class: "inline" },
    h("label", {}, "topic", h("input", { id: "ev-topic", value: params.get("topic") || "push" })),
    h("button", { id: "ev-go", type: "submit" }, "Show"));
  const root = h("div", {}, h("h1", {}, "Events"), h("div", { class: "card" }, form, err), h("div", { class: "card" }, h("div", { id: "event-rows" })));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); refresh().catch((e) => showError(err, e)); });
  async function refresh() {
    const topic = $("#ev-topic").value.trim();
    const list = await get(`/v1/events/${enc(topic)}?limit=100`);
    showError(err, null);
    replace($("#event-rows"), table([
      { label: "at", get: (e) => fmtTime(Number(e.id.split("-")[0])) },
      { label: "task", get: (e) => e.task_id ? h("a", { class: "mono", href: "#/tasks?id=" + enc(e.task_id) }, e.task_id) : "—" },
      { label: "plugin", get: (e) => e.plugin || "—" },
      { label: "data", get: (e) => h("code", {}, e.data_text || "") },
    ], list, { empty: `No events on "${topic}" yet. Plugins add them with emit("${topic}", ...).` }));
  }
  return { root, refresh, errorEl: () => err };
};

pages.audit = (params) => {
  const err = h("p", { class: "error", id: "audit-error", hidden: true });
  const form = h("form", { class: "inline" },
    h("label", {}, "key", h("input", { id: "au-key", value: params.get("key") || "", placeholder: "any" })),
    h("label", {}, "plugin", h("input", { id: "au-plugin", value: params.get("plugin") || "", placeholder: "any" })),
    h("button", { id: "au-go", type: "submit" }, "Show"));
  const root = h("div", {}, h("h1", {}, "Audit"),
    h("div", { class: "card" }, h("p", { class: "hint" }, "Every change made through the API and every refused request, newest first. An admin sees everyone's; another key its own."), form, err),
    h("div", { class: "card" }, h("div", { id: "audit-rows" }, h("div", { class: "empty" }, "Loading…"))));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); refresh().catch((e) => showError(err, e)); });
  async function refresh() {
    const q = new URLSearchParams({ limit: "200" });
    const key = $("#au-key").value.trim(), plugin = $("#au-plugin").value.trim();
    if (key) q.set("key", key);
    if (plugin) q.set("plugin", plugin);
    const page = await get(`/v1/audit?${q}`);
    showError(err, null);
    replace($("#audit-rows"), table([
      { label: "at", get: (e) => fmtTime(e.at) },
      { label: "key", get: (e) => e.key || "—" },
      { label: "request", get: (e) => h("span", { class: "mono" }, `${e.method} ${e.path}`) },
      { label: "plugin", get: (e) => e.plugin || "—" },
      { label: "status", get: (e) => e.status >= 400 ? h("span", { class: "pill dead" }, String(e.status)) : String(e.status) },
    ], page.entries, { empty: "Nothing in the audit yet." }));
  }
  return { root, refresh, errorEl: () => err };
};

// ---- routing and the refresh loop ----------------------------------------------------------

function route() {
  const [path, query] = (location.hash.replace(/^#\/?/, "") || "overview").split("?");
  const name = pages[path] ? path : "overview";
  $$("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === name));
  const page = pages[name](new URLSearchParams(query || ""));
  page.name = name;
  current = page;
  $("#page").replaceChildren(page.root);
  tick(page);
}
async function tick(page) {
  if (page !== current || !$("#token-dialog").hidden) return;
  try {
    await page.refresh();
    showError(page.errorEl(), null);
    $("#status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.status !== 401) showError(page.errorEl(), e);
  }
}
window.addEventListener("hashchange", route);
setInterval(() => current && tick(current), REFRESH_MS);
route();
