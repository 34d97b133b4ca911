"""Resolution: a request becomes its plan at submit time (docs/design/kinds.md, "Requests and
plans"); what the kinds' resolvers share.

Each kind's resolver (`resolve_<kind>`, and `plan_<kind>`, which its record names) is in the
kind's module of store/kinds/ and decides everything a run needs now, so that a bad request is
a 422 rather than a failed run later: the device, the model config, the batch geometry, the
data files or the dataset, and the concrete checkpoint a resume or a validation reads. What
several of them resolve alike is here: device-dependent defaults (a `Profile`, CPU or CUDA),
the device, the model and batch plans, the checkpoint a run reads and its tokenizer, and the
`SubmitContext` they read it all from. The data's files and datasets are pinned on the data
shelf (store/data/pins.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import DatasetStore
from trainctl.store.data.codec import TextCodec, build_codec
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.shards import DataError
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import CheckpointNotFound, InvalidRequest, TrainctlError
from trainctl.store.models.hf_config import AnyModelConfig, HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.names import BEST_TAG, LATEST_REF
from trainctl.store.plans import (
    BatchPlan,
    Device,
    ModelPlan,
    TokenizerPin,
)
from trainctl.store.specs import (
    BatchSpec,
    CheckpointChoice,
    ModelSpec,
    Spec,
    Tracker,
)

# More tokens than this in one forward pass exhausts any single device's memory: a request
# for it is a mistake to refuse now, not a run to fail after loading the data.
MAX_TOKENS_PER_MICRO_BATCH = 1 << 20

# --- device profiles ------------------------------------------------------------------------


class Profile(Spec):
    """Device-dependent defaults."""

    device: Device
    preset: str
    micro_batch_size: int
    grad_accum_steps: int
    seq_len: int
    use_compile: bool
    use_checkpoint_per_layer: bool


# The seed's A100 benchmark configuration, and a CPU-sized one so that a 100-step benchmark
# takes about a minute on two cores instead of hours.
BENCHMARK_PROFILES = {
    "cuda": Profile(
        device="cuda",
        preset="base",
        micro_batch_size=4,
        grad_accum_steps=8,
        seq_len=4096,
        use_compile=True,
        use_checkpoint_per_layer=True,
    ),
    "cpu": Profile(
        device="cpu",
        preset="tiny",
        micro_batch_size=16,
        grad_accum_steps=3,
        seq_len=512,
        use_compile=False,
        use_checkpoint_per_layer=False,
    ),
}
TRAIN_PROFILES = {
    "cuda": Profile(
        device="cuda",
        preset="small",
        micro_batch_size=16,
        grad_accum_steps=2,
        seq_len=1024,
        use_compile=False,
        use_checkpoint_per_layer=False,
    ),
    "cpu": Profile(
        device="cpu",
        preset="tiny",
        micro_batch_size=8,
        grad_accum_steps=1,
        seq_len=256,
        use_compile=False,
        use_checkpoint_per_layer=False,
    ),
}
CPU_BENCHMARK_WARNING = (
    "no CUDA device: ran the CPU profile (preset tiny, micro-batch 16, grad-accum 3, "
    "seq 512) instead of the GPU configuration; figures are not comparable with GPU runs"
)


def pick_device(requested: str, cuda_available: bool) -> Device:
    """'auto' is CUDA where a worker has it, else the CPU. An explicit 'cuda' is CUDA even
    while no GPU worker is live: the run waits for one (its `waiting_reason` says so) rather
    than fail for lack of GPUs."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    return "cuda" if requested == "cuda" else "cpu"


# --- shared by the kinds' resolvers ---------------------------------------------------------


def checkpoint_codec(checkpoints: CheckpointStore, info: CheckpointInfo) -> TextCodec | None:
    """The text codec of a checkpoint's tokenizer (its tokenizer.json, read through the
    store, checked against the recorded sha256); None where it records none."""
    tokenizer_json = None
    if info.tokenizer is not None and info.tokenizer.kind == "bpe":
        try:
            with checkpoints.entry(info.experiment, info.tag).open(TOKENIZER_FILE) as f:
                tokenizer_json = f.read()
        except OSError as exc:
            raise InvalidRequest(
                f"checkpoint {info.experiment}/{info.tag}: cannot read its {TOKENIZER_FILE} "
                f"({exc.strerror or exc})"
            ) from None
    try:
        return build_codec(info.tokenizer, tokenizer_json)
    except DataError as exc:
        raise InvalidRequest(f"checkpoint {info.experiment}/{info.tag}: {exc}") from None


