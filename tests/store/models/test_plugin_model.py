"""A plug-in model in a request (store/models/plugin.py): what submit checks, what its plan
holds, and that only workers having the plug-in take its run (store/db/placement.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from trainctl.store.db.placement import Capacity, Placement, why_waiting
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.kinds.registry import placement_of
from trainctl.store.kinds.train import TrainPlan, TrainRequest, resolve_train, train_need
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.specs import ModelSpec

TINY: dict[str, Any] = {
    "name": "tiny_mlp",
    "config": {"vocab_size": 256, "max_seq_len": 64, "d_model": 32},
}


def refusal(plugin: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        ModelSpec(plugin=plugin)
    return str(caught.value)


def test_a_plan_names_the_plugin_and_its_config_and_reads_back_as_one() -> None:
    request = TrainRequest(steps=3, model={"plugin": TINY}, batch={"seq_len": 32})
    plan = resolve_train(request, cuda_available=False, data_roots=[])
    config = plan.model.config
    assert isinstance(config, PluginModelConfig)
    assert (config.plugin, config.vocab_size, config.max_seq_len) == ("tiny_mlp", 256, 64)
    assert plan.model.plugin == TINY and plan.model.preset is None
    assert TrainPlan.model_validate_json(plan.model_dump_json()) == plan
    assert placement_of(plan).model_plugin == "tiny_mlp"
    assert train_need(plan).estimate.weights_and_optimizer > 0


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        ({"name": "../evil", "config": TINY["config"]}, "name: the name a plug-in"),
        ({"name": "m", "module": "os", "config": {}}, "module: a plug-in model takes only"),
        ({"name": "m", "config": {"max_seq_len": 64}}, "config.vocab_size: an integer"),
        ({"name": "m", "config": {"vocab_size": 256}}, "config.max_seq_len: an integer"),
        ({"name": "m", "config": TINY["config"] | {"f": {"a": 1}}}, "config.f: values are"),
    ],
)
def test_a_bad_plugin_request_is_refused_naming_the_field(plugin: Any, message: str) -> None:
    assert message in refusal(plugin)


def test_a_plugin_and_a_preset_or_hf_are_one_or_the_other() -> None:
    with pytest.raises(ValidationError, match="hf and plugin: each names the whole model"):
        ModelSpec(plugin=TINY, hf={"model_type": "llama"})


def test_the_batch_is_checked_against_the_plugins_context() -> None:
    request = TrainRequest(steps=1, model={"plugin": TINY}, batch={"seq_len": 128})
    with pytest.raises(InvalidRequest, match="above the model's max_seq_len 64"):
        resolve_train(request, cuda_available=False, data_roots=[])


def test_a_run_waits_for_a_worker_that_has_its_plugin() -> None:
    need = Placement(model_plugin="tiny_mlp")
    bare = Capacity("w1", "n1", 0, 4)
    assert why_waiting(need, [bare]) == (
        "waiting: needs the plug-in model 'tiny_mlp'; no live worker has it installed "
        "(GET /models lists the plug-ins of the live workers)"
    )
    having = Capacity("w2", "n2", 0, 4, frozenset({"tiny_mlp"}))
    assert why_waiting(need, [bare, having]) is None
    assert not bare.serves(need) and having.serves(need)


@pytest.fixture
def store(database_url: str) -> Iterator[RunStore]:
    with RunStore(database_url) as run_store:
        run_store.create_all()
        yield run_store


def register(store: RunStore, worker_id: str, plugins: tuple[str, ...]) -> None:
    store.workers.register(
        worker_id, host="h", pid=1, device="cpu", info={}, cpus=2, model_plugins=plugins
    )


def test_only_a_worker_with_the_plugin_claims_its_run(store: RunStore) -> None:
    run = store.enqueue("benchmark", "b", {}, placement=Placement(model_plugin="tiny_mlp"))
    register(store, "bare", ())
    register(store, "having", ("other", "tiny_mlp"))
    assert store.claim("bare", 60.0, rendezvous=lambda: "") is None
    claimed = store.claim("having", 60.0, rendezvous=lambda: "")
    assert claimed is not None and claimed.id == run.id
    assert claimed.placement.model_plugin == "tiny_mlp"
    workers = {w.id: w.model_plugins for w in store.workers.list_workers()}
    assert workers == {"bare": (), "having": ("other", "tiny_mlp")}
