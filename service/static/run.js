// The run page: summary, live charts, the result in words, the validation history, eval
// scores, the model's samples, the log, and buttons to cancel an active run or resume a
// stopped train run. Forks (docs/design/forks.md, "Forks"): a parent's loss chart marks where
// each fork branched, linking to it, and a fork's summary names its parent and fork step.
//
// A long run is not replayed event by event: the page reads the down-sampled metrics
// (?max_points) and the log once, then follows the event stream from the last metrics event.
// A run that writes samples is the exception: no route lists its past `sample` events, so its
// stream starts at the beginning and the metrics and lines already shown are skipped.

import { LR_PREFIX, api, followRun, lrNames, metricRow, postJson, runPath } from "./api.js";
import { fmt, h, progressCell, showError, stateBadge, tableWrap } from "./dom.js";
import { FittedChart } from "./charts.js";
import { EvalScores, evalId, evalLabel, evalRange } from "./evals.js";
import { compareHash } from "./compare.js";
import { describeResult } from "./result.js";
import { samplesFor } from "./samples.js";

const REFRESH_MS = 2000;
const MAX_POINTS = 3000;  // the charts' resolution: a few per pixel of the widest chart
const ACTIVE = new Set(["queued", "running"]);
const RESUMABLE = new Set(["failed", "cancelled"]);

// The lr chart has a series per optimizer, `lr/<name>` in the metrics: which ones, the run's
// optimizer kind decides (store/training/optim.py), so they are added as they first appear.
const LR_COLORS = ["#2f9e44", "#7048e8", "#e8590c", "#1098ad"];
const CHARTS = [
  { id: "loss", title: "Loss", series: [["loss", "train loss", "#1f6feb"], ["val_loss", "val loss", "#d9480f"]] },
  { id: "lr", title: "Learning rate", series: [] },
  { id: "tps", title: "Tokens / s", series: [["tokens_per_sec", "tokens/s", "#0c8599"]] },
];

function chartOptions(spec, forks = [], health = null) {
  const axes = [{ label: "step", values: (u, vals) => vals.map(fmt.compact) }];
  spec.series.forEach(([, , stroke, scale], i) => {
    // Muon's and AdamW's lrs differ ~70x: each optimizer's has a scale of its own, the first
    // two an axis each, left and right.
    if (scale && i < 2) axes.push({ scale, side: i ? 1 : 3, stroke, values: (u, vals) => vals.map(fmt.compact), size: 56 });
  });
  if (axes.length === 1) axes.push({ size: 56, values: (u, vals) => vals.map(fmt.compact) });
  return {
    scales: { x: { time: false }, ...(spec.range ? { y: { range: spec.range } } : {}) }, axes,
    series: [{ label: "step" }, ...spec.series.map(([, label, stroke, scale]) => ({
      label, stroke, spanGaps: true, points: { show: Boolean(spec.points) || label.startsWith("val") },
      ...(scale ? { scale } : {}) }))],
    plugins: spec.id === "loss"
      ? [...(forks.length ? [forkMarkers(forks)] : []), ...(health ? [health.plugin] : [])] : [],
  };
}

// A mark on the loss chart at each loss-health intervention (docs/design/health.md): a line at
// the step, coloured by the action (a rewind's, a skip's, a logged spike's), titled with the
// log line that reported it. Interventions arrive with the log, after the chart is made, so the
// plugin keeps them and adds a mark to the chart it drew, if any yet.
function healthMarkers() {
  const records = [];
  let plot = null;
  let marks = [];
  const make = (u, r) => {
    const mark = h("div", { class: `health-marker ${r.action}`, "data-step": r.step,
      "data-action": r.action, title: r.message });
    u.over.after(mark);
    return [r.step, mark];
  };
  const place = (u) => {
    const { offsetLeft: left, offsetTop: top, clientWidth: width, clientHeight: height } = u.over;
    for (const [step, mark] of marks) {
      const x = u.valToPos(step, "x");
      mark.hidden = !(Number.isFinite(x) && x >= 0 && x <= width);
      Object.assign(mark.style, { left: `${left + x}px`, top: `${top}px`, height: `${height}px` });
    }
  };
  return {
    // r: a log line's `health` record, with the line's message.
    add(r) {
      records.push(r);
      if (!plot) return;
      marks.push(make(plot, r));
      place(plot);
    },
    plugin: { hooks: {
      init: [(u) => { plot = u; marks = records.map((r) => make(u, r)); }],
      draw: [place],
    } },
  };
}

