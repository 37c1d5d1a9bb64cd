"""JPEG files the way phones, cameras and editors write them: made here, deterministically, from Pillow's
encoder and byte-level splicing of marker segments (no network, no files from elsewhere).

``variants()`` maps a name to the bytes of one file. The markers follow ITU T.81 and the EXIF, XMP, ICC,
MPF and Adobe conventions; what each is meant to look like is said next to it.
"""

from __future__ import annotations

import io
import random
import struct
from typing import Any

SIZE = (97, 61)  # odd, and not multiples of the 8/16-pixel blocks


def _image(mode: str = "RGB", seed: int = 0) -> Any:
    """A photo-like picture: gradients with a little noise (not flat colour, not pure noise)."""
    from PIL import Image

    rng = random.Random(seed)
    width, height = SIZE
    pixels = bytearray()
    for y in range(height):
        for x in range(width):
            pixels += bytes(((x * 3 + y + rng.randrange(16)) % 256, (y * 4 + rng.randrange(16)) % 256,
                             (x + y * 2 + rng.randrange(16)) % 256))
    return Image.frombytes("RGB", SIZE, bytes(pixels)).convert(mode)


def _save(image: Any, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **{"quality": 90, **options})
    return buf.getvalue()


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def _insert_after_soi(data: bytes, *segments: bytes) -> bytes:
    return data[:2] + b"".join(segments) + data[2:]


def _drop_segments(data: bytes, marker: int) -> bytes:
    """``data`` without its ``marker`` segments before the first scan (e.g. JFIF's APP0)."""
    out, pos = [data[:2]], 2
    while data[pos + 1] != 0xDA:
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        if data[pos + 1] != marker:
            out.append(data[pos:pos + 2 + length])
        pos += 2 + length
    return b"".join(out) + data[pos:]


def _tiff_ifd(entries: list[tuple[int, int, int, bytes]], start: int, next_ifd: int) -> tuple[bytes, bytes]:
    """A little-endian IFD at offset ``start`` of a TIFF block; values over 4 bytes go after it."""
    body, extra = struct.pack("<H", len(entries)), b""
    extra_at = start + 2 + 12 * len(entries) + 4
    for tag, kind, count, value in entries:
        if len(value) <= 4:
            body += struct.pack("<HHI", tag, kind, count) + value.ljust(4, b"\0")
        else:
            body += struct.pack("<HHII", tag, kind, count, extra_at + len(extra))
            extra += value
    return body + struct.pack("<I", next_ifd), extra


def exif_app1(orientation: int | None = 1, thumbnail: bytes | None = None, maker_note: bytes = b"") -> bytes:
    """An EXIF APP1 segment: IFD0 (make, model, orientation), an EXIF sub-IFD with a maker note, and an
    IFD1 with an embedded JPEG thumbnail, as cameras write them."""
    ifd0 = [(0x010F, 2, 8, b"Camera\0\0"), (0x0110, 2, 8, b"Phone 9\0")]
    if orientation is not None:
        ifd0.append((0x0112, 3, 1, struct.pack("<H", orientation)))
    ifd0.append((0x8769, 4, 1, b"\0\0\0\0"))  # EXIF sub-IFD pointer, patched below
    first, first_extra = _tiff_ifd(ifd0, 8, 0)
    sub_at = 8 + len(first) + len(first_extra)
    sub, sub_extra = _tiff_ifd([(0x927C, 7, len(maker_note) or 4, maker_note or b"MN\0\0")], sub_at, 0)
    blocks = [first, first_extra, sub, sub_extra]
    if thumbnail is not None:
        ifd1_at = sub_at + len(sub) + len(sub_extra)
        thumb_at = ifd1_at + 2 + 12 * 2 + 4
        ifd1, _ = _tiff_ifd([(0x0201, 4, 1, struct.pack("<I", thumb_at)),
                             (0x0202, 4, 1, struct.pack("<I", len(thumbnail)))], ifd1_at, 0)
        blocks[0] = first[:-4] + struct.pack("<I", ifd1_at)
        blocks += [ifd1, thumbnail]
    tiff = b"II*\0" + struct.pack("<I", 8) + b"".join(blocks)
    pointer = tiff.index(struct.pack("<HHI", 0x8769, 4, 1)) + 8
    tiff = tiff[:pointer] + struct.pack("<I", sub_at) + tiff[pointer + 4:]
    return _segment(0xE1, b"Exif\0\0" + tiff)


def xmp_app1(extra: str = "") -> bytes:
    xml = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
           f'<rdf:Description xmp:Rating="5" xmlns:xmp="http://ns.adobe.com/xap/1.0/"/>{extra}</rdf:RDF></x:xmpmeta>')
    return _segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0" + xml.encode())


