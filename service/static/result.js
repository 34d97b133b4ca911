// A run's result in words: labelled values with units, instead of its raw JSON.
//
// Known keys get a label; any other key still shows, its unit read from its name (`_sec`,
// `_frac`, `bytes`, `tokens_per_sec`, `bits_per_byte`), so a field a worker adds later reads
// well without a change here.

import { fmt, h } from "./dom.js";
import { completionBody, completionText, promptLabel } from "./samples.js";

const LABELS = {
  step: "steps done",
  total_steps: "steps planned",
  stopped: "stopped early",
  final_loss: "final train loss",
  final_val_loss: "final validation loss",
  best_loss: "best validation loss",
  final_val_bits_per_byte: "final validation bits per byte",
  token_count: "tokens trained",
  total_tokens: "tokens",
  elapsed_sec: "elapsed",
  data_wait_frac: "time waiting for data",
  tokens_per_sec: "throughput",
  step_time_sec: "time per step",
  loss: "loss",
  ppl: "perplexity",
  bits_per_byte: "bits per byte",
  forward_shape: "forward output shape",
  experiment: "experiment",
  checkpoint: "checkpoint",
  generated_tokens: "generated",
};

export function formatValue(key, v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (Array.isArray(v)) return v.every((x) => typeof x === "number") ? v.join(" × ") : v.join(", ");
  if (typeof v !== "number") return String(v);
  if (key.endsWith("_sec") && key !== "tokens_per_sec") return fmt.duration(v);
  if (key.endsWith("_frac")) return `${(v * 100).toFixed(1)} %`;
  if (key.includes("per_sec")) return `${fmt.int(v)} ${key.split("_per_sec")[0].replaceAll("_", " ")}/s`;
  if (key.includes("bits_per_byte")) return `${v.toFixed(4)} bits/byte`;
  if (key === "bytes" || key.endsWith("_bytes")) return fmt.bytes(v);
  if (key.includes("token")) return `${fmt.int(v)} tokens`;
  return Number.isInteger(v) ? fmt.int(v) : fmt.sig(v);
}

export const label = (key) => LABELS[key] || key.replaceAll("_", " ").replaceAll(".", ": ");

// Nested objects (a validation's checkpoint) become "checkpoint: tag" rows; a train run's
// checkpoint is a tag already.
export function flatten(obj, prefix = "") {
  return Object.entries(obj).flatMap(([k, v]) => (v && typeof v === "object" && !Array.isArray(v)
    ? flatten(v, `${prefix}${k}.`) : [[`${prefix}${k}`, v]]));
}

// A sample run's completions: each prompt with its continuation, as text, and why it ended.
function completionList(completions) {
  return h("ol", { class: "completions" }, ...completions.map((c, i) => h("li", { "data-index": i },
    completionText(promptLabel(c), completionBody(c)),
    h("span", { class: "sample-finish", "data-finish": c.finish_reason ?? "" },
      `${fmt.int((c.token_ids || []).length)} tokens, ended: ${c.finish_reason}`))));
}

export function describeResult(run) {
  const parts = [];
  if (run.error) parts.push(h("p", { class: "run-error", role: "status" }, run.error));
  if (run.result) {
    const { completions, ...rest } = run.result;
    const rows = flatten(rest);
    // step and total_steps read best as one "40 / 40".
    const steps = run.result.total_steps !== undefined && run.result.step !== undefined;
    parts.push(h("dl", { class: "result" }, ...rows
      .filter(([k]) => !(steps && k === "total_steps"))
      .flatMap(([k, v]) => [
        h("dt", {}, steps && k === "step" ? "steps" : label(k)),
        h("dd", { "data-key": k }, steps && k === "step"
          ? `${fmt.int(v)} / ${fmt.int(run.result.total_steps)}` : formatValue(k.split(".").at(-1), v)),
      ])));
    if (Array.isArray(completions)) parts.push(completionList(completions));
  }
  if (!parts.length) parts.push(h("p", { class: "hint" }, `No result yet: the run is ${run.state}.`));
  return h("div", {}, ...parts);
}
