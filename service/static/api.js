// The REST API and the event streams, as the dashboard's views read them.
//
// Auth: when the server has a token, the first 401 asks for it; it is kept in sessionStorage
// (this tab only) and sent as a Bearer header. EventSource cannot send headers, so the event
// stream is read with fetch() and its frames parsed here, resuming with Last-Event-ID after
// a dropped connection.

export const TOKEN_KEY = "trainctl.token";

export class Unauthorized extends Error {}

export function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export async function api(path, options = {}) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) throw new Unauthorized();
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.detail || `HTTP ${response.status} on ${path}`);
  }
  return response.json();
}

export function postJson(path, body) {
  return api(path, { method: "POST", body: JSON.stringify(body),
    headers: { "Content-Type": "application/json" } });
}

export const runPath = (runId) => `/runs/${encodeURIComponent(runId)}`;

// Metric names of event logs from before optimizers were named, and their names now
// (store/training/optim.py, LEGACY_METRIC_NAMES). GET /runs/{id}/metrics renames them already;
// the event stream sends events as they were written.
const LEGACY_METRIC_NAMES = { lr_muon: "lr/muon", lr_adamw: "lr/adamw" };

// Each optimizer's learning rate is the metric `lr/<optimizer name>`.
export const LR_PREFIX = "lr/";

// A metrics row as GET /runs/{id}/metrics has it, from a stream's metrics event.
export function metricRow(event) {
  const row = { event_id: event.id, created_at: event.created_at };
  for (const [key, value] of Object.entries(event.data)) row[LEGACY_METRIC_NAMES[key] ?? key] = value;
  return row;
}

// The optimizer names of a row's learning rates, in the row's order: ["muon", "adamw"].
export function lrNames(row) {
  return Object.keys(row).filter((k) => k.startsWith(LR_PREFIX)).map((k) => k.slice(LR_PREFIX.length));
}

// Reads `text/event-stream` frames from a fetch() body; calls onFrame(type, data, id).
// Resolves true at the `end` frame of a finished run, false when the connection drops.
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

// Follows a run's events after event id `after` until the run ends or `signal` aborts,
// reconnecting after a drop from the last event seen. onEvent(type, event) gets each one.
// Resolves true when the run ended, false when it gave up or was stopped.
export async function followRun(runId, after, onEvent, signal) {
  let lastId = after;
  for (let attempt = 0; attempt < 30 && !signal.aborted; attempt++) {
    try {
      const ended = await readEventStream(`${runPath(runId)}/events`, lastId, (type, event, id) => {
        lastId = Number(id) || lastId;
        onEvent(type, event);
      }, signal);
      if (ended) return true;
    } catch (err) {
      if (signal.aborted) return false;
      if (err instanceof Unauthorized) throw err;
    }
    await new Promise((r) => setTimeout(r, 1000));  // the stream dropped: resume after lastId
  }
  return false;
}
