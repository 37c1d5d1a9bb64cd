"""Listing an S3 prefix in parallel: one delimiter listing finds its folders, which are listed at once.

A sequential ListObjectsV2 returns 1,000 keys a request, one request at a time; with a real region's 20-50 ms a
request, and boto3's ~50 ms of CPU to parse each page, tens of millions of keys take hours. Here the folders
directly below the prefix (one per class in a folder layout) are listed at the same time, up to
``IMAGE_TFRECORDS_S3_CONCURRENCY`` of them, through obstore (its pages parse in Rust at a fifth of boto3's CPU,
the GIL released while a request waits). The caller sees exactly what one sequential listing gives, in the same
order (S3 lists keys in UTF-8 byte order: the prefix's own files and its folders are merged in that order, each
folder's keys as the store gives them), in bounded memory: at most ``WINDOW_PAGES`` pages a folder are listed
ahead of the reader, for at most as many folders as requests in flight.

obstore cannot express every key S3 allows: it refuses a key with an empty segment or a control character and
strips a trailing ``/`` (a console's folder marker ``a/b/`` would read as ``a/b``). A folder where obstore meets
either (a refused key, or an empty object, which is what a marker is) is listed again with boto3, which takes
keys verbatim; the entries already passed on must come back the same, else the listing fails (the folder changed
while it was read: a retry lists it anew). A prefix with more than ``MAX_ROOT_ENTRIES`` entries of its own, or
``IMAGE_TFRECORDS_S3_CONCURRENCY=1``, is listed sequentially with boto3, as before.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import StorageError
from ..source.localfs import FileRun
from .base import FileInfo, join, split_s3
from .s3_reads import concurrency, obstore_for, through_obstore, translate_obstore

PAGE = 1000
WINDOW_PAGES = 4  # pages a folder's lister may hold ahead of the reader
MAX_ROOT_ENTRIES = 10 * PAGE  # the prefix's own files and folders held while its folders are listed
_DONE = object()


class _Redo(Exception):
    """obstore met a key it cannot express faithfully: list the folder again with boto3."""


def parallel_ok() -> bool:
    return concurrency() > 1 and through_obstore()


def iter_files(store: Any, uri: str, everything: bool, sequential: Callable[[], Iterator[FileInfo]],
               runs: bool = False) -> Iterator[Any]:
    """``S3Store.iter_files(uri, everything)`` with the folders below ``uri`` listed in parallel (see the module);
    ``sequential`` is the one-request-at-a-time listing, for a prefix this does not split. With ``runs``, the objects
    of a page that lie directly in its folder come as one ``FileRun`` (``S3Store.iter_file_runs``)."""
    prefix = store.folder(uri)
    files: list[dict[str, Any]] = []
    folders: list[str] = []
    for page in store.pages(uri, Prefix=prefix, Delimiter="/"):
        files += page.get("Contents", [])
        folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if len(files) + len(folders) > MAX_ROOT_ENTRIES:
            yield from sequential()
            return
    order = sorted([(obj["Key"].encode(), obj, None) for obj in files] + [(f.encode(), None, f) for f in folders],
                   key=lambda item: item[0])
    bucket = split_s3(uri)[0]
    stop = threading.Event()
    lanes: dict[int, queue.Queue[Any]] = {}
    parts = [folder for _, _, folder in order if folder is not None]
    ahead, started, read = concurrency(), 0, 0
    with ThreadPoolExecutor(max_workers=max(1, min(ahead, len(parts))), thread_name_prefix="s3-list") as pool:
        try:
            for _, obj, folder in order:
                if folder is None:
                    yield from store.infos([obj], prefix, everything)
                    continue
                while started < len(parts) and started < read + ahead:  # the next folders start listing
                    lanes[started] = queue.Queue(maxsize=WINDOW_PAGES)
                    pool.submit(_list_folder, store, bucket, parts[started], prefix, everything, lanes[started],
                                stop, runs)
                    started += 1
                lane = lanes.pop(read)
                read += 1
                while (item := lane.get()) is not _DONE:
                    if isinstance(item, BaseException):
                        raise item
                    yield from item
        finally:
            stop.set()
            for lane in lanes.values():  # wake listers blocked on a full lane
                while not lane.empty():
                    lane.get_nowait()


def _put(lane: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            lane.put(item, timeout=0.2)
            return
        except queue.Full:
            continue


def _list_folder(store: Any, bucket: str, folder: str, prefix: str, everything: bool,
                 lane: queue.Queue[Any], stop: threading.Event, runs: bool = False) -> None:
    """A lister's thread: the pages of ``folder`` (a full key prefix) into ``lane``, then ``_DONE`` (or the error)."""
    uri = f"s3://{bucket}/{folder}"
    passed, digest = 0, hashlib.sha256()
    try:
        try:
            for items in _obstore_pages(store, bucket, folder, prefix, runs):
                if stop.is_set():
                    return
                for item in items:
                    if type(item) is FileRun:
                        digest.update("".join([f"{item.prefix}{name}\0" for name in item.names]).encode())
                        passed += len(item.names)
                    else:
                        digest.update(item.key.encode() + b"\0")
                        passed += 1
                _put(lane, items, stop)
        except _Redo:
            _relist(store, uri, prefix, everything, passed, digest, lane, stop)
        _put(lane, _DONE, stop)
    except BaseException as exc:  # handed to the reader
        _put(lane, exc, stop)


