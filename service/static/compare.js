// The compare view: several runs' curves overlaid, one colour per run, and their settings side
// by side with the differences marked. A parent and its forks (the run page's "compare with
// forks") line up by themselves: a fork's steps and tokens go on from its parent's.
//
// The URL holds the whole view (#/compare?runs=a,b&x=tokens&log=1&smooth=0.6), so a
// comparison can be shared or reloaded. Each run's history comes down-sampled
// (?max_points); a live run then follows its event stream from its last metrics event.

import { LR_PREFIX, Unauthorized, api, followRun, lrNames, metricRow, runPath } from "./api.js";
import { fmt, h, showError, stateBadge, tableWrap } from "./dom.js";
import { FittedChart, PALETTE, ema, joinTables } from "./charts.js";
import { flatten, formatValue, label } from "./result.js";
import { EVAL_KIND, evalId, evalKeys, evalLabel, evalRange } from "./evals.js";

const MAX_POINTS = 2000;
const ACTIVE = new Set(["queued", "running"]);
const X_AXES = { step: "step", tokens: "tokens", time: "wall time" };
const STEP_KINDS = ["train", "measure"];  // a benchmark measures steps as a train run logs them

// smooth: whether the smoothing control applies (not to lrs: a schedule is smooth already).
const LOSS_CHARTS = [
  { id: "loss", title: "Train loss", kinds: STEP_KINDS, key: "loss", smooth: true },
  { id: "val_loss", title: "Validation loss", kinds: ["val"], key: "val_loss", smooth: true, points: true },
  { id: "val_bpb", title: "Validation bits per byte", kinds: ["val"], key: "val_bits_per_byte",
    smooth: true, points: true, optional: true },
];
const SPEED_CHARTS = [
  { id: "tps", title: "Tokens / s", kinds: STEP_KINDS, key: "tokens_per_sec", smooth: true },
];

// Between them, an "eval vs step" chart per task metric that any of the runs was scored on
// (evals.js), points at the steps of the checkpoints scored, sorted; and a learning-rate chart
// per optimizer that any of the runs has (`lr/<name>`: the runs' optimizer kinds decide,
// store/training/optim.py), in the order they first appear.
function chartsFor(curves) {
  const scores = [...new Set(curves.flatMap((c) => [...c.evals]))].sort();
  const evals = scores.map((key) => ({ id: evalId(key), title: `eval: ${evalLabel(key)}`,
    kinds: [EVAL_KIND], key, points: true, sorted: true, range: evalRange(key) }));
  const names = [...new Set(curves.flatMap((c) => [...c.lrs]))];
  const lrs = names.map((name) => ({ id: `lr_${name}`, title: `Learning rate: ${name}`,
    kinds: ["train"], key: `${LR_PREFIX}${name}` }));
  return [...LOSS_CHARTS, ...evals, ...lrs, ...SPEED_CHARTS];
}

// The settings rows come in this order (prefixes of the plan's dotted keys); others follow.
const SETTING_ORDER = ["experiment", "steps", "model.preset", "model.overrides", "model.config.",
  "batch.", "optimizer.", "schedule.", "data.", "dataset.", "seed", "device", "nproc_per_node",
  "resume_from", "checkpoint_every", "val_every", "log_every"];
// What the table shows unless "all settings" is ticked; a setting outside it that differs
// between the runs shows anyway.
const KEY_SETTINGS = new Set(["kind", "state", "experiment", "steps", "model.preset",
  "model.config.d_model", "model.config.n_layers", "model.config.n_heads", "model.config.n_kv_heads",
  "model.config.ffn_hidden", "model.config.vocab_size", "batch.micro_batch_size",
  "batch.grad_accum_steps", "batch.seq_len", "batch: tokens per step", "optimizer.kind",
  "optimizer.muon_lr", "optimizer.adamw_lr", "optimizer.muon_weight_decay", "optimizer.adamw_weight_decay",
  "optimizer.grad_clip", "schedule.warmup_frac", "schedule.stable_frac", "schedule.decay",
  "schedule.min_lr_ratio", "data.source", "data.dataset", "data.paths", "seed", "device",
  "nproc_per_node", "resume_from.experiment", "resume_from.tag"]);
const RESULT_KEYS = ["final_loss", "best_loss", "final_val_bits_per_byte", "token_count", "elapsed_sec"];

