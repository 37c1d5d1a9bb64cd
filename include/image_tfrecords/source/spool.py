"""The command line's local copy of the S3 source images it inspected, by content, so that writing their records
need not fetch them again (one GET an image instead of two).

Only the command line turns it on (``cli.build``): its inspection and its shard writing run on one machine, in
one private temporary folder removed at the end. DAG tasks may run on different machines, so they read the store
twice (see docs/s3-reads.md). Each process appends the images it inspects to a file of its own, and the SHA-256,
offset and length of each to an index beside it (a file per image would cost ~0.4 ms of file-system work each,
more than the GET it saves). ``take`` gives a copy as it was read back: its readers hash what they use anyway, and
read the store instead where it does not hash to the SHA-256 inspection computed (a damaged copy); no copy (the
budget spent) reads the store as before. At most
``IMAGE_TFRECORDS_SPOOL_MB`` (default 2048) are kept a build, shared evenly between the worker processes.
"""

from __future__ import annotations

import os
import threading

SPOOL_ENV = "IMAGE_TFRECORDS_SPOOL_MB"
DEFAULT_MB = 2048
_folder: str | None = None
_left = 0  # bytes this process may still keep
_out: tuple[int, int, int, int] | None = None  # (pid, data file's fd, index file's fd, bytes written)
_index: dict[str, tuple[str, int, int]] | None = None  # sha256 -> (data file, offset, length), as read back
_lock = threading.Lock()  # inspection on threads (one process) appends from several
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))


def enable(folder: str, processes: int) -> None:
    """Keep copies under ``folder`` from now on, in this process and those it forks (before any inspection)."""
    global _folder, _left
    try:
        budget = int(float(os.environ.get(SPOOL_ENV, DEFAULT_MB)) * 1_000_000)
    except ValueError:
        raise ValueError(f"{SPOOL_ENV} must be a number of megabytes, not {os.environ[SPOOL_ENV]!r}") from None
    disable()
    if budget > 0:
        _folder, _left = folder, budget // max(1, processes)
        os.makedirs(folder, exist_ok=True)


def disable() -> None:
    global _folder, _left, _out, _index
    if _out is not None and _out[0] == os.getpid():
        os.close(_out[1])
        os.close(_out[2])
    _folder, _left, _out, _index = None, 0, None, None


def keep(sha256: str, data: bytes) -> None:
    """Keep ``data`` (which hashes to ``sha256``) while the budget lasts; a failure to write only loses the copy."""
    with _lock:
        _keep(sha256, data)


def _keep(sha256: str, data: bytes) -> None:
    global _left, _out
    if _folder is None or len(data) > _left:
        return
    try:
        if _out is None or _out[0] != os.getpid():  # (a forked worker appends to files of its own)
            name, flags = os.path.join(_folder, f"images-{os.getpid()}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
            _out = (os.getpid(), os.open(name + ".bin", flags, 0o600), os.open(name + ".idx", flags, 0o600), 0)
        pid, images, index, offset = _out
        _write(images, data)
        _write(index, f"{sha256} {offset} {len(data)}\n".encode())
    except OSError:
        _left = 0
        return
    _out = (pid, images, index, offset + len(data))
    _left -= len(data)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def take(sha256: str) -> bytes | None:
    """The bytes kept for ``sha256`` as read back, unchecked (the caller hashes them: ``_record_from_source``), or
    None."""
    global _index
    if _folder is None:
        return None
    with _lock:
        if _index is None:  # read once, when the first record is written (inspection is over by then)
            _index = _read_index(_folder)
    where = _index.get(sha256)
    if where is None:
        return None
    name, offset, length = where
    try:
        with open(name, "rb") as f:
            data = os.pread(f.fileno(), length, offset)
    except OSError:
        return None
    return data


def _read_index(folder: str) -> dict[str, tuple[str, int, int]]:
    index: dict[str, tuple[str, int, int]] = {}
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".idx"):
            data = os.path.join(folder, entry[:-4] + ".bin")
            with open(os.path.join(folder, entry), "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3 and line.endswith(b"\n"):
                        index[parts[0].decode()] = (data, int(parts[1]), int(parts[2]))
    return index
