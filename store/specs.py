"""Run specs: what a user may ask for, with bounds, and the resolve step that fills defaults.

These pydantic models are the single source of truth: the API validates requests with them
(and publishes them in its OpenAPI schema), the run row stores the *resolved* spec, and the
worker executes exactly that. Device-dependent defaults come from a `Profile` (CPU or CUDA).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from store.exceptions import InvalidRequest, TrainctlError
from store.presets import PRESETS, ModelConfig, get_preset

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_STEPS = 10_000_000
TARGET_TOKENS = 8_310_000_000  # the seed's pre-training budget: 8.31 B tokens
# More tokens than this in one forward pass exhausts any single device's memory: a request
# for it is a mistake to refuse now, not a run to fail after loading the data.
MAX_TOKENS_PER_MICRO_BATCH = 1 << 20
# Larger models than this are not something one node of this service trains: a request
# for one is a typo (or an attack), not a plan.
MAX_MODEL_PARAMS = 20_000_000_000
# The most GPUs one node has today (and CPU ranks beyond this only contend for cores).
MAX_NPROC_PER_NODE = 16

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="Letters, digits, '.', '_', '-'.")]
Device = Literal["cpu", "cuda"]


# Numbers and booleans are Strict*: a value must have the JSON type the schema publishes.
# Pydantic's lax mode reads `{"seed": false}` as a seed of 0, "5" as 5 and 1 as true; a user
# who sent the wrong type gets a 422 naming the field instead of a run they did not mean. An
# integer is still a valid float ("muon_lr": 1). Not `strict=True` on the models: that would
# also make the pydantic mypy plugin refuse dicts for nested models (`TrainSpec(data={...})`).
class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(Spec):
    preset: str | None = Field(
        None,
        description=f"Named model preset ({', '.join(PRESETS.names())}); "
        "default: the device profile's preset.",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='ModelConfig fields to change from the preset, e.g. {"n_layers": 4}.',
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None:
            get_preset(v)  # raises UnknownPreset listing the valid names
        return v

    def config(self, default_preset: str) -> ModelConfig:
        cfg = get_preset(self.preset or default_preset).replace(**self.overrides)
        params = cfg.param_counts()["total"]
        if params > MAX_MODEL_PARAMS:
            raise InvalidRequest(
                f"model has {params:,} parameters, above the limit of {MAX_MODEL_PARAMS:,}"
            )
        return cfg


class BatchSpec(Spec):
    micro_batch_size: StrictInt | None = Field(
        None, ge=1, le=4096, description="Sequences per forward/backward pass."
    )
    grad_accum_steps: StrictInt | None = Field(
        None, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    seq_len: StrictInt | None = Field(
        None, ge=8, le=131_072, description="Tokens per sequence; at most the model's max."
    )


class OptimizerSpec(Spec):
    muon_lr: StrictFloat = Field(0.02, gt=0, le=10, description="Muon learning rate.")
    muon_momentum: StrictFloat = Field(0.95, ge=0, lt=1, description="Muon (Nesterov) momentum.")
    muon_weight_decay: StrictFloat = Field(0.1, ge=0, le=1, description="Muon weight decay.")
    muon_adjust_lr_fn: Literal["original", "match_rms_adamw"] = Field(
        "original", description="Muon's per-shape lr adjustment (torch.optim.Muon)."
    )
    adamw_lr: StrictFloat = Field(3e-4, gt=0, le=10, description="AdamW learning rate.")
    adamw_beta1: StrictFloat = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adamw_beta2: StrictFloat = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    adamw_weight_decay: StrictFloat = Field(0.1, ge=0, le=1, description="AdamW weight decay.")
    grad_clip: StrictFloat = Field(
        1.0, ge=0, le=1e6, description="Global gradient-norm clip; 0 disables."
    )


class ScheduleSpec(Spec):
    warmup_frac: StrictFloat = Field(0.01, ge=0, le=1, description="Fraction of steps warming up.")
    stable_frac: StrictFloat = Field(0.84, ge=0, le=1, description="Fraction of steps at full lr.")
    decay: Literal["linear", "cosine", "sqrt"] = Field(
        "linear", description="Shape of the final decay (sqrt: the 1-sqrt cooldown)."
    )
    min_lr_ratio: StrictFloat = Field(
        0.1, ge=0, le=1, description="lr factor at and after the end."
    )

    @model_validator(mode="after")
    def _fractions_fit(self) -> ScheduleSpec:
        if self.warmup_frac + self.stable_frac > 1.0 + 1e-9:
            raise ValueError(
                f"warmup_frac + stable_frac must be <= 1, got "
                f"{self.warmup_frac} + {self.stable_frac}"
            )
        return self


class DataSpec(Spec):
    source: Literal["synthetic", "stdlib", "text", "shards"] = Field(
        "stdlib",
        description="synthetic: random tokens; stdlib: the Python standard library's source "
        "as byte-level text; text: files under the data roots as bytes; shards: .bin token "
        "shards (llm.c format) under the data roots.",
    )
    paths: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Files, folders or globs (text and shards); relative to the first data root.",
    )
    val_paths: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Held-out shards or files; default: the tail of the training data.",
    )
    val_fraction: StrictFloat = Field(
        0.05, gt=0, lt=0.5, description="Tail fraction held out when val_paths is empty."
    )
    max_bytes: StrictInt = Field(
        16_000_000, ge=1024, le=2**34, description="Cap on text bytes read (text, stdlib)."
    )
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="Seed of the batch order.")

    @model_validator(mode="after")
    def _paths_match_source(self) -> DataSpec:
        if self.source in ("text", "shards") and not self.paths:
            raise ValueError(f"data source {self.source!r} needs at least one entry in paths")
        if self.source in ("synthetic", "stdlib") and (self.paths or self.val_paths):
            raise ValueError(f"data source {self.source!r} takes no paths")
        return self


class TrainSpec(Spec):
    experiment: Name = Field("default", description="Checkpoints go to checkpoints/<experiment>.")
    steps: StrictInt = Field(
        ..., ge=1, le=MAX_STEPS, description="Optimizer steps to train in total."
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model preset and changes.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch geometry.")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Muon + AdamW.")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec, description="WSD schedule.")
    data: DataSpec = Field(default_factory=DataSpec, description="Training data.")
    checkpoint_every: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Save step_<N> every this many steps (and at the end); default: steps / 10.",
    )
    max_keep: StrictInt = Field(3, ge=1, le=10_000, description="step_* checkpoints kept.")
    save_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Weights' dtype on disk; bfloat16 is a lossy export."
    )
    async_checkpoint: StrictBool = Field(
        False,
        description="Save checkpoints in the background: the loop stalls only to copy the "
        "state to CPU memory (a copy of the weights and optimizer state, kept between saves), "
        "and a thread writes and commits it exactly as a synchronous save does; at most one "
        "save is in flight and a run waits for it before it ends. Off by default: on a "
        "CPU-only node the writer competes with training for the same cores.",
    )
    val_every: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Validate every this many steps; a better loss "
        "saves the 'best' checkpoint. Default: checkpoint_every.",
    )
    val_batches: StrictInt = Field(8, ge=1, le=10_000, description="Batches per validation.")
    resume_from: str | None = Field(
        None, description="'latest' or a tag of this experiment to continue from."
    )
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="Seed of the model initialisation.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to run.")
    nproc_per_node: StrictInt = Field(
        1,
        ge=1,
        le=MAX_NPROC_PER_NODE,
        description="Processes (GPUs) the run trains on, data-parallel (DDP through "
        "torchrun). The global batch stays micro_batch_size x grad_accum_steps sequences: "
        "each process runs grad_accum_steps / nproc_per_node micro-batches, so "
        "grad_accum_steps must be a multiple of it (by default it is rounded up to one).",
    )
    model_config_resolved: dict[str, Any] | None = Field(
        None, description="Filled by the server: the full model config that runs."
    )

    @field_validator("resume_from")
    @classmethod
    def _resume_ref(cls, v: str | None) -> str | None:
        if v is not None and v != "latest" and not re.match(NAME_PATTERN, v):
            raise ValueError(
                "resume_from must be 'latest' or a checkpoint tag (letters, digits, '.', '_', '-')"
            )
        return v


class BenchmarkSpec(Spec):
    steps: StrictInt = Field(100, ge=1, le=100_000, description="Measured steps.")
    warmup_steps: StrictInt = Field(10, ge=0, le=10_000, description="Unmeasured steps first.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model preset and changes.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch geometry.")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Muon + AdamW.")
    use_compile: StrictBool | None = Field(None, description="torch.compile; default on CUDA only.")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] | None = Field(
        None, description="torch.compile mode; default reduce-overhead."
    )
    use_checkpoint_per_layer: StrictBool | None = Field(
        None, description="Per-layer activation checkpointing; default on CUDA only."
    )
    target_tokens: StrictInt = Field(
        TARGET_TOKENS, ge=1, le=10**15, description="Tokens the time estimate is for."
    )
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1, description="Seed of the model initialisation.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to run.")
    model_config_resolved: dict[str, Any] | None = Field(
        None, description="Filled by the server: the full model config that runs."
    )
    warnings: list[str] = Field(default_factory=list, description="Filled by the server.")


class ValidateSpec(Spec):
    checkpoint: str = Field(
        "latest",
        description="'latest', 'best', or '<experiment>/<tag>'; with 'latest' or "
        "'best', `experiment` narrows the search.",
    )
    experiment: Name | None = Field(None, description="Experiment for latest/best.")
    data: DataSpec = Field(default_factory=DataSpec, description="Validation data.")
    batch_size: StrictInt = Field(4, ge=1, le=4096, description="Sequences per batch.")
    seq_len: StrictInt | None = Field(None, ge=8, le=131_072, description="Default: profile's.")
    num_batches: StrictInt = Field(8, ge=1, le=100_000, description="Batches to average over.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to run.")

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_ref(cls, v: str) -> str:
        parts = v.split("/")
        ok = v in ("latest", "best") or (
            len(parts) == 2 and all(re.match(NAME_PATTERN, p) and ".." not in p for p in parts)
        )
        if not ok:
            raise ValueError("checkpoint must be 'latest', 'best' or '<experiment>/<tag>'")
        return v


# --- resolve -------------------------------------------------------------------------------


class Profile(BaseModel):
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
    if requested == "cuda" and not cuda_available:
        raise InvalidRequest("device 'cuda' was requested but no worker has a CUDA device")
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    return "cuda" if requested == "cuda" else "cpu"


def _geometry(batch: BatchSpec, profile: Profile, cfg: ModelConfig) -> BatchSpec:
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
    return BatchSpec(
        micro_batch_size=micro,
        grad_accum_steps=batch.grad_accum_steps or profile.grad_accum_steps,
        seq_len=seq_len,
    )


def _split_across_ranks(resolved: BatchSpec, requested: BatchSpec, nproc: int) -> BatchSpec:
    """Each of `nproc` ranks runs an equal share of a step's micro-batches."""
    accum = resolved.grad_accum_steps or 1
    if accum % nproc == 0:
        return resolved
    if requested.grad_accum_steps is not None:
        raise InvalidRequest(
            f"batch.grad_accum_steps {accum} does not split evenly across nproc_per_node "
            f"{nproc} processes; use a multiple of {nproc}"
        )
    return resolved.model_copy(update={"grad_accum_steps": -(-accum // nproc) * nproc})


def _model_config(model: ModelSpec, profile: Profile, **runtime: Any) -> ModelConfig:
    try:
        return model.config(profile.preset).replace(**runtime)
    except TrainctlError:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"model.overrides: {exc}") from exc


def resolve_train(spec: TrainSpec, *, cuda_available: bool, data_roots: list[Path]) -> TrainSpec:
    device = pick_device(spec.device, cuda_available)
    profile = TRAIN_PROFILES[device]
    cfg = _model_config(spec.model, profile)
    if spec.data.source in ("stdlib", "text") and cfg.vocab_size < 256:
        raise InvalidRequest("byte-level text needs a vocab_size of at least 256")
    checkpoint_every = spec.checkpoint_every or max(spec.steps // 10, 1)
    return spec.model_copy(
        update={
            "device": device,
            "model": ModelSpec(
                preset=spec.model.preset or profile.preset, overrides=spec.model.overrides
            ),
            "batch": _split_across_ranks(
                _geometry(spec.batch, profile, cfg), spec.batch, spec.nproc_per_node
            ),
            "data": resolve_data(spec.data, data_roots),
            "checkpoint_every": checkpoint_every,
            "val_every": spec.val_every or checkpoint_every,
            "model_config_resolved": cfg.to_dict(),
        }
    )


def resolve_benchmark(spec: BenchmarkSpec, *, cuda_available: bool) -> BenchmarkSpec:
    device = pick_device(spec.device, cuda_available)
    profile = BENCHMARK_PROFILES[device]
    use_compile = profile.use_compile if spec.use_compile is None else spec.use_compile
    compile_mode = spec.compile_mode or "reduce-overhead"
    ckpt = (
        profile.use_checkpoint_per_layer
        if spec.use_checkpoint_per_layer is None
        else spec.use_checkpoint_per_layer
    )
    # MTP stays off in the benchmark (as in the seed) unless the overrides ask for it.
    cfg = _model_config(
        spec.model,
        profile,
        use_compile=use_compile,
        compile_mode=compile_mode,
        use_checkpoint_per_layer=ckpt,
    )
    warnings = list(spec.warnings)
    if device == "cpu" and spec.device == "auto" and CPU_BENCHMARK_WARNING not in warnings:
        warnings.append(CPU_BENCHMARK_WARNING)
    return spec.model_copy(
        update={
            "device": device,
            "model": ModelSpec(
                preset=spec.model.preset or profile.preset, overrides=spec.model.overrides
            ),
            "batch": _geometry(spec.batch, profile, cfg),
            "use_compile": use_compile,
            "compile_mode": compile_mode,
            "use_checkpoint_per_layer": ckpt,
            "model_config_resolved": cfg.to_dict(),
            "warnings": warnings,
        }
    )


def resolve_validate(
    spec: ValidateSpec, *, cuda_available: bool, data_roots: list[Path], max_seq_len: int
) -> ValidateSpec:
    """`max_seq_len` is that of the checkpoint's model (read from its metadata)."""
    device = pick_device(spec.device, cuda_available)
    seq_len = spec.seq_len or min(TRAIN_PROFILES[device].seq_len, max_seq_len)
    if seq_len > max_seq_len:
        raise InvalidRequest(
            f"seq_len {seq_len} is above the checkpoint model's max_seq_len {max_seq_len}"
        )
    return spec.model_copy(
        update={
            "device": device,
            "seq_len": seq_len,
            "data": resolve_data(spec.data, data_roots),
        }
    )


# --- data paths ------------------------------------------------------------------------------


def resolve_data(data: DataSpec, roots: list[Path]) -> DataSpec:
    """Expand globs now (so a typo is a 422, not a failed run) and confine them to the roots."""
    if data.source in ("synthetic", "stdlib"):
        return data
    return data.model_copy(
        update={
            "paths": [str(p) for p in confine_paths(data.paths, roots, "data.paths")],
            "val_paths": [str(p) for p in confine_paths(data.val_paths, roots, "data.val_paths")],
        }
    )


def confine_paths(patterns: list[str], roots: list[Path], field: str) -> list[Path]:
    if patterns and not roots:
        raise InvalidRequest(
            f"{field}: no data roots are configured (set TRAINCTL_DATA_ROOTS), "
            "so no files may be read"
        )
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    files: list[Path] = []
    for pattern in patterns:
        if "\x00" in pattern:
            raise InvalidRequest(f"{field}: path contains a NUL byte")
        full = pattern if os.path.isabs(pattern) else str(real_roots[0] / pattern)
        matches = sorted(glob.glob(full, recursive=True))
        if not matches:
            raise InvalidRequest(f"{field}: no files match {pattern!r}")
        for m in matches:
            p = Path(m)
            found = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            for f in found:
                real = Path(os.path.realpath(f))
                if not any(real.is_relative_to(r) for r in real_roots):
                    raise InvalidRequest(
                        f"{field}: {pattern!r} reaches {f}, outside the data roots "
                        f"({', '.join(map(str, real_roots))})"
                    )
                files.append(real)
    return files
