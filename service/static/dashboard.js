// The trainctl dashboard: plain JS over the REST API, no build step.
//
// Auth: when the server has a token, the first 401 asks for it; it is kept in sessionStorage
// (this tab only) and sent as a Bearer header. EventSource cannot send headers, so the run
// page reads the SSE stream with fetch() and parses the frames itself, resuming with
// Last-Event-ID after a dropped connection.
"use strict";

const TOKEN_KEY = "trainctl.token";
const REFRESH_MS = 2000;
const view = document.getElementById("view");
let leaveView = () => {};  // stops the current view's timers and streams

// --- API ---------------------------------------------------------------------------------

class Unauthorized extends Error {}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path, options = {}) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.detail || `HTTP ${response.status} on ${path}`);
  }
  return response.json();
}

function askForToken() {
  const form = document.getElementById("token-form");
  form.hidden = false;
  document.getElementById("token-input").focus();
}

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value);
  e.target.hidden = true;
  route();
});
document.getElementById("token-button").addEventListener("click", askForToken);

function showError(err) {
  if (err instanceof Unauthorized) return askForToken();
  const box = document.getElementById("error");
  box.textContent = String(err.message || err);
  box.hidden = false;
}

function clearError() { document.getElementById("error").hidden = true; }

// --- DOM helpers -------------------------------------------------------------------------

// h("td", {class: "x"}, "text", child): text is always set as text, never parsed as HTML.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v);
  }
  for (const c of children) el.append(c instanceof Node ? c : String(c ?? ""));
  return el;
}

const fmt = {
  num: (v, d = 4) => (v === null || v === undefined ? "" : Number(v).toPrecision(d)),
  bytes: (n) => (n > 1e9 ? `${(n / 1e9).toFixed(2)} GB` : n > 1e6 ? `${(n / 1e6).toFixed(1)} MB`
    : `${(n / 1e3).toFixed(1)} kB`),
  time: (iso) => (iso ? new Date(iso).toLocaleString() : ""),
};

function stateBadge(state) { return h("span", { class: `state ${state}`, "data-state": state }, state); }

function progressCell(progress) {
  const total = progress.total_steps;
  return h("span", {}, h("progress", { max: total || 1, value: progress.step || 0 }),
    ` ${progress.step || 0}${total ? ` / ${total}` : ""}`);
}

// --- runs table --------------------------------------------------------------------------

async function showRuns() {
  const table = h("table", { id: "runs" });
  view.replaceChildren(h("h2", {}, "Runs"), table);
  const render = async () => {
    const page = await api("/runs?limit=100");
    table.replaceChildren(h("tr", {}, ...["run", "kind", "experiment", "state", "progress",
      "created", "worker"].map((c) => h("th", {}, c))),
      ...page.items.map((r) => h("tr", { "data-run": r.id },
        h("td", {}, h("a", { href: `#/runs/${r.id}` }, r.id)), h("td", {}, r.kind),
        h("td", {}, r.experiment), h("td", {}, stateBadge(r.state)),
        h("td", {}, progressCell(r.progress)), h("td", {}, fmt.time(r.created_at)),
        h("td", {}, r.worker_id || ""))));
  };
  await render();
  const timer = setInterval(() => render().catch(showError), REFRESH_MS);
  return () => clearInterval(timer);
}

// --- run page: live charts from the event stream -----------------------------------------

const CHARTS = [
  { id: "loss", title: "Loss", series: [["loss", "train loss", "#1f6feb"], ["val_loss", "val loss", "#d9480f"]] },
  { id: "lr", title: "Learning rate", series: [["lr_muon", "Muon", "#2f9e44", "muon"], ["lr_adamw", "AdamW", "#7048e8", "adamw"]] },
  { id: "tps", title: "Tokens / s", series: [["tokens_per_sec", "tokens/s", "#0c8599"]] },
];

function buildChart(spec, width) {
  const scales = { x: { time: false } };
  const axes = [{ label: "step" }];
  const small = (u, vals) => vals.map((v) => (v === 0 ? "0" : v.toExponential(1)));
  spec.series.forEach(([, , stroke, scale], i) => {
    // Muon's and AdamW's lrs differ ~70x: each gets its own axis, left and right.
    if (scale) axes.push({ scale, side: i ? 1 : 3, stroke, values: small, size: 70 });
  });
  if (axes.length === 1) axes.push({ size: 60 });
  const opts = {
    width, height: 240, scales, axes,
    series: [{ label: "step" }, ...spec.series.map(([, label, stroke, scale]) => ({
      label, stroke, spanGaps: true, points: { show: label.startsWith("val") },
      ...(scale ? { scale } : {}) }))],
  };
  return new uPlot(opts, [[], ...spec.series.map(() => [])], document.getElementById(`chart-${spec.id}`));
}