def tokenizer_pin(info: CheckpointInfo, codec: TextCodec | None) -> TokenizerPin | None:
    if info.tokenizer is None or codec is None:
        return None
    return TokenizerPin(kind=info.tokenizer.kind, sha256=info.tokenizer.sha256, eot_id=codec.eot_id)


def shared_options(request: Spec, shared: type[Spec]) -> dict[str, Any]:
    """The fields a request hands to its plan unchanged (those of the shared base)."""
    return {name: getattr(request, name) for name in shared.model_fields}


def model_plan(model: ModelSpec, profile: Profile, **runtime: Any) -> ModelPlan:
    if model.hf is not None:
        try:
            hf = HfModelConfig.of_request(model.hf).replace(**runtime)
        except ValueError as exc:
            raise InvalidRequest(f"model.hf: {exc}") from exc
        return ModelPlan(preset=None, overrides={}, hf=model.hf, config=hf)
    if model.plugin is not None:
        try:
            plugin = PluginModelConfig.of_request(model.plugin).replace(**runtime)
        except ValueError as exc:
            raise InvalidRequest(f"model.plugin: {exc}") from exc
        return ModelPlan(preset=None, overrides={}, plugin=model.plugin, config=plugin)
    try:
        config = model.config(profile.preset).replace(**runtime)
    except TrainctlError:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"model.overrides: {exc}") from exc
    return ModelPlan(
        preset=model.preset or profile.preset, overrides=model.overrides, config=config
    )


def batch_geometry(batch: BatchSpec, profile: Profile, cfg: AnyModelConfig) -> BatchPlan:
    seq_len = batch.seq_len or min(profile.seq_len, cfg.max_seq_len)
    if seq_len > cfg.max_seq_len:
        raise InvalidRequest(
            f"batch.seq_len {seq_len} is above the model's max_seq_len {cfg.max_seq_len}"
        )
    micro = batch.micro_batch_size or profile.micro_batch_size
    if micro * seq_len > MAX_TOKENS_PER_MICRO_BATCH:
        raise InvalidRequest(
            f"batch: micro_batch_size {micro} x seq_len {seq_len} = {micro * seq_len:,} tokens "
            f"per forward pass, above the limit of {MAX_TOKENS_PER_MICRO_BATCH:,}; use "
            "grad_accum_steps for a larger batch"
        )
    return BatchPlan(
        micro_batch_size=micro,
        grad_accum_steps=batch.grad_accum_steps or profile.grad_accum_steps,
        seq_len=seq_len,
    )


def chosen_checkpoint(
    checkpoints: CheckpointStore, choice: CheckpointChoice, purpose: str
) -> CheckpointInfo:
    """'latest', 'best' (optionally within `experiment`) or 'exp/tag' → one checkpoint now."""
    try:
        if choice.checkpoint == LATEST_REF:
            return checkpoints.latest(choice.experiment)
        if choice.checkpoint == BEST_TAG:
            return checkpoints.best(choice.experiment)
        experiment, tag = choice.checkpoint.split("/")
        return checkpoints.get(experiment, tag)
    except CheckpointNotFound as exc:
        raise InvalidRequest(f"checkpoint: {exc}; nothing to {purpose}") from None


# --- submit: what each kind's resolver reads (store.kinds.base.RunKind.resolve) ----------


@dataclass
class SubmitContext:
    """What resolving a request may read: the service's settings and stores (or a train run's
    worker's, for the evaluate runs of its checkpoints: store.evals.side_runs)."""

    data_roots: list[Path]
    datasets: DatasetStore
    """The prepared datasets (the data dir's, or the bucket's: TRAINCTL_STORAGE_URL)."""
    checkpoints: CheckpointStore
    exports: CheckpointStore
    """Where exports go: an export request is refused when its checkpoint's is there."""
    runs: RunStore
    cuda: Callable[[], bool]
    """Whether runs can get a CUDA device; asked only by kinds that run a model, once."""
    default_trackers: Sequence[Tracker] = ()
    mlflow_configured: bool = False
    wandb_project: str | None = None
    """The service's W&B project (TRAINCTL_WANDB_PROJECT); None: the wandb tracker is off."""

    @cached_property
    def cuda_available(self) -> bool:
        return self.cuda()