export function compareHash({ runs, x = "step", log = false, smooth = 0 }) {
  const parts = [`runs=${runs.map(encodeURIComponent).join(",")}`];
  if (x !== "step") parts.push(`x=${x}`);
  if (log) parts.push("log=1");
  if (smooth) parts.push(`smooth=${smooth}`);
  return `#/compare?${parts.join("&")}`;
}

function readState(params) {
  const x = params.get("x") in X_AXES ? params.get("x") : "step";
  const smooth = Math.min(0.99, Math.max(0, Number(params.get("smooth")) || 0));
  const runs = [...new Set((params.get("runs") || "").split(",").filter(Boolean))];
  return { runs, x, log: params.get("log") === "1", smooth };
}

const tokensPerStep = (spec) => (spec.batch
  ? spec.batch.micro_batch_size * spec.batch.grad_accum_steps * spec.batch.seq_len : null);

// One run's metrics rows and how to place them on each x axis.
class Curve {
  constructor(run, color) {
    this.run = run;
    this.color = color;
    this.rows = [];
    this.lrs = new Set();  // the names of its optimizers, from its metrics
    this.evals = new Set();  // its score fields, eval/<task>/<metric>
  }

  get lastId() { return this.rows.length ? this.rows.at(-1).event_id : 0; }

  add(row) {
    this.rows.push(row);
    for (const name of lrNames(row)) this.lrs.add(name);
    for (const key of evalKeys(row)) this.evals.add(key);
    const t = Date.parse(row.created_at);
    // Wall time counts from the run's start, or its first event if that came earlier (a
    // requeued run starts again).
    const start = this.run.started_at ? Date.parse(this.run.started_at) : t;
    this.t0 = Math.min(this.t0 ?? start, start, t);
  }

  x(row, axis) {
    if (axis === "step") return row.step ?? null;
    if (axis === "tokens") {
      // Val rows carry no token count: a step is the plan's tokens per step.
      const perStep = tokensPerStep(this.run.spec);
      return row.tokens ?? (row.step !== undefined && perStep ? row.step * perStep : null);
    }
    return (Date.parse(row.created_at) - this.t0) / 1000;
  }

  table(chart, view) {
    const points = [];
    for (const row of this.rows) {
      const x = this.x(row, view.x);
      const y = row[chart.key];
      if (!chart.kinds.includes(row.kind) || x === null || typeof y !== "number") continue;
      points.push([x, view.log && y <= 0 ? null : y]);  // a log axis has no place for 0
    }
    // Scores come as checkpoints are scored, in any order of their steps.
    if (chart.sorted) points.sort(([a], [b]) => a - b);
    const ys = points.map(([, y]) => y);
    return [points.map(([x]) => x), chart.smooth ? ema(ys, view.smooth) : ys];
  }

  count(kinds) { return this.rows.filter((r) => kinds.includes(r.kind)).length; }
}

const shortTime = (s) => (s < 120 ? `${+s.toFixed(1)}s` : s < 7200 ? `${+(s / 60).toFixed(1)}m`
  : `${+(s / 3600).toFixed(1)}h`);

function chartOptions(chart, curves, view) {
  const ticks = (u, vals) => vals.map(view.x === "time" ? shortTime : fmt.compact);
  return {
    legend: { show: false },  // one legend for all the charts, above them
    // A log axis has no 0 for a fraction's range to start at: it keeps its own.
    scales: { x: { time: false },
      y: { distr: view.log ? 3 : 1, ...(chart.range && !view.log ? { range: chart.range } : {}) } },
    axes: [{ label: X_AXES[view.x], values: ticks },
      { size: 56, values: (u, vals) => vals.map((v) => (v === null ? "" : fmt.compact(v))) }],
    series: [{ label: X_AXES[view.x] }, ...curves.map((c) => ({
      label: c.run.id, stroke: c.color, width: 1.5, spanGaps: true,
      points: { show: Boolean(chart.points) } }))],
  };
}

function legend(curves) {
  return curves.map((c) => {
    const swatch = h("span", { class: "swatch" });
    swatch.style.background = c.color;  // CSSOM, which the CSP allows (a style attribute it does not)
    const last = c.rows.filter((r) => STEP_KINDS.includes(r.kind)).at(-1);
    return h("li", { "data-run": c.run.id, "data-points": String(c.count(STEP_KINDS)) }, swatch,
      h("a", { href: `#/runs/${c.run.id}`, title: c.run.id }, c.run.id.slice(0, 8)),
      h("span", {}, c.run.experiment), stateBadge(c.run.state), ...forkOf(c.run),
      h("span", { class: "hint" }, last && typeof last.loss === "number" ? `loss ${fmt.num(last.loss)}` : ""));
  });
}

