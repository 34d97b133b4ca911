"""Resolution: a request becomes its plan at submit time (docs/design/kinds.md, "Requests and
plans").

`resolve_train`, `resolve_validate`, `resolve_benchmark`, `resolve_prepare`, `resolve_sample`
and `resolve_export` decide everything a run needs now, so that a bad request is a 422 rather
than a failed run later: the device, the model config, the batch geometry, the data files or
the dataset, and the concrete checkpoint a resume or a validation reads. Device-dependent
defaults come from a `Profile` (CPU or CUDA).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from trainctl.store.checkpoints.exports import check_exportable
from trainctl.store.checkpoints.info import (
    CheckpointInfo,
    TokenizerId,
    check_fits,
    tokenizers_differ,
)
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import BucketDatasets
from trainctl.store.data.codec import TextCodec, build_codec
from trainctl.store.data.contents import (
    TokenArrays,
    check_enough_tokens,
    check_inputs,
    check_tokenizer,
    dataset_arrays,
    shard_lengths,
    text_length,
)
from trainctl.store.data.datasets import (
    DATASET_FILE,
    TOKENIZER_FILE,
    is_dataset,
    read_dataset,
    read_tokenizer_file,
)
from trainctl.store.data.mixtures import check_distinct_names
from trainctl.store.data.paths import (
    confine_dataset,
    confine_path,
    confine_paths,
    dataset_folder,
    resolve_data,
)
from trainctl.store.data.shards import DataError
from trainctl.store.db.runs import RunStore
from trainctl.store.evals.tasks import check_train_evals
from trainctl.store.exceptions import (
    CheckpointNotFound,
    DatasetExists,
    ExportExists,
    InvalidRequest,
    TrainctlError,
)
from trainctl.store.models.generation import check_context
from trainctl.store.models.hf_config import AnyModelConfig, HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.names import BEST_TAG, LATEST_REF, MAX_NAME_LENGTH, NAME_RULE, is_valid_name
from trainctl.store.plans import (
    BatchPlan,
    BenchmarkPlan,
    CheckpointRef,
    DatasetPin,
    Device,
    ExportPlan,
    ForkPoint,
    ModelPlan,
    PreparePlan,
    SamplePlan,
    TokenizerPin,
    TrainPlan,
    ValidatePlan,
    data_tokenizer,
)
from trainctl.store.specs import (
    BYTES_TOKENIZER,
    MLFLOW_SETTING,
    BatchSpec,
    BenchmarkOptions,
    BenchmarkRequest,
    CheckpointChoice,
    DataSpec,
    ExportRequest,
    ModelSpec,
    PrepareOptions,
    PrepareRequest,
    SampleRequest,
    Spec,
    Tracker,
    TrainOptions,
    TrainRequest,
    ValidateOptions,
    ValidateRequest,
)
from trainctl.store.vocabulary import ACTIVE_STATES

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


# --- resolve --------------------------------------------------------------------------------


def resolve_train(
    request: TrainRequest,
    *,
    cuda_available: bool,
    data_roots: list[Path],
    checkpoints: CheckpointStore | None = None,
    datasets_dir: Path | None = None,
    datasets: BucketDatasets | None = None,
    default_trackers: Sequence[Tracker] = (),
    mlflow_configured: bool = False,
) -> TrainPlan:
    """The plan of a train request. A resume needs `checkpoints`, to pin the checkpoint; a
    dataset named by its name needs `datasets_dir`, where prepare runs write them, or
    `datasets`, the bucket's, when there is one.
    `default_trackers` are the service's (TRAINCTL_TRACKERS), for a request that names none."""
    device = pick_device(request.device, cuda_available)
    profile = TRAIN_PROFILES[device]
    model = _model_plan(request.model, profile)
    if request.data.source in ("stdlib", "text") and model.config.vocab_size < 256:
        raise InvalidRequest("byte-level text needs a vocab_size of at least 256")
    resolved = _data_plan(request.data, data_roots, datasets_dir, datasets)
    data, dataset = resolved.data, resolved.dataset
    for field, pin in resolved.pins:
        _check_vocabulary(
            field,
            pin,
            model.config.vocab_size,
            f"the model's vocab_size of {model.config.vocab_size:,}; raise "
            f"model.overrides.vocab_size to at least {pin.vocab_size:,}",
        )
    geometry = _geometry(request.batch, profile, model.config)
    for field, arrays in resolved.arrays:
        check_enough_tokens(arrays, data.val_fraction, geometry.seq_len, field)
    if request.sample_every is not None:
        _check_samples(request, data, resolved.tokenizer_pin, model.config, datasets)
    checkpoint_every = request.checkpoint_every or max(request.steps // 10, 1)
    tokenizer = data_tokenizer(data, resolved.tokenizer_pin)
    if request.evals is not None:
        source = f"source {data.source!r}"
        check_train_evals(request.evals, tokenizer, source, checkpoint_every, request.steps)
    fork = _fork_point(request, model.config, checkpoints, tokenizer)
    return TrainPlan(
        **_options(request, TrainOptions)
        | _trackers(request, default_trackers, mlflow_configured, data_roots),
        device=device,
        model=model,
        batch=_split_across_ranks(geometry, request.batch, request),
        data=data,
        dataset=dataset,
        datasets=resolved.mixture,
        checkpoint_every=checkpoint_every,
        val_every=request.val_every or checkpoint_every,
        resume_from=_resume_point(request, model.config, checkpoints, tokenizer),
        fork_from=fork,
    )


def resolve_benchmark(request: BenchmarkRequest, *, cuda_available: bool) -> BenchmarkPlan:
    device = pick_device(request.device, cuda_available)
    request.schedule.phases(request.warmup_steps + request.steps)  # fits the steps it times
    profile = BENCHMARK_PROFILES[device]
    use_compile = profile.use_compile if request.use_compile is None else request.use_compile
    ckpt = (
        profile.use_checkpoint_per_layer
        if request.use_checkpoint_per_layer is None
        else request.use_checkpoint_per_layer
    )
    # MTP stays off in the benchmark (as in the seed) unless the overrides ask for it.
    model = _model_plan(
        request.model,
        profile,
        use_compile=use_compile,
        compile_mode=request.compile_mode or "reduce-overhead",
        use_checkpoint_per_layer=ckpt,
    )
    warnings = [CPU_BENCHMARK_WARNING] if device == "cpu" and request.device == "auto" else []
    return BenchmarkPlan(
        **_options(request, BenchmarkOptions),
        device=device,
        model=model,
        batch=_geometry(request.batch, profile, model.config),
        warnings=warnings,
    )


def resolve_validate(
    request: ValidateRequest,
    *,
    cuda_available: bool,
    data_roots: list[Path],
    checkpoints: CheckpointStore,
    datasets_dir: Path | None = None,
    datasets: BucketDatasets | None = None,
) -> ValidatePlan:
    """Pins 'latest', 'best' or 'exp/tag' to one checkpoint now, and takes its model; the
    data must be encoded with the tokenizer the checkpoint was trained with."""
    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "validate")
    config = info.require_model_config()
    seq_len = request.seq_len or min(TRAIN_PROFILES[device].seq_len, config.max_seq_len)
    if seq_len > config.max_seq_len:
        raise InvalidRequest(
            f"seq_len {seq_len} is above the checkpoint model's max_seq_len {config.max_seq_len}"
        )
    resolved = _data_plan(request.data, data_roots, datasets_dir, datasets)
    data, dataset = resolved.data, resolved.dataset  # one source: ValidateOptions' rule
    for field, arrays in resolved.arrays:
        check_enough_tokens(arrays, data.val_fraction, seq_len, field, validation_only=True)
    source = f"checkpoint {info.experiment}/{info.tag}"
    for field, pin in resolved.pins:
        _check_vocabulary(
            field,
            pin,
            config.vocab_size,
            f"the vocab_size of {source}'s model, {config.vocab_size:,}",
        )
    _check_same_tokenizer(info, data_tokenizer(data, dataset), "data")
    return ValidatePlan(
        **_options(request, ValidateOptions) | {"data": data},
        dataset=dataset,
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        seq_len=seq_len,
        device=device,
    )


