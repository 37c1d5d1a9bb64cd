"""Which way a splice copies its kept bytes (``storage.writeback.copies_pages``): the file system type of a device,
read from ``/proc/self/mountinfo``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from image_tfrecords.storage import writeback
from image_tfrecords.storage.writeback import copies_pages, file_system_type, mounted_type

MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 22 0:31 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
41 22 8:17 / /data rw,noatime shared:9 - xfs /dev/sdb1 rw,attr2,inode64
42 22 0:45 /sub /srv rw shared:10 master:3 - btrfs /dev/sdc rw,space_cache=v2
50 22 0:52 / /mnt/odd\\040name rw - nfs4 server:/export rw,vers=4.2
"""


def test_a_devices_type_is_read_from_its_mountinfo_line() -> None:
    assert mounted_type(MOUNTINFO, 253, 1) == "ext4"
    assert mounted_type(MOUNTINFO, 0, 31) == "tmpfs"
    assert mounted_type(MOUNTINFO, 8, 17) == "xfs"
    assert mounted_type(MOUNTINFO, 0, 45) == "btrfs"  # optional fields (master:3) before the separator
    assert mounted_type(MOUNTINFO, 0, 52) == "nfs4"
    assert mounted_type(MOUNTINFO, 8, 1) is None  # not mounted
    assert mounted_type("garbage\n\n1 2\n", 253, 1) is None


def test_pages_are_copied_where_either_file_system_copies_them(monkeypatch: pytest.MonkeyPatch) -> None:
    types = {(253, 1): "ext4", (8, 17): "xfs", (0, 52): "nfs4", (0, 31): "tmpfs"}
    monkeypatch.setattr(writeback, "file_system_type", lambda major, minor: types.get((major, minor)))
    ext4, xfs, nfs, tmpfs, unknown = (os.makedev(*key) for key in [(253, 1), (8, 17), (0, 52), (0, 31), (9, 9)])
    assert copies_pages(ext4, ext4) and copies_pages(tmpfs, tmpfs)
    assert not copies_pages(xfs, xfs) and not copies_pages(nfs, nfs)  # reflinks, a copy on the server
    assert copies_pages(xfs, ext4) and copies_pages(ext4, xfs)
    assert not copies_pages(unknown, unknown)  # not known: the kernel's copy, as before


def test_this_machines_file_systems_are_found(tmp_path: Path) -> None:
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo here")
    device = os.stat(tmp_path).st_dev
    found = file_system_type(os.major(device), os.minor(device))
    assert found is None or (found and " " not in found)
    with open("/proc/self/mountinfo") as f:
        listed = {line.split()[2] for line in f if len(line.split()) > 2}
    assert (found is not None) == (f"{os.major(device)}:{os.minor(device)}" in listed)
