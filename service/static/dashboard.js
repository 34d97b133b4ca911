// The trainctl dashboard: plain JS modules over the REST API, no build step.
//
// Views: the runs table (#/runs), a run's page (#/runs/<id>), the compare view
// (#/compare?runs=a,b...) and the checkpoints (#/checkpoints). Each view function renders into
// <main> and returns what stops its timers and streams when the route changes.

import { TOKEN_KEY } from "./api.js";
import { askForToken, clearError, showError } from "./dom.js";
import { showCheckpoints } from "./checkpoints.js";
import { showCompare } from "./compare.js";
import { showRun } from "./run.js";
import { showRuns } from "./runs.js";

const view = document.getElementById("view");
let leaveView = () => {};

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value);
  e.target.hidden = true;
  route();
});
document.getElementById("token-button").addEventListener("click", askForToken);

let routed = 0;  // counts route changes: a view that finishes loading after the next began is left

async function route() {
  const mine = ++routed;
  leaveView();
  leaveView = () => {};
  clearError();
  const hash = location.hash || "#/runs";
  const [path, query = ""] = hash.slice(1).split("?");
  const params = new URLSearchParams(query);
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", path.startsWith(a.getAttribute("href").slice(1)));
  }
  try {
    const runMatch = path.match(/^\/runs\/([^/]+)$/);
    const leave = runMatch ? await showRun(view, decodeURIComponent(runMatch[1]))
      : path === "/compare" ? await showCompare(view, params)
        : path.startsWith("/checkpoints") ? await showCheckpoints(view)
          : await showRuns(view, params);
    if (mine === routed) leaveView = leave; else leave();
  } catch (err) {
    showError(err);
  }
}

window.addEventListener("hashchange", route);
route();
