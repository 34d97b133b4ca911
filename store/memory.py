"""How much memory a run needs at its peak, estimated from its plan before it is queued
(docs/architecture.md, "Requests and plans").

A request inside every documented bound can still need far more memory than any worker has
(preset `base` with 4,096 sequences of 256 tokens per forward pass on a CPU). Run as it is,
the worker is killed by the kernel's OOM killer, and the kernel may pick other processes
too. So submit refuses it, with the estimate and the limit, when it fits no worker.

The estimate counts, per process (each rank of a data-parallel run holds all of it):
weights, gradients and optimizer state in fp32 (as many state tensors per parameter as the
plan's optimizer kind says it keeps, `store.optimizers`), the activations kept for backward (the
layer inputs only, plus one layer's, with per-layer activation checkpointing), the tied
head's logits, an async checkpoint's staging copy, and a fixed runtime overhead. It errs
high, but within a small factor of what PyTorch allocates.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.hf_config import AnyModelConfig
from trainctl.store.optimizers import DEFAULT_OPTIMIZER_KIND, OPTIMIZER_KINDS
from trainctl.store.plans import BenchmarkPlan, SamplePlan, StepPlan, TrainPlan, ValidatePlan

GIB = 1 << 30
# The most memory one GPU on sale has (NVIDIA's B300, AMD's MI355X: 288 GB of HBM3e), rounded
# up to GiB: the ceiling a CUDA run is held to while no GPU worker says what it has
# (TRAINCTL_MAX_GPU_MEMORY_BYTES lowers it to a cluster's own).
LARGEST_GPU_MEMORY_BYTES = 288 * GIB
# The runtime before any tensor: torch's libraries and allocator pools on a CPU, the CUDA
# context and cuBLAS/cuDNN workspaces on a GPU.
RUNTIME_BYTES = {"cpu": GIB, "cuda": GIB}
# The eager head computes logits in chunks of this many elements (worker.model).
HEAD_CHUNK_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class MemoryEstimate:
    weights_and_optimizer: int
    activations: int
    head: int
    checkpoint_staging: int
    runtime: int

    @property
    def total(self) -> int:
        return (
            self.weights_and_optimizer
            + self.activations
            + self.head
            + self.checkpoint_staging
            + self.runtime
        )

    def describe(self) -> str:
        parts = {
            "weights, gradients and optimizer state": self.weights_and_optimizer,
            "activations": self.activations,
            "head logits": self.head,
            "async checkpoint staging": self.checkpoint_staging,
            "runtime": self.runtime,
        }
        return ", ".join(f"{name} {gib(size)}" for name, size in parts.items() if size)


def gib(size: int) -> str:
    return f"{size / GIB:,.1f} GiB"


def estimate_peak(
    config: AnyModelConfig,
    *,
    device: str,
    micro_batch_size: int,
    seq_len: int,
    async_checkpoint: bool = False,
    training: bool = True,
    optimizer: str = DEFAULT_OPTIMIZER_KIND,
    params: int | None = None,
) -> MemoryEstimate:
    """The peak memory of one process, for one micro-batch in flight, training with the
    optimizer kind `optimizer`. `training` False: a validation, which keeps weights only and
    no activations for backward. `params`: the real parameter count, where a worker built
    the model (on the meta device) and counted it, instead of the config's approximate one."""
    sizes = config.sizes()  # the built-in GPT's or a transformers model's, alike
    d, f, kv = sizes["d_model"], sizes["ffn"], sizes["kv"]
    params = sizes["params"] if params is None else params
    layers = sizes["layers"]
    kind = OPTIMIZER_KINDS.get(optimizer)
    tokens = micro_batch_size * seq_len
    # Autocast keeps most saved activations in bf16 on CUDA; on a CPU everything is fp32.
    element = 2 if device == "cuda" else 4
    # Per token and layer, what backward needs: norm inputs and outputs, q, k, v, the
    # attention output (flash attention keeps no T x T matrix), and SwiGLU's four
    # ffn-wide tensors.
    per_layer = tokens * (10 * d + 2 * kv + 4 * f) * element
    if not training:
        activations = per_layer  # no graph is kept: one layer's tensors at a time
    elif config.use_checkpoint_per_layer:
        activations = layers * tokens * d * element + per_layer
    else:
        activations = layers * per_layer
    vocab_elements = tokens * config.vocab_size
    # Compiled, the head is a plain expression that keeps the logits (and their gradient);
    # eager, a fused function works through them a chunk at a time.
    head = (
        2 * 4 * vocab_elements
        if config.use_compile
        else 2 * 4 * min(vocab_elements, HEAD_CHUNK_ELEMENTS)
    )
    return MemoryEstimate(
        weights_and_optimizer=params * (kind.bytes_per_param if training else 4),
        activations=activations,
        head=head if training else 4 * min(vocab_elements, HEAD_CHUNK_ELEMENTS),
        # The staging copy (weights and optimizer state) is host memory: on a GPU it is
        # not the device's.
        checkpoint_staging=(
            params * kind.staged_bytes_per_param if async_checkpoint and device == "cpu" else 0
        ),
        runtime=RUNTIME_BYTES.get(device, GIB),
    )