// A fork's parent checkpoint and the step it branched at, beside its name in the legend.
function forkOf(run) {
  if (!run.parent) return [];
  const { experiment, tag, step } = run.parent;
  return [h("span", { class: "fork-of", title: run.parent.run_id },
    `fork of ${experiment}/${tag} at step ${fmt.int(step)}`)];
}

function settingRows(curves) {
  const flat = curves.map((c) => new Map(flatten(c.run.spec).map(([k, v]) => [k, v])));
  const keys = [...new Set(flat.flatMap((m) => [...m.keys()]))];
  const rank = (k) => {
    const i = SETTING_ORDER.findIndex((p) => k === p || (p.endsWith(".") && k.startsWith(p))
      || k.startsWith(`${p}.`));
    return i < 0 ? SETTING_ORDER.length : i;
  };
  keys.sort((a, b) => rank(a) - rank(b));
  // 12 significant digits: 3e-4 * 0.1 reads 0.00003, not 0.000029999999999999997.
  const show = (v) => (v === undefined || v === null || (Array.isArray(v) && !v.length) ? "–"
    : Array.isArray(v) ? v.join(", ") : typeof v === "number" ? String(+v.toPrecision(12)) : String(v));
  const rows = [["kind", curves.map((c) => c.run.kind)], ["state", curves.map((c) => c.run.state)],
    ...keys.map((k) => [k, flat.map((m) => show(m.get(k)))])];
  const at = rows.findLastIndex(([k]) => k.startsWith("batch.")) + 1;
  rows.splice(at || rows.length, 0, ["batch: tokens per step",
    curves.map((c) => show(tokensPerStep(c.run.spec) ?? undefined))]);
  return rows;
}

function settingsTable(curves) {
  const head = h("tr", {}, h("th", {}, "setting"), ...curves.map((c) => {
    const swatch = h("span", { class: "swatch" });
    swatch.style.background = c.color;
    return h("th", { title: c.run.id }, swatch, c.run.id.slice(0, 8));
  }));
  const body = settingRows(curves).map(([key, values]) => {
    const differs = curves.length > 1 && new Set(values).size > 1;
    const extra = !differs && !KEY_SETTINGS.has(key) && !key.startsWith("model.overrides.");
    return h("tr", { "data-key": key, class: `${differs ? "differs" : "same"}${extra ? " extra" : ""}` },
      h("th", {}, key), ...values.map((v) => h("td", {}, v)));
  });
  // Outcomes differ by nature: listed below the settings, not marked.
  const results = RESULT_KEYS.map((k) => h("tr", { "data-key": `result.${k}`, class: "result" },
    h("th", {}, `result: ${label(k)}`),
    ...curves.map((c) => h("td", {}, c.run.result && k in c.run.result
      ? formatValue(k, c.run.result[k]) : "–"))));
  return [head, ...body, ...results];
}

