"""Listing and reading a local source without ever leaving it.

A nightly job reads folders that other people (and other programs) change while it runs, so
nothing here trusts a name between two system calls:

- The walk holds a descriptor per folder level and opens each subfolder relative to its parent
  with ``O_NOFOLLOW``: a folder swapped for a symlink mid-walk is refused, not followed. It is
  iterative (no recursion limit) and yields keys in sorted order, as an S3 listing does.
- Opening a file walks the same way, then opens the last name with ``O_PATH | O_NOFOLLOW``
  (nothing is really opened: a FIFO cannot block, a device has no side effect), checks with
  ``fstat`` that it is a regular file, and only then reopens that same inode for reading.
- Every entry gets an outcome: regular files are yielded as files; symlinks, FIFOs, devices and
  sockets are yielded with their ``kind`` (the caller skips and counts them); a name that is not
  valid UTF-8, a folder that cannot be read, or a path that is too deep or too long is yielded with
  a ``problem`` (the caller turns it into a reject). Nothing here raises for one bad entry.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from datetime import datetime
from typing import BinaryIO, NamedTuple

from ..storage.base import EPOCH, FileInfo

MAX_DEPTH = 64  # folder levels below the source root
MAX_KEY_BYTES = 1024  # UTF-8 bytes of a relative path (S3's key limit)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PATH = getattr(os, "O_PATH", 0)
_REOPEN_BY_PROC = bool(_O_PATH) and os.path.isdir("/proc/self/fd")  # checked once, not per file


def _entry(key: str, size: int = 0, modified: datetime = EPOCH, kind: str = "file", problem: str = "",
           detail: str = "", stamp: str = "") -> FileInfo:
    """One thing found under the root, as a listing gives it (``FileInfo``). ``kind``: file, symlink, fifo,
    device, socket or other; ``problem`` (a reject reason) when it cannot become a candidate at all;
    ``stamp``: the modification time in nanoseconds (regular files)."""
    return FileInfo(key, size, modified, kind, problem, detail, stamp)


class NotARegularFile(OSError):
    """The name is (now) a symlink, FIFO, device, socket or folder, or a folder on its path is a symlink."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(errno.EINVAL, detail)
        self.kind = kind
        self.detail = detail


def printable(name: str) -> str:
    """A name as valid UTF-8 text: bytes that are not UTF-8 appear as ``\\xNN`` (lossless for reading)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_clean_name(name: str) -> bool:
    """True if the text (a name from the OS, or a decoded line, surrogate-escaped) is valid UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "other"


def _sorted_names(fd: int) -> list[str]:
    """The names in a folder, sorted as their keys sort (a folder sorts as ``name/``)."""
    names, folders = [], set()
    with os.scandir(fd) as it:
        for entry in it:
            names.append(entry.name)
            if entry.is_dir(follow_symlinks=False):
                folders.add(entry.name)
    if folders:
        names.sort(key=lambda name: name + "/" if name in folders else name)
    else:  # a folder of files (a class folder): plain order
        names.sort()
    return names


def _why(exc: OSError) -> str:
    return _why_errno(exc.errno) if exc.errno else type(exc).__name__


def lstat_names_py(fd: int, names: list[str]) -> tuple[list[int], list[int], list[str]]:
    """``_lstat.lstat_names`` in Python: each name's ``st_mode`` (``-errno`` when the call failed), ``st_size`` and
    ``st_mtime_ns`` as text (``""`` after a failure), without following symlinks."""
    modes, sizes, stamps = [], [], []
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            modes.append(-(exc.errno or errno.EIO))
            sizes.append(0)
            stamps.append("")
            continue
        modes.append(st.st_mode)
        sizes.append(st.st_size)
        stamps.append(str(st.st_mtime_ns))
    return modes, sizes, stamps


try:  # one call a folder; without the package's C parts, the same in Python
    from ._lstat import lstat_names
except ImportError:  # pragma: no cover - a build without a C compiler
    lstat_names = lstat_names_py

class FileRun(NamedTuple):
    """Regular files with clean names of at most ``MAX_KEY_BYTES`` as keys, next to each other in one folder, in
    order: ``walk_runs``' batch (``walk`` yields each as a ``FileInfo``). An S3 listing's run
    (``S3Store.iter_file_runs``) holds objects directly in one folder with their names as listed; discover checks
    those."""

    prefix: str  # the folder's key prefix, "" or "a/b/"
    names: list[str]
    sizes: list[int]
    stamps: list[str]  # st_mtime_ns as text (an S3 object's ETag)
    modified: list[datetime] | None = None  # None: local files (their stamps hold the time); an S3 listing's times


# A folder open for the walk: its descriptor, its key prefix, its entries (names, modes, sizes, stamps: each stat'ed
# once, as the folder is entered), which of them go into a FileRun, and how far the walk has gone
Frame = tuple[int, str, list[str], list[int], list[int], list[str], list[bool], list[int]]


def _frame(fd: int, prefix: str) -> Frame:
    """A folder open for the walk (see ``Frame``), at its first entry."""
    names = _sorted_names(fd)
    modes, sizes, stamps = lstat_names(fd, names)
    is_file, room = stat.S_ISREG, MAX_KEY_BYTES - len(prefix.encode())  # (its folders' names are clean: entered)
    try:  # every name valid UTF-8 (the common case): one check for all
        "".join(names).encode()
        runs = [is_file(mode) and len(name.encode()) <= room for name, mode in zip(names, modes, strict=True)]
    except UnicodeEncodeError:
        runs = [is_file(mode) and is_clean_name(name) and len(name.encode()) <= room
                for name, mode in zip(names, modes, strict=True)]
    return fd, prefix, names, modes, sizes, stamps, runs, [0]