def _obstore_pages(store: Any, bucket: str, folder: str, prefix: str, runs: bool = False
                   ) -> Iterator[list[FileInfo | FileRun]]:
    """The pages of ``folder`` as FileInfo (keys relative to ``prefix``); with ``runs``, each stretch of objects
    directly in ``folder`` as one FileRun. _Redo where obstore may not have given a key as it is."""
    import obstore
    from obstore.exceptions import BaseError, InvalidPathError

    uri = f"s3://{bucket}/{folder}"
    pages = iter(obstore.list(obstore_for(store.client, bucket, listing=True), folder, chunk_size=PAGE))
    while True:
        try:
            page = next(pages, None)
        except (InvalidPathError, ValueError):
            raise _Redo from None
        except (BaseError, OSError, TimeoutError) as exc:
            raise translate_obstore(exc, uri, store.client) from exc
        if page is None:
            return
        yield _page_items(page, folder, prefix, runs)


def _page_items(page: list[dict[str, Any]], folder: str, prefix: str, runs: bool) -> list[FileInfo | FileRun]:
    """One obstore listing page of ``folder`` as FileInfo, or with ``runs`` its stretches of objects directly in
    ``folder`` as FileRuns (their names relative to it); _Redo where a key may not be as S3 holds it."""
    items: list[FileInfo | FileRun] = []
    within, start = folder[len(prefix):], len(folder)
    names: list[str] = []
    sizes: list[int] = []
    stamps: list[str] = []
    times: list[Any] = []
    for meta in page:
        path, size = meta["path"], meta["size"]
        if not size or not path.startswith(folder):  # maybe a marker "a/b/" read as "a/b": boto3 tells
            raise _Redo
        stamp = (meta.get("e_tag") or "").strip('"')
        name = path[start:]
        if runs and "/" not in name:
            names.append(name)
            sizes.append(size)
            stamps.append(stamp)
            times.append(meta["last_modified"])
            continue
        if names:
            items.append(FileRun(within, names, sizes, stamps, times))
            names, sizes, stamps, times = [], [], [], []
        items.append(FileInfo(path[len(prefix):], size, meta["last_modified"], stamp=stamp))
    if names:
        items.append(FileRun(within, names, sizes, stamps, times))
    return items


def _relist(store: Any, uri: str, prefix: str, everything: bool, passed: int, digest: Any,
            lane: queue.Queue[Any], stop: threading.Event) -> None:
    """``uri``'s entries with boto3 after the first ``passed`` ones, which must hash to ``digest``."""
    again, seen = hashlib.sha256(), 0
    for page in store.pages(uri, Prefix=store.folder(uri)):
        if stop.is_set():
            return
        infos = list(store.infos(page.get("Contents", []), prefix, everything))
        skip = min(len(infos), max(0, passed - seen))
        for info in infos[:skip]:
            again.update(info.key.encode() + b"\0")
        seen += skip
        if seen == passed and skip and again.digest() != digest.digest():
            raise StorageError(f"the listing of {join(uri, '')} changed while it was read; a retry lists it anew")
        if infos[skip:]:
            _put(lane, infos[skip:], stop)
    if seen < passed:
        raise StorageError(f"the listing of {join(uri, '')} changed while it was read; a retry lists it anew")
