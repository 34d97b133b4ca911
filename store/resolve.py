"""Resolution: a request becomes its plan at submit time (docs/architecture.md, "Requests and
plans"); what the kinds' resolvers share.

Each kind's resolver (`resolve_<kind>`, and `plan_<kind>`, which its record names) is in the
kind's module of store/kinds/ and decides everything a run needs now, so that a bad request is
a 422 rather than a failed run later: the device, the model config, the batch geometry, the
data files or the dataset, and the concrete checkpoint a resume or a validation reads. What
several of them resolve alike is here: device-dependent defaults (a `Profile`, CPU or CUDA),
the device, the model and batch plans, the data's files and datasets, the checkpoint a run
reads and its tokenizer, and the `SubmitContext` they read it all from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from trainctl.store.checkpoints.info import CheckpointInfo, tokenizers_differ
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.data.bucket import BucketDatasets
from trainctl.store.data.codec import TextCodec, build_codec
from trainctl.store.data.contents import (
    TokenArrays,
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
from trainctl.store.data.paths import confine_dataset, confine_path, dataset_folder, resolve_data
from trainctl.store.data.shards import DataError
from trainctl.store.db.runs import RunStore
from trainctl.store.exceptions import CheckpointNotFound, InvalidRequest, TrainctlError
from trainctl.store.models.hf_config import AnyModelConfig, HfModelConfig
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.names import BEST_TAG, LATEST_REF, NAME_RULE, is_valid_name
from trainctl.store.plans import (
    BatchPlan,
    DatasetPin,
    Device,
    ModelPlan,
    TokenizerPin,
    data_tokenizer,
)
from trainctl.store.specs import (
    BYTES_TOKENIZER,
    BatchSpec,
    CheckpointChoice,
    DataSpec,
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
    datasets of one tokenizer (docs/architecture.md, "Data mixtures")."""
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
