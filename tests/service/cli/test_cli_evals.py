"""`trainctl evals tasks` and `trainctl evaluate --no-watch` against the real service with no
workers (the evaluate run stays queued); the scores table of a finished evaluation is
tests/e2e/test_evaluate_e2e.py's."""

from __future__ import annotations

import json

import pytest

from tests.service.cli.invoke import trainctl
from tests.service.fakes import save_checkpoint
from tests.support.service_process import Service
from tests.support.stores import posix_store
from trainctl.store.evals.tasks import EVAL_TASKS


@pytest.mark.slow
def test_evals_tasks_prints_every_task_with_its_size_and_metrics(service: Service) -> None:
    code, out, err = trainctl(service, "evals", "tasks", env={"COLUMNS": "200"})

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["TASK", "ITEMS", "SPLIT", "FEW-SHOT", "FROM", "MAX", "SHOTS",
                                "METRICS"]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == list(EVAL_TASKS)
    assert rows["hellaswag"][:5] == ["hellaswag", "10,042", "validation", "validation", "25"]
    assert rows["mmlu_anatomy"][:5] == ["mmlu_anatomy", "135", "test", "dev", "5"]
    assert " ".join(rows["arc_easy"][5:]) == "acc, acc_norm, bits_per_byte"

    code, out, _ = trainctl(service, "evals", "tasks", "--json")
    assert code == 0 and [t["name"] for t in json.loads(out)] == list(EVAL_TASKS)


@pytest.mark.slow
def test_evaluate_flags_reach_the_request_and_a_bad_task_exits_2_with_the_services_422(
    service: Service,
) -> None:
    bytes_tokenizer = {"tokenizer": {"kind": "bytes", "sha256": None}}
    save_checkpoint(posix_store(service.data_dir / "checkpoints"), "scored", step=4,
                    metadata=bytes_tokenizer)  # fmt: skip

    code, out, err = trainctl(
        service, "evaluate", "scored", "step_4", "--tasks", "hellaswag, arc_easy", "--limit",
        "8", "--num-fewshot", "2", "--seed", "7", "--priority", "-1", "--no-watch", "--json",
    )  # fmt: skip

    assert code == 0, err
    run = json.loads(out)
    assert (run["kind"], run["state"], run["priority"]) == ("evaluate", "queued", -1)
    spec = run["spec"]
    assert (spec["tasks"], spec["limit"], spec["num_fewshot"], spec["seed"]) == (
        ["hellaswag", "arc_easy"], 8, 2, 7,
    )  # fmt: skip
    assert spec["checkpoint"] == {"experiment": "scored", "tag": "step_4"}
    assert trainctl(service, "runs", "cancel", run["id"])[0] == 0

    code, out, err = trainctl(service, "evaluate", "scored", "latest", "--tasks", "hellaswag,x")
    assert code == 2 and out == ""
    assert "HTTP 422" in err and "unknown eval task 'x'" in err