def extended_xmp_app1() -> bytes:
    guid = b"0123456789ABCDEF0123456789ABCDEF"
    chunk = b"<x:xmpmeta>" + b"z" * 60000 + b"</x:xmpmeta>"
    return _segment(0xE1, b"http://ns.adobe.com/xmp/extension/\0" + guid + struct.pack(">II", len(chunk), 0) + chunk)


def photoshop_app13() -> bytes:
    iptc = b"\x1c\x02\x78" + struct.pack(">H", 11) + b"A caption.."  # IPTC 2:120 caption
    block = b"8BIM" + struct.pack(">H", 0x0404) + b"\0\0" + struct.pack(">I", len(iptc)) + iptc + b"\0"
    return _segment(0xED, b"Photoshop 3.0\0" + block)


def adobe_app14(transform: int) -> bytes:
    return _segment(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform))


def mpf_file(secondaries: int = 1) -> bytes:
    """A primary JPEG with secondary images (MPO, as Pillow writes it: APP2 MPF with the index)."""
    buf = io.BytesIO()
    _image().save(buf, "MPO", save_all=True, append_images=[_image("L", seed=9 + i).convert("RGB").resize((48, 30))
                                                            for i in range(secondaries)])
    return buf.getvalue()


def variants() -> dict[str, bytes]:
    """Name -> bytes of every variant."""
    rgb = _save(_image())
    thumbnail = _save(_image().resize((32, 20)), quality=70)
    out = {
        "baseline_420": _save(_image(), subsampling=2),
        "baseline_422": _save(_image(), subsampling=1),
        "baseline_444": _save(_image(), subsampling=0),
        "progressive": _save(_image(), progressive=True),
        "progressive_optimized": _save(_image(), progressive=True, optimize=True),
        "grayscale": _save(_image("L")),
        "restart_intervals": _save(_image(), restart_marker_blocks=1),
        "quality_100": _save(_image(), quality=100),
        "no_jfif": _drop_segments(rgb, 0xE0),
        "jfif_and_exif": _save(_image(), exif=exif_app1()[4:]),
        "exif_with_thumbnail": _insert_after_soi(_drop_segments(rgb, 0xE0), exif_app1(1, thumbnail)),
        "exif_maker_note_60kb": _insert_after_soi(rgb, exif_app1(1, maker_note=bytes(range(256)) * 234)),
        "exif_truncated": _insert_after_soi(rgb, exif_app1(1, thumbnail)[:40]),
        "exif_garbage": _insert_after_soi(rgb, _segment(0xE1, b"Exif\0\0" + bytes(range(200)))),
        "xmp": _insert_after_soi(rgb, xmp_app1()),
        "exif_xmp_extended_xmp": _insert_after_soi(rgb, exif_app1(1, thumbnail), xmp_app1(), extended_xmp_app1()),
        "icc_profile_3_chunks": _save(_image(), icc_profile=bytes(random.Random(1).randbytes(150_000))),
        "photoshop_iptc": _insert_after_soi(rgb, photoshop_app13()),
        "adobe_app14_ycc": _insert_after_soi(rgb, adobe_app14(1)),
        "comment": _save(_image(), comment=b"Edited with an editor"),
        "many_app_segments": _insert_after_soi(rgb, *[_segment(0xE0 + i % 16, bytes(60000)) for i in range(1, 40)]),
        "fill_bytes_before_markers": rgb[:2] + rgb[2:].replace(b"\xff\xdb", b"\xff\xff\xff\xdb", 1),
        "trailing_zeros": rgb + bytes(4096),
        "trailing_samsung_sefh": rgb + b"\0" * 16 + b"SEFH" + struct.pack("<II", 107, 0) + b"SEFT",
        "trailing_second_jpeg": rgb + thumbnail,
        "ultra_hdr_like_gain_map": _insert_after_soi(rgb, xmp_app1('<hdrgm:Version xmlns:hdrgm="http://ns.adobe.com'
                                                                   '/hdr-gain-map/1.0/">1.0</hdrgm:Version>'))
        + _save(_image("L").resize((48, 30))),
        "mpo_depth_map": mpf_file(1),
        "mpo_two_secondaries": mpf_file(2),
        "cmyk_adobe": _save(_image("CMYK")),
        "missing_eoi": rgb[:-2],
        "truncated_mid_scan": rgb[: len(rgb) * 2 // 3],
        "corrupt_scan_data": rgb[: len(rgb) // 2] + bytes(64) + rgb[len(rgb) // 2 + 64:],
    }
    for orientation in (0, 2, 3, 4, 5, 6, 7, 8, 9, 65535):
        out[f"exif_orientation_{orientation}"] = _insert_after_soi(rgb, exif_app1(orientation, thumbnail))
    return out