def resolve_prepare(
    request: PrepareRequest,
    *,
    data_roots: list[Path],
    datasets_dir: Path,
    datasets: BucketDatasets | None = None,
) -> PreparePlan:
    """Inputs and tokenizer confined to the roots, the output a new folder of `datasets_dir`,
    or a new dataset of the bucket's `datasets` when there is one."""
    output = str(Path(os.path.realpath(datasets_dir)) / request.name)
    if datasets is not None:
        output = datasets.describe(request.name)
        if datasets.exists(request.name):
            raise DatasetExists(
                f"name: {datasets.describe()} already has a {request.name!r}; choose another name"
            )
    elif os.path.lexists(output):
        raise DatasetExists(
            f"name: the data dir's datasets/ already has a {request.name!r}; choose another "
            "name, or remove that folder first"
        )
    inputs = confine_paths(request.inputs, data_roots, "inputs", skip_hidden=True)
    check_inputs(inputs, "inputs")
    return PreparePlan(
        **_options(request, PrepareOptions),
        name=request.name,
        inputs=[str(p) for p in inputs],
        tokenizer=_tokenizer_file(request.tokenizer, data_roots),
        output=output,
    )


def resolve_sample(
    request: SampleRequest, *, cuda_available: bool, checkpoints: CheckpointStore
) -> SamplePlan:
    """Pins the checkpoint and encodes the prompts with its tokenizer now, so that a prompt
    or a length that cannot work is a 422, not a failed run."""
    device = pick_device(request.device, cuda_available)
    info = chosen_checkpoint(checkpoints, request, "sample from")
    config = info.require_model_config()
    codec = checkpoint_codec(checkpoints, info)
    source = f"checkpoint {info.experiment}/{info.tag}"
    if request.prompts is not None:
        if codec is None:
            raise InvalidRequest(
                f"prompts: {source} records no tokenizer (it was trained on synthetic tokens "
                "or bare shards), so it cannot encode text or decode its completions; send "
                "prompt_tokens (token ids) instead"
            )
        tokens = [codec.encode(p) for p in request.prompts]
    else:
        tokens = request.prompt_tokens or []
        check_token_ids(tokens, config.vocab_size, "prompt_tokens", source)
    for i, ids in enumerate(tokens):
        where = f"prompt {i}" if len(tokens) > 1 else "prompt"
        try:
            check_context(len(ids), request.generation.max_new_tokens, config.max_seq_len)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{where}: {exc} ({source})") from None
    return SamplePlan(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        tokenizer=tokenizer_pin(info, codec),
        prompts=request.prompts,
        prompt_tokens=tokens,
        generation=request.generation,
        device=device,
    )


