// DOM helpers, number formats and the error box every view shares.

import { Unauthorized } from "./api.js";

// h("td", {class: "x"}, "text", child): text is always set as text, never parsed as HTML.
// No `style` attributes: the Content-Security-Policy refuses them (set el.style instead).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v);
  }
  for (const c of children) el.append(c instanceof Node ? c : String(c ?? ""));
  return el;
}

// A wide table scrolls inside its own box, never the page (a phone is 390 px wide).
export const tableWrap = (table) => h("div", { class: "table-wrap" }, table);

// en-US whatever the browser's locale: the tests read these strings.
const grouped = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const significant = new Intl.NumberFormat("en-US", { maximumSignificantDigits: 5 });

export const fmt = {
  num: (v, d = 4) => (v === null || v === undefined ? "" : Number(v).toPrecision(d)),
  int: (v) => grouped.format(v),
  sig: (v) => significant.format(v),
  bytes: (n) => (n > 1e9 ? `${(n / 1e9).toFixed(2)} GB` : n > 1e6 ? `${(n / 1e6).toFixed(1)} MB`
    : `${(n / 1e3).toFixed(1)} kB`),
  time: (iso) => (iso ? new Date(iso).toLocaleString() : ""),
  duration: (s) => (s < 1 ? `${+(s * 1000).toPrecision(3)} ms` : s < 60 ? `${s.toFixed(1)} s` : s < 3600
    ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`
    : `${Math.floor(s / 3600)} h ${String(Math.round((s % 3600) / 60)).padStart(2, "0")} min`),
  // Axis ticks: 12k rather than 12,000; 3.0e-4 rather than 0.0003.
  compact: (v) => {
    const a = Math.abs(v);
    if (v === 0) return "0";
    if (a >= 1e9) return `${+(v / 1e9).toPrecision(3)}G`;
    if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
    if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
    if (a < 1e-2) return v.toExponential(1);
    return String(+v.toPrecision(3));
  },
};

// reason: why a queued run waits (its waiting_reason), shown on hover.
export function stateBadge(state, reason = null) {
  return h("span", { class: `state ${state}`, "data-state": state, title: reason }, state);
}

export function progressCell(progress) {
  const total = progress.total_steps;
  return h("span", { class: "progress" }, h("progress", { max: total || 1, value: progress.step || 0 }),
    ` ${progress.step || 0}${total ? ` / ${total}` : ""}`);
}

export function askForToken() {
  const form = document.getElementById("token-form");
  form.hidden = false;
  document.getElementById("token-input").focus();
}

export function showError(err) {
  if (err instanceof Unauthorized) return askForToken();
  const box = document.getElementById("error");
  box.textContent = String(err.message || err);
  box.hidden = false;
}

export function clearError() { document.getElementById("error").hidden = true; }
