"""Read one source file for inspection or writing, with bounded memory and a defined outcome.

A file's fate is decided as early as possible: its listed size against ``max_file_mb`` before it
is opened, its kind on the open descriptor (see ``localfs``), its magic bytes before the rest is
read; then at most ``max_bytes + 1`` bytes are read, so a file that grew since it was listed is
still caught. Every failure that concerns only this file is a ``RejectedImage`` with a reason.
"""

from __future__ import annotations

from ..images.probe import RejectedImage, sniff_format
from ..storage import Storage, StorageError, StoreUnreachable
from .localfs import NotARegularFile

_HEAD = 32  # enough bytes for every magic number sniff_format knows


def _too_large(size: int, max_bytes: int) -> RejectedImage:
    return RejectedImage("too_large", f"{size / 1e6:.1f} MB exceeds max_file_mb {max_bytes / 1e6:g}")


def read_source(storage: Storage, source: str, filename: str, max_bytes: int, listed_size: int = -1) -> bytes:
    """The bytes of ``source/filename``; RejectedImage if the file cannot or must not become a record.

    Reasons: ``too_large``, ``empty_file``, ``not_an_image`` (magic bytes; the rest is never read),
    ``not_a_regular_file`` (a symlink, FIFO, device... in its place since it was listed), ``unreadable``
    (gone, permission denied, I/O error). Store-wide failures (an unreachable S3 endpoint) propagate.
    """
    if listed_size > max_bytes:
        raise _too_large(listed_size, max_bytes)
    try:
        with storage.open_source(source, filename) as (stream, size):
            size = size if size >= 0 else listed_size
            if size > max_bytes:
                raise _too_large(size, max_bytes)
            head = stream.read(_HEAD)
            if not head:
                raise RejectedImage("empty_file")
            if sniff_format(head) is None:
                raise RejectedImage("not_an_image", "content is not a known image format")
            want = (size if size >= 0 else max_bytes) - len(head) + 1  # one byte more: did it grow?
            rest = stream.read(max(want, 1))
            if len(head) + len(rest) > max_bytes:
                raise _too_large(len(head) + len(rest), max_bytes)
            while size < 0 or len(head) + len(rest) > size:  # unknown size, or it grew: read on, bounded
                more = stream.read(max_bytes + 1 - len(head) - len(rest))
                if not more:
                    break
                rest += more
                if len(head) + len(rest) > max_bytes:
                    raise _too_large(len(head) + len(rest), max_bytes)
            return head + rest
    except RejectedImage:
        raise
    except FileNotFoundError:
        raise RejectedImage("unreadable", "file disappeared since it was listed") from None
    except NotARegularFile as exc:
        raise RejectedImage("not_a_regular_file", f"{exc.detail} (changed since it was listed); not read") \
            from None
    except (StorageError, StoreUnreachable):
        raise
    except OSError as exc:
        reason = "permission denied" if isinstance(exc, PermissionError) else (exc.strerror or type(exc).__name__)
        raise RejectedImage("unreadable", reason) from None
