"""The dashboard in a real headless browser (Debian's chromium, driven by playwright), against
the real service with a worker process and the API token on.

The layout is measured, not just the data: at each width every chart lies inside its card,
no two cards overlap and the page does not scroll sideways. Screenshots are kept in
test-artifacts/ (or $TRAINCTL_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import poll
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.schemas import RunPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.service.settings import Settings

TOKEN = "dashboard-secret"
ARTIFACTS = Path(
    os.environ.get("TRAINCTL_TEST_ARTIFACTS")
    or Path(__file__).resolve().parents[3] / "test-artifacts"
)
CHROMIUM = os.environ.get("TRAINCTL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Root in a container needs --no-sandbox; the rest keeps a closed network from stalling it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTHS = (1280, 1920, 390)
"""A laptop, a desktop and a phone (issue 16's widths); 1400 is where the fault was seen."""

STEPS = 24
# Small enough to finish in seconds on a busy CPU, with validations and checkpoints to show.
SMALL_RUN = {
    "steps": STEPS,
    "log_every": 1,
    "val_every": 8,
    "checkpoint_every": 12,
    "val_batches": 1,
    "batch": {"micro_batch_size": 2, "seq_len": 64},
    "device": "cpu",
}
# Runs that stay live until a test stops them.
LONG_RUN = {**SMALL_RUN, "steps": 100_000, "checkpoint_every": 5, "val_every": 1000}

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="no chromium (make test installs it: make browser)"
)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app with one worker process and a token, served by uvicorn on a free port; one
    for the module, so that its finished runs are trained once."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("dashboard"),
        workers=1,
        api_token=TOKEN,
        heartbeat_seconds=0.5,
    )
    with serve(create_app(settings), stop_timeout=60) as url:
        yield url


@pytest.fixture(scope="module")
def api(base_url: str) -> Iterator[TrainctlClient]:
    with TrainctlClient(base_url, token=TOKEN) as client:
        poll(lambda: client.readiness().workers_alive >= 1, timeout=120, what="a worker")
        yield client


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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser: Any, base_url: str) -> Iterator[Any]:
    """open_page(hash, width): a fresh tab on the dashboard, token given; it fails the test
    if the page threw."""
    errors: list[str] = []
    pages: list[Any] = []

    def open_(hash: str, width: int = 1280) -> Any:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: dialog.accept())  # "Cancel run ...?": yes
        page.goto(f"{base_url}/{hash}")
        page.fill("#token-input", TOKEN)  # the first 401 asks for the token
        page.click("#token-form button")
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
    assert errors == []


def artifact(name: str) -> str:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(ARTIFACTS / name)


def points(page: Any, chart: str) -> int:
    return int(page.get_attribute(f"#{chart}", "data-points") or 0)


