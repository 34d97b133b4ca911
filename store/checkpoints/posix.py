"""The storage of the folder stores on a POSIX filesystem: folders, flocks, renames, fsync
(docs/design/checkpoints.md, "Checkpoint store").

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
itself may be a link (that is the administrator's choice, not a user's). A file is read only
if it is regular and has no other name: it is opened non-blocking and checked with `fstat`
(`store.files`), so a FIFO never blocks a reader and a hardlink to a file outside the store
is missing too; the store itself never makes one. (The datasets' storage reads hardlinks:
`hardlinks`.) Readers offer the descriptor that was checked as ``/proc/self/fd/N``, never a
path that could be swapped.
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
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainctl.store.checkpoints.manifests import MANIFEST_FILE
from trainctl.store.checkpoints.storage import Complete, NotAFile
from trainctl.store.exceptions import CheckpointCorrupt
from trainctl.store.files import (
    NotRegularFile,
    check_regular,
    describe_mode,
    descriptor_path,
    make_folder_at,
    open_folder_at,
    open_folders_below,
    open_regular_fd_at,
)
from trainctl.store.names import is_valid_name, validate_name

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
GUARD_PREFIX = ".guard-"
# A trash folder that remembers its tag came from a commit replacing that tag; `delete` uses a
# tagless trash name so that `cleanup` never resurrects an entry the user deleted.
_STAGE_RE = re.compile(rf"{re.escape(STAGING_PREFIX)}.+-[0-9a-f]{{32}}")
_TAGGED_TRASH_RE = re.compile(rf"{re.escape(TRASH_PREFIX)}(?P<tag>.+)-[0-9a-f]{{32}}")

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
        self.local_path: str | None = descriptor_path(fd)


class PosixSink:
    """A new file of a stage: every byte handed to the kernel at once, write-out started per
    chunk (Linux `sync_file_range`), fsync at `close`."""

    def __init__(self, path: Path | str, dir_fd: int | None = None) -> None:
        """A new file at `path` (relative to the folder `dir_fd`, if given): O_EXCL, so a
        link planted at its name is never opened."""
        self._fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dir_fd
        )
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


def _open_below(base: Path, *names: str) -> int:
    """A descriptor of `base/names...`: `base` as it is (the store's root may be a link, the
    administrator's choice), each of `names` without following a link."""
    return open_folders_below(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), names)


def _open_folder(folder: Path) -> int:
    """A descriptor of `folder`, opened so that neither it nor its parent is a symlink."""
    folder = folder.absolute()
    return _open_below(folder.parent.parent, folder.parent.name, folder.name)


def open_fd(folder: Path, name: str, *, single_link: bool = True) -> int:
    """A read descriptor of the regular file `name` directly in `folder`, following no link.

    Raises FileNotFoundError for nothing there, and its `NotAFile` for anything else there (a
    link, a folder, a FIFO, a device, a file with a second name unless `single_link` is
    False) or a folder reached through a link, so callers treat it as a missing file. Never
    blocks: a FIFO is opened non-blocking, and refused.
    """
    try:
        folder_fd = _open_folder(folder)
    except OSError as exc:  # ELOOP/ENOTDIR: a link where a folder should be
        missing = FileNotFoundError if exc.errno == errno.ENOENT else NotAFile
        raise missing(f"{folder}: not a folder of the store ({exc.strerror})") from None
    try:
        return open_regular_fd_at(folder_fd, name, folder / name, single_link=single_link)
    except FileNotFoundError:
        raise
    except OSError as exc:  # NotRegularFile, or ELOOP: a link swapped in after the check
        raise NotAFile(f"{folder / name}: not a regular file ({exc.strerror})") from None
    finally:
        os.close(folder_fd)


