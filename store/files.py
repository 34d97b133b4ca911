"""Opening files in folders that other people can write to (docs/design/checkpoints.md, "Checkpoint
store"; docs/design/data.md, "Datasets"; docs/design/sinks.md, "Metrics sinks").

Anyone who can write to a data root, a shared checkpoint filesystem or a tracker folder can
put something else where a file is expected. Each is harmless only if it is never opened as
one:

- a FIFO: `open()` waits for a writer, for ever, and a read on it too;
- a socket or a device: not data, and opening a device can act on it (a tape rewinds);
- a symlink: the bytes of a file elsewhere, or writes that land elsewhere;
- a hardlink: another name of a file that may lie outside every root.

So a file is read only once `stat` says it is a regular file, and it is opened with
O_NONBLOCK (a FIFO swapped in after the check then opens at once instead of waiting) and
checked again with `fstat` on the descriptor that is read, which a rename cannot change.
Where no link may be followed (the stores' own folders, the tracker's), folders are opened one
component at a time with O_NOFOLLOW and files relative to the folder's descriptor. The POSIX
checkpoint backend (`store/checkpoints/posix.py`) and the data readers build on these.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterable
from pathlib import Path

_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class NotRegularFile(OSError):
    """Something other than a regular file (with one name, where that is asked) stands where a
    file was expected; its message says what it is."""


def describe_mode(mode: int) -> str:
    """What a file of this mode is, in words: 'a FIFO', 'a folder', ..."""
    kinds = [
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISREG, "a regular file"),
    ]
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def check_regular(st: os.stat_result, where: object, *, single_link: bool = False) -> None:
    """Raise NotRegularFile unless `st` is a regular file (with one name, if `single_link`)."""
    if not stat.S_ISREG(st.st_mode):
        what = f"{describe_mode(st.st_mode)}, not a regular file"
        raise NotRegularFile(errno.EINVAL, what, str(where))
    if single_link and st.st_nlink != 1:
        raise NotRegularFile(
            errno.EMLINK, f"a file with {st.st_nlink} names (a hardlink), not one", str(where)
        )


def _checked(fd: int, where: object, single_link: bool) -> int:
    """`fd` once fstat says it is what was asked for, set blocking again; else closed."""
    try:
        check_regular(os.fstat(fd), where, single_link=single_link)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def descriptor_path(fd: int) -> str:
    """A path that reopens the file open at `fd`, in this process, whatever became of its
    name (Linux: the descriptor's entry under /proc): for a library that takes a path."""
    return f"/proc/self/fd/{fd}"


def open_regular_fd(path: str | Path) -> int:
    """A read descriptor of the regular file at `path` (links on the way are followed: data
    roots confine by real path). Never blocks; NotRegularFile for a FIFO, a socket, a device
    or a folder, FileNotFoundError for nothing."""
    check_regular(os.stat(path), path)  # a device is not even opened
    return _checked(os.open(path, _READ), path, single_link=False)


def open_regular_fd_at(folder_fd: int, name: str, where: object, *, single_link: bool) -> int:
    """A read descriptor of the regular file `name` directly in the folder `folder_fd`,
    following no link; with `single_link`, refusing a file that has other names."""
    try:
        st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such file", str(where)) from None
    check_regular(st, where, single_link=single_link)
    fd = os.open(name, _READ | os.O_NOFOLLOW, dir_fd=folder_fd)
    return _checked(fd, where, single_link)


def open_regular(path: str | Path) -> io.BufferedReader:
    """`open_regular_fd` as a binary file object."""
    return io.BufferedReader(io.FileIO(open_regular_fd(path), "rb"))


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file, at most `limit` of them plus one (so that a caller can
    tell a file that is too large)."""
    with open_regular(path) as f:
        return f.read(limit + 1)


# --- folders that follow no link --------------------------------------------------------------


def open_folder(path: str | Path) -> int:
    """A descriptor of the folder at the absolute `path`, no component of which may be a link
    (ELOOP or ENOTDIR otherwise): pass a real path (`os.path.realpath`), and a link swapped in
    since is refused rather than followed."""
    parts = Path(path).parts
    if not parts or parts[0] != os.sep:
        raise ValueError(f"{path}: not an absolute path")
    return open_folders_below(os.open(os.sep, _NOFOLLOW_DIR), parts[1:])


def open_folders_below(fd: int, names: Iterable[str]) -> int:
    """A descriptor of the folder `names[0]/names[1]/...` below the folder `fd`, which it
    takes over (closes), each name opened without following a link."""
    try:
        for name in names:
            inner = open_folder_at(fd, name)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _component(name: str) -> str:
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"{name!r} is not one path component")
    return name


def open_folder_at(folder_fd: int, name: str) -> int:
    """A descriptor of the folder `name` in `folder_fd`; a link there is refused (ELOOP)."""
    return os.open(_component(name), _NOFOLLOW_DIR, dir_fd=folder_fd)


def make_folder_at(folder_fd: int, name: str) -> int:
    """A descriptor of the folder `name` in `folder_fd`, made if missing; a link there is
    refused (ELOOP), never followed."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(_component(name), 0o777, dir_fd=folder_fd)
    return open_folder_at(folder_fd, name)


def create_file_at(folder_fd: int, name: str, mode: int = 0o644) -> int:
    """A write descriptor of a new file `name` in `folder_fd`: O_EXCL, so nothing that is
    there already (a planted link) is opened."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(_component(name), flags, mode, dir_fd=folder_fd)
