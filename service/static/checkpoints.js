// The checkpoints of every experiment, with download links and a prune form.

import { TOKEN_KEY, api, authHeaders, postJson } from "./api.js";
import { fmt, h, showError, tableWrap } from "./dom.js";

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
    const out = await postJson("/checkpoints/prune", body);
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

export async function showCheckpoints(view) {
  const body = h("div", { id: "checkpoints" });
  view.replaceChildren(h("h2", {}, "Checkpoints"), body);
  const render = async () => {
    const { items } = await api("/checkpoints");
    const experiments = [...new Set(items.map((c) => c.experiment))];
    body.replaceChildren(...experiments.flatMap((exp) => [
      pruneForm(exp, render),
      tableWrap(h("table", { "data-experiment": exp },
        h("tr", {}, ...["tag", "step", "best loss", "size", "created", "run", "files"].map((c) => h("th", {}, c))),
        ...items.filter((c) => c.experiment === exp).map((c) => h("tr", { "data-tag": c.tag },
          h("td", {}, c.tag), h("td", {}, c.step ?? ""), h("td", {}, fmt.num(c.best_loss)),
          h("td", {}, fmt.bytes(c.size_bytes)), h("td", {}, fmt.time(c.created_at)),
          h("td", {}, c.run_id ? h("a", { href: `#/runs/${c.run_id}` }, c.run_id) : ""),
          h("td", { class: "files" }, ...c.files.map((f) => downloadLink(c, f))))))),
    ]));
    if (!items.length) body.append(h("p", {}, "No checkpoints yet."));
  };
  await render();
  return () => {};
}