def resolve_export(
    request: ExportRequest, *, checkpoints: CheckpointStore, exports: CheckpointStore
) -> ExportPlan:
    """Pins the checkpoint, refuses a model that the format cannot express, and names the
    export's place in the exports store (a folder, or a prefix of the bucket), which must not
    be taken yet (an export is never overwritten)."""
    info = chosen_checkpoint(checkpoints, request, "export")
    config = info.require_model_config()
    if isinstance(config, PluginModelConfig):
        raise InvalidRequest(
            f"checkpoint {info.experiment}/{info.tag} holds the plug-in model "
            f"{config.plugin!r}, which has no transformers form to export to"
        )
    if not isinstance(config, HfModelConfig):  # a transformers model exports as it is
        check_exportable(config)
    if exports.taken(info.experiment, info.tag):
        raise ExportExists(
            f"checkpoint {info.experiment}/{info.tag} is already exported (GET /exports/"
            f"{info.experiment}/{info.tag}); delete that export first to export it again"
        )
    return ExportPlan(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        model=config,
        format=request.format,
        dtype=request.dtype,
        output=exports.describe(info.experiment, info.tag),
    )


def _check_samples(
    request: TrainRequest,
    data: DataSpec,
    dataset: DatasetPin | None,
    config: AnyModelConfig,
    bucket: BucketDatasets | None,
) -> None:
    """Samples need text in and out, and each prompt with its completion must fit the model."""
    codec = data_codec(data, dataset, bucket)
    if codec is None:
        raise InvalidRequest(
            f"sample_every: the tokens of data source {data.source!r} come from no known "
            "tokenizer, so prompts cannot be encoded nor samples decoded; train on a dataset, "
            "stdlib or text, or leave sample_every out"
        )
    for i, prompt in enumerate(request.sample_prompts):
        try:
            check_context(
                len(codec.encode(prompt)), request.sample_settings.max_new_tokens,
                config.max_seq_len,
            )  # fmt: skip
        except InvalidRequest as exc:
            raise InvalidRequest(f"sample_prompts[{i}]: {exc}") from None


