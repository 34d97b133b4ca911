"""The storage of the folder stores on a POSIX filesystem: folders, flocks, renames, fsync
(docs/architecture.md, "Checkpoint store").

```
<root>/
  .guard-<experiment>          guard lock file (beside, not inside, the experiment)
  <experiment>/
    <tag>/                     a committed entry: its files, the marker (manifest) last
    .staging-<tag>-<uuid>/     a stage in progress (never listed)
    .trash-<tag>-<uuid>/       a replaced tag, mid-commit (cleanup restores it)
    .trash-<uuid>/             a deleted entry (cleanup removes it)
```

No link is followed on the way to a file: the experiment and tag folders are opened with
O_NOFOLLOW and the file relative to the folder's descriptor, also with O_NOFOLLOW. A link
planted in a shared filesystem (``manifest.json -> /etc/passwd``, a weights file pointing
elsewhere, a tag or experiment folder that is a link) is then missing, never read; the root
itself may be a link (that is the administrator's choice, not a user's). Readers offer the
descriptor that was checked as ``/proc/self/fd/N``, never a path that could be swapped.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import io
import logging
import os
import re
import shutil
import stat
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.storage import Complete
from trainctl.store.exceptions import CheckpointCorrupt
from trainctl.store.names import is_valid_name, validate_name

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
GUARD_PREFIX = ".guard-"
# A trash folder that remembers its tag came from a commit replacing that tag; `delete` uses a
# tagless trash name so that `cleanup` never resurrects an entry the user deleted.
_TAGGED_TRASH_RE = re.compile(rf"^{re.escape(TRASH_PREFIX)}(?P<tag>.+)-[0-9a-f]{{32}}$")
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# A sink asks the kernel to start writing out what it was given once this much is pending,
# so that the fsync at its close finds little left to flush.
WRITE_OUT_MIN = 4 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start write-out of dirty pages, do not wait


def _load_sync_file_range() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux: the final fsync does all the work
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


# --- files ----------------------------------------------------------------------------------


class PosixReader(io.BufferedReader):
    """A file of an entry through the descriptor that was checked; `local_path` reopens that
    very file (whatever its name points to by then) while this reader is open."""

    def __init__(self, fd: int) -> None:
        super().__init__(io.FileIO(fd, "rb"))
        self.size = os.fstat(fd).st_size
        self.local_path: str | None = f"/proc/self/fd/{fd}"


class PosixSink:
    """A new file of a stage: every byte handed to the kernel at once, write-out started per
    chunk (Linux `sync_file_range`), fsync at `close`."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._offset = 0  # bytes handed to the kernel so far
        self._flushed = 0  # bytes whose write-out has been started

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._offset += written
        if _sync_file_range is not None and self._offset - self._flushed >= WRITE_OUT_MIN:
            # Advisory: an error here (EIO, ENOSPC) is reported again by the fsync in close.
            _sync_file_range(self._fd, self._flushed, self._offset - self._flushed,
                             _SYNC_FILE_RANGE_WRITE)  # fmt: skip
            self._flushed = self._offset
        return size

    def close(self) -> None:
        """Fsync and close. Raises what the disk reports (ENOSPC)."""
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        finally:
            self.release()

    def release(self) -> None:
        """Close without making durable: the write failed, its stage is being removed."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, opened so that neither it nor its parent is a symlink."""
    folder = folder.absolute()
    above = os.open(folder.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parent = os.open(folder.parent.name, _NOFOLLOW_DIR, dir_fd=above)
    finally:
        os.close(above)
    try:
        return os.open(folder.name, _NOFOLLOW_DIR, dir_fd=parent)
    finally:
        os.close(parent)


def open_fd(folder: Path, name: str) -> int:
    """A read descriptor of the regular file `name` directly in `folder`, following no link.

    Raises FileNotFoundError for anything else there (a link, a folder, a device) or a
    folder reached through a link, so callers treat it as a missing file.
    """
    try:
        folder_fd = _open_folder(folder)
    except OSError as exc:  # ELOOP/ENOTDIR: a link where a folder should be
        raise FileNotFoundError(f"{folder}: not a folder of the store ({exc.strerror})") from None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise FileNotFoundError(f"{folder / name}: not a regular file ({exc.strerror})") from None
    finally:
        os.close(folder_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{folder / name}: not a regular file")
    return fd


class _Folder:
    """`Files` of a folder of the storage (a committed entry, or trash that cleanup checks)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def open(self, name: str) -> PosixReader:
        return PosixReader(open_fd(self.folder, validate_name("file", name)))

    def describe(self, name: str | None = None) -> str:
        return str(self.folder / name if name is not None else self.folder)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk, making renames and new files in it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- folders --------------------------------------------------------------------------------


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


def _discard(path: Path) -> None:
    """Remove a hidden folder. It is already invisible, so a failure is logged, not raised:
    `cleanup` will retry it at the next start."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError:
        logger.warning("could not remove %s; cleanup will retry", path, exc_info=True)


# --- stages ---------------------------------------------------------------------------------


class PosixStage:
    """A hidden folder beside the entry it becomes, so its commit is a same-folder rename."""

    def __init__(self, folder: Path, final: Path) -> None:
        self.folder, self.final = folder, final
        self._sinks: list[PosixSink] = []
        self._done = False

    def create(self, name: str) -> PosixSink:
        sink = PosixSink(self.folder / validate_name("file", name))
        self._sinks.append(sink)
        return sink

    def commit(self, *, replace: bool = True) -> None:
        """Rename the stage to its tag, replacing an existing one atomically.

        Two renames are needed when the tag exists (POSIX cannot rename over a non-empty
        folder); a crash between them leaves a tagged trash folder that `cleanup` puts back.
        """
        assert all(s.closed for s in self._sinks), "commit before every file was closed"
        fsync_dir(self.folder)  # the files' names are durable before the folder is renamed
        exp_dir, final, trash = self.final.parent, self.final, None
        with _renames_locked(exp_dir, exclusive=True):
            if final.exists() or final.is_symlink():
                if not replace:
                    raise FileExistsError(errno.EEXIST, "the entry exists", str(final))
                trash = exp_dir / f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex}"
                os.rename(final, trash)
            try:
                os.rename(self.folder, final)
            except OSError:
                if trash is not None:
                    os.rename(trash, final)  # put the old one back rather than leave a gap
                raise
        self._done = True
        fsync_dir(exp_dir)
        if trash is not None:
            _discard(trash)

    def abort(self) -> None:
        # On a full disk its bytes are what the next save (or another run) needs; cleanup
        # at the next start is too late.
        for sink in self._sinks:
            sink.release()
        if not self._done:
            shutil.rmtree(self.folder, ignore_errors=True)
            self._done = True


# --- the storage ----------------------------------------------------------------------------


class PosixStorage:
    """Entries as folders ``<root>/<experiment>/<tag>/``; `marker` is the file each entry
    writes last, whose mtime is its commit time (a checkpoint's manifest)."""

    def __init__(self, root: Path, marker: str = MANIFEST_FILE) -> None:
        self.root, self.marker = Path(root), marker

    def path_of(self, experiment: str, tag: str | None = None) -> Path:
        """Where an experiment or entry lives on disk, for tools and tests that work on the
        folders themselves; readers go through `open`."""
        folder = self.root / validate_name("experiment", experiment)
        return folder / validate_name("tag", tag) if tag is not None else folder

    def describe(
        self, experiment: str | None = None, tag: str | None = None, name: str | None = None
    ) -> str:
        path = self.root
        for part in (experiment, tag, name):
            if part is None:
                break
            path = path / part
        return str(path)

    def experiments(self) -> list[str]:
        return [p.name for p in _visible_dirs(self.root)]

    def tags(self, experiment: str) -> list[str]:
        exp_dir = self.path_of(experiment)
        if not _is_real_dir(exp_dir):
            return []
        with _renames_locked(exp_dir, exclusive=False):
            return [p.name for p in _visible_dirs(exp_dir)]

    def exists(self, experiment: str, tag: str | None = None) -> bool:
        return _is_real_dir(self.path_of(experiment, tag))

    def open(self, experiment: str, tag: str, name: str) -> PosixReader:
        return _Folder(self.path_of(experiment, tag)).open(name)

    @contextmanager
    def reading(self, experiment: str) -> Iterator[None]:
        with _renames_locked(self.path_of(experiment), exclusive=False):
            yield

    def committed_at(self, experiment: str, tag: str) -> float | None:
        try:
            return os.lstat(self.path_of(experiment, tag) / self.marker).st_mtime
        except FileNotFoundError:
            return None

    def stage(self, experiment: str, tag: str) -> PosixStage:
        exp_dir = self.path_of(experiment)
        final = self.path_of(experiment, tag)
        exp_dir.mkdir(parents=True, exist_ok=True)
        if exp_dir.is_symlink():
            raise CheckpointCorrupt(
                f"{exp_dir} is a symlink; the store writes only into its own folders"
            )
        staging = exp_dir / f"{STAGING_PREFIX}{tag}-{uuid.uuid4().hex}"
        staging.mkdir()
        return PosixStage(staging, final)

    def delete(self, experiment: str, tag: str) -> bool:
        """Rename to a tagless trash name (so `cleanup` never restores it), then remove."""
        exp_dir, folder = self.path_of(experiment), self.path_of(experiment, tag)
        trash = exp_dir / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            with _renames_locked(exp_dir, exclusive=True):
                os.rename(folder, trash)
        except FileNotFoundError:
            return False  # someone else removed it first: the outcome we wanted
        fsync_dir(exp_dir)
        _discard(trash)
        return True

    def cleanup(self, experiment: str | None, complete: Complete) -> list[tuple[str, str]]:
        names = [experiment] if experiment is not None else self.experiments()
        handled: list[tuple[str, str]] = []
        for name in names:
            exp_dir = self.path_of(name)
            if not _is_real_dir(exp_dir):
                continue
            for entry in sorted(exp_dir.iterdir()):
                if entry.is_dir() and not entry.is_symlink() and _clean(entry, complete):
                    handled.append((name, entry.name))
        return handled

    @contextmanager
    def guard(self, experiment: str) -> Iterator[None]:
        """An flock on ``<root>/.guard-<experiment>`` (a file beside, not inside, the
        experiment folder, whose listing stays entries only); it works across processes and
        nodes that share the store. A store this process cannot write to is not guarded:
        nothing here can delete from it."""
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


def _clean(entry: Path, complete: Complete) -> bool:
    """Remove a staging folder or trash, or put back a whole entry whose tag a commit left
    free; False for a folder that is neither (a committed entry)."""
    if entry.name.startswith(STAGING_PREFIX):
        _discard(entry)
        return True
    if not entry.name.startswith(TRASH_PREFIX):
        return False
    match = _TAGGED_TRASH_RE.fullmatch(entry.name)
    final = entry.parent / match.group("tag") if match else None
    if final is not None and not final.exists() and complete(_Folder(entry)):
        with _renames_locked(entry.parent, exclusive=True):
            os.rename(entry, final)
        fsync_dir(entry.parent)
        logger.warning("restored %s from %s (a commit was interrupted)", final, entry.name)
    else:
        _discard(entry)
    return True
