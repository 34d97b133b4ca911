"""A run's data as submit resolves it (docs/design/kinds.md, "Requests and plans";
docs/design/data.md, "Datasets", "Data mixtures"): data paths expanded and confined, each dataset
found, checked and pinned (`store.plans.DatasetPin`), and the tokens of each source counted, so that
data that cannot work is a 422 now rather than a failed run later.

A dataset is named by its name, found in the deployment's dataset store (`DatasetStore`:
the data dir's or the bucket's, read alike), or by a path with a '/' to a folder inside the
data roots, read where it lies and confined to the roots file by file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

from trainctl.store.checkpoints.info import tokenizers_differ
from trainctl.store.data.bucket import DatasetStore, NoSuchDataset
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
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.names import NAME_RULE, is_valid_name
from trainctl.store.plans import DatasetPin, data_tokenizer
from trainctl.store.specs import BYTES_TOKENIZER, DataSpec


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


def data_plan(data: DataSpec, roots: list[Path], datasets: DatasetStore | None) -> ResolvedData:
    """The data of a request resolved; `datasets` (the deployment's) where it names a dataset."""
    if data.source == "mixture":
        return _mixture_plan(data, roots, _needed(datasets, "data.mixture"))
    if data.source != "dataset":
        resolved = resolve_data(data, roots)
        arrays = _file_arrays(resolved)
        return ResolvedData(resolved, None, [], [], [] if arrays is None else [("data", arrays)])
    assert data.dataset is not None  # DataSpec's rule
    store = _needed(datasets, "data.dataset")
    folder, pin, arrays = _pin_dataset(data.dataset, "data.dataset", roots, store)
    field = f"data.dataset {data.dataset!r}"
    return ResolvedData(
        data.model_copy(update={"dataset": folder}),
        pin,
        [],
        [(field, pin)],
        [("data", arrays)],
    )


def _mixture_plan(data: DataSpec, roots: list[Path], datasets: DatasetStore) -> ResolvedData:
    """Each dataset of a mixture read and pinned as data.dataset's is; they must be distinct
    datasets of one tokenizer (docs/design/data.md, "Data mixtures")."""
    assert data.mixture is not None  # DataSpec's rule
    paths = [f"data.mixture[{i}].dataset" for i in range(len(data.mixture))]
    fields = [f"{path} {s.dataset!r}" for path, s in zip(paths, data.mixture, strict=True)]
    pinned = [
        _pin_dataset(s.dataset, path, roots, datasets)
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
    ref: str, path: str, roots: list[Path], datasets: DatasetStore
) -> tuple[str, DatasetPin, TokenArrays]:
    """The dataset `ref` (the request's field `path`) names, read and pinned, and its
    arrays' tokens: one of the store's, named by its name (or by its pin, a plan's), else
    the real folder a path names inside the roots."""
    field = f"{path} {ref!r}"
    name = datasets.name_of(ref)
    if name is not None:
        return _pin_stored_dataset(datasets, name, path, field)
    folder = dataset_folder(ref, roots, path)
    if not is_dataset(folder):
        raise InvalidRequest(
            f"{field} has no {DATASET_FILE}: not a prepared dataset, or its prepare has not "
            "finished (wait for it, or prepare it again)"
        )
    try:
        found = read_dataset(folder)
    except DataError as exc:
        raise InvalidRequest(f"{field}: {exc}") from None
    confine_dataset(found, roots, field)
    tokenizer = found.tokenizer_path
    if tokenizer is not None and _sha256(tokenizer, field) != found.tokenizer.sha256:
        raise InvalidRequest(
            f"{field}: its {tokenizer.name} is not the one its {DATASET_FILE} records (sha256 "
            "differs): the shards may not be its tokens; prepare it again"
        )
    return str(folder), DatasetPin.of(found), dataset_arrays(found, field)


def _pin_stored_dataset(
    datasets: DatasetStore, name: str, path: str, field: str
) -> tuple[str, DatasetPin, TokenArrays]:
    """A dataset of the store read from its dataset.json and its files' list (a bucket's
    manifest, which the worker's cache checks its downloads against; a folder's files, as
    they are): each shard's size is its tokens, and the tokenizer's sha256 is listed."""
    if not is_valid_name(name):
        raise InvalidRequest(
            f"{path}: {name!r} is neither a dataset name ({NAME_RULE}) nor a path with a '/' "
            "to a dataset folder inside the data roots"
        )
    try:
        listed = datasets.read(name)
        arrays = listed.token_arrays()
    except NoSuchDataset as exc:
        raise InvalidRequest(
            f"{path}: {exc}; or name a folder inside the data roots with a path: './{name}'"
        ) from None
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
    """What `worker.training.loop.build_token_arrays` makes of text or shard files: a shard
    an array, the text files one array (and the val files another), at most `max_bytes`
    each."""
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


def data_codec(
    data: DataSpec, dataset: DatasetPin | None, datasets: DatasetStore | None
) -> TextCodec | None:
    """The text codec of a run's data: its dataset's tokenizer (in the store, or in the
    folder its pin names), bytes for byte-level text, None where unknown."""
    tokenizer_json = None
    if dataset is not None and dataset.tokenizer.kind == "bpe":
        store = _needed(datasets, "data.dataset")
        name = store.name_of(dataset.folder)
        try:
            if name is not None:
                tokenizer_json = store.tokenizer(name)
            else:
                tokenizer_json = read_tokenizer_file(Path(dataset.folder) / TOKENIZER_FILE)
        except DataError as exc:
            raise InvalidRequest(f"data.dataset: {exc}") from None
    try:
        return build_codec(data_tokenizer(data, dataset), tokenizer_json)
    except DataError as exc:
        raise InvalidRequest(f"data.dataset: {exc}") from None


def _needed(datasets: DatasetStore | None, field: str) -> DatasetStore:
    """The store a request's datasets are found in: the deployment's, which a caller that
    resolves requests without one (a test, a benchmark) may leave out where none is named."""
    if datasets is None:
        raise InvalidRequest(f"{field}: no dataset store to find a dataset in")
    return datasets


def check_vocabulary(field: str, dataset: DatasetPin, vocab_size: int, model: str) -> None:
    if dataset.vocab_size > vocab_size:
        raise InvalidRequest(
            f"{field} has a vocabulary of {dataset.vocab_size:,} tokens, more than {model}"
        )


def tokenizer_file(ref: str, roots: list[Path]) -> str:
    """A prepare's tokenizer: 'bytes', or the real path of a tokenizer.json (or of the
    folder that holds one) inside the roots that `tokenizers` loads."""
    if ref == BYTES_TOKENIZER:
        return ref
    path = confine_path(ref, roots, "tokenizer")
    if path.is_dir():
        path = confine_path(str(path / TOKENIZER_FILE), roots, "tokenizer")
    if not path.is_file():
        raise InvalidRequest(f"tokenizer: {ref!r} is not a file")
    check_tokenizer(path, "tokenizer")
    return str(path)
