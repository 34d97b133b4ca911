"""A parallel strategy that only a plug-in defines trains a run on two CPU ranks (docs/design/
training.md, "Multi-GPU and multi-node"): `replicas`, from tests/plugins/trainctl_replicas,
installed by pip as a distribution declaring its record under `trainctl.parallel_strategies`
and its builder under `trainctl.strategies`, with no trainctl module edited.

The ranks start isolated (store/processes.py: `python -I`, torchrun's children of the
launcher's), so they find the strategy only by its entry points, in the environment the run is
launched from (tests/e2e/plugin_env.py makes one). They train like one process on the same
global batch, as ddp's replicas do, and save in the layout the plug-in's builder chose:
sharded, every rank writing its part, which the built-in ddp never writes; one process loads
it back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.plugin_env import install_plugin, pyproject
from tests.support.ranks import LOSS_RTOL, STEPS, tiny_plan, train_losses
from tests.support.stores import posix_store
from trainctl.store.checkpoints.manifests import DCP_LAYOUT
from trainctl.worker.checkpoints.state import load_checkpoint
from trainctl.worker.models import build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer

REPO = Path(__file__).resolve().parents[2]
REPLICAS = pyproject(
    "trainctl-replicas",
    "trainctl_replicas",
    {
        "trainctl.parallel_strategies": {"replicas": "trainctl_replicas.record:REPLICAS"},
        "trainctl.strategies": {"replicas": "trainctl_replicas.builder:BUILDER"},
    },
)
# Run by the plug-in environment's python from the repository (`-c`: the working folder
# first on its path, as `python -m` puts it): two ranks of a run naming the strategy.
LAUNCH = """
import json, sys
from pathlib import Path
from tests.support.ranks import tiny_plan
from trainctl.store.training.parallelism import PARALLEL_STRATEGIES
from trainctl.store.worker_settings import WorkerSettings
from trainctl.worker.launch import launch_train
from trainctl.worker.training.parallelism import STRATEGY_BUILDERS

root = Path(sys.argv[1])
plan = tiny_plan(parallelism={"strategy": "replicas"}, nproc_per_node=2)
result = launch_train(plan, WorkerSettings(data_dir=root), ctx=None)
found = {"records": PARALLEL_STRATEGIES.names(), "builders": STRATEGY_BUILDERS.names()}
(root / "out.json").write_text(json.dumps({**found, "result": result}, default=str))
"""


@pytest.fixture(scope="module")
def replicas_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of an environment where trainctl-replicas is installed (by pip, offline)."""
    env, source = tmp_path_factory.mktemp("replicas-env"), tmp_path_factory.mktemp("replicas-src")
    return install_plugin(env, source, "trainctl_replicas", REPLICAS)


def test_a_strategy_only_a_plugin_defines_trains_two_ranks_in_the_layout_its_builder_chose(
    replicas_python: Path, tmp_path: Path
) -> None:
    launched = subprocess.run(
        [str(replicas_python), "-c", LAUNCH, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-6000:]
    out: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    assert out["records"] == ["ddp", "fsdp", "replicas"] == out["builders"]

    single: list[dict[str, Any]] = []
    one = TrainerHooks(on_metrics=single.append)
    Trainer(tiny_plan(), posix_store(tmp_path / "single"), hooks=one).run()
    got = train_losses(out["result"]["metrics"])
    assert len(got) == STEPS
    assert got == pytest.approx(train_losses(single), rel=LOSS_RTOL)

    checkpoints = posix_store(tmp_path / "checkpoints")
    saved = checkpoints.get("ddp", f"step_{STEPS}")  # tiny_plan's experiment
    assert saved.layout == DCP_LAYOUT  # every rank wrote its part: the builder's choice
    model = build_model(tiny_plan().model.config, seed=1)
    meta = load_checkpoint(model, None, None, checkpoints.entry("ddp", saved.tag))
    assert (meta["step"], meta["world_size"]) == (STEPS, 2)
