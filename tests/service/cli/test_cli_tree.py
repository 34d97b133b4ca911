"""`trainctl runs tree EXP`: the tree of forks an experiment's train run is in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
        assert lines[0].startswith(f"stable  {root['short_id']}  queued")
        assert any(f"stable.cool  {cool['short_id']}  queued" in line for line in lines)
        assert any(cool["id"][:8] in line and "from stable/step_10  <" in line for line in lines)
        assert any(other["id"][:8] in line and line.rstrip().endswith("step_10") for line in lines)
        assert root["id"] not in out  # the short ids, not the whole ones

        code, out, _ = trainctl(served, "runs", "tree", "stable.cool", "--json")
        tree = json.loads(out)
        assert tree["run"]["id"] == root["id"]
        assert [f["id"] for f in tree["forks"]] == [cool["id"], other["id"]]

        code, _, err = trainctl(served, "runs", "tree", "nothing")
        assert code == 1 and "experiment 'nothing' has no train run" in err


def test_runs_show_takes_a_short_id_and_runs_list_shows_short_ids(
    client: TestClient, settings: Settings
) -> None:
    run = submit(client, "train", CPU_TRAIN).json()

    with serve(create_app(settings)) as url:
        code, shown, _ = trainctl(At(url), "runs", "show", run["short_id"])
        _, listed, _ = trainctl(At(url), "runs", "list")

    assert code == 0 and json.loads(shown)["id"] == run["id"]
    assert listed.splitlines()[1].split()[:2] == [run["id"][:8], "train"]
    assert run["id"] not in listed


def test_submit_forks_queues_a_sweep_from_a_spec_file_all_or_none(
    client: TestClient, ckpts: CheckpointStore, settings: Settings, tmp_path: Path
) -> None:
    root = submit(client, "train", CPU_TRAIN | {"experiment": "stable"}).json()
    save_checkpoint(ckpts, "stable", step=10, metadata={"run_id": root["id"]})
    cooldown = {"steps": 100, "device": "cpu", "schedule": {"decay_start": 10, "decay": "sqrt"}}
    sweep = tmp_path / "sweep.json"
    sweep.write_text(
        json.dumps({"variants": [cooldown | {"experiment": f"stable.{n}"} for n in ("a", "b")]})
    )
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"variants": [cooldown | {"experiment": "stable.c"}, {}]}))
    not_a_sweep = tmp_path / "run.json"
    not_a_sweep.write_text(json.dumps(cooldown))

    with serve(create_app(settings)) as url:
        served = At(url)
        code, out, err = trainctl(served, "submit", "forks", "stable/step_10", "--spec", sweep)
        assert code == 0, err
        lines = out.splitlines()
        assert len(lines) == 2 and all(line.startswith("submitted fork ") for line in lines)
        assert "into stable.a (queued" in lines[0] and "into stable.b (queued" in lines[1]
        assert "their tree: trainctl runs tree stable" in err
        _, listed, _ = trainctl(served, "runs", "list", "--json")
        forks = [r["id"] for r in json.loads(listed) if r["experiment"] in ("stable.a", "stable.b")]
        compare = f"{url}/#/compare?runs={root['id']},"
        assert compare in err and all(fork in err for fork in forks), err

        code, out, err = trainctl(served, "submit", "forks", "stable/step_10", "--spec", refused)
        assert code == 2 and "variants.1" in err, err
        code, _, err = trainctl(served, "submit", "forks", "stable/step_10", "--spec", not_a_sweep)
        assert code == 2 and 'a sweep is {"variants": [...]}' in err
        _, listed, _ = trainctl(served, "runs", "list", "--json")
    experiments = {run["experiment"] for run in json.loads(listed)}
    assert {"stable.a", "stable.b"} <= experiments and "stable.c" not in experiments