def data_codec(
    data: DataSpec, dataset: DatasetPin | None, bucket: BucketDatasets | None = None
) -> TextCodec | None:
    """The text codec of a run's data: its dataset's tokenizer (in its folder, or in the
    `bucket` when the pin names a dataset there), bytes for byte-level text, None where
    unknown."""
    tokenizer_json = None
    if dataset is not None and dataset.tokenizer.kind == "bpe":
        name = bucket.name_of(dataset.folder) if bucket is not None else None
        try:
            if name is not None and bucket is not None:
                tokenizer_json = bucket.tokenizer(name)
            else:
                tokenizer_json = read_tokenizer_file(Path(dataset.folder) / TOKENIZER_FILE)
        except DataError as exc:
            raise InvalidRequest(f"data.dataset: {exc}") from None
    try:
        return build_codec(data_tokenizer(data, dataset), tokenizer_json)
    except DataError as exc:
        raise InvalidRequest(f"data.dataset: {exc}") from None


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


def check_token_ids(tokens: list[list[int]], vocab_size: int, field: str, source: str) -> None:
    for i, ids in enumerate(tokens):
        if ids and max(ids) >= vocab_size:
            raise InvalidRequest(
                f"{field}[{i}]: token id {max(ids)} is not below the vocab_size of {source}'s "
                f"model, {vocab_size:,}"
            )


def tokenizer_pin(info: CheckpointInfo, codec: TextCodec | None) -> TokenizerPin | None:
    if info.tokenizer is None or codec is None:
        return None
    return TokenizerPin(kind=info.tokenizer.kind, sha256=info.tokenizer.sha256, eot_id=codec.eot_id)


def _tokenizer_file(ref: str, roots: list[Path]) -> str:
    if ref == BYTES_TOKENIZER:
        return ref
    path = confine_path(ref, roots, "tokenizer")
    if path.is_dir():
        path = confine_path(str(path / TOKENIZER_FILE), roots, "tokenizer")
    if not path.is_file():
        raise InvalidRequest(f"tokenizer: {ref!r} is not a file")
    check_tokenizer(path, "tokenizer")
    return str(path)


def _trackers(
    request: TrainRequest, default: Sequence[Tracker], mlflow_configured: bool, roots: list[Path]
) -> dict[str, Any]:
    """The trackers the run is mirrored to and the real folder of its TensorBoard files."""
    trackers = list(default) if request.trackers is None else request.trackers
    if "mlflow" in trackers and not mlflow_configured:
        raise InvalidRequest(
            f"trackers: 'mlflow' needs a tracking server, and this service has none: set "
            f"{MLFLOW_SETTING} (or leave 'mlflow' out)"
        )
    folder = request.tensorboard_dir
    if folder is not None:
        if "tensorboard" not in trackers:
            raise InvalidRequest("tensorboard_dir: the run has no 'tensorboard' tracker")
        real = confine_path(folder, roots, "tensorboard_dir")
        if not real.is_dir():
            raise InvalidRequest(f"tensorboard_dir: {folder!r} is not a folder")
        folder = str(real)
    return {"trackers": trackers, "tensorboard_dir": folder}


def _options(request: Spec, shared: type[Spec]) -> dict[str, Any]:
    """The fields a request hands to its plan unchanged (those of the shared base)."""
    return {name: getattr(request, name) for name in shared.model_fields}


def _model_plan(model: ModelSpec, profile: Profile, **runtime: Any) -> ModelPlan:
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


