"""A checkpoint's model config is input to the worker too (docs/models.md, "What is checked
where"): a planted field a request could not give is refused before transformers sees it, on
every path that builds a model from a checkpoint (export, validate/sample/evaluate's loader,
resume's check), and by the build itself whatever hands it the config; an export writes the
config.json of the model it built, never the checkpoint's own file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import save_checkpoint
from tests.support.hf_archs import hf
from tests.support.plans import train_plan
from tests.support.stores import entry_at, manifest_of, posix_store, read_files, write_entry
from trainctl.store.checkpoints.exports import CONFIG_FILE
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, METADATA_FILE
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.hf_config import HfModelConfig
from trainctl.worker.checkpoints.exports import export_hf, load_trained
from trainctl.worker.checkpoints.state import check_model_fits
from trainctl.worker.models import build_model
from trainctl.worker.models.generation import load_for_generation
from trainctl.worker.models.hf import ModelBuildError
from trainctl.worker.training.optim import build_optimizers

PLANTED = {
    "_attn_implementation": "kernels-community/flash-attn",
    "auto_map": ["AutoModelForCausalLM", "evil.Model"],
    "trust_remote_code": True,
    "torch_dtype": "float64",
    "eos_token_id": 50000,
}


def tiny_llama() -> HfModelConfig:
    config = train_plan(steps=1, model={"hf": hf("llama")}).model.config
    assert isinstance(config, HfModelConfig)
    return config


def saved(tmp_path: Path) -> Path:
    """A tiny llama's checkpoint, as the worker writes one: weights, config.json, metadata."""
    model = build_model(tiny_llama(), seed=0)
    folder = tmp_path / "checkpoints" / "exp"
    optimizers = build_optimizers(model)
    return save_checkpoint(model, optimizers, None, 1, 100, None, folder, files=model.files())


def replace_files(checkpoint: Path, changes: dict[str, bytes]) -> None:
    """Commit the checkpoint again with `changes` and a manifest that lists them: what one
    who can write the store can do."""
    store = posix_store(checkpoint.parent.parent)
    files = read_files(store, "exp", checkpoint.name) | changes
    files.pop(MANIFEST_FILE)
    write_entry(store, "exp", checkpoint.name, {**files, MANIFEST_FILE: manifest_of(files)})


def plant(checkpoint: Path, field: str, value: Any) -> None:
    """Give metadata.json's model config and config.json `field`, past the store's rules."""
    store = posix_store(checkpoint.parent.parent)
    files = read_files(store, "exp", checkpoint.name)
    meta = json.loads(files[METADATA_FILE])
    meta["model_config"]["fields"][field] = value
    config = json.loads(files[CONFIG_FILE]) | {field: value}
    changes = {METADATA_FILE: json.dumps(meta), CONFIG_FILE: json.dumps(config)}
    replace_files(checkpoint, {name: text.encode() for name, text in changes.items()})


@pytest.mark.parametrize("field", PLANTED)
def test_the_build_refuses_a_planted_field_before_transformers_sees_it(field: str) -> None:
    clean = tiny_llama()
    unchecked = HfModelConfig.model_construct(
        **{**clean.__dict__, "fields": {**clean.fields, field: PLANTED[field]}}
    )
    with pytest.raises(ModelBuildError, match=field):
        build_model(unchecked)


@pytest.mark.parametrize("field", PLANTED)
def test_every_worker_path_that_reads_a_checkpoint_refuses_a_planted_model_config(
    tmp_path: Path, field: str
) -> None:
    checkpoint = saved(tmp_path)
    plant(checkpoint, field, PLANTED[field])
    store = posix_store(checkpoint.parent.parent)
    with pytest.raises(InvalidRequest, match=field):
        load_trained(entry_at(checkpoint))  # export
    with pytest.raises(InvalidRequest, match=field):
        load_for_generation(store, ("exp", checkpoint.name))  # validate, sample, evaluate
    metadata = json.loads(read_files(store, "exp", checkpoint.name)[METADATA_FILE])
    with pytest.raises(ValueError, match=field):
        check_model_fits(build_model(tiny_llama()), metadata, "exp/step_1")  # resume


def test_an_export_writes_the_config_of_the_model_it_built_not_the_checkpoints_file(
    tmp_path: Path,
) -> None:
    checkpoint = saved(tmp_path)
    store = posix_store(checkpoint.parent.parent)
    config = json.loads(read_files(store, "exp", checkpoint.name)[CONFIG_FILE])
    planted = config | {"auto_map": {"AutoModel": "evil.Model"}}
    replace_files(checkpoint, {CONFIG_FILE: json.dumps(planted).encode()})
    exports = posix_store(tmp_path / "exports")
    export_hf(entry_at(checkpoint), exports, "exp", checkpoint.name)
    exported = json.loads(read_files(exports, "exp", checkpoint.name)[CONFIG_FILE])
    assert "auto_map" not in exported and exported["model_type"] == "llama"