// A marker on the loss chart at each fork's step: a dashed line over the plotting area and,
// at its top, a link to the fork named by its branch (its experiment) and short id. Links are
// elements beside uPlot's cursor layer, not drawn on the canvas, so that they can be clicked.
// Forks of one step stack their labels; a label in the right half of the chart turns left,
// and is cut to the room it has, so that it never leaves the chart.
function forkMarkers(forks) {
  let marks = [];
  const place = (u) => {
    const { offsetLeft: left, offsetTop: top, clientWidth: width, clientHeight: height } = u.over;
    for (const [step, mark, link] of marks) {
      const x = u.valToPos(step, "x");
      mark.hidden = !(Number.isFinite(x) && x >= 0 && x <= width);
      if (mark.hidden) continue;
      const flip = x > width / 2;
      mark.classList.toggle("flip", flip);
      Object.assign(mark.style, { left: `${left + x}px`, top: `${top}px`, height: `${height}px` });
      link.style.maxWidth = `${Math.max(0, (flip ? x : width - x) - 4)}px`;
    }
  };
  return {
    hooks: {
      init: [(u) => {
        marks = forks.map((fork, i) => {
          const link = h("a", { href: `#/runs/${fork.id}`,
            title: `fork ${fork.short_id} from ${fork.parent.experiment}/${fork.parent.tag}` },
          fork.experiment, " ", h("span", { class: "short-id" }, fork.short_id));
          link.style.top = `${(i % 4) * 1.5}em`;
          const mark = h("div", { class: "fork-marker", "data-run": fork.id, "data-step": fork.parent.step },
            link);
          u.over.after(mark);
          return [fork.parent.step, mark, link];
        });
      }],
      draw: [place],
    },
  };
}

class RunCharts {
  // forks: the run's forks (GET /runs/{id}/lineage), marked on its loss chart.
  constructor(forks = []) {
    this.forks = forks;
    this.health = healthMarkers();
    this.steps = [];  // x values; one entry per train or benchmark-measure step
    this.specs = CHARTS.map((c) => ({ ...c, series: [...c.series] }));  // this run's series
    this.data = Object.fromEntries(this.specs.map((c) => [c.id, c.series.map(() => [])]));
    this.stale = new Set();  // charts whose series changed: made again at the next draw
    this.pending = false;
  }

  mount() { this.plots = new Map(this.specs.map((c) => [c.id, this.plot(c)])); }

  plot(spec) {
    const container = document.getElementById(`chart-${spec.id}`);
    container.replaceChildren();
    return new FittedChart(container, chartOptions(spec, this.forks, this.health),
      [[], ...spec.series.map(() => [])]);
  }

  // An optimizer's lr not seen before gets a series, empty for the steps before.
  learn(m) {
    const lr = this.specs.find((c) => c.id === "lr");
    for (const name of lrNames(m)) {
      const key = `${LR_PREFIX}${name}`;
      if (lr.series.some(([k]) => k === key)) continue;
      lr.series.push([key, name, LR_COLORS[lr.series.length % LR_COLORS.length], key]);
      this.data.lr.push(this.steps.map(() => null));
      this.stale.add(lr);
    }
  }

