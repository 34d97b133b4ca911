"""The dashboard in a real headless browser (Debian's chromium, driven by playwright), against
the real service with a worker process and the API token on.

The layout is measured, not just the data: at each width every chart lies inside its card,
no two cards overlap and the page does not scroll sideways. Screenshots are kept in
test-artifacts/ (or $TRAINCTL_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.service.dashboard.pages import (
    MEASURE,
    SMALL_RUN,
    STEPS,
    WIDTHS,
    artifact,
    fits,
    needs_chromium,
)
from tests.support.leftovers import RunsToStop
from tests.support.polling import poll
from trainctl.service.schemas import RunPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings
from trainctl.store.db.runs import RunStore

# A browser, and runs a worker trains first: slow.
pytestmark = [needs_chromium, pytest.mark.slow]

# Runs that stay live until a test stops them.
LONG_RUN = {**SMALL_RUN, "steps": 100_000, "checkpoint_every": 5, "val_every": 1000}


@pytest.fixture(scope="module")
def finished(api: TrainctlClient) -> tuple[RunPublic, RunPublic]:
    """Two finished train runs of one experiment: byte-level text (so bits per byte) with
    Muon + AdamW, and synthetic tokens with AdamW alone, the baseline Muon is compared with.
    One experiment trains one run at a time."""
    text = api.submit("train", {**SMALL_RUN, "experiment": "cmp", "data": {"max_bytes": 300_000}})
    assert api.wait(text.id, timeout=600).state == "succeeded"
    other = {**SMALL_RUN, "experiment": "cmp", "data": {"source": "synthetic"}}
    synthetic = api.submit("train", {**other, "optimizer": {"kind": "adamw", "adamw_lr": 1e-3}})
    assert api.wait(synthetic.id, timeout=600).state == "succeeded"
    return api.get_run(text.id), api.get_run(synthetic.id)


def points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f"#{chart}", "data-points") or 0)


def points_now(page: Any, *charts: str) -> list[int]:
    """The points of each chart, read in one script, so at one moment: the page redraws all
    of a stream's charts in one frame, and two reads apart could straddle a redraw."""
    script = "ids => ids.map(id => Number(document.getElementById(id).dataset.points || 0))"
    return [int(n) for n in page.evaluate(script, list(charts))]


# --- a live run --------------------------------------------------------------------------------


def test_the_dashboard_charts_a_running_run_live_and_lists_its_checkpoints(
    api: TrainctlClient, open_page: Any, stop_runs: RunsToStop
) -> None:
    run = api.submit("train", {**LONG_RUN, "experiment": "web", "data": {"max_bytes": 300_000}})
    stop_runs.track(run.id)
    page = open_page(f"#/runs/{run.id}")

    # Polled from here rather than with wait_for_function: that evaluates a string in the
    # page, which the dashboard's Content-Security-Policy rightly refuses.
    before = poll(lambda: (n := points(page, "chart-loss")) > 2 and n, what="loss points")
    poll(lambda: points(page, "chart-loss") > before, timeout=60, what="a new loss point")
    tps, lr, loss = points_now(page, "chart-tps", "chart-lr", "chart-loss")
    assert tps == lr == loss >= before  # one stream, all of its charts drawn together
    assert page.text_content("#run-summary .state") == "running"
    assert page.is_visible("#cancel-run") and not page.is_visible("#resume-run")
    page.screenshot(path=artifact("dashboard.png"), full_page=True)

    page.goto(page.url.split("#")[0] + "#/runs")
    page.wait_for_selector(f"tr[data-run='{run.id}'] .state.running")
    assert "web" in (page.text_content("#runs") or "")

    poll(lambda: api.list_checkpoints("web"), what="a checkpoint")
    page.goto(page.url.split("#")[0] + "#/checkpoints")
    page.wait_for_selector("table[data-experiment='web'] tr[data-tag] td.files a")
    links = [a.get_attribute("href") or "" for a in page.locator("td.files a").all()]
    assert any(h.endswith("/files/model.safetensors") for h in links)
    api.cancel_run(run.id)
    assert api.wait(run.id, timeout=60).state == "cancelled"


# --- the layout ----------------------------------------------------------------------------