class _Folder:
    """`Files` of a folder of the storage (a committed entry, or trash that cleanup checks)."""

    def __init__(self, folder: Path, *, single_link: bool = True) -> None:
        self.folder, self.single_link = folder, single_link

    def open(self, name: str) -> PosixReader:
        name = validate_name("file", name)
        return PosixReader(open_fd(self.folder, name, single_link=self.single_link))

    def describe(self, name: str | None = None) -> str:
        return str(self.folder / name if name is not None else self.folder)


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
def _renames_locked(folder: Path, *, exclusive: bool) -> Iterator[int]:
    """Hold an flock on an experiment folder, opened without following a link, and give its
    descriptor: exclusive while renaming entries in it, shared while scanning it.

    A scan (readdir) running while a commit and a retention rename entries can return neither
    the new checkpoint nor the old one, so an experiment that always has a latest would list
    none; under the lock a scan sees the folder as of one moment, and the two renames of a
    replacing commit look like one. The lock is advisory, works across processes, is taken
    on the folder itself (no lock file to list) and is never held while taking another.
    Renames go through the descriptor, so an experiment folder swapped for a link (to a
    folder outside the store) is refused (ELOOP), never renamed in.
    """
    fd = _open_below(folder.parent, folder.name)
    try:
        with _flocked(fd, exclusive=exclusive):
            yield fd
    finally:
        os.close(fd)


