// The runs table: state and progress of the latest runs, a filter by experiment, and
// checkboxes to pick runs for the compare view.

import { api } from "./api.js";
import { fmt, h, progressCell, showError, stateBadge, tableWrap } from "./dom.js";
import { compareHash } from "./compare.js";

const REFRESH_MS = 2000;
const COLUMNS = ["run", "kind", "experiment", "state", "progress", "created", "worker"];

export async function showRuns(view, params) {
  // Kept across the refreshes that rebuild the rows.
  const selected = new Set();
  const experiments = new Set();
  let experiment = params.get("experiment") || "";
  let shown = [];

  const filter = h("select", { id: "experiment-filter", "aria-label": "experiment",
    onchange: () => {
      experiment = filter.value;
      // The filter is in the URL like the compare view's selection; replaceState: no reload.
      history.replaceState(null, "", experiment
        ? `#/runs?experiment=${encodeURIComponent(experiment)}` : "#/runs");
      render().catch(showError);
    } });
  const compare = h("button", { type: "button", id: "compare-button", disabled: true,
    onclick: () => { location.hash = compareHash({ runs: [...selected] }); } }, "Compare");
  const allBox = h("input", { type: "checkbox", id: "select-all", "aria-label": "select all shown",
    onchange: () => {
      for (const r of shown) if (allBox.checked) selected.add(r.id); else selected.delete(r.id);
      render().catch(showError);
    } });
  const table = h("table", { id: "runs" });
  view.replaceChildren(h("h2", {}, "Runs"),
    h("div", { class: "toolbar" }, h("label", {}, "Experiment ", filter), compare,
      h("span", { class: "hint" }, "Tick runs to compare their curves and settings.")),
    tableWrap(table));

  const syncControls = () => {
    const names = [...experiments].sort();
    filter.replaceChildren(h("option", { value: "" }, "all"),
      ...names.map((name) => h("option", { value: name, selected: name === experiment }, name)));
    compare.disabled = selected.size < 1;
    compare.textContent = selected.size ? `Compare ${selected.size}` : "Compare";
    allBox.checked = shown.length > 0 && shown.every((r) => selected.has(r.id));
  };

  // Rows are updated in place, not rebuilt: a checkbox replaced between a click's press and
  // release loses the click.
  const rows = new Map();
  // Each cell has its column's class: a narrow window leaves the lesser columns out
  // (dashboard.css), so that a run's state stays in view.
  const head = h("tr", {}, h("th", {}, allBox),
    ...COLUMNS.map((c) => h("th", { class: `col-${c}` }, c)));
  const makeRow = (r) => {
    const id = r.id;
    const box = h("input", { type: "checkbox", "data-run": id, "aria-label": `select ${id}`,
      onchange: () => {
        if (box.checked) selected.add(id); else selected.delete(id);
        syncControls();
      } });
    const cells = COLUMNS.slice(1).map((c) => h("td", { class: `col-${c}` }));
    // The short id, and beside it a fork's branch: the experiment it was forked into.
    const branch = r.parent ? [" ", h("span", { class: "branch" }, r.experiment)] : [];
    const tr = h("tr", { "data-run": id }, h("td", {}, box),
      h("td", { class: "col-run" }, h("a", { href: `#/runs/${id}`, title: id }, r.short_id),
        ...branch), ...cells);
    return { tr, box, cells };
  };
  const update = (row, r) => {
    row.box.checked = selected.has(r.id);
    const values = [r.kind, h("span", { class: "name" }, r.experiment),
      stateBadge(r.state, r.waiting_reason), progressCell(r.progress),
      fmt.time(r.created_at), r.worker_id || ""];
    row.cells.forEach((td, i) => td.replaceChildren(values[i]));
  };

  let rendering = 0;  // counts renders: a slower, older answer (another filter) is dropped
  const render = async () => {
    const mine = ++rendering;
    const query = experiment ? `&experiment=${encodeURIComponent(experiment)}` : "";
    const page = await api(`/runs?limit=100${query}`);
    if (mine !== rendering) return;
    shown = page.items;
    for (const r of shown) {
      experiments.add(r.experiment);
      if (!rows.has(r.id)) rows.set(r.id, makeRow(r));
      update(rows.get(r.id), r);
    }
    const order = shown.map((r) => r.id).join();
    if (table.dataset.order !== order) {  // new runs, or another filter
      table.replaceChildren(head, ...shown.map((r) => rows.get(r.id).tr));
      table.dataset.order = order;
    }
    syncControls();
  };

  if (experiment) {  // the filter's other choices, when the page opens filtered
    experiments.add(experiment);
    for (const r of (await api("/runs?limit=100")).items) experiments.add(r.experiment);
  }
  await render();
  const timer = setInterval(() => render().catch(showError), REFRESH_MS);
  return () => clearInterval(timer);
}