def test_a_finished_runs_page_fits_its_cards_at_every_width_and_follows_resizes(
    finished: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    run, _ = finished
    # Opened at 1400 px, where the charts used to run under the next card, then resized:
    # the charts must follow the window, not keep the width they were made at.
    page = open_page(f"#/runs/{run.id}", width=1400)
    poll(lambda: points(page, "chart-loss") == STEPS, what="the run's points")
    measured = {}
    for width in (1400, *WIDTHS):
        fits(page, width)
        page.screenshot(path=artifact(f"run-page-{width}.png"), full_page=True)
        measured[width] = page.evaluate(MEASURE)
    (Path(artifact("run-page-layout.json"))).write_text(json.dumps(measured, indent=1))

    # The result in words, and the validation history as a table.
    assert page.text_content("#run-result dd[data-key='step']") == "24 / 24"
    assert page.text_content("#run-result dd[data-key='token_count']") == "3,072 tokens"
    assert (page.text_content("#run-result dd[data-key='final_val_bits_per_byte']") or "").endswith(
        " bits/byte"
    )
    steps = [
        row.get_attribute("data-step")
        for row in page.locator("#run-validation tr[data-step]").all()
    ]
    assert steps == ["8", "16", "24"]
    assert page.locator("#run-validation th", has_text="bits/byte").count() == 1
    # A finished run has nothing to cancel, and a succeeded one nothing to resume.
    assert page.locator("#cancel-run, #resume-run").count() == 0
    # A run without sample_every has no samples (test_dashboard_samples.py has one that does).
    assert page.locator("#run-samples").count() == 0
    # Nor, without eval scores, an eval table or chart: not even an empty box.
    assert page.locator("#run-evals, #run-eval-charts").count() == 0
    # A series for each optimizer's lr, as the metrics name them (lr/muon, lr/adamw).
    assert lr_series(page) == ["muon", "adamw"]
    baseline = open_page(f"#/runs/{finished[1].id}")
    poll(lambda: points(baseline, "chart-lr") == STEPS, what="the AdamW run's points")
    assert lr_series(baseline) == ["adamw"]


# Each loss-health mark on the loss chart: its action, title and place on the x axis.
HEALTH_MARKERS = """() => {
  const over = document.querySelector("#chart-loss .u-over").getBoundingClientRect();
  return [...document.querySelectorAll("#chart-loss .health-marker")].map((m) => ({
    action: m.dataset.action, title: m.title, hidden: m.hidden,
    x: (m.getBoundingClientRect().left - over.left) / over.width }));
}"""


def test_the_loss_chart_marks_each_loss_health_intervention_at_its_step(
    finished: tuple[RunPublic, RunPublic], open_page: Any, settings: Settings
) -> None:
    _, run = finished
    message = "health: step 12: loss 9.1 is 7.0 standard deviations above its average; rewound"
    health = {"step": 12, "loss": 9.1, "reason": "spike", "action": "rewind", "statistic": 7.0,
              "window": [22, 24], "rewound_to": 8}  # fmt: skip
    with RunStore(settings.db_url) as runs:  # as a worker logs it (worker/context.py)
        runs.append_event(run.id, "log", {"level": "warning", "message": message,
                                          "health": health})  # fmt: skip
    page = open_page(f"#/runs/{run.id}")
    poll(lambda: points(page, "chart-loss") == STEPS, what="the run's points")
    page.wait_for_selector("#chart-loss .health-marker")  # the log is read after the metrics

    for width in WIDTHS:
        fits(page, width)
        (mark,) = page.evaluate(HEALTH_MARKERS)
        assert (mark["action"], mark["title"], mark["hidden"]) == ("rewind", message, False)
        assert 0.4 < mark["x"] < 0.55, mark  # step 12 of steps 1 to 24
        page.screenshot(path=artifact(f"run-health-{width}.png"), full_page=True)


# Where each row's state cell is, and whether the page or the table scrolls sideways.
RUNS_TABLE = """() => {
  const wrap = document.querySelector("#runs").closest(".table-wrap");
  return {
    view: document.scrollingElement.clientWidth,
    page: document.scrollingElement.scrollWidth,
    table: wrap.scrollWidth, wrap: wrap.clientWidth,
    states: [...document.querySelectorAll("#runs tr[data-run]")].map((tr) => {
      const box = tr.querySelector(".state").closest("td").getBoundingClientRect();
      return { run: tr.dataset.run, left: box.left, right: box.right };
    }),
  };
}"""


def test_the_runs_table_keeps_every_runs_state_in_view_at_390_px_and_names_forks(
    api: TrainctlClient,
    finished: tuple[RunPublic, RunPublic],
    open_page: Any,
    stop_runs: RunsToStop,
) -> None:
    _, baseline = finished
    # A fork of the AdamW run's last checkpoint, its branch named; cancelled after the test.
    fork = {**SMALL_RUN, "experiment": "cmp.cool", "steps": 100_000, "fork_from": "cmp/latest"}
    fork |= {"data": {"source": "synthetic"}, "optimizer": {"kind": "adamw"}}
    cool = api.submit("train", fork)
    stop_runs.track(cool.id)
    page = open_page("#/runs", width=390)
    for run in (*finished, cool):
        page.wait_for_selector(f"tr[data-run='{run.id}'] .state")

    m = page.evaluate(RUNS_TABLE)
    page.screenshot(path=artifact("runs-390.png"), full_page=True)
    assert m["page"] <= m["view"], f"the page scrolls sideways: {m['page']} > {m['view']} px"
    assert m["table"] <= m["wrap"], f"the table scrolls sideways: {m['table']} > {m['wrap']} px"
    out_of_view = [s for s in m["states"] if s["left"] < 0 or s["right"] > m["view"]]
    assert len(m["states"]) >= 3 and out_of_view == [], out_of_view
    # Short ids, and a fork's branch beside its own.
    assert page.text_content(f"tr[data-run='{baseline.id}'] td.col-run") == baseline.short_id
    assert page.text_content(f"tr[data-run='{cool.id}'] td.col-run") == f"{cool.short_id} cmp.cool"


def lr_series(page: Any) -> list[str]:
    """The series of a run page's learning-rate chart, by their legend's labels."""
    labels = page.locator("#chart-lr .u-legend .u-series .u-label").all_text_contents()
    return [label for label in labels if label != "step"]


# --- compare -----------------------------------------------------------------------------------


def test_runs_picked_in_the_table_open_a_compare_view_whose_url_holds_the_selection(
    finished: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    a, b = finished
    page = open_page("#/runs")
    page.wait_for_selector(f"tr[data-run='{b.id}']")
    page.select_option("#experiment-filter", "cmp")  # the experiment's runs, then all of them
    poll(lambda: "experiment=cmp" in page.url, what="the filter in the URL")
    # The table shows the experiment's runs only (the URL changes before the rows do).
    experiments = "#runs tr[data-run] td:nth-child(4)"
    poll(lambda: set(page.locator(experiments).all_text_contents()) == {"cmp"}, what="the filter")
    page.wait_for_selector(f"tr[data-run='{a.id}']")
    page.check("#select-all")
    page.click("#compare-button")

    page.wait_for_selector("#compare-legend li")
    assert set(page.url.split("runs=")[1].split("&")[0].split(",")) == {a.id, b.id}
    legend = [li.get_attribute("data-run") for li in page.locator("#compare-legend li").all()]
    assert sorted(legend) == sorted([a.id, b.id])
    total = 2 * STEPS
    poll(lambda: points(page, "compare-loss") == total, what="both runs' train loss")
    # An lr chart per optimizer either run has: Muon's the first run's alone.
    assert points(page, "compare-lr_muon") == STEPS and points(page, "compare-lr_adamw") == total
    assert points(page, "compare-tps") == total
    assert points(page, "compare-val_loss") == 2 * 3
    assert points(page, "compare-val_bpb") == 3  # only the byte-level run knows its bits per byte
    # The settings side by side, what differs marked.
    order = 1 if legend[0] == a.id else -1
    for key, values in [("kind", ["muon_adamw", "adamw"]), ("adamw_lr", ["0.0003", "0.001"])]:
        row = page.locator(f"#compare-settings tr[data-key='optimizer.{key}']")
        assert "differs" in (row.get_attribute("class") or "")
        assert row.locator("td").all_text_contents() == values[::order]
    assert "same" in (
        page.get_attribute("#compare-settings tr[data-key='model.preset']", "class") or ""
    )

    # The controls go into the URL; opening that URL again restores them.
    page.select_option("#compare-x", "tokens")
    page.check("#compare-log")
    # A range input cannot be typed into: set it as a drag would, with an input event.
    page.eval_on_selector(
        "#compare-smooth", "el => { el.value = '0.6'; el.dispatchEvent(new Event('input')); }"
    )
    poll(
        lambda: "x=tokens" in page.url and "log=1" in page.url and "smooth=0.6" in page.url,
        what="the controls in the URL",
    )
    shared = page.url
    again = open_page("#" + shared.split("#")[1])
    again.wait_for_selector("#compare-legend li")
    assert again.input_value("#compare-x") == "tokens"
    assert again.is_checked("#compare-log") and again.input_value("#compare-smooth") == "0.6"
    assert [
        li.get_attribute("data-run") for li in again.locator("#compare-legend li").all()
    ] == legend
    poll(lambda: points(again, "compare-loss") == total, what="the shared view's points")

    for width in WIDTHS:
        fits(again, width)
        again.screenshot(path=artifact(f"compare-{width}.png"), full_page=True)


def test_the_compare_view_follows_a_live_run_over_its_event_stream(
    api: TrainctlClient,
    finished: tuple[RunPublic, RunPublic],
    open_page: Any,
    stop_runs: RunsToStop,
) -> None:
    done, _ = finished
    live = api.submit("train", {**LONG_RUN, "experiment": "live", "data": {"source": "synthetic"}})
    stop_runs.track(live.id)
    poll(lambda: api.get_run(live.id).state == "running", what="the live run to start")
    page = open_page(f"#/compare?runs={done.id},{live.id}")
    row = f"#compare-legend li[data-run='{live.id}']"
    page.wait_for_selector(row)

    first = poll(lambda: int(page.get_attribute(row, "data-points") or 0), what="live points")
    poll(
        lambda: int(page.get_attribute(row, "data-points") or 0) > first + 2,
        timeout=60,
        what="the live run's new points",
    )
    assert page.text_content(f"{row} .state") == "running"

    api.cancel_run(live.id)
    assert api.wait(live.id, timeout=60).state == "cancelled"
    page.wait_for_selector(f"{row} .state.cancelled")  # the stream's end refreshes the run


# --- cancel and resume -------------------------------------------------------------------------


def test_the_run_page_cancels_a_run_and_resumes_it_from_the_latest_checkpoint(
    api: TrainctlClient, open_page: Any, stop_runs: RunsToStop
) -> None:
    # AdamW alone: its plan holds Muon's settings too, at their defaults, which the resume
    # sends back (and a request may, for a kind that does not read them).
    spec = {**LONG_RUN, "experiment": "resume", "data": {"source": "synthetic"}}
    run = api.submit("train", {**spec, "optimizer": {"kind": "adamw"}})
    stop_runs.track(run.id)
    page = open_page(f"#/runs/{run.id}")
    poll(lambda: api.list_checkpoints("resume"), what="a checkpoint to resume from")

    page.click("#cancel-run")  # the dialog is accepted
    assert api.wait(run.id, timeout=60).state == "cancelled"
    page.wait_for_selector("#run-summary .state.cancelled")
    assert page.locator("#cancel-run").count() == 0
    latest = api.latest_checkpoint("resume")

    page.click("#resume-run")
    poll(lambda: run.id not in page.url or page.is_visible("#error"), what="the resumed run")
    assert not page.is_visible("#error"), page.text_content("#error")
    resumed = api.get_run(stop_runs.track(page.url.split("#/runs/")[1]))
    page.wait_for_selector("#run-summary .state")
    assert resumed.kind == "train" and resumed.experiment == "resume"
    assert resumed.spec["resume_from"] == {"experiment": "resume", "tag": latest.tag}
    assert resumed.spec["steps"] == LONG_RUN["steps"]
    assert resumed.spec["optimizer"] == api.get_run(run.id).spec["optimizer"]
    poll(
        lambda: api.get_run(resumed.id).progress.step > (latest.step or 0),
        timeout=120,
        what="the resumed run to train past its checkpoint",
    )
    api.cancel_run(resumed.id)
    assert api.wait(resumed.id, timeout=60).state == "cancelled"


# --- a run that waits ---------------------------------------------------------------------------


def test_the_run_page_says_why_a_queued_run_waits_and_shows_its_priority(
    api: TrainctlClient, open_page: Any, stop_runs: RunsToStop
) -> None:
    # Two GPUs on a service whose one worker is on the CPU: queued, not failed, and why.
    gpu_run = {**SMALL_RUN, "device": "cuda", "nproc_per_node": 2, "priority": 3}
    run = api.submit("train", {**gpu_run, "experiment": "waits", "data": {"source": "synthetic"}})
    stop_runs.track(run.id)
    page = open_page(f"#/runs/{run.id}")
    page.wait_for_selector("#run-waiting")
    assert "needs 2 GPUs per node" in (page.text_content("#run-waiting") or "")
    assert page.text_content("#run-priority") == "priority3"

    table = open_page("#/runs")
    badge = f'tr[data-run="{run.id}"] .state.queued'
    table.wait_for_selector(badge)
    assert "needs 2 GPUs per node" in (table.get_attribute(badge, "title") or "")


def test_the_run_page_shows_a_runs_stragglers_and_hangs_as_they_are_reported(
    api: TrainctlClient, settings: Settings, open_page: Any, stop_runs: RunsToStop
) -> None:
    # A run that never starts (it asks for GPUs), given the log events the watches write.
    gpu_run = {**SMALL_RUN, "device": "cuda", "nproc_per_node": 2}
    run = api.submit("train", {**gpu_run, "experiment": "watched", "data": {"source": "synthetic"}})
    stop_runs.track(run.id)
    slow = {"step": 20, "slowdowns": {"1": 0.35}, "nodes": {"1": "node-b"},
            "avoid_nodes": ["node-b"], "threshold": 0.2, "window": 20}  # fmt: skip
    with RunStore(settings.db_url) as runs:
        runs.append_event(run.id, "log", {"level": "warning", "message": "slow", "straggler": slow})
        page = open_page(f"#/runs/{run.id}")
        page.wait_for_selector("#run-stragglers")
        assert page.text_content("#run-stragglers") == (
            "stragglersrank 1 on node-b +35 % (step 20; the next attempt avoids node-b)"
        )
        hang = {"ranks": [1, 0], "step": 30, "phase": "a training step", "late_seconds": 0.2}
        runs.append_event(run.id, "log", {"level": "error", "message": "hung", "hang": hang})
        caught_up = {**slow, "step": 40, "slowdowns": {}, "nodes": {}, "avoid_nodes": []}
        runs.append_event(run.id, "log", {"level": "info", "message": "ok", "straggler": caught_up})
    # the page follows the run's event stream
    page.wait_for_selector("#run-hangs")
    assert page.text_content("#run-hangs") == "hangs1 (last: rank 1 after step 30)"
    poll(lambda: page.text_content("#run-stragglers") == "stragglersnone (step 40)", timeout=30,
         what="the straggler to catch up")  # fmt: skip


# --- eval scores and forks (issues 27 and 28) ---------------------------------------------------

EVAL_TASK = "arc_easy"
EVAL_COLUMNS = [f"{EVAL_TASK}/{m}" for m in ("acc", "acc_norm", "bits_per_byte")]
FORK_STEP = 12


@pytest.fixture(scope="module")
def tree(api: TrainctlClient) -> tuple[RunPublic, RunPublic]:
    """A parent train run on byte-level text (so its checkpoints can be scored), a fork of
    its step-12 checkpoint with a 1-sqrt cooldown to step 24, and real evaluations (ARC-Easy,
    2 items) of both of the parent's checkpoints and the fork's last: the scores are metrics
    events on the run that wrote each checkpoint."""
    text = {"data": {"max_bytes": 300_000}}
    parent = api.submit("train", {**SMALL_RUN, **text, "experiment": "tree"})
    assert api.wait(parent.id, timeout=600).state == "succeeded"
    cooldown = {"decay_start": FORK_STEP, "decay": "sqrt", "min_lr_ratio": 0.0}
    fork = api.submit(
        "train",
        {**SMALL_RUN, **text, "experiment": "tree.cool", "schedule": cooldown}
        | {"fork_from": f"tree/step_{FORK_STEP}"},
    )

    def evaluate(checkpoint: str) -> RunPublic:
        scoring = {"checkpoint": checkpoint, "tasks": [EVAL_TASK], "limit": 2, "device": "cpu"}
        return api.submit("evaluate", scoring)

    # A checkpoint is resolved at submit: the fork's once it has trained.
    evals = [evaluate(f"tree/step_{FORK_STEP}"), evaluate(f"tree/step_{STEPS}")]
    assert api.wait(fork.id, timeout=600).state == "succeeded"
    evals.append(evaluate(f"tree.cool/step_{STEPS}"))
    for run in evals:
        done = api.wait(run.id, timeout=600)
        assert done.state == "succeeded", done.error
    return api.get_run(parent.id), api.get_run(fork.id)


def test_the_run_page_shows_eval_scores_per_checkpoint_as_a_table_and_charts_at_every_width(
    tree: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    parent, _ = tree
    page = open_page(f"#/runs/{parent.id}")
    page.wait_for_selector("#run-evals tr[data-step]")
    head = page.locator("#run-evals th").all_text_contents()
    assert head == ["step", *EVAL_COLUMNS]
    steps = [r.get_attribute("data-step") for r in page.locator("#run-evals tr[data-step]").all()]
    assert steps == [str(FORK_STEP), str(STEPS)]
    scores = page.locator("#run-evals tr[data-step] td.num").all_text_contents()
    assert len(scores) == 2 * (1 + len(EVAL_COLUMNS)) and all(s.strip() for s in scores)
    # An "eval vs step" chart per task metric, a point per checkpoint scored.
    charts = page.locator("#run-eval-charts .chart h3").all_text_contents()
    assert charts == [f"eval: {c}" for c in EVAL_COLUMNS]
    for metric in ("acc", "acc_norm", "bits_per_byte"):
        chart = f"chart-eval-{EVAL_TASK}-{metric}"

        def plotted(chart: str = chart) -> bool:
            return points(page, chart) == 2

        poll(plotted, what=f"{chart}'s points")
    for width in WIDTHS:
        fits(page, width)
        page.screenshot(path=artifact(f"run-evals-{width}.png"), full_page=True)


# Where each fork marker's label is, against its chart's plotting area.
FORK_MARKERS = """() => {
  const over = document.querySelector("#chart-loss .u-over").getBoundingClientRect();
  return [...document.querySelectorAll("#chart-loss .fork-marker")].map((m) => {
    const a = m.querySelector("a"); const line = m.getBoundingClientRect();
    const label = a.getBoundingClientRect();
    return { href: a.getAttribute("href"), text: a.textContent,
      x: (line.left - over.left) / over.width,
      inside: label.left >= over.left - 0.5 && label.right <= over.right + 0.5 };
  });
}"""


def test_a_parents_loss_chart_marks_where_each_fork_branched_with_a_link_at_every_width(
    tree: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    parent, fork = tree
    page = open_page(f"#/runs/{parent.id}")
    poll(lambda: points(page, "chart-loss") == STEPS, what="the parent's points")
    page.wait_for_selector("#chart-loss .fork-marker a")
    for width in WIDTHS:
        fits(page, width)
        (marker,) = page.evaluate(FORK_MARKERS)
        assert marker["href"] == f"#/runs/{fork.id}" and marker["inside"], marker
        assert "tree.cool" in marker["text"] and fork.short_id in marker["text"]
        # Step 12 of steps 1 to 24: near the middle of the x axis.
        assert 0.4 < marker["x"] < 0.6, marker
        page.screenshot(path=artifact(f"run-forks-{width}.png"), full_page=True)

    # The fork's page names its parent and the step it branched at.
    page.click("#chart-loss .fork-marker a")
    page.wait_for_selector("#run-parent a")
    assert page.get_attribute("#run-parent a", "href") == f"#/runs/{parent.id}"
    assert f"tree/step_{FORK_STEP}" in (page.text_content("#run-parent") or "")
    assert page.text_content("#run-fork-step") == f"fork step{FORK_STEP}"
    assert page.locator("#chart-loss .fork-marker").count() == 0  # a fork without forks


def test_compare_with_forks_overlays_a_parent_and_its_forks_on_global_step_and_tokens(
    tree: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    parent, fork = tree
    page = open_page(f"#/runs/{parent.id}")
    page.click("#compare-forks")
    page.wait_for_selector("#compare-legend li")
    legend = [li.get_attribute("data-run") for li in page.locator("#compare-legend li").all()]
    assert legend == [parent.id, fork.id]
    # The fork goes on from the parent's step 12: its 12 steps after it, on the same axis.
    total = STEPS + (STEPS - FORK_STEP)
    poll(lambda: points(page, "compare-loss") == total, what="the parent's and the fork's loss")
    # Eval vs step: the parent's two checkpoints and the fork's one.
    poll(lambda: points(page, f"compare-eval-{EVAL_TASK}-acc") == 3, what="the eval curves")
    assert "fork of" in (page.text_content(f"#compare-legend li[data-run='{fork.id}']") or "")
    page.select_option("#compare-x", "tokens")
    poll(lambda: points(page, "compare-loss") == total, what="the curves on tokens")
    assert points(page, f"compare-eval-{EVAL_TASK}-acc") == 3
    for width in WIDTHS:
        fits(page, width)
        page.screenshot(path=artifact(f"compare-forks-{width}.png"), full_page=True)