export async function showCompare(view, params) {
  const state = readState(params);
  if (!state.runs.length) {
    view.replaceChildren(h("h2", {}, "Compare runs"), h("p", { id: "compare-empty" },
      "No runs picked: tick them in the ", h("a", { href: "#/runs" }, "runs table"), "."));
    return () => {};
  }
  // A run that is gone is left out, named in the error box; the others are compared.
  const found = await Promise.allSettled(state.runs.map((id) => api(runPath(id))));
  const failed = found.filter((f) => f.status === "rejected").map((f) => f.reason);
  const locked = failed.find((err) => err instanceof Unauthorized);
  if (locked) throw locked;  // the token form, then the view again
  if (failed.length) {
    const missing = state.runs.filter((id, i) => found[i].status === "rejected");
    showError(new Error(`cannot compare ${missing.join(", ")}: ${failed[0].message}`));
  }
  const curves = found.filter((f) => f.status === "fulfilled")
    .map((f, i) => new Curve(f.value, PALETTE[i % PALETTE.length]));
  await Promise.all(curves.map(async (c) => {
    const { items } = await api(`${runPath(c.run.id)}/metrics?max_points=${MAX_POINTS}`);
    items.forEach((row) => c.add(row));
  }));

  const legendList = h("ul", { id: "compare-legend" });
  const settings = h("table", { id: "compare-settings" });
  const chartsBox = h("div", { class: "charts" });
  let charts = [];
  let cards = [];
  const layout = () => {
    charts = chartsFor(curves);
    cards = charts.map((c) => h("div", { class: "chart", "data-chart": c.id },
      h("h3", {}, c.title), h("div", { class: "plot", id: `compare-${c.id}`, "data-points": "0" })));
    chartsBox.replaceChildren(...cards);
  };
  const sameCharts = () => chartsFor(curves).map((c) => c.id).join() === charts.map((c) => c.id).join();
  layout();
  const setUrl = () => history.replaceState(null, "", compareHash({ ...state, runs: curves.map((c) => c.run.id) }));
  const xSelect = h("select", { id: "compare-x", "aria-label": "x axis", onchange: () => {
    state.x = xSelect.value; setUrl(); build();
  } }, ...Object.entries(X_AXES).map(([v, text]) => h("option", { value: v, selected: v === state.x }, text)));
  const logBox = h("input", { type: "checkbox", id: "compare-log", checked: state.log, onchange: () => {
    state.log = logBox.checked; setUrl(); build();
  } });
  const smoothOut = h("output", { id: "compare-smooth-value" }, state.smooth.toFixed(2));
  const smooth = h("input", { type: "range", id: "compare-smooth", min: 0, max: 0.99, step: 0.01,
    value: state.smooth, "aria-label": "smoothing", oninput: () => {
      state.smooth = Number(smooth.value);
      smoothOut.textContent = state.smooth.toFixed(2);
      setUrl(); schedule();
    } });
  const diffOnly = h("input", { type: "checkbox", id: "compare-diff-only", onchange: () => {
    settings.classList.toggle("diff-only", diffOnly.checked);
  } });
  const allSettings = h("input", { type: "checkbox", id: "compare-all-settings", onchange: () => {
    settings.classList.toggle("all", allSettings.checked);
  } });

  view.replaceChildren(
    h("h2", {}, "Compare runs"),
    h("div", { id: "compare-controls", class: "toolbar" },
      h("label", {}, "x axis ", xSelect), h("label", {}, logBox, " log y"),
      h("label", {}, "smoothing ", smooth, " ", smoothOut)),
    legendList,
    chartsBox,
    h("div", { class: "toolbar" }, h("h3", {}, "Settings"),
      h("label", {}, diffOnly, " only differences"), h("label", {}, allSettings, " all settings")),
    tableWrap(settings));

  let plots = [];
  let pending = false;
  const draw = () => {
    pending = false;
    if (!sameCharts()) {  // a live run's first lr of an optimizer the others lack
      layout();
      build();
      return;
    }
    for (const [chart, plot, card] of plots) {
      const tables = curves.map((c) => c.table(chart, state));
      const points = tables.reduce((n, [xs]) => n + xs.length, 0);
      card.hidden = Boolean(chart.optional) && points === 0;  // bits per byte: where known
      plot.setData(joinTables(tables));
      card.querySelector(".plot").dataset.points = String(points);
    }
    legendList.replaceChildren(...legend(curves));
  };
  const schedule = () => {
    if (!pending) { pending = true; requestAnimationFrame(draw); }
  };
  // A new x axis or y scale needs new uPlot options: the plots are made again.
  const build = () => {
    for (const [, plot] of plots) plot.destroy();
    plots = charts.map((chart, i) => {
      const container = cards[i].querySelector(".plot");
      container.replaceChildren();
      return [chart, new FittedChart(container, chartOptions(chart, curves, state),
        joinTables(curves.map((c) => c.table(chart, state)))), cards[i]];
    });
    draw();
  };
  const renderSettings = () => settings.replaceChildren(...settingsTable(curves));
  build();
  renderSettings();

  const controller = new AbortController();
  for (const c of curves.filter((curve) => ACTIVE.has(curve.run.state))) {
    const refresh = async () => {
      c.run = await api(runPath(c.run.id));
      renderSettings();
      schedule();
    };
    followRun(c.run.id, c.lastId, (type, event) => {
      if (type === "metrics") { c.add(metricRow(event)); schedule(); }
      else if (type === "state") refresh().catch(showError);
    }, controller.signal).then((ended) => ended && refresh()).catch(showError);
  }
  return () => { controller.abort(); for (const [, plot] of plots) plot.destroy(); };
}
