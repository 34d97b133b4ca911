"""Host-device syncs in the training loop (issue 46's CPU part, docs/performance.md, "Host
syncs"): every read of a tensor's value on the host (`.item()`, `.tolist()`, `.cpu()`,
`.numpy()`, `float()`, `int()`, a Python `if` on a tensor) waits for the device to finish
what it was given, and leaves it idle while Python catches up. A train step makes exactly one
(the loss, the norm and the agreement on the update, together), loss health adds none, and a
validation makes one however many batches it reads.

The reads are counted here on the CPU, with a torch function mode that sees every Python
read of a tensor, attributed to the step the loop is in (its `on_progress` hook): a read added
anywhere in the step path counts, in the loop, the optimizers, the model or the health checks.
A read inside a C++ op (none in the ops a step runs) or a `.to("cpu")` (a no-op on a CPU)
is the GPU run's to see (bench/gpu.sh)."""

from __future__ import annotations

import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.support.hf_archs import hf
from tests.support.plans import train_plan
from tests.support.stores import posix_store
from trainctl.worker.models import build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import Trainer
from trainctl.worker.training.validation import compute_validation_loss

READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}
STEPS, LOG_EVERY = 9, 4
TRANSFORMERS = "/transformers/models/"


class HostReads(TorchFunctionMode):
    """Every host read of a tensor's value while active, as `(read, function)`, filed under
    the current `at` (the loop's step); those made inside a transformers model's own code
    apart, in `model_reads`."""

    def __init__(self) -> None:
        super().__init__()
        self.at = 0
        self.reads: defaultdict[int, list[tuple[str, str]]] = defaultdict(list)
        self.model_reads: defaultdict[int, list[tuple[str, str]]] = defaultdict(list)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS:
            stack = traceback.extract_stack()[:-1]
            whose = (
                self.model_reads if any(TRANSFORMERS in f.filename for f in stack) else self.reads
            )
            whose[self.at].append((name, stack[-1].name))
        return func(*args, **(kwargs or {}))

    def step(self, step: int, total: int) -> None:
        self.at = step


def test_the_counter_sees_every_kind_of_host_read() -> None:
    t = torch.tensor([1.5, 2.0])
    with HostReads() as counted:
        t[0].item(), t.tolist(), t.cpu(), t.numpy(), float(t[0]), int(t[1])
        if t[0] > 1:
            pass
    assert [name for name, _ in counted.reads[0]] == [
        "item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "model",
    [{"preset": "tiny"}, {"hf": hf("llama")}, {"hf": hf("qwen3_moe")}],
    ids=["gpt", "llama", "moe"],  # the MoE has its own metric of the step (the aux loss)
)
def test_a_train_step_reads_the_device_once_and_health_adds_nothing(
    tmp_path: Path, model: dict[str, Any]
) -> None:
    plan = train_plan(
        experiment="syncs",
        steps=STEPS,
        log_every=LOG_EVERY,
        checkpoint_every=STEPS,
        val_every=STEPS,
        model=model,
        batch={"micro_batch_size": 2, "seq_len": 16, "grad_accum_steps": 2},
    )
    assert plan.health.nonfinite == "skip" and plan.health.spike.action != "off"  # all on
    counted = HostReads()
    trainer = Trainer(plan, posix_store(tmp_path), hooks=TrainerHooks(on_progress=counted.step))
    with counted:
        result = trainer.run()
    assert result["step"] == STEPS
    # Step s's reads are filed under s - 1 (the loop reports s once it is done), and its log,
    # validation and save come after, under s: the boundaries at LOG_EVERY and the last.
    for step in range(STEPS):
        if step % LOG_EVERY == 0 and step > 0:
            continue  # a log boundary: the metrics it writes are floats already read
        assert counted.reads[step] == [("tolist", "train_step")], (step, counted.reads[step])
    # transformers' eager MoE blocks pick their experts on the host (`nonzero`, then an
    # index read per expert hit in every layer): the peer's code, a sync per expert that a
    # grouped-GEMM MoE would not have. The dense models read nothing.
    moe = "moe" in str(model)
    assert bool(counted.model_reads) == moe, dict(counted.model_reads)
    if moe:
        assert {read for reads in counted.model_reads.values() for read in reads} == {
            ("__index__", "_get_abs_string_index")
        }


def test_a_validation_reads_the_device_once() -> None:
    net = build_model("tiny")
    batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(5)]
    with HostReads() as counted:
        result = compute_validation_loss(net, batches=batches)
    assert result["n_tokens"] == 5 * 2 * 16
    assert counted.reads[0] == [("item", "compute_validation_loss")]