  add(m) {
    if (m.kind === "train" || m.kind === "measure") {
      this.learn(m);
      this.steps.push(m.step);
      for (const c of this.specs) c.series.forEach(([key], i) => this.data[c.id][i].push(m[key] ?? null));
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
    for (const spec of this.stale) {
      this.plots.get(spec.id).destroy();
      this.plots.set(spec.id, this.plot(spec));
    }
    this.stale.clear();
    for (const c of this.specs) {
      this.plots.get(c.id).setData([this.steps, ...this.data[c.id]]);
      document.getElementById(`chart-${c.id}`).dataset.points = String(this.steps.length);
    }
  }

  destroy() { for (const plot of this.plots?.values() ?? []) plot.destroy(); }
}

// A run's eval scores: a table per checkpoint step among the panels and an "eval vs step"
// chart per task metric below the charts, both made when the first score arrives (a run
// without scores shows neither). Scores come rarely, often after the run ended: the charts are
// made again whenever a task metric is new.
class EvalSection {
  constructor(charts, panels) {
    this.scores = new EvalScores();
    this.charts = charts;  // the run's charts, which the eval charts follow
    this.panels = panels;
    this.plots = new Map();
    this.pending = false;
  }

  add(m) {
    if (!this.scores.add(m) || this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.draw());
  }

  draw() {
    this.pending = false;
    if (!this.table) {
      this.table = h("div", { class: "table-wrap" });
      this.panels.append(h("section", { class: "panel" }, h("h3", {}, "Eval scores"), this.table));
      this.box = h("div", { class: "charts", id: "run-eval-charts" });
      this.charts.after(this.box);
    }
    this.table.replaceChildren(this.scores.table());
    const keys = this.scores.keys;
    if (keys.join() !== [...this.plots.keys()].join()) this.layout(keys);
    for (const [key, plot] of this.plots) {
      const [steps, values] = this.scores.series(key);
      plot.setData([steps, values]);
      const scored = values.filter((v) => v !== null).length;
      document.getElementById(`chart-${evalId(key)}`).dataset.points = String(scored);
    }
  }

  layout(keys) {
    this.destroy();
    const cards = keys.map((key) => h("div", { class: "chart" }, h("h3", {}, `eval: ${evalLabel(key)}`),
      h("div", { class: "plot", id: `chart-${evalId(key)}`, "data-points": "0" })));
    this.box.replaceChildren(...cards);
    this.plots = new Map(keys.map((key, i) => {
      const spec = { id: evalId(key), series: [[key, evalLabel(key), "#7048e8"]], points: true,
        range: evalRange(key) };
      return [key, new FittedChart(cards[i].querySelector(".plot"), chartOptions(spec), [[], []])];
    }));
  }

