"""A FIFO where a run reads, on the real service and its real worker: refused at submit when it
is there already, and failing its run, naming it, when it is swapped in after submit, where
it used to hang the worker for good (its cancel never reached it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.support.polling import poll
from tests.support.special_files import plant

TINY = {
    "model": {"preset": "tiny"},
    "device": "cpu",
    "batch": {"micro_batch_size": 2, "seq_len": 32},
}


def post(service: Any, kind: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{service.url}/runs/{kind}", json=body, timeout=60)


def run_of(service: Any, run_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{service.url}/runs/{run_id}", timeout=60).json()
    return answer


def ended(service: Any, run_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        run = run_of(service, run_id)
        return run if run["state"] in ("succeeded", "failed", "cancelled") else None

    done: dict[str, Any] = poll(finished, timeout=300, what=f"run {run_id} to end")
    return done


def test_a_fifo_in_the_data_is_refused_at_submit_and_fails_a_run_it_was_swapped_into(
    service: Any, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "corpus.txt").write_text("def f(x):\n    return x\n" * 400)
    (roots / "docs.jsonl").write_text(json.dumps({"text": "print('hello')\n" * 50}) + "\n")
    plant(roots / "pipe.txt", "fifo")
    service.extra_env = {"TRAINCTL_DATA_ROOTS": str(roots)}
    service.start(workers=1)

    text = {"source": "text", "paths": ["pipe.txt"]}
    refused = post(service, "train", {"experiment": "refused", "steps": 2, "data": text, **TINY})
    assert refused.status_code == 422
    assert "'pipe.txt' reaches 'pipe.txt', a FIFO, not a regular file" in refused.json()["detail"]

    # The worker is kept busy while the victims are queued and their files swapped.
    busy = post(service, "train", {"experiment": "busy", "steps": 1_000_000, **TINY}).json()
    poll(lambda: run_of(service, busy["id"])["state"] == "running", timeout=300, what="busy")
    text = {"source": "text", "paths": ["corpus.txt"]}
    train = post(service, "train", {"experiment": "victim", "steps": 2, "data": text, **TINY})
    prepare = post(service, "prepare", {"name": "victim", "inputs": ["docs.jsonl"], "workers": 1})
    assert train.status_code == prepare.status_code == 202, (train.text, prepare.text)
    plant(roots / "corpus.txt", "fifo")
    plant(roots / "docs.jsonl", "fifo")
    httpx.post(f"{service.url}/runs/{busy['id']}/cancel", timeout=60)

    for victim, name in [(train.json(), "corpus.txt"), (prepare.json(), "docs.jsonl")]:
        run = ended(service, victim["id"])
        assert run["state"] == "failed", run
        assert f"{name}: a FIFO, not a regular file" in run["error"]
    assert ended(service, busy["id"])["state"] == "cancelled"
    assert httpx.get(f"{service.url}/healthz", timeout=60).status_code == 200
