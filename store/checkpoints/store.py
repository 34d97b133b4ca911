"""The checkpoint store's policy: complete checkpoints only, listing, latest and best,
downloads by manifest, delete, prune and retention (docs/design/checkpoints.md, "Checkpoint store").

A checkpoint is *complete* when its manifest parses and every listed file exists with the
listed size. Readers only ever see complete checkpoints, so a crash mid-save can never become
"latest". Where the files live is the storage's business (`storage.Storage`: folders on POSIX,
dicts in memory); this module only asks it for committed entries and their files. It knows
nothing of torch: the worker writes the files through `CheckpointStore.stage`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime

from trainctl.store.checkpoints.consolidate import ConsolidatedModel, consolidate
from trainctl.store.checkpoints.info import CheckpointInfo, PruneOutcome, read_info
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, is_complete
from trainctl.store.checkpoints.storage import Entry, Reader, Storage
from trainctl.store.checkpoints.writer import CheckpointWriter
from trainctl.store.exceptions import (
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointProtected,
    InvalidName,
    InvalidRequest,
)
from trainctl.store.names import (
    BEST_TAG,
    LATEST_REF,
    is_valid_experiment,
    parse_step,
    validate_name,
)

logger = logging.getLogger(__name__)

# Readers re-scan an experiment when an entry vanishes under them; a few tries are plenty,
# since each one only races the deletes that happen during one scan.
_LIST_ATTEMPTS = 5

Protected = Collection[tuple[str, str]]
"""(experiment, tag) pairs that must stay; a Mapping also says why, for the error message."""
# What a delete must spare, or how to ask for it: a callable is asked under `guard`, so a run
# that starts to depend on a checkpoint at that moment is either seen or finds it gone.
Protection = Protected | Callable[[], Protected]
IN_USE = "in use by a queued or running run"


def _spared(protected: Protection) -> Protected:
    return protected() if callable(protected) else protected


_reported: dict[str, tuple[float | None, str]] = {}
_reported_lock = threading.Lock()


# --- the store -----------------------------------------------------------------------------


class CheckpointStore:
    """All reads and writes of checkpoints (or exports) in one storage go through here."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def describe(
        self, experiment: str | None = None, tag: str | None = None, name: str | None = None
    ) -> str:
        """The store, an experiment, a checkpoint or one of its files, in words."""
        return self.storage.describe(experiment, tag, name)

    def entry(self, experiment: str, tag: str) -> Entry:
        """The files of checkpoint `tag`, to check and load (`manifests.verify_manifest`,
        the worker's loader); unlike `get`, an incomplete one is not refused here."""
        return Entry(
            self.storage, validate_name("experiment", experiment), validate_name("tag", tag)
        )

    def taken(self, experiment: str, tag: str) -> bool:
        """Whether an entry is committed under `tag`, complete or not: a tag that a new
        entry of that name (an export) may not be written to."""
        return self.storage.exists(
            validate_name("experiment", experiment), validate_name("tag", tag)
        )

    def experiments(self) -> list[str]:
        """Names of experiments, sorted (they may hold no complete checkpoint yet)."""
        return self.storage.experiments()

    def guard(self, experiment: str) -> AbstractContextManager[None]:
        """Hold the experiment's guard: "a run starts to depend on a checkpoint" (submit) and
        "a checkpoint is deleted" (delete, prune, a worker's retention) take turns.

        Without it a retention that read the protected set just before a validation run was
        queued could delete the checkpoint that run is about to read. It works across the
        processes and nodes that share the storage, and is re-entrant within a thread.
        """
        return self.storage.guard(validate_name("experiment", experiment))

    # --- writing ---

    def stage(self, experiment: str, tag: str) -> CheckpointWriter:
        """A new checkpoint `tag`, invisible until its writer commits (replacing a checkpoint
        of that tag atomically)."""
        if not is_valid_experiment(experiment):
            validate_name("experiment", experiment)  # says why, for a name of no rule
            raise InvalidName(
                f"invalid experiment name {experiment!r}: 'latest' and 'best' name checkpoints"
            )
        validate_name("tag", tag)
        if tag == LATEST_REF:
            raise InvalidName(
                f"{LATEST_REF!r} is reserved for the newest checkpoint; pick another tag"
            )
        return CheckpointWriter(self.storage.stage(experiment, tag))

    def join(self, experiment: str, tag: str, key: str) -> CheckpointWriter:
        """The stage `key` (a writer's `key`) another process is writing, to add files to:
        the ranks of a sharded save write their shards into the owner's one checkpoint.
        This writer cannot commit; hand its `listing` to the owner's `adopt`."""
        staged = self.storage.join(
            validate_name("experiment", experiment), validate_name("tag", tag), key
        )
        return CheckpointWriter(staged, joined=True)

    def cleanup(self, experiment: str | None = None) -> list[tuple[str, str]]:
        """Remove leftover stages and finish interrupted commits and deletes.

        Returns what it removed or restored: (experiment, the storage's name for it, such as
        a staging folder's; `describe` places it). Run it at start, before claiming
        runs: a stage of a save in progress would be removed too. Pass `experiment` to touch
        only the experiment this process is about to train.
        """
        if experiment is not None:
            validate_name("experiment", experiment)
        return self.storage.cleanup(experiment, is_complete)

    # --- reading ---

    def list_checkpoints(self, experiment: str | None = None) -> list[CheckpointInfo]:
        """Complete checkpoints, sorted by experiment, then step (None last), then tag."""
        names = [experiment] if experiment is not None else self.experiments()
        infos = [info for name in names for info in self._list_experiment(name)]
        infos.sort(key=lambda i: (i.experiment, i.step is None, i.step or 0, i.tag))
        return infos

    def _read(self, experiment: str, tag: str) -> CheckpointInfo:
        return read_info(Entry(self.storage, experiment, tag), experiment, tag)

    def _hidden(self, experiment: str, tag: str, why: CheckpointCorrupt) -> bool:
        """Log, once per state of the entry, why it is not listed (a bad checkpoint is
        skipped, never an error of the listing, but someone should hear of it); True when
        it is gone instead, which makes the caller's snapshot stale."""
        if not self.storage.exists(experiment, tag):
            return True
        where = self.describe(experiment, tag)
        state = (self.storage.committed_at(experiment, tag), str(why))
        with _reported_lock:
            if _reported.get(where) == state:
                return False
            _reported[where] = state
        logger.warning("not listing %s: %s", where, why)
        return False

    def _list_experiment(self, experiment: str) -> list[CheckpointInfo]:
        """Complete checkpoints of one experiment, from a snapshot that nothing vanished from.

        An entry deleted while it is read (retention or a prune racing this reader) makes the
        snapshot stale: a newer checkpoint may have been committed after the scan, and
        returning the rest would show an experiment with no latest at all. So scan again.
        """
        infos: list[CheckpointInfo] = []
        for _ in range(_LIST_ATTEMPTS):
            infos, vanished = [], False
            for tag in self.storage.tags(experiment):
                try:
                    infos.append(self._read(experiment, tag))
                except CheckpointCorrupt as exc:
                    # Incomplete or damaged: invisible by design. Gone: the snapshot is stale.
                    vanished = self._hidden(experiment, tag, exc) or vanished
            if not vanished:
                break
        return infos

    def get(self, experiment: str, tag: str) -> CheckpointInfo:
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        if not self.storage.exists(experiment):
            raise CheckpointNotFound(f"experiment {experiment!r} does not exist in the store")
        try:
            # Held still, so that a commit replacing `tag` (two renames) is never seen half
            # done.
            with self.storage.reading(experiment):
                if not self.storage.exists(experiment, tag):
                    raise CheckpointCorrupt(f"{self.describe(experiment, tag)}: not there")
                return self._read(experiment, tag)
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
            keyed: list[tuple[tuple[float, float, int, str], CheckpointInfo]] = []
            for _ in range(_LIST_ATTEMPTS):
                infos = self.list_checkpoints()
                keyed = [(key, i) for i in infos if (key := self._created_key(i)) is not None]
                if len(keyed) == len(infos):
                    break  # nothing was deleted while we looked: the snapshot holds the newest
            return max(keyed, key=lambda pair: pair[0], default=(None, None))[1]
        return self._latest_step(experiment)

    def _created_key(self, info: CheckpointInfo) -> tuple[float, float, int, str] | None:
        """Sort key for "most recently created": metadata created_at, then the commit time.

        None when the checkpoint was deleted since it was listed (it is no candidate any more).
        """
        mtime = self.storage.committed_at(info.experiment, info.tag)
        if mtime is None:
            return None
        created = mtime
        if info.created_at:
            try:
                stamp = datetime.fromisoformat(info.created_at)
                created = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
            except ValueError:
                pass  # an unparseable stamp is no worse than a missing one: the commit time
        return (created, mtime, info.step if info.step is not None else -1, info.tag)

    def _latest_step(self, experiment: str) -> CheckpointInfo | None:
        """The highest complete ``step_*`` of one experiment, reading entries from the top down.

        Only the newest entry is read (a few more when the newest are incomplete), however
        many checkpoints the experiment keeps: this answers the most polled endpoint. An entry
        that vanishes while it is read makes the scan stale, as in `_list_experiment`.
        """
        found = None
        for _ in range(_LIST_ATTEMPTS):
            steps = sorted(
                (
                    (step, tag)
                    for tag in self.storage.tags(experiment)
                    if (step := parse_step(tag)) is not None
                ),
                reverse=True,
            )
            found, vanished = None, False
            for _, tag in steps:
                try:
                    found = self._read(experiment, tag)
                    break
                except CheckpointCorrupt:
                    vanished = vanished or not self.storage.exists(experiment, tag)
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

    def open_file(self, experiment: str, tag: str, name: str) -> tuple[CheckpointInfo, Reader]:
        """The checkpoint and a reader of one of its files, for download.

        Only ``manifest.json`` and names the manifest lists are servable, matched exactly;
        user text is never joined to a path before that match. The file is opened without
        following a link, so a planted symlink is refused, and what is served is the file
        that was checked: the caller reads the reader, never a path of its own.
        """
        info = self._servable(experiment, tag, name)
        try:
            return info, self.storage.open(experiment, tag, name)
        except FileNotFoundError:
            raise CheckpointNotFound(
                f"file {name!r} of checkpoint {tag!r} in experiment {experiment!r} "
                "is not a regular file inside the store"
            ) from None

    def file_url(
        self, experiment: str, tag: str, name: str, expires: int
    ) -> tuple[CheckpointInfo, str | None]:
        """The checkpoint and a URL that serves one of its files for `expires` seconds
        straight from the storage (`Storage.url`: the save its manifest names, read under
        one `reading`, so the URL and the info are of one save); None where the storage
        cannot, or for the manifest: `open_file` then. Servable names as `open_file`'s."""
        with self.storage.reading(experiment):
            info = self._servable(experiment, tag, name)
            try:
                return info, self.storage.url(experiment, tag, name, expires)
            except FileNotFoundError:
                raise CheckpointNotFound(
                    f"no complete checkpoint {tag!r} in experiment {experiment!r}"
                ) from None

    def _servable(self, experiment: str, tag: str, name: str) -> CheckpointInfo:
        """The checkpoint, when `name` is the manifest or a file it lists, matched exactly;
        user text is never joined to a path before that match."""
        if not isinstance(name, str) or not name or any(c in name for c in "/\\\x00"):
            raise InvalidName(f"invalid file name {name!r}: give a bare file name, no path")
        info = self.get(experiment, tag)
        allowed = [f["name"] for f in info.files] + [MANIFEST_FILE]
        if name not in allowed:
            raise CheckpointNotFound(
                f"checkpoint {tag!r} of experiment {experiment!r} has no file {name!r}; "
                f"it has: {', '.join(allowed)}"
            )
        return info

    def consolidated(self, experiment: str, tag: str) -> ConsolidatedModel | None:
        """The one model file of a sharded checkpoint, stitched from its shards as it is
        read (`consolidate`); None for a checkpoint that holds it whole (its own
        model.safetensors, served by `open_file`)."""
        info = self.get(experiment, tag)
        return consolidate(self.entry(experiment, tag)) if info.sharded else None

    # --- deleting ---

    def delete(
        self, experiment: str, tag: str, *, protected: Protection = frozenset()
    ) -> CheckpointInfo:
        """Delete a checkpoint: it vanishes from listings at once and is never seen half
        removed."""
        with self.guard(experiment):
            info = self.get(experiment, tag)
            spared = _spared(protected)
            if (experiment, tag) in spared:
                why = spared.get((experiment, tag)) if isinstance(spared, Mapping) else None
                raise CheckpointProtected(
                    f"checkpoint {tag!r} of experiment {experiment!r} is "
                    f"{why or IN_USE}; cancel that run or wait for it to finish, then delete it"
                )
            self.storage.delete(experiment, tag)
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
        while prune runs (necessarily newer) is never deleted, and a save's stage is never
        even seen.
        """
        if type(keep_last) is not int or keep_last < 0:
            raise InvalidRequest(f"keep_last must be an integer >= 0, got {keep_last!r}")
        if not self.storage.exists(validate_name("experiment", experiment)):
            raise CheckpointNotFound(f"experiment {experiment!r} does not exist in the store")
        with self.guard(experiment):
            infos = self.list_checkpoints(experiment)
            spared = _spared(protected)
            doomed = self._prune_candidates(experiment, infos, keep_last, keep_best, spared)
            if not dry_run:
                for info in doomed:
                    self.storage.delete(info.experiment, info.tag)
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
