from __future__ import annotations

from trainctl.worker.model import build_model
from trainctl.worker.optim import OptimizerConfig, build_optimizers


def test_every_parameter_is_in_exactly_one_optimizer() -> None:
    model = build_model("tiny", seed=0, mtp_depth=1)
    muon, adamw = build_optimizers(model)
    ids = [id(p) for opt in (muon, adamw) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}


def test_muon_gets_only_hidden_matrices_and_adamw_the_rest() -> None:
    model = build_model("tiny", seed=0)
    muon, adamw = build_optimizers(model)
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    adamw_ids = {id(p) for g in adamw.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        if id(p) in muon_ids:
            assert p.dim() == 2 and "tok_emb" not in name, name
    assert id(model.tok_emb.weight) in adamw_ids  # embedding, and so the tied head
    assert id(model.final_norm.weight) in adamw_ids
    assert id(model.blocks[0].attn.q_norm.weight) in adamw_ids
    assert id(model.blocks[0].mlp.w_gate.weight) in muon_ids


def test_seed_defaults_and_explicit_adjust_lr_fn() -> None:
    muon, adamw = build_optimizers(build_model("tiny", seed=0))
    assert muon.defaults["lr"] == 0.02
    assert muon.defaults["adjust_lr_fn"] == "original"
    assert adamw.defaults["lr"] == 3e-4
    assert adamw.defaults["betas"] == (0.9, 0.95)
    decays = sorted(g["weight_decay"] for g in adamw.param_groups)
    assert decays == [0.0, 0.1]  # vectors never decay; the embedding does


def test_config_values_reach_the_optimizers() -> None:
    cfg = OptimizerConfig(muon_lr=0.01, adamw_lr=1e-3, muon_adjust_lr_fn="match_rms_adamw")
    muon, adamw = build_optimizers(build_model("tiny", seed=0), cfg)
    assert (muon.defaults["lr"], adamw.defaults["lr"]) == (0.01, 1e-3)
    assert muon.defaults["adjust_lr_fn"] == "match_rms_adamw"
