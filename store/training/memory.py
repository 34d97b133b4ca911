"""How much memory a run needs at its peak, estimated from its plan before it is queued
(docs/design/kinds.md, "Requests and plans").

A request inside every documented bound can still need far more memory than any worker has
(preset `base` with 4,096 sequences of 256 tokens per forward pass on a CPU). Run as it is,
the worker is killed by the kernel's OOM killer, and the kernel may pick other processes
too. So submit refuses it, with the estimate and the limit, when it fits no worker.

The estimate counts, per process: weights, gradients and optimizer state in fp32 (as many
state tensors per parameter as the plan's optimizer kind says it keeps, `store.training.optim`),
all of it on each rank under ddp and 1/W of it under a sharding strategy
(`store.training.parallelism`, with what it gathers, `fsdp_gathered_bytes`), the activations kept
for backward (the layer inputs only, plus one layer's, with per-layer activation checkpointing), a
transformers model's attention scores (heads x T x T, one layer's), the tied head's logits, an
async checkpoint's staging copy, and a fixed runtime overhead. It errs high, but within a small
factor of what PyTorch allocates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.hf_config import AnyModelConfig
from trainctl.store.plans import StepPlan
from trainctl.store.training.optim import DEFAULT_OPTIMIZER_KIND, OPTIMIZER_KINDS

GIB = 1 << 30
# The most memory one GPU on sale has (NVIDIA's B300, AMD's MI355X: 288 GB of HBM3e), rounded
# up to GiB: the ceiling a CUDA run is held to while no GPU worker says what it has
# (TRAINCTL_MAX_GPU_MEMORY_BYTES lowers it to a cluster's own).
LARGEST_GPU_MEMORY_BYTES = 288 * GIB
# The runtime before any tensor: torch's libraries and allocator pools on a CPU, the CUDA
# context and cuBLAS/cuDNN workspaces on a GPU.
RUNTIME_BYTES = {"cpu": GIB, "cuda": GIB}
# The eager head computes logits in chunks of this many elements (worker.models.gpt).
HEAD_CHUNK_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class MemoryEstimate:
    weights_and_optimizer: int
    activations: int
    head: int
    checkpoint_staging: int
    runtime: int
    gathered: int = 0
    """A sharded rank's unsharded copies: FSDP's all-gathered parameters and unsharded
    gradients (`fsdp_gathered_bytes`); 0 under ddp."""

    @property
    def total(self) -> int:
        return (
            self.weights_and_optimizer
            + self.gathered
            + self.activations
            + self.head
            + self.checkpoint_staging
            + self.runtime
        )

    def describe(self) -> str:
        parts = {
            "weights, gradients and optimizer state": self.weights_and_optimizer,
            "gathered by fsdp": self.gathered,
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
    shards: Sharding | None = None,
) -> MemoryEstimate:
    """The peak memory of one process, for one micro-batch in flight, training with the
    optimizer kind `optimizer`. `training` False: a validation, which keeps weights only and
    no activations for backward. `params`: the real parameter count, where a worker built
    the model (on the meta device) and counted it, instead of the config's approximate one.
    `shards`: a sharding strategy's split of the state, and what it gathers; None: replicated."""
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
    # A transformers model's attention may materialise every head's T x T scores (its math
    # kernel does; which kernel runs is transformers' choice): one layer's at a time, in
    # fp32 where softmax computes them. The built-in model's flash attention keeps none.
    heads = sizes.get("heads", 0)
    activations += micro_batch_size * heads * seq_len * seq_len * 4
    vocab_elements = tokens * config.vocab_size
    # Compiled, the head is a plain expression that keeps the logits (and their gradient);
    # eager, a fused function works through them a chunk at a time.
    head = (
        2 * 4 * vocab_elements
        if config.use_compile
        else 2 * 4 * min(vocab_elements, HEAD_CHUNK_ELEMENTS)
    )
    state = params * (kind.bytes_per_param if training else 4)
    count = shards.count if shards is not None else 1
    return MemoryEstimate(
        weights_and_optimizer=-(-state // count),  # rounded up: uneven shards
        gathered=fsdp_gathered_bytes(sizes, params, device, shards) if shards else 0,
        activations=activations,
        head=head if training else 4 * min(vocab_elements, HEAD_CHUNK_ELEMENTS),
        # The staging copy (weights and optimizer state) is host memory: on a GPU it is
        # not the device's.
        checkpoint_staging=(
            params * kind.staged_bytes_per_param // count
            if async_checkpoint and device == "cpu"
            else 0
        ),
        runtime=RUNTIME_BYTES.get(device, GIB),
    )


@dataclass(frozen=True)
class Sharding:
    """How a sharding strategy splits one rank's training state (`store.training.parallelism`)."""

    count: int
    """The shard count: nnodes x nproc_per_node."""
    reshard_after_forward: bool
    accumulates: bool
    """More than one micro-batch per rank and step: gradients are kept unsharded between the
    backwards that do not synchronise."""


def fsdp_gathered_bytes(sizes: dict[str, int], params: int, device: str, shards: Sharding) -> int:
    """What an FSDP2 rank holds unsharded at its peak, besides its 1/W shards. The model:

    - parameters are gathered in the param dtype: bf16 on CUDA (MixedPrecisionPolicy), fp32
      on a CPU;
    - the root unit (the embedding, which is also the tied head, the final norm, MTP heads:
      whatever is not in a block) is gathered at the root's forward and kept until its
      backward, so through the whole step;
    - with reshard_after_forward, two blocks at a time: the one computing and the next one,
      whose all-gather FSDP prefetches to overlap it; without, every block stays gathered from
      its forward to its backward, so at the start of backward all of them are;
    - one block's unsharded gradient in fp32 before its reduce-scatter;
    - with more than one micro-batch per rank, the whole model's unsharded gradients (param
      dtype) are kept between the backwards that do not synchronise
      (`set_requires_gradient_sync(False)`): one reduce-scatter per step costs that memory.

    A block is counted from the widths (attention 2d² + 2d·kv, SwiGLU 3d·ffn): an MoE's
    experts land in the root unit, which errs high."""
    d, f, kv, layers = sizes["d_model"], sizes["ffn"], sizes["kv"], sizes["cache_layers"]
    element = 2 if device == "cuda" else 4
    block = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    blocks = min(layers * block, params)
    root = params - blocks
    block = blocks // max(layers, 1)
    held = blocks if not shards.reshard_after_forward else min(2, layers) * block
    unsharded_grads = params * element if shards.accumulates else 0
    return (root + held) * element + block * 4 + unsharded_grads


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
    sharded: tuple[str, MemoryEstimate] | None = None,
) -> None:
    """InvalidRequest naming the estimate and the limit when `processes` copies of the run
    (ranks) do not fit the largest worker's memory. A GPU rank has a device each; CPU
    ranks share the node's memory. Without a known limit, nothing is refused. `sharded`: a
    sharding strategy's name and the run's estimate under it, suggested where it fits."""
    if limit is None:
        return
    if not isinstance(limit, MemoryLimit):
        limit = MemoryLimit(limit)
    need = node_bytes(estimate, processes, device)
    if need <= limit.size:
        return
    ranks = f" for each of {processes} processes" if processes > 1 and device == "cpu" else ""
    where = "GPU memory" if device == "cuda" else "memory"
    advice = (
        "use a smaller micro_batch_size or seq_len (grad_accum_steps keeps the batch), "
        "activation checkpointing, or a smaller model"
    )
    if sharded is not None:
        name, alternative = sharded
        sharded_need = node_bytes(alternative, processes, device)
        fits = sharded_need <= limit.size
        advice = (
            f"sharded it needs about {gib(sharded_need)} ({alternative.describe()}), which "
            f"{'fits' if fits else 'does not fit either'}: "
            + (f'set "parallelism": {{"strategy": "{name}"}}' if fits else advice)
        )
    raise InvalidRequest(
        f"{what} needs about {gib(need)} of {where}{ranks} ({estimate.describe()}), more "
        f"than {limit.held_by}: {gib(limit.size)}; {advice}"
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
    real parameters when the estimate had to guess them (worker/training/memory.py)."""
    sharded: tuple[str, MemoryEstimate] | None = None
    """A replicated run's estimate under a sharding strategy, by the strategy's name: what
    a refusal suggests."""


def step_estimate(
    plan: StepPlan, async_checkpoint: bool, params: int | None, shards: Sharding | None = None
) -> MemoryEstimate:
    """The peak of one process running a training step's plan: a train run's (each kind's
    need is in its module of store/kinds/) or a benchmark's."""
    b = plan.batch
    return estimate_peak(
        plan.model.config,
        device=plan.device,
        micro_batch_size=b.micro_batch_size,
        seq_len=b.seq_len,
        async_checkpoint=async_checkpoint,
        optimizer=plan.optimizer.kind,
        params=params,
        shards=shards,
    )


def admit(need: MemoryNeed, limit: int | MemoryLimit | None) -> None:
    """Refuse a run that fits no worker's memory (see `refuse_unless_it_fits`)."""
    refuse_unless_it_fits(
        need.estimate, need.processes, need.device, limit, need.what, need.sharded
    )


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
