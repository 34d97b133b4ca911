"""The run page's samples (issues 15 and 16) in a real headless browser, against the real
service with a worker: a train run's latest samples per prompt, with the earlier steps a
select away, and a sample run's completions. The fixtures (conftest.py), the layout measurement
and the screenshots (pages.py) are test_dashboard.py's too; this module serves its own service
and data.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.service.dashboard.pages import SMALL_RUN, WIDTHS, artifact, fits, needs_chromium
from tests.support.polling import poll
from trainctl.service.schemas import RunPublic
from trainctl.service.sdk.client import TrainctlClient

# A browser, and runs a worker trains first: slow.
pytestmark = [needs_chromium, pytest.mark.slow]

# Model output is untrusted text: markup in a prompt (and so in what the page shows) must
# read as the characters it is. Each would change the page's title if it ran.
SCRIPT = "<script>document.title='pwned'</script>"
IMG = "<img src=x onerror=\"document.title='pwned'\">"
# One unbroken 300-character word: it must wrap inside its card, not widen the page.
LONG = "x" * 300
PROMPTS = ["def ", "import ", SCRIPT, IMG, LONG]
SAMPLE_EVERY = 8
STEPS = 16
SAMPLED_RUN = {
    **SMALL_RUN,
    "steps": STEPS,
    "val_every": SAMPLE_EVERY,
    "checkpoint_every": SAMPLE_EVERY,
    "experiment": "samples",
    "data": {"max_bytes": 300_000},
    "sample_every": SAMPLE_EVERY,
    "sample_prompts": PROMPTS,
    "sample_settings": {"max_new_tokens": 24, "temperature": 0},
}

# The sample cards' boxes inside their section, and how far each text block's content
# reaches past its own width (a line that did not wrap).
MEASURE_SAMPLES = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return { left: r.left, top: r.top, right: r.right, bottom: r.bottom }; };
  return {
    section: box(document.getElementById("run-samples")),
    cards: [...document.querySelectorAll("#run-samples .sample")].map(box),
    unwrapped: [...document.querySelectorAll("#run-samples pre.sample-text")]
      .map((pre) => pre.scrollWidth - pre.clientWidth),
  };
}"""


@pytest.fixture(scope="module")
def sampling(api: TrainctlClient) -> RunPublic:
    """A train run that samples its prompts at steps 8 and 16, submitted (not waited for):
    a page opened at once sees its samples arrive."""
    return api.submit("train", SAMPLED_RUN)


