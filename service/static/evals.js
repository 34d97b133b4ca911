// Eval scores: an evaluate run records each score as a field `eval/<task>/<metric>` of a
// metrics event of kind `eval`, at the step of the checkpoint it scored, on the train run that
// wrote that checkpoint (store/evals/tasks.py, docs/evals.md). The run page shows a run's scores as
// a table per checkpoint step and an "eval vs step" chart per task metric; the compare view
// overlays those curves across runs. A run without scores shows neither.

import { fmt, h } from "./dom.js";

export const EVAL_KIND = "eval";
const EVAL_PREFIX = `${EVAL_KIND}/`;

// The score fields of a metrics row: ["eval/arc_easy/acc", ...]; none for other kinds.
export function evalKeys(row) {
  return row.kind === EVAL_KIND ? Object.keys(row).filter((k) => k.startsWith(EVAL_PREFIX)) : [];
}

// "arc_easy/acc", the task metric a score field names.
export const evalLabel = (key) => key.slice(EVAL_PREFIX.length);

// A chart's id part: "eval-arc_easy-acc" (task and metric names are words).
export const evalId = (key) => key.replaceAll("/", "-");

// Accuracies are fractions: their charts span 0 to 1 (left to itself, uPlot spans a run's
// accuracy of 0 at every checkpoint from 0 to 100). null: the chart's own range.
const FRACTIONS = new Set(["acc", "acc_norm"]);
export const evalRange = (key) => (FRACTIONS.has(key.split("/").at(-1)) ? [0, 1] : null);

// One run's scores by checkpoint step. An evaluate run writes one event per task, and a
// checkpoint scored again replaces its earlier scores: the newest event of a field wins.
export class EvalScores {
  constructor() {
    this.byStep = new Map();
    this.keys = [];  // sorted: a task's metrics side by side
  }

  // Whether the row held scores.
  add(row) {
    const keys = evalKeys(row);
    if (!keys.length || typeof row.step !== "number") return false;
    const scores = this.byStep.get(row.step) ?? {};
    for (const key of keys) scores[key] = row[key];
    this.byStep.set(row.step, scores);
    this.keys = [...new Set([...this.keys, ...keys])].sort();
    return true;
  }

  get steps() { return [...this.byStep.keys()].sort((a, b) => a - b); }

  // uPlot's data for one field: the steps and the scores at them.
  series(key) {
    const steps = this.steps;
    return [steps, steps.map((s) => this.byStep.get(s)[key] ?? null)];
  }

  table() {
    return h("table", { id: "run-evals" },
      h("tr", {}, h("th", {}, "step"), ...this.keys.map((k) => h("th", {}, evalLabel(k)))),
      ...this.steps.map((step) => h("tr", { "data-step": step },
        h("td", { class: "num" }, fmt.int(step)),
        ...this.keys.map((k) => h("td", { class: "num" }, fmt.num(this.byStep.get(step)[k]))))));
  }
}