@contextmanager
def _flocked(fd: int, *, exclusive: bool) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _rename_at(folder_fd: int, old: str, new: str) -> None:
    os.rename(old, new, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


def _lexists_at(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


_local = threading.local()


def _held_guards() -> set[tuple[str, str]]:
    """The guards this thread holds (flocks of one process's threads exclude each other)."""
    if not hasattr(_local, "guards"):
        _local.guards = set()
    held: set[tuple[str, str]] = _local.guards
    return held


def _discard(path: Path | str, dir_fd: int | None = None) -> None:
    """Remove a hidden folder (`path` relative to `dir_fd`, if given; rmtree follows no link).
    It is already invisible, so a failure is logged, not raised: `cleanup` will retry it at
    the next start."""
    try:
        shutil.rmtree(path, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        logger.warning("could not remove %s; cleanup will retry", path, exc_info=True)


# --- stages ---------------------------------------------------------------------------------


class PosixStage:
    """A hidden folder beside the entry it becomes, so its commit is a same-folder rename.

    It works through descriptors of the experiment folder and of itself, both opened without
    following a link: an experiment folder swapped for a link while a save runs cannot turn
    its writes, or its commit, to a folder outside the store.
    """

    def __init__(
        self, exp_fd: int, exp_dir: Path, name: str, tag: str, *, owner: bool = True
    ) -> None:
        """Make the stage `name` in the experiment folder `exp_fd`, whose descriptor it keeps
        (and closes) from now on; not its `owner`: open the one another process made
        (`PosixStorage.join`)."""
        self._exp_fd, self._fd, self.name, self.tag = exp_fd, -1, name, tag
        self.folder, self.final = exp_dir / name, exp_dir / tag
        self.owner = owner
        self._sinks: list[PosixSink] = []
        self._done = not owner  # a joined stage's folder is its owner's to remove
        try:
            if owner:
                os.mkdir(name, 0o777, dir_fd=exp_fd)
            self._fd = open_folder_at(exp_fd, name)
        except BaseException:
            self._close()
            raise

    @property
    def key(self) -> str:
        return self.name

    def create(self, name: str) -> PosixSink:
        sink = PosixSink(validate_name("file", name), dir_fd=self._fd)
        self._sinks.append(sink)
        return sink

    def commit(self, *, replace: bool = True) -> None:
        """Rename the stage to its tag, replacing an existing one atomically.

        Two renames are needed when the tag exists (POSIX cannot rename over a non-empty
        folder); a crash between them leaves a tagged trash folder that `cleanup` puts back.
        """
        if not self.owner:
            raise RuntimeError(f"{self.folder}: only the process that made a stage commits it")
        assert all(s.closed for s in self._sinks), "commit before every file was closed"
        os.fsync(self._fd)  # the files' names are durable before the folder is renamed
        exp, trash = self._exp_fd, None
        with _flocked(exp, exclusive=True):
            if _lexists_at(exp, self.tag):
                if not replace:
                    raise FileExistsError(errno.EEXIST, "the entry exists", str(self.final))
                trash = f"{TRASH_PREFIX}{self.tag}-{uuid.uuid4().hex}"
                _rename_at(exp, self.tag, trash)
            try:
                _rename_at(exp, self.name, self.tag)
            except OSError:
                if trash is not None:
                    _rename_at(exp, trash, self.tag)  # put the old one back, leave no gap
                raise
        self._done = True
        os.fsync(exp)
        if trash is not None:
            _discard(trash, dir_fd=exp)
        self._close()

    def abort(self) -> None:
        # On a full disk its bytes are what the next save (or another run) needs; cleanup
        # at the next start is too late.
        for sink in self._sinks:
            sink.release()
        if not self._done:
            shutil.rmtree(self.name, ignore_errors=True, dir_fd=self._exp_fd)
            self._done = True
        self._close()

    def _close(self) -> None:
        for fd in (self._fd, self._exp_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._exp_fd = -1

    def __del__(self) -> None:  # a stage dropped unfinished: its folder is cleanup's
        self._close()


# --- the storage ----------------------------------------------------------------------------


class PosixStorage:
    """Entries as folders ``<root>/<experiment>/<tag>/``; `marker` is the file each entry
    writes last, whose mtime is its commit time (a checkpoint's manifest)."""

    def __init__(self, root: Path, marker: str = MANIFEST_FILE, *, hardlinks: bool = False) -> None:
        """`hardlinks`: read a file that has other names too. The datasets' storage does
        (docs/design/data.md, "Datasets", "Walks and opens": deduplicated copies and snapshots
        are hardlinks, and the kernel lets a user link only a file they could read and write
        already); the checkpoint stores, on filesystems others write to, do not."""
        self.root, self.marker, self.hardlinks = Path(root), marker, hardlinks

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
        try:
            with _renames_locked(exp_dir, exclusive=False) as fd:
                return _entry_names(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            return []  # gone since the check, or a link swapped in: nothing of ours

    def exists(self, experiment: str, tag: str | None = None) -> bool:
        return _is_real_dir(self.path_of(experiment, tag))

    def open(self, experiment: str, tag: str, name: str) -> PosixReader:
        return _Folder(self.path_of(experiment, tag), single_link=not self.hardlinks).open(name)

    @contextmanager
    def reading(self, experiment: str) -> Iterator[None]:
        with _renames_locked(self.path_of(experiment), exclusive=False):
            yield

    def url(self, experiment: str, tag: str, name: str, expires: int) -> str | None:
        return None  # a local file is served by the service itself (Range, ETag)

    def committed_at(self, experiment: str, tag: str) -> float | None:
        try:
            return os.lstat(self.path_of(experiment, tag) / self.marker).st_mtime
        except FileNotFoundError:
            return None

    def stage(self, experiment: str, tag: str) -> PosixStage:
        self.path_of(experiment, tag)  # a valid tag
        exp_fd = self._experiment_folder(experiment)
        stage = f"{STAGING_PREFIX}{tag}-{uuid.uuid4().hex}"
        return PosixStage(exp_fd, self.path_of(experiment), stage, tag)

    def _experiment_folder(self, experiment: str) -> int:
        """A descriptor of the experiment's folder, made if missing (with the root); a link
        or a file standing at its name is refused, never followed."""
        exp_dir = self.path_of(experiment)
        self.root.mkdir(parents=True, exist_ok=True)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return make_folder_at(root, experiment)
        except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where the folder should be
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            # An OSError still: a save that cannot be written fails as one (the worker's
            # CheckpointWriteFailed), saying what stands there.
            what = describe_mode(os.lstat(exp_dir).st_mode)
            raise NotADirectoryError(
                exc.errno,
                f"{what}, not a folder, stands where the experiment's folder should be; the "
                "store writes only into its own folders, never through a link",
                str(exp_dir),
            ) from None
        finally:
            os.close(root)

    def join(self, experiment: str, tag: str, key: str) -> PosixStage:
        self.path_of(experiment, tag)  # valid names
        if _STAGE_RE.fullmatch(key) is None or not key.startswith(f"{STAGING_PREFIX}{tag}-"):
            raise FileNotFoundError(f"{self.describe(experiment, key)}: not a stage of {tag!r}")
        try:
            exp_fd = _open_below(self.root, experiment)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FileNotFoundError(f"{self.describe(experiment)}: not a folder") from None
            raise
        return PosixStage(exp_fd, self.path_of(experiment), key, tag, owner=False)

    def adopt(self, experiment: str, tag: str, folder: Path) -> bool:
        """Commit the finished `folder`, of the same filesystem, as the entry `tag` by one
        rename into the experiment folder, as it is (its own last file is its marker: a
        prepare's dataset.json); FileExistsError when anything stands at the tag."""
        self.path_of(experiment, tag)  # valid names
        fd = self._experiment_folder(experiment)
        try:
            with _flocked(fd, exclusive=True):
                if _lexists_at(fd, tag):
                    where = self.describe(experiment, tag)
                    raise FileExistsError(errno.EEXIST, "the entry exists", where)
                os.rename(folder, tag, dst_dir_fd=fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def delete(self, experiment: str, tag: str) -> bool:
        """Rename to a tagless trash name (so `cleanup` never restores it), then remove."""
        self.path_of(experiment, tag)  # valid names
        trash = f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            fd = _open_below(self.root, experiment)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return False  # gone, or a link swapped in: nothing of ours to delete
            raise
        try:
            with _flocked(fd, exclusive=True):
                _rename_at(fd, tag, trash)
            os.fsync(fd)
            _discard(trash, dir_fd=fd)
        except FileNotFoundError:
            return False  # someone else removed it first: the outcome we wanted
        finally:
            os.close(fd)
        return True

    def cleanup(self, experiment: str | None, complete: Complete) -> list[tuple[str, str]]:
        names = [experiment] if experiment is not None else self.experiments()
        handled: list[tuple[str, str]] = []
        for name in names:
            try:
                fd = _open_below(self.root, name)
            except OSError:  # not there, or a link: nothing of ours to clean
                continue
            try:
                with os.scandir(fd) as found:
                    entries = sorted(e.name for e in found if e.is_dir(follow_symlinks=False))
                for entry in entries:
                    if _clean(fd, self.path_of(name), entry, complete):
                        handled.append((name, entry))
            finally:
                os.close(fd)
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
            fd = _open_guard(self.root / f"{GUARD_PREFIX}{experiment}")
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


def _entry_names(folder_fd: int) -> list[str]:
    """The entries of an experiment folder: real sub-folders with store names, sorted."""
    with os.scandir(folder_fd) as found:
        names = [e.name for e in found if e.is_dir(follow_symlinks=False)]
    return sorted(n for n in names if is_valid_name(n))


def _open_guard(path: Path) -> int:
    """The guard's lock file, made if missing; a link or anything but a plain file planted at
    its name is refused, not followed (O_CREAT through a link would make a file elsewhere)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise CheckpointCorrupt(f"{path} is a link, not the store's lock file; remove it") from None
    try:
        check_regular(os.fstat(fd), path)
    except NotRegularFile as exc:
        os.close(fd)
        raise CheckpointCorrupt(f"{path}: {exc.strerror}, not the store's lock file") from None
    return fd


def _clean(exp_fd: int, exp_dir: Path, name: str, complete: Complete) -> bool:
    """Remove a staging folder or trash, or put back a whole entry whose tag a commit left
    free; False for a folder that is neither (a committed entry)."""
    if name.startswith(STAGING_PREFIX):
        _discard(name, dir_fd=exp_fd)
        return True
    if not name.startswith(TRASH_PREFIX):
        return False
    match = _TAGGED_TRASH_RE.fullmatch(name)
    tag = match.group("tag") if match else None
    if tag is not None and not _lexists_at(exp_fd, tag) and complete(_Folder(exp_dir / name)):
        with _flocked(exp_fd, exclusive=True):
            _rename_at(exp_fd, name, tag)
        os.fsync(exp_fd)
        logger.warning("restored %s from %s (a commit was interrupted)", exp_dir / tag, name)
    else:
        _discard(name, dir_fd=exp_fd)
    return True