class RunCharts {
  constructor(width) {
    this.steps = [];  // x values; one entry per train or benchmark-measure step
    this.data = Object.fromEntries(CHARTS.map((c) => [c.id, c.series.map(() => [])]));
    this.plots = CHARTS.map((c) => [c, buildChart(c, width)]);
    this.pending = false;
  }

  add(m) {
    if (m.kind === "train" || m.kind === "measure") {
      this.steps.push(m.step);
      for (const c of CHARTS) c.series.forEach(([key], i) => this.data[c.id][i].push(m[key] ?? null));
    } else if (m.kind === "val" && this.steps.length) {
      const i = this.steps.lastIndexOf(m.step);
      if (i >= 0) this.data.loss[1][i] = m.val_loss;
    }
    if (!this.pending) {  // redraw at most once a frame, however fast events arrive
      this.pending = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  draw() {
    this.pending = false;
    for (const [c, plot] of this.plots) {
      plot.setData([this.steps, ...this.data[c.id]]);
      document.getElementById(`chart-${c.id}`).dataset.points = String(this.steps.length);
    }
  }
}

// Reads `text/event-stream` frames from a fetch() body; calls onFrame(type, data, id).
async function readEventStream(path, lastId, onFrame, signal) {
  const headers = { ...authHeaders(), ...(lastId ? { "Last-Event-ID": String(lastId) } : {}) };
  const response = await fetch(path, { headers, signal });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) throw new Error(`HTTP ${response.status} on ${path}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const fields = { event: "message", data: [], id: null };
      for (const line of frame.split("\n")) {
        if (line.startsWith(":")) continue;
        const at = line.indexOf(":");
        const [k, v] = [line.slice(0, at), line.slice(at + 1).replace(/^ /, "")];
        if (k === "data") fields.data.push(v); else if (k === "event" || k === "id") fields[k] = v;
      }
      if (fields.event === "end") return true;
      if (fields.data.length) onFrame(fields.event, JSON.parse(fields.data.join("\n")), fields.id);
    }
  }
}

// bpb: the latest validation's bits per byte, where the run's data says how many bytes a
// token is (the figure that compares runs with different tokenizers); null otherwise.
function summary(run, bpb) {
  const item = (label, value) => h("div", {}, h("span", {}, label), value);
  return h("div", { class: "summary" }, item("state", stateBadge(run.state)),
    item("kind", run.kind), item("experiment", run.experiment),
    item("progress", progressCell(run.progress)), item("attempt", run.attempt),
    item("worker", run.worker_id || "-"), item("created", fmt.time(run.created_at)),
    ...(bpb === null ? [] : [item("val bits/byte", h("span", { class: "bpb" }, fmt.num(bpb)))]));
}

async function showRun(runId) {
  let run = await api(`/runs/${encodeURIComponent(runId)}`);
  let bpb = null;
  const head = h("div", { id: "run-summary" }, summary(run, bpb));
  const outcome = h("pre", { id: "run-outcome" });
  const logs = h("pre", { id: "run-logs" });
  view.replaceChildren(
    h("h2", {}, `Run ${run.id}`),
    head,
    h("div", { class: "charts" }, ...CHARTS.map((c) =>
      h("div", { class: "chart" }, h("h3", {}, c.title), h("div", { id: `chart-${c.id}`, "data-points": "0" })))),
    h("h3", {}, "Result"), outcome, h("h3", {}, "Log"), logs);
  const charts = new RunCharts(Math.max(360, (view.clientWidth - 48) / 2));
  const controller = new AbortController();
  const refresh = async () => {
    run = await api(`/runs/${encodeURIComponent(runId)}`);
    head.replaceChildren(summary(run, bpb));
    outcome.textContent = run.error || (run.result ? JSON.stringify(run.result, null, 2) : "");
  };
  const onMetrics = (m) => {
    charts.add(m);
    if (typeof m.val_bits_per_byte === "number") {
      bpb = m.val_bits_per_byte;
      head.replaceChildren(summary(run, bpb));
    }
  };
  let lastId = 0;
  const follow = async () => {
    for (let attempt = 0; attempt < 30 && !controller.signal.aborted; attempt++) {
      try {
        const ended = await readEventStream(`/runs/${encodeURIComponent(runId)}/events`, lastId,
          (type, event, id) => {
            lastId = Number(id) || lastId;
            if (type === "metrics") onMetrics(event.data);
            else if (type === "log") logs.append(`${event.data.level}: ${event.data.message}\n`);
            else if (type === "state") refresh().catch(showError);
          }, controller.signal);
        if (ended) return refresh();
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof Unauthorized) return showError(err);
      }
      await new Promise((r) => setTimeout(r, 1000));  // the stream dropped: resume after lastId
    }
  };
  refresh().catch(showError);
  follow().catch(showError);
  const timer = setInterval(() => refresh().catch(showError), REFRESH_MS);
  return () => { controller.abort(); clearInterval(timer); };
}

// --- checkpoints -------------------------------------------------------------------------

// With a token, a plain link cannot carry the header: fetch the file and hand the browser a
// blob. That holds the file in memory; for multi-GB weights `trainctl checkpoints download`
// resumes and verifies.
function downloadLink(c, f) {
  const url = `/checkpoints/${c.experiment}/${c.tag}/files/${f.name}`;
  return h("a", { href: url, download: f.name, onclick: async (e) => {
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    e.preventDefault();
    const response = await fetch(url, { headers: authHeaders() });
    if (!response.ok) return showError(new Error(`download failed: HTTP ${response.status}`));
    const blob = URL.createObjectURL(await response.blob());
    h("a", { href: blob, download: f.name }).click();
    setTimeout(() => URL.revokeObjectURL(blob), 60000);
  } }, f.name);
}

function pruneForm(experiment, rerender) {
  const keep = h("input", { type: "number", min: 0, value: 2, "aria-label": "keep last" });
  const best = h("input", { type: "checkbox", checked: true });
  const result = h("span", { class: "prune-result" });
  const prune = async (dryRun) => {
    const body = { experiment, keep_last: Number(keep.value), keep_best: best.checked, dry_run: dryRun };
    if (!dryRun && !confirm(`Delete old checkpoints of ${experiment}, keeping the last ${keep.value}?`)) return;
    const out = await api("/checkpoints/prune", { method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json" } });
    const tags = out.deleted.map((c) => c.tag).join(", ") || "nothing";
    result.textContent = dryRun ? `would delete: ${tags}` : `deleted: ${tags}`;
    if (!dryRun) await rerender();
  };
  return h("div", { class: "prune", "data-experiment": experiment },
    h("strong", {}, experiment), "keep last", keep, h("label", {}, best, " keep best"),
    h("button", { type: "button", onclick: () => prune(true).catch(showError) }, "Preview"),
    h("button", { type: "button", class: "prune-button", onclick: () => prune(false).catch(showError) }, "Prune"),
    result);
}

async function showCheckpoints() {
  const body = h("div", { id: "checkpoints" });
  view.replaceChildren(h("h2", {}, "Checkpoints"), body);
  const render = async () => {
    const { items } = await api("/checkpoints");
    const experiments = [...new Set(items.map((c) => c.experiment))];
    body.replaceChildren(...experiments.flatMap((exp) => [
      pruneForm(exp, render),
      h("table", { "data-experiment": exp },
        h("tr", {}, ...["tag", "step", "best loss", "size", "created", "run", "files"].map((c) => h("th", {}, c))),
        ...items.filter((c) => c.experiment === exp).map((c) => h("tr", { "data-tag": c.tag },
          h("td", {}, c.tag), h("td", {}, c.step ?? ""), h("td", {}, fmt.num(c.best_loss)),
          h("td", {}, fmt.bytes(c.size_bytes)), h("td", {}, fmt.time(c.created_at)),
          h("td", {}, c.run_id ? h("a", { href: `#/runs/${c.run_id}` }, c.run_id) : ""),
          h("td", { class: "files" }, ...c.files.map((f) => downloadLink(c, f)))))),
    ]));
    if (!items.length) body.append(h("p", {}, "No checkpoints yet."));
  };
  await render();
  return () => {};
}

// --- routing -----------------------------------------------------------------------------

async function route() {
  leaveView();
  leaveView = () => {};
  clearError();
  const hash = location.hash || "#/runs";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  }
  try {
    const runMatch = hash.match(/^#\/runs\/([^/]+)$/);
    if (runMatch) leaveView = await showRun(decodeURIComponent(runMatch[1]));
    else if (hash.startsWith("#/checkpoints")) leaveView = await showCheckpoints();
    else leaveView = await showRuns();
  } catch (err) {
    showError(err);
  }
}

window.addEventListener("hashchange", route);
route();
