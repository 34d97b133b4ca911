"""The checkpoint store: layout, manifests, listing, latest/best, retention and safe paths.

Layout: ``<root>/<experiment>/<tag>/`` holding ``model.safetensors``, ``optimizer.pt``,
``metadata.json`` and ``manifest.json`` (written last). A tag is ``step_<N>``, ``best`` or a
user tag. This module knows nothing of torch: the worker writes the files into a folder from
`CheckpointStore.staging_dir`, calls `write_manifest`, then `CheckpointStore.commit`.

A checkpoint is *complete* when its manifest parses and every listed file exists with the
listed size. Readers only ever see complete checkpoints, so a crash mid-save can never become
"latest". Hidden folders (``.staging-*``, ``.trash-*``) are never listed; `cleanup` removes or
restores them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    fsync_dir,
    open_fd,
    read_metadata,
    verify_manifest,
)
from trainctl.store.exceptions import (
    CheckpointCorrupt,
    CheckpointMismatch,
    CheckpointNotFound,
    CheckpointProtected,
    InvalidName,
    InvalidRequest,
)
from trainctl.store.names import (
    BEST_TAG,
    LATEST_REF,
    is_valid_name,
    parse_step,
    validate_name,
)
from trainctl.store.presets import ModelConfig

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"

# Readers re-scan an experiment when a folder vanishes under them; a few tries are plenty,
# since each one only races the deletes that happen during one scan.
_LIST_ATTEMPTS = 5
# A trash folder that remembers its tag came from `commit` replacing that tag; `delete` uses a
# tagless trash name so that `cleanup` never resurrects a checkpoint the user deleted.
_TAGGED_TRASH_RE = re.compile(rf"^{re.escape(TRASH_PREFIX)}(?P<tag>.+)-[0-9a-f]{{32}}$")

Protected = Collection[tuple[str, str]]
"""(experiment, tag) pairs that must stay; a Mapping also says why, for the error message."""
# What a delete must spare, or how to ask for it: a callable is asked under `guard`, so a run
# that starts to depend on a checkpoint at that moment is either seen or finds it gone.
Protection = Protected | Callable[[], Protected]
GUARD_PREFIX = ".guard-"
IN_USE = "in use by a queued or running run"


# --- checkpoint info -----------------------------------------------------------------------


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


@dataclass(frozen=True)
class CheckpointInfo:
    """What the store knows about one complete checkpoint (manifest + metadata.json)."""

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
    path: Path

    model_config: ModelConfig | None
    """The model the checkpoint holds; None when metadata.json records none readable."""

    tokenizer: TokenizerId | None = None
    """The tokenizer of its training data; None when unknown (synthetic tokens, bare shards,
    a checkpoint from before datasets). A bpe one's tokenizer.json is in the manifest."""

    def require_model_config(self) -> ModelConfig:
        """The checkpoint's model config, or a clear error saying why it is unknown."""
        if self.model_config is None:
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


def check_fits(saved: ModelConfig, model: ModelConfig, source: str, advice: str = "") -> None:
    """Refuse to load a checkpoint into a model of another architecture (runtime fields such
    as torch.compile may differ); the message lists every difference."""
    diff = saved.differences(model)
    if diff:
        details = ", ".join(
            f"{k}: checkpoint {a!r} vs requested {b!r}" for k, (a, b) in diff.items()
        )
        raise CheckpointMismatch(f"{source} was saved by a different model ({details}){advice}")


def _model_config(meta: dict[str, Any]) -> ModelConfig | None:
    saved = meta.get("model_config")
    try:
        return ModelConfig.from_dict(saved) if isinstance(saved, dict) else None
    except (TypeError, ValueError):
        return None  # an unreadable config: the checkpoint lists, but nothing can load it


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


def _load_info(experiment: str, tag: str, folder: Path) -> CheckpointInfo:
    """Read a checkpoint folder; raise `CheckpointCorrupt` if it is not complete."""
    manifest = verify_manifest(folder, deep=False)
    meta = read_metadata(folder)
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
        path=folder,
        model_config=_model_config(meta),
        tokenizer=_tokenizer(meta),
    )


def _created_key(info: CheckpointInfo) -> tuple[float, float, int, str] | None:
    """Sort key for "most recently created": metadata created_at, then the manifest mtime.

    None when the checkpoint was deleted since it was listed (it is no candidate any more).
    """
    try:
        mtime = os.lstat(info.path / MANIFEST_FILE).st_mtime
    except FileNotFoundError:
        return None
    created = mtime
    if info.created_at:
        try:
            stamp = datetime.fromisoformat(info.created_at)
            created = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
        except ValueError:
            pass  # an unparseable stamp is no worse than a missing one: fall back to mtime
    return (created, mtime, info.step if info.step is not None else -1, info.tag)


