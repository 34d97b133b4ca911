"""`trainctl runs tree EXP`: the tree of forks an experiment's train run is in."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi.testclient import TestClient

from tests.service.api.submits import CPU_TRAIN, submit
from tests.service.cli.invoke import trainctl
from tests.service.fakes import save_checkpoint
from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.store.checkpoints.store import CheckpointStore


@dataclass(frozen=True)
class At:
    url: str


def test_runs_tree_shows_the_whole_tree_from_its_root(
    client: TestClient, ckpts: CheckpointStore, settings: Settings
) -> None:
    root = submit(client, "train", CPU_TRAIN | {"experiment": "stable"}).json()
    save_checkpoint(ckpts, "stable", step=10, metadata={"run_id": root["id"]})
    fork = {"steps": 100, "device": "cpu", "fork_from": "stable/step_10"}
    cool = submit(client, "train", fork | {"experiment": "stable.cool"}).json()
    other = submit(client, "train", fork | {"experiment": "stable.other"}).json()

    with serve(create_app(settings)) as url:  # a second app on the same data dir
        served = At(url)
        code, out, _ = trainctl(served, "runs", "tree", "stable.cool")
        assert code == 0
        lines = out.splitlines()
        assert lines[0].startswith(f"stable  {root['id']}  queued")
        assert any(cool["id"] in line and "from stable/step_10  <" in line for line in lines)
        assert any(other["id"] in line and line.rstrip().endswith("step_10") for line in lines)

        code, out, _ = trainctl(served, "runs", "tree", "stable.cool", "--json")
        tree = json.loads(out)
        assert tree["run"]["id"] == root["id"]
        assert [f["id"] for f in tree["forks"]] == [cool["id"], other["id"]]

        code, _, err = trainctl(served, "runs", "tree", "nothing")
        assert code == 1 and "experiment 'nothing' has no train run" in err
