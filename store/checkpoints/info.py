"""What the store knows of one checkpoint, read once from its manifest and metadata.json for
every caller (docs/design/checkpoints.md, "Checkpoint store", "One reader").

Plain data that imports neither a storage backend nor fcntl: plans, codecs and the client
side name these types without pulling in the store's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainctl.store.checkpoints.manifests import (
    DCP_LAYOUT,
    FULL_LAYOUT,
    METADATA_FILE,
    manifest_layout,
    read_metadata,
    verify_manifest,
)
from trainctl.store.checkpoints.storage import Files
from trainctl.store.data.mixtures import read_sources, source_tokens
from trainctl.store.exceptions import CheckpointMismatch, InvalidRequest
from trainctl.store.models.hf_config import AnyModelConfig, model_config_from_dict
from trainctl.store.names import parse_step


@dataclass(frozen=True)
class TokenizerId:
    """Which tokenizer made a run's tokens: what a checkpoint records in metadata.json's
    `tokenizer` and what a validation's data must share with it."""

    kind: str
    """bytes (a token is a byte) or bpe (a tokenizer.json)."""
    sha256: str | None
    """Of the tokenizer.json; None for bytes."""

    def describe(self) -> str:
        if self.kind == "bytes":
            return "byte-level tokens"
        return f"tokens of the {self.kind} tokenizer with sha256 {self.sha256}"


def tokenizers_differ(a: TokenizerId | None, b: TokenizerId | None) -> bool:
    """Whether token ids of `b` mean other tokens than those of `a`: both known, and not the
    same tokenizer. Where either is unknown (synthetic tokens, bare shards, a checkpoint from
    before datasets) the check cannot be made and is not. The one rule for a resume, a fork, a
    validation and the datasets of a mixture."""
    return a is not None and b is not None and a != b


@dataclass(frozen=True)
class CheckpointInfo:
    """What the store knows about one complete checkpoint (manifest + metadata.json). Its
    files are read through the store (`CheckpointStore.entry`), never by a path."""

    experiment: str
    tag: str
    step: int | None
    token_count: int | None
    best_loss: float | None
    run_id: str | None
    created_at: str | None
    """ISO 8601, as the writer recorded it in metadata.json."""
    size_bytes: int
    """Sum of the manifest's file sizes."""
    files: list[dict[str, Any]]
    """The manifest's entries: ``{name, size, sha256}``."""

    model_config: AnyModelConfig | None
    """The model the checkpoint holds; None when metadata.json records none readable."""

    model_config_error: str | None = None
    """Why the recorded model_config was refused (a field no request may set, a shape the
    model cannot run): checked as a request's is, whoever wrote the checkpoint."""

    tokenizer: TokenizerId | None = None
    """The tokenizer of its training data; None when unknown (synthetic tokens, bare shards,
    a checkpoint from before datasets). A bpe one's tokenizer.json is in the manifest."""

    optimizer_kind: str | None = None
    """The optimizer kind whose state it holds; None for a checkpoint from before it was
    recorded."""

    layout: str = FULL_LAYOUT
    """How its files hold the weights (`manifests.LAYOUTS`): whole, or sharded by rank."""

    source_tokens: dict[str, int] | None = None
    """A data mixture's tokens trained on from each of its datasets, by name
    (`store.data.mixtures`); None for a run of one source."""

    @property
    def sharded(self) -> bool:
        return self.layout == DCP_LAYOUT

    def require_model_config(self) -> AnyModelConfig:
        """The checkpoint's model config, or a clear error saying why it is unknown."""
        if self.model_config is None:
            if self.model_config_error is not None:
                raise InvalidRequest(
                    f"checkpoint {self.experiment}/{self.tag}: the model_config in its "
                    f"{METADATA_FILE} is refused, as it would be in a request: "
                    f"{self.model_config_error}"
                )
            raise InvalidRequest(
                f"checkpoint {self.experiment}/{self.tag} records no readable model_config in "
                f"its {METADATA_FILE}, so the model it holds is unknown"
            )
        return self.model_config


@dataclass(frozen=True)
class PruneOutcome:
    deleted: list[CheckpointInfo]
    kept: list[CheckpointInfo]
    dry_run: bool


def check_fits(saved: AnyModelConfig, model: AnyModelConfig, source: str, advice: str = "") -> None:
    """Refuse to load a checkpoint into a model of another architecture (runtime fields such
    as torch.compile may differ); the message lists every difference."""
    diff = saved.differences(model)
    if diff:
        details = ", ".join(
            f"{k}: checkpoint {a!r} vs requested {b!r}" for k, (a, b) in diff.items()
        )
        raise CheckpointMismatch(f"{source} was saved by a different model ({details}){advice}")


def check_same_tokenizer(info: CheckpointInfo, tokenizer: TokenizerId | None, what: str) -> None:
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


def read_info(files: Files, experiment: str, tag: str) -> CheckpointInfo:
    """Read a checkpoint's manifest and metadata; raise `CheckpointCorrupt` if it is not
    complete."""
    manifest = verify_manifest(files, deep=False)
    meta = read_metadata(files)
    model_config, model_config_error = _model_config(meta)
    step = _typed(meta, "step", int)
    best_loss = _typed(meta, "best_loss", (int, float))
    return CheckpointInfo(
        experiment=experiment,
        tag=tag,
        step=step if step is not None else parse_step(tag),
        token_count=_typed(meta, "token_count", int),
        best_loss=float(best_loss) if best_loss is not None else None,
        run_id=_typed(meta, "run_id", str),
        created_at=_typed(meta, "created_at", str),
        size_bytes=sum(f["size"] for f in manifest["files"]),
        files=manifest["files"],
        model_config=model_config,
        model_config_error=model_config_error,
        tokenizer=_tokenizer(meta),
        optimizer_kind=_typed(meta, "optimizer_kind", str),
        layout=manifest_layout(manifest),
        source_tokens=_source_tokens(meta),
    )


def _model_config(meta: dict[str, Any]) -> tuple[AnyModelConfig | None, str | None]:
    """The recorded model config, or None and why: an unreadable one lists, but nothing can
    load it, and what refused it is said when something tries."""
    saved = meta.get("model_config")
    if not isinstance(saved, dict):
        return None, None
    try:
        return model_config_from_dict(saved), None
    except ValidationError as exc:
        return None, "; ".join(
            str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.errors()
        )
    except (TypeError, ValueError) as exc:
        return None, str(exc)


def _source_tokens(meta: dict[str, Any]) -> dict[str, int] | None:
    sources = read_sources(meta)
    return None if sources is None else source_tokens(sources)


def _tokenizer(meta: dict[str, Any]) -> TokenizerId | None:
    saved = meta.get("tokenizer")
    if not isinstance(saved, dict) or saved.get("kind") not in ("bytes", "bpe"):
        return None
    sha256 = saved.get("sha256")
    return TokenizerId(saved["kind"], sha256 if isinstance(sha256, str) else None)


def _typed(meta: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """A metadata field if it has the expected type, else None (bool is not an int here)."""
    value = meta.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None
