from __future__ import annotations

from typing import Any

import pytest
import torch

from trainctl.store.exceptions import UnknownPreset
from trainctl.store.models.presets import PRESETS, ModelConfig, PresetRegistry
from trainctl.worker.models.gpt import build_model, count_parameters


def test_output_shape_is_batch_time_vocab() -> None:
    model = build_model("tiny", seed=0)
    logits = model(torch.randint(0, 512, (3, 17)))
    assert logits.shape == (3, 17, 512)


def test_logits_are_softcapped() -> None:
    model = build_model("tiny", seed=0)
    with torch.no_grad():
        model.tok_emb.weight.mul_(1000)  # huge logits before the cap
        logits = model(torch.randint(0, 512, (1, 8)))
    assert logits.abs().max() <= 15.0
    assert logits.abs().max() > 14.0


def test_head_is_tied_to_the_embedding() -> None:
    model = build_model("tiny", seed=0)
    names = [n for n, _ in model.named_parameters()]
    assert "tok_emb.weight" in names
    assert not any("lm_head" in n for n in names)
    assert count_parameters(model) == model.config.param_counts()["total"]


def test_attention_is_causal() -> None:
    model = build_model("tiny", seed=0).eval()
    x = torch.randint(0, 512, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 512  # change only the future
    with torch.no_grad():
        assert torch.allclose(model(x)[0, :8], model(y)[0, :8], atol=1e-5)


def test_presets_have_the_documented_sizes() -> None:
    assert {"tiny", "small", "base"} <= set(PRESETS.names())
    small = PRESETS.get("small").param_counts()["total"]
    base = PRESETS.get("base")
    assert 110e6 < small < 140e6
    assert 370e6 < base.param_counts()["total"] < 450e6
    assert (base.vocab_size, base.max_seq_len) == (64_000, 4096)


def test_unknown_preset_lists_the_valid_names() -> None:
    with pytest.raises(UnknownPreset, match="valid presets: 1b, 8b, base, small, tiny"):
        build_model("huge")


def test_registering_a_preset_twice_is_an_error() -> None:
    registry = PresetRegistry()
    registry.register("a", ModelConfig(), "doc")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", ModelConfig(), "doc")


def test_a_model_rebuilds_from_its_config_dict() -> None:
    model = build_model("tiny", seed=1, n_layers=3)
    again = build_model(model.config.to_dict(), seed=1)
    assert again.config == model.config
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_mtp_heads_add_weighted_losses() -> None:
    model = build_model("tiny", seed=0, mtp_depth=2, mtp_loss_weights=(0.5, 0.25))
    x = torch.randint(0, 512, (2, 16))
    total, main = model.loss(x, x)
    assert len(model.mtp_heads) == 2
    assert total > main


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    x = torch.randint(0, 512, (2, 16))
    grads = []
    for ckpt in (False, True):
        model = build_model("tiny", seed=0, use_checkpoint_per_layer=ckpt)
        loss, _ = model.loss(x, x)
        loss.backward()
        grad = model.get_parameter("blocks.0.attn.wq.weight").grad
        assert grad is not None
        grads.append(grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_sequences_longer_than_the_model_maximum_are_refused() -> None:
    model = build_model("tiny", seed=0)
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 512"):
        model(torch.zeros(1, 513, dtype=torch.long))


def test_invalid_configs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="divisible by n_kv_heads"):
        ModelConfig(n_heads=12, n_kv_heads=5)


def test_a_compiled_model_trains_through_its_compiled_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training calls `loss`, not `forward`: compiling `forward` alone left every step eager.
    (That the compiled step computes what eager does: tests/reliability/test_compile.py.)"""
    compiled: list[str] = []

    def fake_compile(fn: Any, mode: str | None = None) -> Any:
        compiled.append(getattr(fn, "__name__", type(fn).__name__))
        return fn  # the eager function itself: nothing is compiled here

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = build_model("tiny", seed=0, use_compile=True, compile_mode="default")
    # nn.Module.compile compiles _call_impl (forward, which validation calls)
    assert compiled == ["_call_impl", "eager_loss"] and model.compiled_loss is not None
    calls: list[int] = []
    eager = model.compiled_loss

    def spy(idx: torch.Tensor, targets: torch.Tensor) -> Any:
        calls.append(idx.shape[0])
        return eager(idx, targets)

    model.compiled_loss = spy
    x = torch.randint(0, 512, (2, 8))
    loss, _ = model.loss(x, x)
    assert calls == [2]
    assert build_model("tiny", seed=0).compiled_loss is None
    assert torch.equal(loss, build_model("tiny", seed=0).loss(x, x)[0])


@pytest.mark.gpu
def test_compiled_model_runs_on_cuda() -> None:
    model = build_model(
        "tiny", device="cuda", seed=0, use_compile=True, compile_mode="reduce-overhead"
    )
    x = torch.randint(0, 512, (2, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = model.loss(x, x)
    loss.backward()
    assert torch.isfinite(loss)
