"""`trainctl` flags for placement and queueing (--nnodes, --spread, --priority, --max-attempts)
reach the request, and a queued run that no live worker can take says why, against a real
service with no workers (submitted runs stay queued)."""

from __future__ import annotations

import json

import pytest

from tests.service.cli.invoke import trainctl
from tests.service.fakes import save_checkpoint
from tests.support.service_process import Service
from tests.support.stores import posix_store

SUBMIT_COMMANDS = [
    ("submit", "train"),
    ("submit", "validate"),
    ("submit", "benchmark"),
    ("submit", "prepare"),
    ("sample",),
    ("checkpoints", "export"),
    ("evaluate",),
]


@pytest.mark.slow
def test_train_flags_reach_the_request_and_the_run_says_what_it_waits_for(
    service: Service,
) -> None:
    code, out, err = trainctl(
        service, "submit", "train", "-e", "gang", "--steps", "3", "--device", "cuda",
        "--nproc-per-node", "2", "--nnodes", "1", "--spread", "same_node",
        "--priority", "5", "--max-attempts", "2", "--json",
    )  # fmt: skip

    assert code == 0, err
    run = json.loads(out)
    assert (run["priority"], run["max_attempts"], run["state"]) == (5, 2, "queued")
    assert (run["spec"]["nnodes"], run["spec"]["spread"], run["spec"]["nproc_per_node"]) == (
        1, "same_node", 2,
    )  # fmt: skip
    assert run["placement"]["gpus_per_node"] == 2
    reason = run["waiting_reason"]
    assert reason.startswith("waiting: needs 1 node of 2 GPUs")

    code, out, _ = trainctl(service, "runs", "list", "-e", "gang")
    assert code == 0 and "queued, waiting: needs 1 node of 2 GPUs" in " ".join(out.split())
    code, out, err = trainctl(service, "runs", "show", run["id"])
    assert code == 0 and json.loads(out)["waiting_reason"] == reason  # stdout: JSON alone
    assert f"run {run['id']} is queued, {reason}" in " ".join(err.split())


def test_nnodes_takes_an_elastic_range_and_refuses_what_is_neither(service: Service) -> None:
    # This service keeps its runs in SQLite, which refuses any gang: its answer names the
    # range's max, as the request got it.
    code, _, err = trainctl(service, "submit", "train", "--nnodes", "2:3", "--steps", "3")
    assert code == 2 and "nnodes 3: a run across several nodes needs PostgreSQL" in " ".join(
        err.split()
    ), err
    code, _, err = trainctl(service, "submit", "train", "--nnodes", "3:2", "--steps", "3")
    assert code == 2 and "min 3 is above max 2" in err, err  # refused: exit 2, as a 422 is
    for bad in ("two", "2:", "2-4"):
        code, _, err = trainctl(service, "submit", "train", "--nnodes", bad, "--steps", "3")
        assert code == 2 and f"--nnodes {bad!r}: give a node count (2)" in " ".join(err.split())


@pytest.mark.slow
def test_a_plain_submit_line_says_why_the_run_waits(service: Service) -> None:
    code, out, err = trainctl(service, "submit", "benchmark", "--steps", "5", "--device", "cuda")

    assert code == 0, err
    assert "(queued, waiting: needs 1 node of 1 GPU; no worker is live)" in out


@pytest.mark.slow
def test_queueing_flags_reach_the_other_kinds_requests(service: Service) -> None:
    code, out, err = trainctl(
        service, "submit", "benchmark", "--steps", "5", "--priority", "-2", "--max-attempts",
        "4", "--json",
    )  # fmt: skip
    assert code == 0, err
    run = json.loads(out)
    assert (run["priority"], run["max_attempts"]) == (-2, 4)

    save_checkpoint(posix_store(service.data_dir / "checkpoints"), "done", step=4)
    code, out, err = trainctl(
        service, "checkpoints", "export", "done", "step_4", "--no-watch", "--priority", "9",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    run = json.loads(out)
    assert (run["kind"], run["priority"]) == ("export", 9)


@pytest.mark.slow
def test_an_out_of_range_priority_is_the_services_422(service: Service) -> None:
    code, out, err = trainctl(service, "submit", "benchmark", "--steps", "5", "--priority", "5000")

    assert code == 2 and out == ""
    assert "priority" in err and "HTTP 422" in err


@pytest.mark.parametrize("command", SUBMIT_COMMANDS, ids=" ".join)
def test_every_submit_command_takes_a_priority_and_max_attempts(command: tuple[str, ...]) -> None:
    code, out, _ = trainctl(None, *command, "--help", env={"COLUMNS": "200"})

    assert code == 0 and "--priority" in out and "--max-attempts" in out