def _why_errno(number: int) -> str:
    return "permission denied" if number in (errno.EACCES, errno.EPERM) else os.strerror(number)


def walk(root: str) -> Iterator[FileInfo]:
    """Every entry below ``root`` (a folder the caller names; it may itself be a symlink), keys relative
    to it with ``/`` separators, in sorted order. Folders are not yielded, only what they hold."""
    for found in walk_runs(root):
        if isinstance(found, FileRun):
            prefix = found.prefix
            for name, size, stamp in zip(found.names, found.sizes, found.stamps, strict=True):
                yield FileInfo(prefix + name, size, None, "file", "", "", stamp)
        else:
            yield found


def walk_runs(root: str) -> Iterator[FileInfo | FileRun]:
    """``walk``, each stretch of regular files with clean, short names in one folder as one ``FileRun`` (nothing
    else differs): a listing then costs a few list operations a file, not a ``FileInfo`` each."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack: list[Frame] = []
    try:
        stack.append(_frame(root_fd, ""))
    except BaseException:
        os.close(root_fd)
        raise
    gone = -errno.ENOENT
    try:
        while stack:
            fd, prefix, names, modes, sizes, stamps, runs, at = stack[-1]
            end = len(names)
            while at[0] < end:  # resumed where it was after a subfolder (its frame keeps the place)
                i = at[0]
                if runs[i]:
                    j = i + 1
                    while j < end and runs[j]:
                        j += 1
                    at[0] = j
                    yield FileRun(prefix, names[i:j], sizes[i:j], stamps[i:j])
                    continue
                at[0] = i + 1
                name, mode, key = names[i], modes[i], prefix + names[i]
                if mode < 0:
                    if mode != gone:  # (gone: removed while listing)
                        yield _entry(printable(key), problem="unreadable", detail=_why_errno(-mode))
                    continue
                found = _other_entry(fd, name, key, mode, sizes[i], stamps[i], len(stack))
                if isinstance(found, FileInfo):
                    yield found
                elif found is not None:  # a subfolder: listed before the rest of this one
                    stack.append(found)
                    break
            else:
                os.close(fd)
                stack.pop()
    finally:
        for frame in stack:
            os.close(frame[0])


def _other_entry(fd: int, name: str, key: str, mode: int, size: int, stamp: str, depth: int) -> Frame | FileInfo | None:
    """What ``walk`` yields for an entry that is not a regular file with a clean, short name (or the frame of a
    subfolder to enter, or None when it is gone)."""
    kind = kind_of(mode)
    if not is_clean_name(name):
        folder = kind == "folder"
        return _entry(printable(key) + ("/" if folder else ""), kind=kind, problem="bad_filename",
                      detail=f"{'folder ' if folder else ''}name is not valid UTF-8 (shown with \\x escapes)"
                             f"{'; nothing in it was read' if folder else ''}: rename it")
    if len(key.encode()) > MAX_KEY_BYTES:
        return _entry(key + ("/" if kind == "folder" else ""), problem="path_too_long",
                      detail=f"path is longer than {MAX_KEY_BYTES} bytes")
    if kind == "folder":
        return _open_folder(fd, name, key, depth)
    return FileInfo(key, size, None, kind, "", "", stamp)


def _open_folder(parent: int, name: str, key: str, depth: int) -> Frame | FileInfo | None:
    """A stack frame for a subfolder, an entry saying why it is not descended into, or None if it is gone."""
    if depth >= MAX_DEPTH:
        return _entry(key + "/", problem="path_too_long", detail=f"more than {MAX_DEPTH} folder levels deep")
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a symlink or file since listed
            return _entry(key + "/", kind="symlink")
        return _entry(key + "/", problem="unreadable", detail=f"folder: {_why(exc)}")
    try:
        return _frame(fd, key + "/")
    except OSError as exc:
        os.close(fd)
        return _entry(key + "/", problem="unreadable", detail=f"folder: {_why(exc)}")


def open_file(root: str, key: str) -> tuple[BinaryIO, int]:
    """Open ``root/key`` for reading, confined to ``root``; returns the file and its size.

    Raises FileNotFoundError, PermissionError (or another OSError), or NotARegularFile when the
    name or a folder on its path is not what a plain file under the root must be.
    """
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise NotARegularFile("other", f"{key!r} is not a clean relative path")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotARegularFile("symlink", f"folder {part!r} on its path is not a plain folder "
                                                     "(a symlink?)") from None
                raise
            os.close(fd)
            fd = child
        file_fd = _open_regular(fd, parts[-1])
    finally:
        os.close(fd)
    size = os.fstat(file_fd).st_size
    return os.fdopen(file_fd, "rb"), size


def _open_regular(folder: int, name: str) -> int:
    """A read descriptor for ``name`` in ``folder`` if it is a regular file (checked on the descriptor)."""
    if _REOPEN_BY_PROC:
        handle = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        try:
            _require_regular(os.fstat(handle).st_mode)
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        finally:
            os.close(handle)
    else:  # no O_PATH: a non-blocking open never waits on a FIFO
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                         dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotARegularFile("symlink", "it is a symlink") from None
            raise
    try:
        _require_regular(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(mode: int) -> None:
    kind = kind_of(mode)
    if kind != "file":
        raise NotARegularFile(kind, f"it is a {kind}, not a regular file")