def _geometry(batch: BatchSpec, profile: Profile, cfg: AnyModelConfig) -> BatchPlan:
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


def _split_across_ranks(
    resolved: BatchPlan, requested: BatchSpec, ranks: TrainOptions
) -> BatchPlan:
    """Each of the nnodes x nproc_per_node ranks runs an equal share of a step's
    micro-batches."""
    accum, world = resolved.grad_accum_steps, ranks.nnodes * ranks.nproc_per_node
    if accum % world == 0:
        return resolved
    if requested.grad_accum_steps is not None:
        raise InvalidRequest(
            f"batch.grad_accum_steps {accum} does not split evenly across nnodes "
            f"{ranks.nnodes} x nproc_per_node {ranks.nproc_per_node} = {world} processes; "
            f"use a multiple of {world}"
        )
    return resolved.model_copy(update={"grad_accum_steps": -(-accum // world) * world})


class ResolvedData(NamedTuple):
    """A request's data as submit resolved it: paths expanded, datasets read and pinned."""

    data: DataSpec
    """The data with its paths expanded, or each dataset named by its real folder."""
    dataset: DatasetPin | None
    """The dataset data.dataset names, pinned."""
    mixture: list[DatasetPin]
    """The datasets data.mixture names, pinned, in its order."""
    pins: list[tuple[str, DatasetPin]]
    """Every dataset pinned (one, a mixture's, or none), by the field that names it."""
    arrays: list[tuple[str, TokenArrays]]
    """The tokens of each source's arrays, by the field that names it, each file checked to
    be what the source reads (store.data.contents); none for synthetic tokens and the
    standard library, which are never short."""

    @property
    def tokenizer_pin(self) -> DatasetPin | None:
        """The dataset whose tokenizer the run's tokens are of: a mixture's datasets share
        one (`_mixture_plan`)."""
        return self.pins[0][1] if self.pins else None


def _data_plan(
    data: DataSpec, roots: list[Path], datasets_dir: Path | None, bucket: BucketDatasets | None
) -> ResolvedData:
    if data.source == "mixture":
        return _mixture_plan(data, roots, datasets_dir, bucket)
    if data.source != "dataset":
        resolved = resolve_data(data, roots)
        arrays = _file_arrays(resolved)
        return ResolvedData(resolved, None, [], [], [] if arrays is None else [("data", arrays)])
    assert data.dataset is not None  # DataSpec's rule
    folder, pin, arrays = _pin_dataset(data.dataset, "data.dataset", roots, datasets_dir, bucket)
    field = f"data.dataset {data.dataset!r}"
    return ResolvedData(
        data.model_copy(update={"dataset": folder}),
        pin,
        [],
        [(field, pin)],
        [("data", arrays)],
    )


def _mixture_plan(
    data: DataSpec, roots: list[Path], datasets_dir: Path | None, bucket: BucketDatasets | None
) -> ResolvedData:
    """Each dataset of a mixture read and pinned as data.dataset's is; they must be distinct
    datasets of one tokenizer (docs/design/data.md, "Data mixtures")."""
    assert data.mixture is not None  # DataSpec's rule
    paths = [f"data.mixture[{i}].dataset" for i in range(len(data.mixture))]
    fields = [f"{path} {s.dataset!r}" for path, s in zip(paths, data.mixture, strict=True)]
    pinned = [
        _pin_dataset(s.dataset, path, roots, datasets_dir, bucket)
        for s, path in zip(data.mixture, paths, strict=True)
    ]
    folders = [folder for folder, _, _ in pinned]
    check_distinct_names(fields, folders)
    pins = [pin for _, pin, _ in pinned]
    first = pins[0].tokenizer.id
    for field, pin in zip(fields[1:], pins[1:], strict=True):
        if tokenizers_differ(first, pin.tokenizer.id):
            raise InvalidRequest(
                f"{field} holds {pin.tokenizer.id.describe()}, but {fields[0]} holds "
                f"{first.describe()}: a mixture's datasets must share one tokenizer, or one "
                "token id would mean two things to the model; prepare them with the same "
                "tokenizer.json"
            )
    mixture = [
        s.model_copy(update={"dataset": folder})
        for s, folder in zip(data.mixture, folders, strict=True)
    ]
    return ResolvedData(
        data.model_copy(update={"mixture": mixture}),
        None,
        pins,
        list(zip(fields, pins, strict=True)),
        [(f"data.mixture[{i}]", arrays) for i, (_, _, arrays) in enumerate(pinned)],
    )


def _pin_dataset(
    ref: str,
    path: str,
    roots: list[Path],
    datasets_dir: Path | None,
    bucket: BucketDatasets | None = None,
) -> tuple[str, DatasetPin, TokenArrays]:
    """The real folder of the dataset `ref` (the request's field `path`) names, or its URL
    in the bucket, read and pinned, and its arrays' tokens."""
    field = f"{path} {ref!r}"
    name = bucket.name_of(ref) if bucket is not None else None
    if bucket is not None and name is not None:
        return _pin_bucket_dataset(bucket, name, path, field)
    folder = dataset_folder(ref, roots, datasets_dir, path)
    if not is_dataset(folder):
        raise InvalidRequest(
            f"{field} has no {DATASET_FILE}: not a prepared dataset, or its prepare has not "
            "finished (wait for it, or prepare it again)"
        )
    try:
        found = read_dataset(folder)
    except DataError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None
    confine_dataset(found, [*roots, *([datasets_dir] if datasets_dir else [])], field)
    tokenizer = found.tokenizer_path
    if tokenizer is not None and _sha256(tokenizer, field) != found.tokenizer.sha256:
        raise InvalidRequest(
            f"{field}: its {tokenizer.name} is not the one its {DATASET_FILE} records (sha256 "
            "differs): the shards may not be its tokens; prepare it again"
        )
    return str(folder), DatasetPin.of(found), dataset_arrays(found, field)


def _pin_bucket_dataset(
    bucket: BucketDatasets, name: str, path: str, field: str
) -> tuple[str, DatasetPin, TokenArrays]:
    """A dataset of the bucket read from its manifest and dataset.json alone: the manifest
    lists each shard's size (its tokens) and the tokenizer's sha256, and the worker's cache
    checks its downloads against the same manifest."""
    if not is_valid_name(name):
        raise InvalidRequest(f"{path}: {name!r} is not a dataset name ({NAME_RULE})")
    try:
        listed = bucket.read(name)
        arrays = listed.token_arrays()
    except DataError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None
    found = listed.dataset
    if found.tokenizer.kind == "bpe" and (
        listed.files.get(TOKENIZER_FILE, (0, None))[1] != found.tokenizer.sha256
    ):
        raise InvalidRequest(
            f"{field}: its {TOKENIZER_FILE} is not the one its {DATASET_FILE} records (sha256 "
            "differs): the shards may not be its tokens; prepare it again"
        )
    return found.where, DatasetPin.of(found), arrays


def _file_arrays(data: DataSpec) -> TokenArrays | None:
    """What `worker.training.loop.build_token_arrays` makes of text or shard files: a shard an
    array, the text files one array (and the val files another), at most `max_bytes` each."""
    train, val = [Path(p) for p in data.paths], [Path(p) for p in data.val_paths]
    if data.source == "shards":
        return TokenArrays(shard_lengths(train, "data.paths"), shard_lengths(val, "data.val_paths"))
    if data.source == "text":
        texts = [text_length(train, data.max_bytes, "data.paths")]
        return TokenArrays(
            texts, [text_length(val, data.max_bytes, "data.val_paths")] if val else []
        )
    return None


def _sha256(tokenizer: Path, field: str) -> str:
    """Of a dataset's tokenizer.json, read as every data file is (never blocking)."""
    try:
        return hashlib.sha256(read_tokenizer_file(tokenizer)).hexdigest()
    except DataError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None


def _check_vocabulary(field: str, dataset: DatasetPin, vocab_size: int, model: str) -> None:
    if dataset.vocab_size > vocab_size:
        raise InvalidRequest(
            f"{field} has a vocabulary of {dataset.vocab_size:,} tokens, more than {model}"
        )


def _check_same_tokenizer(info: CheckpointInfo, tokenizer: TokenizerId | None, what: str) -> None:
    """A loss over token ids of another tokenizer means nothing: refuse it while it is
    known on both sides (a checkpoint from before datasets records none)."""
    if not tokenizers_differ(info.tokenizer, tokenizer):
        return
    assert info.tokenizer is not None and tokenizer is not None  # tokenizers_differ's rule
    raise InvalidRequest(
        f"checkpoint {info.experiment}/{info.tag} was trained on {info.tokenizer.describe()}, "
        f"but the {what} is {tokenizer.describe()}: another tokenizer's token ids mean "
        "nothing to it; use data encoded with the checkpoint's tokenizer"
    )


def _resume_point(
    request: TrainRequest,
    config: AnyModelConfig,
    checkpoints: CheckpointStore | None,
    tokenizer: TokenizerId | None,
) -> CheckpointRef | None:
    """The concrete checkpoint `resume_from` names, checked to fit the model being trained."""
    if request.resume_from is None:
        return None
    if checkpoints is None:
        raise InvalidRequest("resume_from: no checkpoint store to resume from")
    try:
        info = checkpoints.resolve(request.experiment, request.resume_from)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"resume_from: experiment {request.experiment!r} has no checkpoint "
            f"{request.resume_from!r} to resume from; train without resume_from, or name one of "
            "its checkpoints (GET /checkpoints?experiment=...)"
        ) from None
    source = f"resume_from: checkpoint {info.tag!r} of experiment {info.experiment!r}"
    advice = "; request the same model preset and overrides"
    check_fits(info.require_model_config(), config, source, advice)
    _check_same_tokenizer(info, tokenizer, "training data")
    return CheckpointRef(experiment=info.experiment, tag=info.tag)


def _fork_point(
    request: TrainRequest,
    config: AnyModelConfig,
    checkpoints: CheckpointStore | None,
    tokenizer: TokenizerId | None,
) -> ForkPoint | None:
    """The checkpoint `fork_from` names, pinned, and checked to be one the fork can continue
    (docs/design/forks.md, "Forks"): the model, the tokenizer and the optimizer kind are the
    parent's, and the fork's schedule fits after its step. A fork's own `schedule` is checked
    by `ScheduleSpec.phases` for every train run."""
    phases = request.schedule.phases(request.steps)
    if request.fork_from is None:
        return None
    if checkpoints is None:
        raise InvalidRequest("fork_from: no checkpoint store to fork from")
    experiment, ref = request.fork_from.split("/")
    if experiment == request.experiment:
        raise InvalidRequest(
            f"experiment: a fork of {request.fork_from!r} goes into an experiment of its own, "
            f"not its parent's {experiment!r} (their step checkpoints would collide); name "
            "another experiment, e.g. "
            f"{(experiment + '.fork')[:MAX_NAME_LENGTH]!r}"
        )
    try:
        info = checkpoints.resolve(experiment, ref)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"fork_from: experiment {experiment!r} has no checkpoint {ref!r} to fork from; "
            "name one of its checkpoints (GET /checkpoints?experiment=...)"
        ) from None
    source = f"fork_from: checkpoint {info.experiment}/{info.tag}"
    if info.step is None:
        raise InvalidRequest(f"{source} records no step, so there is no point to fork at")
    check_fits(
        info.require_model_config(), config, source, "; a fork keeps its parent's model: "
        "request the same model preset and overrides",
    )  # fmt: skip
    _check_same_tokenizer(info, tokenizer, "fork's training data")
    if info.optimizer_kind is not None and info.optimizer_kind != request.optimizer.kind:
        raise InvalidRequest(
            f"optimizer.kind: {source} holds the state of optimizer kind "
            f"{info.optimizer_kind!r}, not {request.optimizer.kind!r}; a fork keeps its "
            "parent's optimizers"
        )
    if request.steps <= info.step:
        raise InvalidRequest(
            f"steps: {source} is at step {info.step}; a fork trains on to a later step, so "
            f"steps must be above {info.step}"
        )
    if "schedule" in request.model_fields_set and phases.decay_start < info.step:
        raise InvalidRequest(
            f"schedule.decay_start: the fork's decay would start at step {phases.decay_start}, "
            f"before the fork's first step {info.step}; start it at {info.step} or later"
        )
    return ForkPoint(
        checkpoint=CheckpointRef(experiment=info.experiment, tag=info.tag),
        step=info.step,
        run_id=info.run_id,
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


# --- submit: each kind's resolver, as the run-kind records (store.kinds.registry) name them
# ----------


@dataclass
class SubmitContext:
    """What resolving a request may read: the service's settings and stores (or a train run's
    worker's, for the evaluate runs of its checkpoints: store.evals.side_runs)."""

    data_roots: list[Path]
    datasets_dir: Path
    checkpoints: CheckpointStore
    exports: CheckpointStore
    """Where exports go: an export request is refused when its checkpoint's is there."""
    runs: RunStore
    cuda: Callable[[], bool]
    """Whether runs can get a CUDA device; asked only by kinds that run a model, once."""
    default_trackers: Sequence[Tracker] = ()
    mlflow_configured: bool = False
    datasets: BucketDatasets | None = None
    """The bucket's prepared datasets (TRAINCTL_STORAGE_URL); None: `datasets_dir`'s."""

    @cached_property
    def cuda_available(self) -> bool:
        return self.cuda()


def plan_train(request: TrainRequest, ctx: SubmitContext) -> TrainPlan:
    return resolve_train(
        request,
        cuda_available=ctx.cuda_available,
        data_roots=ctx.data_roots,
        checkpoints=ctx.checkpoints,
        datasets_dir=ctx.datasets_dir,
        datasets=ctx.datasets,
        default_trackers=ctx.default_trackers,
        mlflow_configured=ctx.mlflow_configured,
    )


def plan_validate(request: ValidateRequest, ctx: SubmitContext) -> ValidatePlan:
    return resolve_validate(
        request,
        cuda_available=ctx.cuda_available,
        data_roots=ctx.data_roots,
        checkpoints=ctx.checkpoints,
        datasets_dir=ctx.datasets_dir,
        datasets=ctx.datasets,
    )


def plan_benchmark(request: BenchmarkRequest, ctx: SubmitContext) -> BenchmarkPlan:
    return resolve_benchmark(request, cuda_available=ctx.cuda_available)


def plan_prepare(request: PrepareRequest, ctx: SubmitContext) -> PreparePlan:
    plan = resolve_prepare(
        request, data_roots=ctx.data_roots, datasets_dir=ctx.datasets_dir, datasets=ctx.datasets
    )
    refuse_a_second_prepare(ctx.runs, plan.name)
    return plan


def plan_sample(request: SampleRequest, ctx: SubmitContext) -> SamplePlan:
    return resolve_sample(request, cuda_available=ctx.cuda_available, checkpoints=ctx.checkpoints)


def plan_export(request: ExportRequest, ctx: SubmitContext) -> ExportPlan:
    plan = resolve_export(request, checkpoints=ctx.checkpoints, exports=ctx.exports)
    refuse_a_second_export(ctx.runs, plan)
    return plan


def refuse_a_second_export(runs: RunStore, plan: ExportPlan) -> None:
    """Like a prepare: two exports of one checkpoint would race to publish one folder."""
    ref = plan.checkpoint
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="export", state=state, experiment=ref.experiment, limit=500)
        for run in active:
            if run.spec.get("output") == plan.output:
                raise ExportExists(
                    f"checkpoint {ref} is being exported by run {run.id} ({state}); wait for "
                    "it, or cancel it"
                )


def refuse_a_second_prepare(runs: RunStore, name: str) -> None:
    """Two prepare runs of one name would race to publish it: the second is refused now.
    (Two submitted at the same moment may both pass; the later to finish then fails.)"""
    for state in ACTIVE_STATES:
        active, _ = runs.list_runs(kind="prepare", state=state, experiment=name, limit=1)
        if active:
            raise DatasetExists(
                f"name: dataset {name!r} is being prepared by run {active[0].id} ({state}); "
                "wait for it, or cancel it"
            )
