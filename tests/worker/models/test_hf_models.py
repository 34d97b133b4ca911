"""Transformers architectures trained by trainctl (worker/models, docs/models.md): what Muon
gets, a short run that learns, a bit-exact resume in a fresh process, an export that
transformers loads with trainctl's logits, samples, and bad configs refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from tests.support.hf_archs import ARCHITECTURES, TRAINED, hf
from tests.support.plans import train_plan
from tests.support.stores import posix_store
from tests.support.train_script import run_script
from trainctl.store.exceptions import InvalidRequest
from trainctl.worker.checkpoints.exports import export_hf
from trainctl.worker.models import build_model
from trainctl.worker.models.generation import load_for_generation
from trainctl.worker.models.hf import ModelBuildError
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import train
from trainctl.worker.training.optim import ROUTER_NAMES, muon_params

STEPS, STOP_AT = 24, 12


def tiny(model_type: str, **changes: Any) -> Any:
    return build_model(train_plan(steps=1, model={"hf": hf(model_type, **changes)}).model.config)


def muon_names(model: torch.nn.Module) -> list[str]:
    return [name.removeprefix("inner.") for name, _ in muon_params(model)]


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_muon_gets_the_hidden_matrices_only(model_type: str) -> None:
    model = tiny(model_type)
    names = muon_names(model)
    assert names, "no hidden matrix at all"
    embedding = model.inner.get_input_embeddings().weight
    head = model.inner.get_output_embeddings().weight
    for name, p in muon_params(model):
        short = name.removeprefix("inner.")
        # Each one against the rule: a 2-D matrix inside the layers, not a table, a head or
        # a router, and not tied to the embedding.
        assert p.dim() == 2 and short.startswith("model.layers."), short
        assert p is not embedding and p is not head, short
        assert not set(short.split(".")[:-1]) & ROUTER_NAMES, short
        assert "norm" not in short and not short.endswith(".bias"), short
    # What a reader checks by eye: the projections of attention and MLP, experts included.
    assert any("q_proj" in n or "in_proj" in n or "q_a_proj" in n for n in names)
    assert any("down_proj" in n for n in names)
    if model_type == "qwen3_next":
        assert not any("conv1d" in n or "A_log" in n or "dt_bias" in n for n in names)


def test_the_builtin_model_keeps_its_muon_parameters() -> None:
    model = build_model("tiny", mtp_depth=1)
    names = muon_names(model)
    assert "tok_emb.weight" not in names and "blocks.0.mlp.w_gate.weight" in names
    assert all(p.dim() == 2 for _, p in muon_params(model))


@pytest.mark.parametrize(
    ("hf_request", "message"),
    [
        ({"model_type": "not_a_model"}, "is not a causal LM"),
        (hf("llama", n_layers=2), "LlamaConfig has no field n_layers"),
        (hf("qwen3", auto_map={"AutoModel": "x.Y"}), "auto_map: not accepted"),
    ],
)
def test_a_bad_config_is_refused_at_submit(hf_request: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        train_plan(steps=1, model={"hf": hf_request})


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe", "olmo2", "qwen3_next"])
def test_an_unsatisfiable_head_count_is_refused_at_submit(model_type: str) -> None:
    with pytest.raises(InvalidRequest, match="num_key_value_heads"):
        train_plan(steps=1, model={"hf": hf(model_type, num_key_value_heads=3)})


@pytest.mark.parametrize(
    ("model_type", "changes", "message"),
    [
        # The config class checks this in its __init__, which submit does not run.
        ("qwen3_next", {"layer_types": ["linear_attention"]}, "number of layer types"),
        # An activation is looked up by name when the model is built.
        ("llama", {"hidden_act": "no_such_activation"}, "cannot build this model"),
    ],
)
def test_what_only_transformers_knows_fails_when_the_model_is_built(
    model_type: str, changes: dict[str, Any], message: str
) -> None:
    plan = train_plan(steps=1, model={"hf": hf(model_type, **changes)})
    with pytest.raises(ModelBuildError, match=message):
        build_model(plan.model.config)


def test_a_head_dim_the_config_class_does_not_list_sets_the_attention_width() -> None:
    # Qwen3-MoE takes head_dim through **kwargs: accepted at submit because its modeling
    # code reads it, and the built model's projections have the asked width.
    model = tiny("qwen3_moe", head_dim=32)
    attention = model.inner.model.layers[0].self_attn
    assert attention.head_dim == 32
    assert attention.q_proj.out_features == 4 * 32 and attention.k_proj.out_features == 2 * 32


def request_of(model_type: str, experiment: str) -> dict[str, Any]:
    return dict(
        experiment=experiment,
        steps=STEPS,
        model={"hf": hf(model_type)},
        batch={"micro_batch_size": 8, "seq_len": 64, "grad_accum_steps": 1},
        optimizer={"adamw_lr": 3e-3},
        data={"max_bytes": 200_000},
        checkpoint_every=STOP_AT,
        val_every=STOP_AT,
        val_batches=2,
        log_every=1,
    )


@pytest.mark.slow
@pytest.mark.parametrize("model_type", TRAINED)
def test_an_architecture_trains_resumes_exports_and_samples(
    model_type: str, tmp_path: Path
) -> None:
    torch.set_num_threads(2)  # as the resumed process (run_script) runs
    store = posix_store(tmp_path)
    metrics: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    straight = train_plan(
        **request_of(model_type, "straight"),
        sample_every=STEPS,
        sample_prompts=["def "],
        sample_settings={"max_new_tokens": 8},
    )
    train(straight, store, hooks=TrainerHooks(on_metrics=metrics.append, on_sample=samples.append))
    losses = [m["loss"] for m in metrics if m["kind"] == "train"]
    assert losses[-1] <= 0.7 * losses[0], losses
    assert any(m["kind"] == "val" and "val_bits_per_byte" in m for m in metrics)
    if ARCHITECTURES[model_type].get("output_router_logits"):
        assert all(m["aux_loss"] > 0 for m in metrics if m["kind"] == "train")
    assert len(samples) == 1 and len(samples[0]["completion"].encode()) >= 1

    # Resume: stop half-way here, go on in a fresh process, and compute the same steps.
    first: list[dict[str, Any]] = []
    resumed = train_plan(**request_of(model_type, "resumed"))
    train(
        resumed,
        store,
        hooks=TrainerHooks(
            on_metrics=lambda m: first.append(m) if m["kind"] == "train" else None,
            should_stop=lambda: len(first) >= STOP_AT,
        ),
    )
    rest = train_plan(tmp_path, **request_of(model_type, "resumed"), resume_from="latest")
    second = run_script(rest, tmp_path)
    assert [m["loss"] for m in first] + [r["loss"] for r in second] == losses
    a = load_file(str(tmp_path / "straight" / f"step_{STEPS}" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / f"step_{STEPS}" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # Export: transformers loads it, and its logits are trainctl's.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exports = posix_store(tmp_path / "exports")
    export_hf(store.entry("straight", f"step_{STEPS}"), exports, "straight", "final")
    folder = tmp_path / "exports" / "straight" / "final"
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours, _ = load_for_generation(store, ("straight", f"step_{STEPS}"))
    tokens = torch.tensor([list(b"def train(model):\n    return")])
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=tokens).logits, ours(tokens), rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(folder)("def").input_ids == list(b"def")
    # The checkpoint folder itself is a transformers folder too.
    checkpoint = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / f"step_{STEPS}")
    assert type(checkpoint) is type(theirs)