_reported: dict[Path, tuple[int, str]] = {}
_reported_lock = threading.Lock()


def _report_hidden(folder: Path, why: CheckpointCorrupt) -> None:
    """Log, once per state of the folder, why a folder is not listed: a bad checkpoint is
    skipped, never an error of the listing, but someone should hear of it."""
    try:
        state = (folder.lstat().st_mtime_ns, str(why))
    except OSError:
        return  # gone: nothing to report
    with _reported_lock:
        if _reported.get(folder) == state:
            return
        _reported[folder] = state
    logger.warning("not listing %s: %s", folder, why)


def _is_real_dir(path: Path) -> bool:
    """A folder that is not a symlink: the store never reads or writes through a link, which
    anyone who can write to a shared checkpoint filesystem could plant."""
    return not path.is_symlink() and path.is_dir()


def _visible_dirs(folder: Path) -> list[Path]:
    """Real (non-symlink) sub-folders whose names are valid store names, sorted by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _is_real_dir(p) and is_valid_name(p.name))


@contextmanager
def _renames_locked(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold an flock on an experiment folder: exclusive while renaming entries in it, shared
    while scanning it.

    A scan (readdir) running while a commit and a retention rename entries can return neither
    the new checkpoint nor the old one, so an experiment that always has a latest would list
    none; under the lock a scan sees the folder as of one moment, and the two renames of a
    replacing commit look like one. The lock is advisory, works across processes, is taken
    on the folder itself (no lock file to list) and is never held while taking another.
    """
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


_local = threading.local()


def _held_guards() -> set[tuple[str, str]]:
    """The guards this thread holds (flocks of one process's threads exclude each other)."""
    if not hasattr(_local, "guards"):
        _local.guards = set()
    held: set[tuple[str, str]] = _local.guards
    return held


def _spared(protected: Protection) -> Protected:
    return protected() if callable(protected) else protected