@dataclass(frozen=True)
class MemoryLimit:
    """The most memory a run may need, and whose it is, in words for a refusal."""

    size: int
    held_by: str = "the largest worker has"


def refuse_unless_it_fits(
    estimate: MemoryEstimate,
    processes: int,
    device: str,
    limit: int | MemoryLimit | None,
    what: str,
) -> None:
    """InvalidRequest naming the estimate and the limit when `processes` copies of the run
    (ranks) do not fit the largest worker's memory. A GPU rank has a device each; CPU
    ranks share the node's memory. Without a known limit, nothing is refused."""
    if limit is None:
        return
    if not isinstance(limit, MemoryLimit):
        limit = MemoryLimit(limit)
    need = node_bytes(estimate, processes, device)
    if need <= limit.size:
        return
    ranks = f" for each of {processes} processes" if processes > 1 and device == "cpu" else ""
    where = "GPU memory" if device == "cuda" else "memory"
    raise InvalidRequest(
        f"{what} needs about {gib(need)} of {where}{ranks} ({estimate.describe()}), more "
        f"than {limit.held_by}: {gib(limit.size)}; use a smaller micro_batch_size or "
        "seq_len (grad_accum_steps keeps the batch), activation checkpointing, or a "
        "smaller model"
    )


def node_bytes(estimate: MemoryEstimate, processes: int, device: str) -> int:
    """What `processes` copies of the run need of one worker: CPU ranks share the node's
    memory, each GPU rank has a device of its own."""
    return estimate.total * (processes if device == "cpu" else 1)


@dataclass(frozen=True)
class MemoryNeed:
    """What one run needs: the peak of each of its `processes`, on `device`."""

    estimate: MemoryEstimate
    processes: int
    device: str
    what: str
    """The run in words, for the refusal: 'this train run'."""
    config: AnyModelConfig
    """The model it was estimated for: a worker that claims the run counts this model's
    real parameters when the estimate had to guess them (worker/admission.py)."""


def train_need(plan: TrainPlan, params: int | None = None) -> MemoryNeed:
    what = "this train run"
    return _step_need(plan, what, plan.async_checkpoint, plan.nproc_per_node, params)


def benchmark_need(plan: BenchmarkPlan, params: int | None = None) -> MemoryNeed:
    return _step_need(plan, "this benchmark", False, 1, params)


def _step_need(
    plan: StepPlan, what: str, async_checkpoint: bool, processes: int, params: int | None
) -> MemoryNeed:
    b = plan.batch
    estimate = estimate_peak(
        plan.model.config,
        device=plan.device,
        micro_batch_size=b.micro_batch_size,
        seq_len=b.seq_len,
        async_checkpoint=async_checkpoint,
        optimizer=plan.optimizer.kind,
        params=params,
    )
    return MemoryNeed(estimate, processes, plan.device, what, plan.model.config)


def validate_need(plan: ValidatePlan, params: int | None = None) -> MemoryNeed:
    estimate = estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=plan.batch_size,
        seq_len=plan.seq_len,
        training=False,
        params=params,
    )
    return MemoryNeed(estimate, 1, plan.device, "this validation", plan.model)


def sample_need(plan: SamplePlan, params: int | None = None) -> MemoryNeed:
    # Every prompt decodes at once, over at most the whole context: a validation's forward
    # of that batch, and the keys and values of every layer kept for it.
    longest = max(len(p) for p in plan.prompt_tokens) + plan.generation.max_new_tokens
    estimate = estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=len(plan.prompt_tokens),
        seq_len=longest,
        training=False,
        params=params,
    )
    sizes = plan.model.sizes()
    kv, layers = sizes["kv"], sizes["cache_layers"]
    cache = 2 * layers * len(plan.prompt_tokens) * longest * kv * 4
    estimate = dataclasses.replace(estimate, activations=estimate.activations + cache)
    return MemoryNeed(estimate, 1, plan.device, "this sample run", plan.model)


def admit(need: MemoryNeed, limit: int | MemoryLimit | None) -> None:
    """Refuse a run that fits no worker's memory (see `refuse_unless_it_fits`)."""
    refuse_unless_it_fits(need.estimate, need.processes, need.device, limit, need.what)


def host_memory_bytes() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit when lower
    (a container's `--memory`)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
