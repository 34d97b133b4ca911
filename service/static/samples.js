// The model's output on the run page (issue 15): a train run's latest samples, with the
// earlier steps a select away, and a sample run's completions as their pieces stream in.
//
// Samples are model output: every piece of it is set as text (h() and textContent), never
// parsed as HTML, so a completion or a prompt holding markup shows as the characters it is.

import { fmt, h } from "./dom.js";

// One prompt and its continuation: the prompt muted, the completion after it, both in a
// monospace block that keeps the model's whitespace and wraps a long line inside the card.
export function completionText(prompt, text) {
  return h("pre", { class: "sample-text" },
    h("span", { class: "sample-prompt" }, prompt), h("span", { class: "sample-completion" }, text));
}

// A prompt given as token ids has no text to show: say how many ids it was.
export function promptLabel(completion) {
  if (typeof completion.prompt === "string") return completion.prompt;
  const ids = completion.prompt_tokens || [];
  return `[${fmt.int(ids.length)} prompt tokens] `;
}

// A completion whose tokenizer is unknown has ids only (a sample run given prompt_tokens).
export const completionBody = (c) => (typeof c.text === "string" ? c.text : (c.token_ids || []).join(" "));

const finishNote = (reason) => h("span", { class: "sample-finish", "data-finish": reason ?? "" },
  reason ? `ended: ${reason}` : "generating…");

// The finish note of a card, replaced (the card keeps the new one).
function setFinish(item, reason) {
  const note = finishNote(reason);
  item.finish.replaceWith(note);
  item.finish = note;
}

// A train run's samples: one card per prompt, showing the chosen step (the latest unless the
// user picked an earlier one). The loop writes one event per prompt, in the order of
// sample_prompts, at every sample step; a prompt listed twice is told apart by its occurrence
// within the step.
export class TrainSamples {
  constructor(run) {
    this.prompts = run.spec.sample_prompts || [];
    this.every = run.spec.sample_every;
    this.steps = [];             // steps that have samples, ascending
    this.byStep = new Map();     // step -> completions, by prompt position
    this.picked = null;          // a step the user chose; null follows the latest
    this.select = h("select", { id: "sample-step", "aria-label": "samples of step",
      onchange: () => { this.picked = this.select.value ? Number(this.select.value) : null; this.draw(); } });
    this.cards = h("div", { class: "samples" });
    this.section = h("section", { id: "run-samples", class: "panel", "data-kind": "train" },
      h("div", { class: "toolbar" }, h("h3", {}, "Latest samples"),
        h("label", {}, "step ", this.select)),
      this.cards);
    this.draw();
  }

  add(sample) {
    let row = this.byStep.get(sample.step);
    if (!row) {
      row = [];
      this.byStep.set(sample.step, row);
      this.steps.push(sample.step);
      this.steps.sort((a, b) => a - b);
      this.fillSelect();
    }
    const positions = this.prompts.flatMap((p, i) => (p === sample.prompt ? [i] : []));
    const seen = row.filter((s) => s && s.prompt === sample.prompt).length;
    // A prompt not in the plan (never expected) still shows, after the planned ones.
    // Seen already at this step: a retried attempt sampled the step again.
    const at = positions.length ? positions[seen % positions.length]
      : Math.max(this.prompts.length, row.length);
    row[at] = sample;
    this.drawSoon();
  }

  update() {}  // the samples come from the events alone
  restart() {}  // a retried attempt's samples replace those of the same step

  fillSelect() {
    const latest = this.steps.at(-1);
    this.select.replaceChildren(h("option", { value: "" }, `latest (${fmt.int(latest)})`),
      ...[...this.steps].reverse().map((s) => h("option", { value: s }, fmt.int(s))));
    this.select.value = this.picked === null ? "" : String(this.picked);
  }

  drawSoon() {  // a step's prompts arrive together: draw them once
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  draw() {
    const step = this.picked ?? this.steps.at(-1);
    this.select.disabled = this.steps.length < 2;
    if (step === undefined) {
      this.cards.replaceChildren(h("p", { class: "hint" },
        `No samples yet: the model is sampled every ${fmt.int(this.every)} steps and at the last.`));
      return;
    }
    const row = this.byStep.get(step);
    const count = Math.max(this.prompts.length, row.length);
    this.section.dataset.step = String(step);
    this.cards.replaceChildren(...Array.from({ length: count }, (_, i) => {
      const s = row[i];
      const prompt = s ? s.prompt : this.prompts[i];
      return h("article", { class: "sample", "data-index": i, "data-step": step },
        h("div", { class: "sample-head" }, h("span", { class: "sample-step" }, `step ${fmt.int(step)}`),
          s ? finishNote(s.finish_reason) : h("span", { class: "hint" }, "no sample at this step")),
        completionText(prompt, s ? s.completion : ""));
    }));
  }
}

// A sample run's completions as they are generated: each `sample` event appends its delta to
// completion `index`; the last one carries the finish reason. Once the run has its result,
// the result panel shows the completions whole (result.js) and this section steps aside.
export class StreamedCompletions {
  constructor(run) {
    const spec = run.spec;
    const prompts = spec.prompts || (spec.prompt_tokens || []).map((ids) => promptLabel({ prompt_tokens: ids }));
    this.items = prompts.map((prompt, i) => {
      const block = completionText(prompt, "");
      const finish = finishNote(null);
      const card = h("article", { class: "sample", "data-index": i },
        h("div", { class: "sample-head" }, h("span", { class: "sample-step" }, `prompt ${i + 1}`), finish),
        block);
      return { card, text: block.querySelector(".sample-completion"), finish };
    });
    this.section = h("section", { id: "run-samples", class: "panel", "data-kind": "sample" },
      h("h3", {}, "Completions"), h("div", { class: "samples" }, ...this.items.map((it) => it.card)));
    this.update(run);
  }

  add(piece) {
    const item = this.items[piece.index];
    if (!item) return;
    item.text.append(piece.delta);
    if (piece.finish_reason) setFinish(item, piece.finish_reason);
  }

  restart() {
    for (const item of this.items) {
      item.text.textContent = "";
      setFinish(item, null);
    }
  }

  // Finished, the result panel shows the completions whole (result.js).
  update(run) { this.section.hidden = Array.isArray(run.result?.completions); }
}

// The view a run's sample events go to, or null for a run that writes none.
export function samplesFor(run) {
  if (run.kind === "sample") return new StreamedCompletions(run);
  if (run.kind === "train" && run.spec.sample_every) return new TrainSamples(run);
  return null;
}