  destroy() {
    for (const plot of this.plots.values()) plot.destroy();
    this.plots = new Map();
  }
}

// Where the service mirrors the run to Weights & Biases, a link to its W&B page.
// bpb: the latest validation's bits per byte, where the run's data says how many bytes a
// token is (the figure that compares runs with different tokenizers); null otherwise. A
// queued run that no live worker can take says why, on a line of its own.
function summary(run, bpb, watch = {}) {
  const item = (label, value, attrs = {}) => h("div", attrs, h("span", {}, label), value);
  return h("div", { class: "summary" }, item("state", stateBadge(run.state)),
    item("kind", run.kind), item("experiment", run.experiment),
    item("progress", progressCell(run.progress)), item("attempt", run.attempt),
    item("priority", run.priority, { id: "run-priority" }),
    item("worker", run.worker_id || "-"), item("created", fmt.time(run.created_at)),
    ...(run.parent ? parentItems(run.parent, item) : []),
    ...(bpb === null ? [] : [item("val bits/byte", h("span", { class: "bpb" }, fmt.num(bpb)))]),
    ...((run.jobs || []).length ? [item("jobs", jobsText(run.jobs), { id: "run-jobs" })] : []),
    ...(run.wandb_url ? [item("W&B", h("a", { href: run.wandb_url, target: "_blank", rel: "noopener" },
      "run page"), { id: "run-wandb" })] : []),
    ...(run.waiting_reason ? [item("why it waits", run.waiting_reason,
      { id: "run-waiting", class: "waiting" })] : []),
    ...watchItems(watch, item));
}

// What the hang and straggler watches reported (docs/design/hangs.md): the stragglers as of
// the last report, and the hangs that stopped an attempt.
function watchItems(watch, item) {
  const items = [];
  if (watch.straggler) {
    const { slowdowns, nodes = {}, avoid_nodes: avoid = [], step } = watch.straggler;
    const slow = Object.entries(slowdowns);
    const on = (rank) => (nodes[rank] ? ` on ${nodes[rank]}` : "");
    const text = slow.length
      ? slow.map(([rank, x]) => `rank ${rank}${on(rank)} +${Math.round(x * 100)} %`).join(", ")
      : "none";
    const avoids = avoid?.length ? `; the next attempt avoids ${avoid.join(", ")}` : "";
    items.push(item("stragglers", `${text} (step ${fmt.int(step)}${avoids})`,
      { id: "run-stragglers", class: slow.length ? "waiting" : "" }));
  }
  if (watch.hangs?.length) {
    const last = watch.hangs.at(-1);
    items.push(item("hangs", `${watch.hangs.length} (last: rank ${last.ranks[0]} after step ${last.step})`,
      { id: "run-hangs", class: "waiting" }));
  }
  return items;
}

// The scheduler jobs a run's attempts ran in (a Slurm backend's), newest first: id, state,
// nodes, as squeue would name them.
function jobsText(jobs) {
  return [...jobs].reverse().map((j) =>
    `${j.backend} ${j.job_id} ${j.state.toLowerCase()}${j.nodes ? ` on ${j.nodes}` : ""}`).join(", ");
}

// A fork's parent checkpoint, a link to the run that saved it (where its metadata names one),
// and the step the fork branched at.
function parentItems(parent, item) {
  const name = `${parent.experiment}/${parent.tag}`;
  const checkpoint = parent.run_id ? h("a", { href: `#/runs/${parent.run_id}`, title: parent.run_id }, name)
    : name;
  return [item("forked from", checkpoint, { id: "run-parent" }),
    item("fork step", fmt.int(parent.step), { id: "run-fork-step" })];
}

// Every fork below a run, its forks' forks too, oldest first by generation.
const descendants = (forks) => forks.flatMap((f) => [f, ...descendants(f.forks)]);

// A parent's link to the compare view on it and its forks, aligned on global step.
function compareForks(run, forks) {
  if (!forks.length) return [];
  const runs = [run.id, ...descendants(forks).map((f) => f.id)];
  return [h("a", { id: "compare-forks", href: compareHash({ runs }),
    title: "This run and its forks on shared charts" }, `Compare with forks (${runs.length - 1})`)];
}

function validationTable(rows) {
  const hasBpb = rows.some((r) => typeof r.val_bits_per_byte === "number");
  const best = Math.min(...rows.map((r) => r.val_loss));
  const head = ["step", "val loss", "perplexity", ...(hasBpb ? ["bits/byte"] : []), "at"];
  return h("table", { id: "run-validation" },
    h("tr", {}, ...head.map((c) => h("th", {}, c))),
    ...rows.map((r) => h("tr", { "data-step": r.step ?? "", class: r.val_loss === best ? "best" : null },
      h("td", { class: "num" }, r.step === undefined ? "" : fmt.int(r.step)),
      h("td", { class: "num" }, fmt.num(r.val_loss)), h("td", { class: "num" }, fmt.num(r.val_ppl)),
      ...(hasBpb ? [h("td", { class: "num" }, fmt.num(r.val_bits_per_byte))] : []),
      h("td", {}, fmt.time(r.created_at)))));
}

// The run's plan as a request again, continuing from its experiment's latest checkpoint: the
// same route and body a client resumes with (POST /runs/train, "resume_from": "latest").
// The plan's resolved parts are the server's to fill in again: the model config (a request
// names the preset and its overrides) and the pinned datasets. A dataset the run named by its
// name is pinned as its folder, <data dir>/datasets/<name>; a request names it by name again,
// a mixture's datasets alike.
// A fork resumes as any run, from its own experiment's latest: its fork_from was its start.
const byName = (folder) => {
  const parts = folder.split("/");
  return parts.at(-2) === "datasets" ? parts.at(-1) : folder;
};

export function resumeRequest(spec) {
  const {
    model, dataset, datasets: ___, resume_from: _, fork_from: __,
    min_nnodes: minNodes, shrink_after_seconds: shrinkAfter, ...rest
  } = spec;
  // An elastic gang's plan spells its range as nnodes (its most) and min_nnodes; a request,
  // as nnodes {min, max, shrink_after_seconds} (docs/scaling.md, "Elastic gangs").
  if (minNodes != null) {
    rest.nnodes = { min: minNodes, max: spec.nnodes, shrink_after_seconds: shrinkAfter };
  }
  let data = spec.data;
  if (data.source === "dataset" && dataset) data = { ...data, dataset: byName(data.dataset) };
  if (data.source === "mixture" && data.mixture) {
    data = { ...data, mixture: data.mixture.map((s) => ({ ...s, dataset: byName(s.dataset) })) };
  }
  // A transformers architecture is named by its hf fields alone, a plug-in model by its name
  // and config (docs/models.md); the plan keeps each as the request gave it.
  const named = model.hf ? { hf: model.hf }
    : model.plugin ? { plugin: model.plugin }
    : { preset: model.preset, overrides: model.overrides };
  return { ...rest, data, model: named, resume_from: "latest" };
}

function actions(run, refresh) {
  const buttons = [];
  if (ACTIVE.has(run.state)) {
    buttons.push(h("button", { type: "button", id: "cancel-run", onclick: async (e) => {
      if (!confirm(`Cancel run ${run.id}? A running run stops at its next step.`)) return;
      e.target.disabled = true;
      await postJson(`${runPath(run.id)}/cancel`, {}).then(refresh).catch(showError);
    } }, "Cancel run"));
  }
  if (run.kind === "train" && RESUMABLE.has(run.state)) {
    buttons.push(h("button", { type: "button", id: "resume-run", onclick: async (e) => {
      e.target.disabled = true;  // one click, one run
      try {
        const resumed = await postJson("/runs/train", resumeRequest(run.spec));
        location.hash = `#/runs/${resumed.id}`;
      } catch (err) {
        e.target.disabled = false;
        showError(err);
      }
    }, title: `A new train run of ${run.experiment} from its latest checkpoint` },
    "Resume from latest checkpoint"));
  }
  return buttons;
}

export async function showRun(view, runId) {
  let run = await api(runPath(runId));
  // A train run's forks, as the page opens: they mark its loss chart.
  const forks = run.kind === "train" ? (await api(`${runPath(run.id)}/lineage`)).forks : [];
  let bpb = null;
  const valRows = [];
  const watch = { straggler: null, hangs: [] };
  const head = h("div", { id: "run-summary" }, summary(run, bpb, watch));
  // (refresh is defined below; a button calls it only once clicked)
  const bar = h("div", { id: "run-actions", class: "toolbar" },
    ...actions(run, () => refresh().catch(showError)), ...compareForks(run, forks));
  const result = h("div", { id: "run-result" }, describeResult(run));
  const samples = samplesFor(run);  // null for a run without samples
  const validation = h("div", { class: "table-wrap" }, h("p", { class: "hint" }, "No validation yet."));
  const logs = h("pre", { id: "run-logs" });
  const metered = run.kind !== "sample";  // a sample run writes no metrics: no charts for it
  const chartsBox = h("div", { class: "charts" }, ...CHARTS.map((c) =>
    h("div", { class: "chart" }, h("h3", {}, c.title),
      h("div", { class: "plot", id: `chart-${c.id}`, "data-points": "0" }))));
  const panels = h("div", { class: "panels" },
    h("section", { class: "panel" }, h("h3", {}, "Result"), result),
    ...(metered ? [h("section", { class: "panel" }, h("h3", {}, "Validation"), validation)] : []));
  view.replaceChildren(
    h("h2", { class: "run-title" }, `Run ${run.id}`),
    bar, head,
    ...(metered ? [chartsBox] : []),
    panels,
    ...(samples ? [samples.section] : []),
    h("h3", {}, "Log"), logs);
  const charts = metered ? new RunCharts(forks) : null;
  charts?.mount();
  const evals = metered ? new EvalSection(chartsBox, panels) : null;

  let barState = run.state;
  let shownResult = JSON.stringify([run.state, run.result, run.error]);
  const refresh = async () => {
    run = await api(runPath(runId));
    head.replaceChildren(summary(run, bpb, watch));
    // The buttons change with the state only: one replaced under the pointer loses its click.
    if (run.state !== barState) {
      barState = run.state;
      bar.replaceChildren(...actions(run, () => refresh().catch(showError)), ...compareForks(run, forks));
    }
    // Redrawn only when it changed: a redraw every REFRESH_MS would drop a text selection.
    const now = JSON.stringify([run.state, run.result, run.error]);
    if (now !== shownResult) {
      shownResult = now;
      result.replaceChildren(describeResult(run));
    }
    samples?.update(run);
  };
  const onMetrics = (m) => {
    charts?.add(m);
    evals?.add(m);
    if (m.kind === "val" && typeof m.val_loss === "number") {
      valRows.push(m);
      validation.replaceChildren(validationTable(valRows));
    }
    if (typeof m.val_bits_per_byte === "number") {
      bpb = m.val_bits_per_byte;
      head.replaceChildren(summary(run, bpb, watch));
    }
  };

  const past = await api(`${runPath(runId)}/metrics?max_points=${MAX_POINTS}`);
  past.items.forEach(onMetrics);
  // Read after the metrics, so it holds every log line up to the last metrics event; the
  // stream then starts there and skips the lines already shown.
  const { items: lines } = await api(`${runPath(runId)}/logs`);
  const shownLog = lines.length ? lines.at(-1).event_id : 0;
  logs.append(...lines.map((l) => `${l.level}: ${l.message}\n`));
  const onWatch = (line) => {
    if (!line.straggler && !line.hang) return;
    if (line.straggler) watch.straggler = line.straggler;
    if (line.hang) watch.hangs.push(line.hang);
    head.replaceChildren(summary(run, bpb, watch));
  };
  lines.forEach(onWatch);
  for (const l of lines) if (l.health) charts?.health.add({ ...l.health, message: l.message });
  const after = past.items.length ? past.items.at(-1).event_id : 0;

  const controller = new AbortController();
  const follow = followRun(runId, samples ? 0 : after, (type, event) => {
    if (type === "sample") return samples?.add(event.data);
    // A retried attempt writes its samples again, from the start.
    if (type === "state" && event.data.state === "running") samples?.restart();
    if (event.id <= after) return;  // shown already, from the metrics read above
    if (type === "metrics") onMetrics(metricRow(event));
    else if (type === "log" && event.id > shownLog) {
      logs.append(`${event.data.level}: ${event.data.message}\n`);
      onWatch(event.data);
      if (event.data.health) charts?.health.add({ ...event.data.health, message: event.data.message });
    }
    else if (type === "state") refresh().catch(showError);
  }, controller.signal);
  follow.then((ended) => ended && refresh()).catch(showError);
  refresh().catch(showError);
  const timer = setInterval(() => refresh().catch(showError), REFRESH_MS);
  return () => { controller.abort(); clearInterval(timer); charts?.destroy(); evals?.destroy(); };
}
