"""torch.compile of the train step, with per-layer activation checkpointing, against eager.

On the CPU (inductor, mode `default`) under `make soak` only: with inductor's compiles of the
`tiny` step (forward and backward) and of validation's forward, the test takes one to two
minutes on two cores, beyond `make test`'s budget. The CUDA twin (mode `reduce-overhead`, CUDA
graphs, under bf16 autocast) is a `gpu` test: `pytest -m gpu`, which `bench/gpu.sh` runs on a
GPU node.

Run the CPU one alone with `TRAINCTL_SOAK_ROUNDS=1 pytest tests/reliability/test_compile.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.plans import train_plan
from tests.support.stores import posix_store
from trainctl.worker.training.hooks import TrainerHooks, never
from trainctl.worker.training.loop import train

STEPS, CHECKPOINT_AT = 20, 10
# fp32 on the CPU. The compiled step computes the same loss in another order: inductor fuses
# and reorders the reductions (RMSNorm, softmax, the cross-entropy over 512 logits), and its
# graph has the plain head + cross-entropy where eager runs the fused head loss. So the first
# step's loss, from the same weights, differs by float32 rounding alone (a few ulps, about
# 1e-7 relative; 1e-6 allowed). The gradients differ by as little, but Muon orthogonalises
# them in bfloat16 (torch.optim.Muon casts to bf16 for Newton-Schulz): an ulp of float32 can
# flip a bf16 rounding, 4e-3 relative on that element, so each update differs a little and the
# difference grows over the steps (1.8e-4 at most over these 20 steps when this was written,
# docs/performance.md item 7). 1e-3 leaves room for another CPU's kernels and is still far
# below what a wrong graph does: a stale weight or a dropped recompute moves the loss by 1e-2
# or more from the second step on.
FIRST_STEP_RTOL = 1e-6
CPU_RTOL = 1e-3
# bf16 autocast on CUDA: matmuls in bfloat16 (8 bits of mantissa, 4e-3 relative), and the
# compiled graph rounds to bf16 at other places than eager does.
CUDA_RTOL = 2e-2


def request(experiment: str, compile_mode: str | None, **kw: Any) -> dict[str, Any]:
    """A `tiny` run on the stdlib bytes with per-layer checkpointing; compiled in
    `compile_mode`, or eager for None."""
    overrides: dict[str, Any] = {"use_checkpoint_per_layer": True}
    if compile_mode is not None:
        overrides |= {"use_compile": True, "compile_mode": compile_mode}
    return dict(
        experiment=experiment,
        steps=STEPS,
        model={"preset": "tiny", "overrides": overrides},
        data={"source": "stdlib", "max_bytes": 1 << 20},
        batch={"micro_batch_size": 4, "seq_len": 128, "grad_accum_steps": 2},
        checkpoint_every=CHECKPOINT_AT,
        val_every=STEPS,
        val_batches=1,
        **kw,
    )


def losses(root: Path, stop_after: int | None = None, **req: Any) -> dict[int, float]:
    """The train losses of a run by step (it stops after `stop_after` steps)."""
    seen: dict[int, float] = {}

    def on_metrics(m: dict[str, Any]) -> None:
        if m["kind"] == "train":
            seen[m["step"]] = m["loss"]

    stop = (lambda: len(seen) >= stop_after) if stop_after else never
    train(
        train_plan(root, **req),
        posix_store(root),
        hooks=TrainerHooks(on_metrics=on_metrics, should_stop=stop),
    )
    return seen


@pytest.fixture
def deterministic() -> Iterator[None]:
    """torch's deterministic algorithms, for the test's duration.

    The compiled CPU step is not bit-reproducible by default: inductor lowers the embedding's
    backward (an index_put with accumulate) to atomic adds across threads, whose order varies
    from run to run (two runs of the same compiled graph on the same batches parted at the
    third step by 3e-7 relative). In deterministic mode inductor keeps aten's index_put there,
    so a resume can be checked bit for bit, as eager resumes are
    (tests/worker/training/test_train.py).
    """
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def max_relative_difference(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


@pytest.mark.soak  # inductor takes minutes on 2 cores
def test_on_cpu_the_compiled_step_matches_eager_and_resumes_from_its_checkpoint(
    tmp_path: Path, deterministic: None
) -> None:
    started = time.perf_counter()
    eager = losses(tmp_path, **request("eager", None))
    compiled = losses(tmp_path, **request("compiled", "default"))
    compiled_at = time.perf_counter()
    first = losses(tmp_path, CHECKPOINT_AT, **request("resumed", "default"))
    second = losses(tmp_path, **request("resumed", "default", resume_from="latest"))
    diff = max_relative_difference(compiled, eager)
    print(
        f"\neager  {[round(eager[s], 6) for s in sorted(eager)]}\n"
        f"compiled {[round(compiled[s], 6) for s in sorted(compiled)]}\n"
        f"relative difference: step 1 {abs(compiled[1] - eager[1]) / eager[1]:.1e}, "
        f"max {diff:.3e}; eager + compiled {compiled_at - started:.0f} s, "
        f"both halves of the resumed run {time.perf_counter() - compiled_at:.0f} s"
    )
    assert sorted(eager) == list(range(1, STEPS + 1))
    assert eager[STEPS] < eager[1] - 0.5  # it learns: the comparison is not of flat noise
    assert abs(compiled[1] - eager[1]) <= FIRST_STEP_RTOL * eager[1]
    assert diff <= CPU_RTOL
    assert sorted(first) == list(range(1, CHECKPOINT_AT + 1))
    assert sorted(second) == list(range(CHECKPOINT_AT + 1, STEPS + 1))
    # The resumed run recompiles the same graph: the same kernels on the same inputs.
    assert {**first, **second} == compiled


@pytest.mark.gpu
def test_on_cuda_the_reduce_overhead_step_matches_eager(tmp_path: Path) -> None:
    """CUDA graphs over a step of two micro-batches, bf16 autocast, activation checkpointing."""
    eager = losses(tmp_path, **request("eager", None, device="cuda"))
    compiled = losses(tmp_path, **request("compiled", "reduce-overhead", device="cuda"))
    diff = max_relative_difference(compiled, eager)
    print(f"\nmax relative difference {diff:.3e} (bf16 autocast)")
    assert diff <= CUDA_RTOL