# Boxes of the page's cards and of the chart inside each, and its scroll extent. An element
# hidden (display: none) has no box and is left out.
MEASURE = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return { left: r.left, top: r.top, right: r.right, bottom: r.bottom }; };
  const shown = (el) => el.getClientRects().length > 0;
  const cards = [...document.querySelectorAll(".chart, .panel")].filter(shown);
  return {
    scrollWidth: document.scrollingElement.scrollWidth,
    clientWidth: document.scrollingElement.clientWidth,
    cards: cards.map((card) => ({ card: box(card),
      chart: card.querySelector(".uplot") ? box(card.querySelector(".uplot")) : null })),
  };
}"""


def overflow(inner: dict[str, float], outer: dict[str, float]) -> float:
    """How far `inner` reaches out of `outer`, in pixels (0 when inside)."""
    return max(
        0.0,
        outer["left"] - inner["left"],
        outer["top"] - inner["top"],
        inner["right"] - outer["right"],
        inner["bottom"] - outer["bottom"],
    )


def overlap(a: dict[str, float], b: dict[str, float]) -> float:
    width = min(a["right"], b["right"]) - max(a["left"], b["left"])
    height = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return max(0.0, width) * max(0.0, height)


def layout_faults(page: Any) -> list[str]:
    """What is wrong with the layout now, in words; [] when it fits."""
    m = page.evaluate(MEASURE)
    faults = []
    if m["scrollWidth"] > m["clientWidth"]:
        faults.append(f"scrolls sideways: {m['scrollWidth']} > {m['clientWidth']} px")
    for i, c in enumerate(m["cards"]):
        if c["chart"] is not None and (out := overflow(c["chart"], c["card"])) > 0.5:
            faults.append(f"chart {i} reaches {out:.0f} px out of its card")
    boxes = [c["card"] for c in m["cards"]]
    faults += [
        f"cards {i} and {j} overlap"
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes[i + 1 :], i + 1)
        if overlap(a, b) > 0.5
    ]
    return faults


def fits(page: Any, width: int) -> None:
    """Size the window to `width` and wait for the charts to follow (a ResizeObserver)."""
    page.set_viewport_size({"width": width, "height": 900})
    faults: list[str] = []

    def settled() -> bool:
        faults[:] = layout_faults(page)
        return not faults

    try:
        poll(settled, timeout=10, what=f"the layout to fit {width} px")
    except AssertionError:
        raise AssertionError(f"at {width} px: {'; '.join(faults)}") from None


# --- a live run --------------------------------------------------------------------------------


def test_the_dashboard_charts_a_running_run_live_and_lists_its_checkpoints(
    api: TrainctlClient, open_page: Any
) -> None:
    run = api.submit("train", {**LONG_RUN, "experiment": "web", "data": {"max_bytes": 300_000}})
    page = open_page(f"#/runs/{run.id}")

    # Polled from here rather than with wait_for_function: that evaluates a string in the
    # page, which the dashboard's Content-Security-Policy rightly refuses.
    before = poll(lambda: (n := points(page, "chart-loss")) > 2 and n, what="loss points")
    poll(lambda: points(page, "chart-loss") > before, timeout=60, what="a new loss point")
    assert points(page, "chart-tps") == points(page, "chart-lr") >= before  # one stream
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
    # A series for each optimizer's lr, as the metrics name them (lr/muon, lr/adamw).
    assert lr_series(page) == ["muon", "adamw"]
    baseline = open_page(f"#/runs/{finished[1].id}")
    poll(lambda: points(baseline, "chart-lr") == STEPS, what="the AdamW run's points")
    assert lr_series(baseline) == ["adamw"]


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
    api: TrainctlClient, finished: tuple[RunPublic, RunPublic], open_page: Any
) -> None:
    done, _ = finished
    live = api.submit("train", {**LONG_RUN, "experiment": "live", "data": {"source": "synthetic"}})
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
    api: TrainctlClient, open_page: Any
) -> None:
    # AdamW alone: its plan holds Muon's settings too, at their defaults, which the resume
    # sends back (and a request may, for a kind that does not read them).
    spec = {**LONG_RUN, "experiment": "resume", "data": {"source": "synthetic"}}
    run = api.submit("train", {**spec, "optimizer": {"kind": "adamw"}})
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
    resumed = api.get_run(page.url.split("#/runs/")[1])
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
    api: TrainctlClient, open_page: Any
) -> None:
    # Two GPUs on a service whose one worker is on the CPU: queued, not failed, and why.
    gpu_run = {**SMALL_RUN, "device": "cuda", "nproc_per_node": 2, "priority": 3}
    run = api.submit("train", {**gpu_run, "experiment": "waits", "data": {"source": "synthetic"}})
    try:
        page = open_page(f"#/runs/{run.id}")
        page.wait_for_selector("#run-waiting")
        assert "needs 2 GPUs per node" in (page.text_content("#run-waiting") or "")
        assert page.text_content("#run-priority") == "priority3"

        table = open_page("#/runs")
        badge = f'tr[data-run="{run.id}"] .state.queued'
        table.wait_for_selector(badge)
        assert "needs 2 GPUs per node" in (table.get_attribute(badge, "title") or "")
    finally:
        api.cancel_run(run.id)