def _discard(path: Path) -> None:
    """Remove a hidden folder. It is already invisible, so a failure is logged, not raised:
    `cleanup` will retry it at the next start."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:
        logger.warning("could not remove %s; cleanup will retry", path, exc_info=True)


# --- the store -----------------------------------------------------------------------------


class CheckpointStore:
    """All reads and writes of ``<root>/<experiment>/<tag>/`` go through here."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def experiment_dir(self, experiment: str) -> Path:
        return self.root / validate_name("experiment", experiment)

    def experiments(self) -> list[str]:
        """Names of experiment folders, sorted (they may hold no complete checkpoint yet)."""
        return [p.name for p in _visible_dirs(self.root)]

    @contextmanager
    def guard(self, experiment: str) -> Iterator[None]:
        """Hold the experiment's guard: "a run starts to depend on a checkpoint" (submit) and
        "a checkpoint is deleted" (delete, prune, a worker's retention) take turns.

        Without it a retention that read the protected set just before a validation run was
        queued could delete the checkpoint that run is about to read. The lock is an flock
        on ``<root>/.guard-<experiment>`` (a file beside, not inside, the experiment folder,
        whose listing stays checkpoints only); it works across processes and nodes that
        share the store. A store this process cannot write to is not guarded: nothing here
        can delete from it.
        """
        validate_name("experiment", experiment)
        key = (str(self.root.resolve()), experiment)
        if key in _held_guards():  # reentrant within a thread: a second flock would deadlock
            yield
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                self.root / f"{GUARD_PREFIX}{experiment}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            )
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            fd = -1
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
            _held_guards().add(key)
            yield
        finally:
            _held_guards().discard(key)
            if fd >= 0:
                os.close(fd)  # releases the lock

    # --- writing ---

    def staging_dir(self, experiment: str, tag: str) -> Path:
        """A fresh hidden folder beside the final one, so `commit` is a same-folder rename."""
        validate_name("tag", tag)
        if tag == LATEST_REF:
            raise InvalidName(
                f"{LATEST_REF!r} is reserved for the newest checkpoint; pick another tag"
            )
        exp_dir = self.experiment_dir(experiment)
        exp_dir.mkdir(parents=True, exist_ok=True)
        if exp_dir.is_symlink():
            raise CheckpointCorrupt(
                f"{exp_dir} is a symlink; the store writes only into its own folders"
            )
        staging = exp_dir / f"{STAGING_PREFIX}{tag}-{uuid.uuid4().hex}"
        staging.mkdir()
        return staging

    def commit(self, staging: Path, experiment: str, tag: str) -> Path:
        """Make a staged checkpoint visible as `tag`, replacing an existing one atomically.

        Two renames are needed when `tag` exists (POSIX cannot rename over a non-empty
        folder); a crash between them leaves a tagged trash folder that `cleanup` puts back.
        """
        exp_dir = self.experiment_dir(experiment)
        validate_name("tag", tag)
        if staging.parent.resolve() != exp_dir.resolve():
            raise ValueError(f"{staging} is not a staging folder of experiment {experiment!r}")
        verify_manifest(staging, deep=False)
        final = exp_dir / tag
        trash = None
        with _renames_locked(exp_dir, exclusive=True):
            if final.exists() or final.is_symlink():
                trash = exp_dir / f"{TRASH_PREFIX}{tag}-{uuid.uuid4().hex}"
                os.rename(final, trash)
            try:
                os.rename(staging, final)
            except OSError:
                if trash is not None:
                    os.rename(trash, final)  # put the old one back rather than leave a gap
                raise
        fsync_dir(exp_dir)
        if trash is not None:
            _discard(trash)
        return final

    def cleanup(self, experiment: str | None = None) -> list[Path]:
        """Remove leftover staging folders and finish interrupted commits and deletes.

        Returns the hidden folders it removed or restored. Run it at start, before claiming
        runs: a staging folder of a save in progress would be removed too. Pass `experiment`
        to touch only the experiment this process is about to train.
        """
        names = [experiment] if experiment is not None else self.experiments()
        handled: list[Path] = []
        for name in names:
            exp_dir = self.experiment_dir(name)
            if not _is_real_dir(exp_dir):
                continue
            for entry in sorted(exp_dir.iterdir()):
                if entry.is_dir() and not entry.is_symlink() and self._clean_entry(entry):
                    handled.append(entry)
        return handled

    def _clean_entry(self, entry: Path) -> bool:
        if entry.name.startswith(STAGING_PREFIX):
            _discard(entry)
            return True
        if not entry.name.startswith(TRASH_PREFIX):
            return False
        match = _TAGGED_TRASH_RE.fullmatch(entry.name)
        final = entry.parent / match.group("tag") if match else None
        if final is not None and not final.exists() and self._is_complete(entry):
            with _renames_locked(entry.parent, exclusive=True):
                os.rename(entry, final)
            fsync_dir(entry.parent)
            logger.warning("restored %s from %s (a commit was interrupted)", final, entry.name)
        else:
            _discard(entry)
        return True

    @staticmethod
    def _is_complete(folder: Path) -> bool:
        try:
            verify_manifest(folder, deep=False)
        except CheckpointCorrupt:
            return False
        return True

    # --- reading ---

    def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointInfo]:
        """Complete checkpoints, sorted by experiment, then step (None last), then tag."""
        names = [experiment] if experiment is not None else self.experiments()
        infos = [info for name in names for info in self._list_experiment(name)]
        infos.sort(key=lambda i: (i.experiment, i.step is None, i.step or 0, i.tag))
        return infos

    def _list_experiment(self, experiment: str) -> list[CheckpointInfo]:
        """Complete checkpoints of one experiment, from a snapshot that nothing vanished from.

        A folder deleted while it is read (retention or a prune racing this reader) makes the
        snapshot stale: a newer checkpoint may have been committed after the folder scan, and
        returning the rest would show an experiment with no latest at all. So scan again.
        """
        exp_dir = self.experiment_dir(experiment)
        if not _is_real_dir(exp_dir):
            return []
        for _ in range(_LIST_ATTEMPTS):
            infos, vanished = [], False
            with _renames_locked(exp_dir, exclusive=False):
                folders = _visible_dirs(exp_dir)
            for folder in folders:
                try:
                    infos.append(_load_info(experiment, folder.name, folder))
                except CheckpointCorrupt as exc:
                    # Incomplete or damaged: invisible by design. Gone: the snapshot is stale.
                    vanished = vanished or not folder.exists()
                    _report_hidden(folder, exc)
            if not vanished:
                break
        return infos

    def get(self, experiment: str, tag: str) -> CheckpointInfo:
        exp_dir = self.experiment_dir(experiment)
        validate_name("tag", tag)
        if not _is_real_dir(exp_dir):
            raise CheckpointNotFound(f"experiment {experiment!r} does not exist in the store")
        folder = exp_dir / tag
        try:
            # Locked, so that a commit replacing `tag` (two renames) is never seen half done.
            with _renames_locked(exp_dir, exclusive=False):
                if not _is_real_dir(folder):
                    raise CheckpointCorrupt(f"{folder}: not a folder")
                return _load_info(experiment, tag, folder)
        except CheckpointCorrupt:
            raise CheckpointNotFound(
                f"no complete checkpoint {tag!r} in experiment {experiment!r}"
            ) from None

    def latest(self, experiment: str | None = None) -> CheckpointInfo:
        """Highest complete ``step_*`` of an experiment; across experiments, the newest one."""
        info = self.latest_or_none(experiment)
        if info is None:
            where = f" for experiment {experiment!r}" if experiment is not None else "s"
            raise CheckpointNotFound(f"no checkpoint{where} yet")
        return info

    def latest_or_none(self, experiment: str | None = None) -> CheckpointInfo | None:
        if experiment is None:
            for _ in range(_LIST_ATTEMPTS):
                infos = self.list_checkpoints()
                keyed = [(key, i) for i in infos if (key := _created_key(i)) is not None]
                if len(keyed) == len(infos):
                    break  # nothing was deleted while we looked: the snapshot holds the newest
            return max(keyed, key=lambda pair: pair[0], default=(None, None))[1]
        return self._latest_step(experiment)

    def _latest_step(self, experiment: str) -> CheckpointInfo | None:
        """The highest complete ``step_*`` of one experiment, reading folders from the top down.

        Only the newest folder is read (a few more when the newest are incomplete), however
        many checkpoints the experiment keeps: this answers the most polled endpoint. A folder
        that vanishes while it is read makes the scan stale, as in `_list_experiment`.
        """
        exp_dir = self.experiment_dir(experiment)
        if not _is_real_dir(exp_dir):
            return None
        found = None
        for _ in range(_LIST_ATTEMPTS):
            with _renames_locked(exp_dir, exclusive=False):
                folders = _visible_dirs(exp_dir)
            steps = sorted(
                ((step, f) for f in folders if (step := parse_step(f.name)) is not None),
                reverse=True,
            )
            found, vanished = None, False
            for _, folder in steps:
                try:
                    found = _load_info(experiment, folder.name, folder)
                    break
                except CheckpointCorrupt:
                    vanished = vanished or not folder.exists()
            if not vanished:
                break
        return found

    def latest_of_run(self, experiment: str, run_id: str) -> CheckpointInfo | None:
        """The highest ``step_*`` that run `run_id` wrote: where it continues when it is
        interrupted and requeued (not always the experiment's latest: a run may resume from
        an older tag)."""
        mine = [
            (step, info)
            for info in self.list_checkpoints(experiment)
            if info.run_id == run_id and (step := parse_step(info.tag)) is not None
        ]
        return max(mine, key=lambda pair: pair[0], default=(0, None))[1]

    def best(self, experiment: str | None = None) -> CheckpointInfo:
        """The ``best`` tag of an experiment; across experiments, the lowest best_loss."""
        if experiment is not None:
            return self.get(experiment, BEST_TAG)
        bests = [
            i for i in self.list_checkpoints() if i.tag == BEST_TAG and i.best_loss is not None
        ]
        if not bests:
            raise CheckpointNotFound("no best checkpoint yet in any experiment")
        return min(bests, key=lambda i: (i.best_loss, i.experiment))

    def resolve(self, experiment: str, ref: str) -> CheckpointInfo:
        """``latest``, ``best`` or a tag → the checkpoint it names."""
        if ref == LATEST_REF:
            return self.latest(experiment)
        return self.get(experiment, ref)

    def open_file(self, experiment: str, tag: str, name: str) -> tuple[CheckpointInfo, int]:
        """The checkpoint and a read descriptor of one of its files, for download.

        Only ``manifest.json`` and names the manifest lists are servable, matched exactly;
        user text is never joined to a path before that match. The file is opened without
        following a link (`manifests.open_fd`), so a planted symlink is refused, and what is
        served is the file that was checked: the caller reads the descriptor, never the path.
        """
        if not isinstance(name, str) or not name or any(c in name for c in "/\\\x00"):
            raise InvalidName(f"invalid file name {name!r}: give a bare file name, no path")
        info = self.get(experiment, tag)
        allowed = [f["name"] for f in info.files] + [MANIFEST_FILE]
        if name not in allowed:
            raise CheckpointNotFound(
                f"checkpoint {tag!r} of experiment {experiment!r} has no file {name!r}; "
                f"it has: {', '.join(allowed)}"
            )
        try:
            return info, open_fd(info.path, name)
        except FileNotFoundError:
            raise CheckpointNotFound(
                f"file {name!r} of checkpoint {tag!r} in experiment {experiment!r} "
                "is not a regular file inside the store"
            ) from None

    # --- deleting ---

    def delete(
        self, experiment: str, tag: str, *, protected: Protection = frozenset()
    ) -> CheckpointInfo:
        """Delete a checkpoint. It is renamed away first, so it vanishes from listings at once
        and a half-removed folder is never seen."""
        with self.guard(experiment):
            info = self.get(experiment, tag)
            spared = _spared(protected)
            if (experiment, tag) in spared:
                why = spared.get((experiment, tag)) if isinstance(spared, Mapping) else None
                raise CheckpointProtected(
                    f"checkpoint {tag!r} of experiment {experiment!r} is "
                    f"{why or IN_USE}; cancel that run or wait for it to finish, then delete it"
                )
            self._remove(info)
        return info

    def prune(
        self,
        experiment: str,
        *,
        keep_last: int,
        keep_best: bool = True,
        dry_run: bool = False,
        protected: Protection = frozenset(),
    ) -> PruneOutcome:
        """Delete ``step_*`` checkpoints older than the newest `keep_last`.

        The outcome's `kept` holds every complete checkpoint of the experiment that remains.
        Never deleted: the latest step (even with keep_last=0, since resume needs it), ``best``
        and user tags (only ``step_*`` is pruned), the step that ``best`` was copied from when
        `keep_best`, and anything in `protected`. With `dry_run` nothing is removed.

        Concurrent saves are safe: only checkpoints of the snapshot listed at the start are
        candidates and the newest step of that snapshot is kept, so a checkpoint committed
        while prune runs (necessarily newer) is never deleted, and a save's staging folder is
        never even seen.
        """
        if type(keep_last) is not int or keep_last < 0:
            raise InvalidRequest(f"keep_last must be an integer >= 0, got {keep_last!r}")
        if not _is_real_dir(self.experiment_dir(experiment)):
            raise CheckpointNotFound(f"experiment {experiment!r} does not exist in the store")
        with self.guard(experiment):
            infos = self.list_checkpoints(experiment)
            spared = _spared(protected)
            doomed = self._prune_candidates(experiment, infos, keep_last, keep_best, spared)
            if not dry_run:
                for info in doomed:
                    self._remove(info)
        doomed_tags = {i.tag for i in doomed}
        return PruneOutcome(doomed, [i for i in infos if i.tag not in doomed_tags], dry_run)

    def _prune_candidates(
        self,
        experiment: str,
        infos: list[CheckpointInfo],
        keep_last: int,
        keep_best: bool,
        protected: Protected,
    ) -> list[CheckpointInfo]:
        steps = sorted(
            (i for i in infos if parse_step(i.tag) is not None),
            key=lambda i: parse_step(i.tag) or 0,
            reverse=True,
        )
        best = next((i for i in infos if i.tag == BEST_TAG), None)
        best_step = best.step if keep_best and best is not None else None
        return [
            i
            for i in steps[max(keep_last, 1) :]
            if (experiment, i.tag) not in protected
            and (best_step is None or parse_step(i.tag) != best_step)
        ]

    @staticmethod
    def _remove(info: CheckpointInfo) -> None:
        """Rename to a tagless trash name (so `cleanup` never restores it), then remove."""
        trash = info.path.parent / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            with _renames_locked(info.path.parent, exclusive=True):
                os.rename(info.path, trash)
        except FileNotFoundError:
            return  # someone else removed it first: the outcome we wanted
        fsync_dir(info.path.parent)
        _discard(trash)

    def retain(
        self, experiment: str, max_keep: int, protected: Protection = frozenset()
    ) -> list[CheckpointInfo]:
        """Retention after a save (seed ``max_keep``); return the deleted.

        Exactly `max_keep` step checkpoints stay (plus protected ones): the ``best`` folder is
        its own copy and is never pruned, so the step it was copied from need not be kept.
        """
        return self.prune(
            experiment, keep_last=max_keep, keep_best=False, protected=protected
        ).deleted