def samples_by_step(client: TrainctlClient, run_id: str) -> dict[int, list[dict[str, Any]]]:
    """A finished run's `sample` events' data by step, in the order they were written."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in client.events(run_id):
        if event.type == "sample":
            by_step[event.data["step"]].append(event.data)
    return by_step


def shown_samples(page: Any) -> list[tuple[str, str]]:
    """(prompt, completion) of each sample card, as the page shows them."""
    return [
        (
            card.locator(".sample-prompt").text_content() or "",
            card.locator(".sample-completion").text_content() or "",
        )
        for card in page.locator("#run-samples .sample").all()
    ]


def escaped(page: Any) -> None:
    """Nothing the model or a prompt wrote became markup, and nothing of it ran."""
    assert page.locator("#view script, #view img").count() == 0
    assert page.title() == "trainctl"


def samples_inside(page: Any) -> None:
    """Every sample card lies inside the samples section, and every text block wraps."""
    m = page.evaluate(MEASURE_SAMPLES)
    section = m["section"]
    for i, card in enumerate(m["cards"]):
        assert card["left"] >= section["left"] - 0.5, f"card {i} starts left of its section"
        assert card["right"] <= section["right"] + 0.5, f"card {i} reaches past its section"
    assert max(m["unwrapped"]) <= 0, f"a sample's text overflows its card: {m['unwrapped']}"


def test_a_train_runs_page_shows_each_prompts_latest_sample_at_every_width(
    api: TrainctlClient,
    sampling: RunPublic,
    open_page: Any,
) -> None:
    # Opened at once, mostly while the run is queued or running: its samples arrive live.
    page = open_page(f"#/runs/{sampling.id}")
    assert api.wait(sampling.id, timeout=600).state == "succeeded"
    by_step = samples_by_step(api, sampling.id)
    assert sorted(by_step) == [SAMPLE_EVERY, STEPS]
    page.wait_for_selector(f"#run-samples .sample[data-step='{STEPS}']")

    # The last step's completion of each prompt, exactly as the events have it.
    latest = [(s["prompt"], s["completion"]) for s in by_step[STEPS]]
    assert [p for p, _ in latest] == PROMPTS
    poll(lambda: shown_samples(page) == latest, timeout=10, what="the latest samples")
    steps = page.locator("#run-samples .sample-step").all_text_contents()
    assert steps == [f"step {STEPS}"] * len(PROMPTS)
    escaped(page)

    for width in WIDTHS:
        fits(page, width)
        samples_inside(page)
        page.screenshot(path=artifact(f"run-samples-{width}.png"), full_page=True)

    # The earlier step is a select away; "latest" follows the newest again.
    page.select_option("#sample-step", str(SAMPLE_EVERY))
    earlier = [(s["prompt"], s["completion"]) for s in by_step[SAMPLE_EVERY]]
    poll(lambda: shown_samples(page) == earlier, timeout=10, what="step 8's samples")
    assert page.get_attribute("#run-samples", "data-step") == str(SAMPLE_EVERY)
    page.select_option("#sample-step", "")
    poll(lambda: shown_samples(page) == latest, timeout=10, what="the latest samples again")


def test_a_sample_runs_page_shows_its_completions_as_text(
    api: TrainctlClient,
    sampling: RunPublic,
    open_page: Any,
) -> None:
    assert api.wait(sampling.id, timeout=600).state == "succeeded"  # its checkpoints
    prompts = ["def ", SCRIPT, IMG]
    run = api.submit_sample(
        checkpoint="latest",
        experiment="samples",
        prompts=prompts,
        generation={"max_new_tokens": 48, "seed": 7},
    )
    # Opened at once, mostly while the run is queued or running: its pieces arrive live.
    page = open_page(f"#/runs/{run.id}")
    done = api.wait(run.id, timeout=300)
    assert done.state == "succeeded", done.error
    assert done.result is not None
    completions = done.result["completions"]
    expected = [(p, c["text"]) for p, c in zip(prompts, completions, strict=True)]

    # The result panel shows the completions as text, not JSON.
    items = "#run-result ol.completions li"
    page.wait_for_selector(items)
    shown = [
        (
            li.locator(".sample-prompt").text_content(),
            li.locator(".sample-completion").text_content(),
        )
        for li in page.locator(items).all()
    ]
    assert shown == expected
    assert done.result is not None
    tokens = done.result["generated_tokens"]
    assert page.text_content("#run-result dd[data-key='generated_tokens']") == f"{tokens} tokens"
    assert "[object Object]" not in (page.text_content("#run-result") or "")
    assert page.locator(".chart, #run-validation").count() == 0  # it writes no metrics

    # The stream's pieces, put together, are the completions; finished, the section that
    # showed them live steps aside for the result.
    page.wait_for_selector("#run-samples[data-kind='sample']", state="hidden")
    # A run that finished before the page opened is hidden at once, while its events are
    # still being replayed into the section: wait for the last piece, not the state.
    poll(lambda: shown_samples(page) == expected, timeout=60, what="the streamed completions")
    finish = [
        f.get_attribute("data-finish") for f in page.locator("#run-samples .sample-finish").all()
    ]
    assert finish == [c["finish_reason"] for c in completions]
    escaped(page)
    for width in WIDTHS:
        fits(page, width)
        page.screenshot(path=artifact(f"sample-run-{width}.png"), full_page=True)
