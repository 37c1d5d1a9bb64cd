"""A deterministic corpus of JPEG variants as phones, cameras and editors write them.

Everything is made here from Pillow output by splicing segments at the byte level (no network, no
files): ``variant(name)`` returns the bytes, ``VARIANTS`` lists the names. Structures Pillow cannot
write (4:4:0 and 4:1:1 subsampling, 12-bit samples) come from ``flat_jpeg``, a tiny baseline encoder
of one flat colour whose scan data is exact. Arithmetic coding cannot be made here (neither Pillow
nor this encoder writes it), so it is not in the corpus.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any

SIZE = (67, 45)  # odd, not a multiple of any MCU: width and height cannot be swapped unnoticed
SOI, EOI = b"\xff\xd8", b"\xff\xd9"


# -- building blocks ----------------------------------------------------------------------------------
def photo(mode: str = "RGB", size: tuple[int, int] = SIZE, seed: int = 0) -> Any:
    """A smooth gradient with mild noise: compresses like a photo, same bytes every run."""
    import numpy as np
    from PIL import Image

    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(seed).integers(0, 24, (height, width, 3))
    rgb = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], axis=-1)
    return Image.fromarray(((rgb + noise) % 256).astype(np.uint8), "RGB").convert(mode)


def encode(image: Any, fmt: str = "JPEG", **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def jpeg(mode: str = "RGB", **options: Any) -> bytes:
    return encode(photo(mode), "JPEG", quality=90, **options)


def segment(marker: int, payload: bytes) -> bytes:
    """One marker segment: 0xFF, the marker, a length that counts itself, the payload."""
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def split(data: bytes) -> tuple[list[bytes], bytes]:
    """The segments between SOI and the first SOS, and everything from that SOS on."""
    pos, segments = 2, []
    while data[pos + 1] != 0xDA:
        (length,) = struct.unpack_from(">H", data, pos + 2)
        segments.append(data[pos:pos + 2 + length])
        pos += 2 + length
    return segments, data[pos:]


def rebuild(segments: list[bytes], rest: bytes) -> bytes:
    return SOI + b"".join(segments) + rest


def is_app(seg: bytes, marker: int, prefix: bytes = b"") -> bool:
    return seg[1] == marker and seg[4:4 + len(prefix)] == prefix


def insert(data: bytes, new: list[bytes], after_app: bool = True, drop: Callable[[bytes], bool] | None = None) -> bytes:
    """``data`` with segments ``new`` after its APPn segments (or first), dropping those ``drop`` picks."""
    segments, rest = split(data)
    if drop is not None:
        segments = [seg for seg in segments if not drop(seg)]
    at = sum(1 for seg in segments if 0xE0 <= seg[1] <= 0xEF) if after_app else 0
    return rebuild(segments[:at] + new + segments[at:], rest)


def tiff_ifds(ifds: list[list[tuple[int, int, int, bytes]]], tail: bytes = b"") -> bytes:
    """A big-endian TIFF (EXIF) of chained IFDs; entries are (tag, type, count, value of 4 bytes at most).

    ``tail`` follows the IFDs; an entry value of b"@tail" becomes its offset."""
    out, offset = [b"MM\x00*", struct.pack(">I", 8)], 8
    sizes = [2 + 12 * len(entries) + 4 for entries in ifds]
    tail_at = 8 + sum(sizes)
    for index, entries in enumerate(ifds):
        offset += sizes[index]
        body = struct.pack(">H", len(entries))
        for tag, kind, count, value in entries:
            value = struct.pack(">I", tail_at) if value == b"@tail" else value
            body += struct.pack(">HHI", tag, kind, count) + value.ljust(4, b"\0")
        out.append(body + struct.pack(">I", offset if index + 1 < len(ifds) else 0))
    return b"".join(out) + tail


def exif(orientation: int | None = 1, thumbnail: bytes = b"") -> bytes:
    """An EXIF APP1 segment: IFD0 with the orientation, IFD1 with a JPEG thumbnail if given."""
    ifds = [[(0x0112, 3, 1, struct.pack(">H", orientation))] if orientation is not None else []]
    if thumbnail:
        ifds.append([(0x0201, 4, 1, b"@tail"), (0x0202, 4, 1, struct.pack(">I", len(thumbnail)))])
    return segment(0xE1, b"Exif\0\0" + tiff_ifds(ifds, thumbnail))


def with_exif(data: bytes, app1: bytes, keep_jfif: bool = True) -> bytes:
    """``data`` with ``app1`` after its JFIF APP0 (or instead of it)."""
    segments, rest = split(data)
    jfif = [seg for seg in segments if is_app(seg, 0xE0, b"JFIF")]
    others = [seg for seg in segments if not is_app(seg, 0xE0, b"JFIF")]
    return rebuild((jfif if keep_jfif else []) + [app1] + others, rest)


# -- a flat-colour baseline encoder for structures Pillow cannot write ---------------------------------
_DC_BITS = (0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)  # ITU T.81 K.3 luminance DC
_DC_VALUES = bytes(range(12))


def _dc_codes() -> dict[int, tuple[int, int]]:
    """Canonical Huffman codes of the K.3 DC table: symbol -> (code, length)."""
    codes, code, index = {}, 0, 0
    for length, count in enumerate(_DC_BITS, 1):
        for _ in range(count):
            codes[_DC_VALUES[index]] = (code, length)
            code, index = code + 1, index + 1
        code <<= 1
    return codes


class _Bits:
    """An entropy-coded segment writer: bits MSB first, 0xFF bytes stuffed with 0x00, padded with 1s."""

    def __init__(self) -> None:
        self.out, self.acc, self.count = bytearray(), 0, 0

    def put(self, value: int, length: int) -> None:
        self.acc, self.count = (self.acc << length) | value, self.count + length
        while self.count >= 8:
            self.count -= 8
            byte = (self.acc >> self.count) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes((byte,))
        self.acc &= (1 << self.count) - 1

    def flush(self) -> bytes:
        if self.count:
            self.put((1 << (8 - self.count)) - 1, 8 - self.count)
        return bytes(self.out)


def _blocks_per_mcu(sampling: list[tuple[int, int]]) -> list[int]:
    return [h * v for h, v in sampling] if len(sampling) > 1 else [1]


def _mcus(size: tuple[int, int], sampling: list[tuple[int, int]]) -> int:
    hmax, vmax = (max(h for h, _ in sampling), max(v for _, v in sampling)) if len(sampling) > 1 else (1, 1)
    return -(-size[0] // (8 * hmax)) * -(-size[1] // (8 * vmax))


def flat_jpeg(size: tuple[int, int], sampling: list[tuple[int, int]], levels: list[int], precision: int = 8,
              sof: int = 0xC0) -> bytes:
    """A JPEG of one flat colour: ``sampling`` (h, v) and sample ``levels`` per component.

    Every block's AC coefficients are zero (an EOB), so only the first block of each component codes
    a DC difference; quantisation is 1, so that DC is 8 x (level - 2^(precision-1))."""
    codes, bits = _dc_codes(), _Bits()
    dht = segment(0xC4, b"\x00" + bytes(_DC_BITS) + _DC_VALUES + b"\x10" + bytes([1] + [0] * 15) + b"\x00")
    dqt = segment(0xDB, b"\x10" + b"\x00\x01" * 64 if precision > 8 else b"\x00" + b"\x01" * 64)
    components = b"".join(bytes((i + 1, h << 4 | v, 0)) for i, (h, v) in enumerate(sampling))
    header = segment(sof, struct.pack(">BHHB", precision, size[1], size[0], len(sampling)) + components)
    sos = segment(0xDA, bytes((len(sampling),)) + b"".join(bytes((i + 1, 0)) for i in range(len(sampling)))
                  + b"\x00\x3f\x00")
    diffs = [8 * (level - (1 << (precision - 1))) for level in levels]
    for _ in range(_mcus(size, sampling)):
        for index, blocks in enumerate(_blocks_per_mcu(sampling)):
            for _ in range(blocks):
                category = abs(diffs[index]).bit_length()
                bits.put(*codes[category])
                if category:
                    bits.put(diffs[index] if diffs[index] > 0 else diffs[index] + (1 << category) - 1, category)
                bits.put(0, 1)  # EOB, the only AC symbol: code "0"
                diffs[index] = 0
    return SOI + dqt + header + dht + sos + bits.flush() + EOI


# -- the variants ---------------------------------------------------------------------------------------
def _thumbnail() -> bytes:
    return encode(photo("RGB", (16, 11), 7), "JPEG", quality=70)


def _mpo(secondary: Any, primary_extra: list[bytes] | None = None) -> bytes:
    data = encode(photo(), "MPO", save_all=True, append_images=[secondary], quality=90)
    return insert(data, primary_extra) if primary_extra else data


def _xmp(attributes: str) -> bytes:
    packet = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
              f"<rdf:Description {attributes}/></rdf:RDF></x:xmpmeta>")
    return segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0" + packet.encode())


def _extended_xmp() -> list[bytes]:
    """Standard XMP naming a GUID, and ~140 KB of extended XMP in 65,000-byte APP1 chunks."""
    guid = b"0123456789ABCDEF0123456789ABCDEF"
    full = b"<x:xmpmeta><depth>" + bytes(range(32, 127)) * 1500 + b"</depth></x:xmpmeta>"
    head = _xmp(f'xmlns:xmpNote="http://ns.adobe.com/xmp/note/" xmpNote:HasExtendedXMP="{guid.decode()}"')
    chunks = [full[i:i + 65000] for i in range(0, len(full), 65000)]
    prefix = b"http://ns.adobe.com/xmp/extension/\0" + guid
    return [head] + [segment(0xE1, prefix + struct.pack(">II", len(full), i * 65000) + chunk)
                     for i, chunk in enumerate(chunks)]


def _big_icc() -> bytes:
    """sRGB padded by 150 KB (header size updated): Pillow splits it over three APP2 chunks."""
    from PIL import ImageCms

    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes() + bytes(150_000)
    return struct.pack(">I", len(profile)) + profile[4:]


def _photoshop_iptc() -> bytes:
    iptc = b"\x1c\x02\x00\x00\x02\x00\x04" + b"\x1c\x02\x78" + struct.pack(">H", 11) + b"A caption\xff\xd9"
    resource = b"8BIM\x04\x04\x00\x00" + struct.pack(">I", len(iptc)) + iptc + b"\0" * (len(iptc) % 2)
    return segment(0xED, b"Photoshop 3.0\0" + resource)


def _adobe(transform: int) -> bytes:
    return segment(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, transform))


def _fill_bytes(data: bytes) -> bytes:
    """0xFF fill bytes before every header marker and before EOI (T.81 B.1.1.2 allows any number)."""
    segments, rest = split(data)
    return SOI + b"".join(b"\xff" * 3 + seg for seg in segments) + b"\xff\xff" + rest[:-2] + b"\xff" * 4 + EOI


def _ycck(data: bytes) -> bytes:
    """Pillow's CMYK JPEG with its Adobe transform flag set to YCCK (2): decoders convert, the data stays."""
    return data.replace(b"Adobe\x00\x64\x00\x00\x00\x00\x00", b"Adobe\x00\x64\x00\x00\x00\x00\x02", 1)


def _sof1(data: bytes) -> bytes:
    """A baseline JPEG labelled extended sequential (SOF1), as some encoders label it: the same bitstream."""
    segments, rest = split(data)
    return rebuild([b"\xff\xc1" + seg[2:] if seg[1] == 0xC0 else seg for seg in segments], rest)


def _unusual_apps() -> list[bytes]:
    """APPn segments cameras and editors write, one with marker-like bytes (SOI, SOS, EOI) in its payload."""
    return [segment(0xE3, b"Meta\0" + bytes(40)), segment(0xEB, b"JP\x00\x00" + bytes(30)),
            segment(0xEC, b"Ducky\x00\x01\x00\x04\x00\x00\x00\x5a\x00\x00"), segment(0xE5, b""),
            segment(0xEF, b"\xff\xd8\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00\xff\xd9 markers inside a payload")]


def _huge_apps() -> list[bytes]:
    return [segment(0xE3 + i % 12, bytes((i + j) % 256 for j in range(65533))) for i in range(24)]


def _corrupt_exif() -> dict[str, bytes]:
    good = tiff_ifds([[(0x0112, 3, 1, struct.pack(">H", 6)), (0x8769, 4, 1, struct.pack(">I", 4000))]])
    return {"exif_truncated": segment(0xE1, b"Exif\0\0" + good[:20]),
            "exif_bad_ifd_offset": segment(0xE1, b"Exif\0\0" + good[:4] + struct.pack(">I", 1 << 30) + good[8:]),
            "exif_garbage": segment(0xE1, b"Exif\0\0" + bytes(range(256)) * 2),
            "exif_empty": segment(0xE1, b"Exif\0\0")}


def _mpf(count: int, entries: list[tuple[int, int, int]]) -> bytes:
    """An MPF APP2 segment (little-endian) claiming ``count`` images, with (attribute, size, offset) entries."""
    tags = [(0xB000, 7, 4, b"0100"), (0xB001, 4, 1, struct.pack("<I", count))]
    table_at = 8 + 2 + 12 * (len(tags) + 1) + 4
    tags.append((0xB002, 7, 16 * len(entries), struct.pack("<I", table_at)))
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHI", *tag[:3]) + tag[3] for tag in tags)
    table = b"".join(struct.pack("<IIIHH", attribute, size, offset, 0, 0) for attribute, size, offset in entries)
    return segment(0xE2, b"MPF\0II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + table)


def _patch(data: bytes, old: bytes, new: bytes) -> bytes:
    at = data.index(old)
    return data[:at] + new + data[at + len(old):]


def _malformed() -> dict[str, Callable[[], bytes]]:
    """Damage decoders shrug off (libjpeg ignores the segment or warns and goes on), and damage they do not."""
    base = jpeg
    return {
        "short_jfif_app0": lambda: insert(base(), [segment(0xE0, b"JFIF\0\1")], drop=lambda seg: is_app(seg, 0xE0)),
        "short_adobe_app14": lambda: insert(base(), [segment(0xEE, b"Adobe\0")]),
        "short_icc_chunk": lambda: insert(base(), [segment(0xE2, b"ICC_PROFILE\0\1")]),
        "tem_marker": lambda: _patch(base(), b"\xff\xdb", b"\xff\x01\xff\xdb"),
        "junk_before_marker": lambda: _patch(base(), b"\xff\xdb", b"\0\0\0\xff\xdb"),
        "malformed_mpf": lambda: insert(base(), [_mpf(3, [(0x20030000, 0, 0), (0, 100, 999_999)])]),
        "corrupt_scan_data": lambda: base()[:1000] + bytes(50) + base()[1050:],
        "restart_out_of_order": lambda: _patch(jpeg(restart_marker_blocks=1), b"\xff\xd0", b"\xff\xd3"),
        "eoi_mid_scan": lambda: base()[:1200] + EOI,
        "two_components": lambda: flat_jpeg(SIZE, [(1, 1), (1, 1)], [100, 150]),
        "app_payload_with_sos_bytes": lambda: insert(base(), [segment(0xE9, b"\xff\xda\x00\x08" * 150 + EOI)]),
    }


def _builders() -> dict[str, Callable[[], bytes]]:
    base = jpeg
    builders: dict[str, Callable[[], bytes]] = {
        "baseline_jfif": base,
        "progressive": lambda: jpeg(progressive=True),
        "progressive_optimized": lambda: jpeg(progressive=True, optimize=True),
        "optimized_huffman": lambda: jpeg(optimize=True),
        "subsampling_444": lambda: jpeg(subsampling=0),
        "subsampling_422": lambda: jpeg(subsampling=1),
        "subsampling_420": lambda: jpeg(subsampling=2),
        "subsampling_440": lambda: flat_jpeg(SIZE, [(1, 2), (1, 1), (1, 1)], [200, 90, 160]),
        "subsampling_411": lambda: flat_jpeg(SIZE, [(4, 1), (1, 1), (1, 1)], [60, 140, 100]),
        "flat_444": lambda: flat_jpeg(SIZE, [(1, 1)] * 3, [120, 128, 128]),
        "flat_gray": lambda: flat_jpeg(SIZE, [(1, 1)], [77]),
        "grayscale": lambda: jpeg("L"),
        "grayscale_progressive": lambda: jpeg("L", progressive=True),
        "adobe_rgb_transform0": lambda: jpeg(keep_rgb=True),
        "adobe_ycc_transform1": lambda: insert(base(), [_adobe(1)]),
        "cmyk_adobe": lambda: jpeg("CMYK"),
        "ycck_adobe": lambda: _ycck(jpeg("CMYK")),
        "restart_every_block": lambda: jpeg(restart_marker_blocks=1),
        "restart_every_row": lambda: jpeg(restart_marker_rows=1),
        "restart_progressive": lambda: jpeg(progressive=True, restart_marker_blocks=2),
        "sof1_extended_8bit": lambda: _sof1(base()),
        "exif_and_jfif": lambda: with_exif(base(), exif(1)),
        "exif_without_jfif": lambda: with_exif(base(), exif(1), keep_jfif=False),
        "exif_before_jfif": lambda: insert(base(), [exif(1)], after_app=False),
        "neither_jfif_nor_exif": lambda: insert(base(), [], drop=lambda seg: is_app(seg, 0xE0)),
        "exif_thumbnail": lambda: with_exif(base(), exif(1, _thumbnail())),
        "exif_thumbnail_no_orientation": lambda: with_exif(base(), exif(None, _thumbnail()), keep_jfif=False),
        "xmp": lambda: insert(base(), [_xmp('xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Make="Phone"')]),
        "extended_xmp": lambda: insert(base(), _extended_xmp()),
        "icc_multi_chunk": lambda: jpeg(icc_profile=_big_icc()),
        "app13_photoshop_iptc": lambda: insert(base(), [_photoshop_iptc()]),
        "comments": lambda: insert(jpeg(comment=b"Pillow comment"), [segment(0xFE, b"second \xff\xd9\xff\xda")]),
        "unusual_app_markers": lambda: insert(base(), _unusual_apps()),
        "huge_app_segments": lambda: insert(base(), _huge_apps()),
        "mpo_two_frames": lambda: _mpo(photo(seed=3)),
        "mpo_depth_map": lambda: _mpo(photo("L", (34, 23), 4)),
        "ultra_hdr_gain_map": lambda: _mpo(photo("L", (34, 23), 5), [_xmp(
            'xmlns:hdrgm="http://ns.adobe.com/hdr-gain-map/1.0/" hdrgm:Version="1.0"')]),
        "fill_bytes": lambda: _fill_bytes(base()),
        "fill_bytes_progressive": lambda: _fill_bytes(jpeg(progressive=True)),
        "trailer_samsung": lambda: base() + b"\x00\x00SEFH" + bytes(range(200)) + b"SEFT",
        "trailer_second_jpeg": lambda: base() + _thumbnail(),
        "trailer_zeros": lambda: base() + bytes(4096),
        "trailer_ff_bytes": lambda: base() + b"\xff" * 64,
        "missing_eoi": lambda: base()[:-2],
        "missing_eoi_progressive": lambda: jpeg(progressive=True)[:-2],
        "truncated_scan": lambda: base()[:-200],
        "twelve_bit_sof1": lambda: flat_jpeg(SIZE, [(1, 1)], [2048], precision=12, sof=0xC1),
        "twelve_bit_sof0": lambda: flat_jpeg(SIZE, [(1, 1)], [2048], precision=12),
    }
    for value in (*range(10), 65535):
        builders[f"exif_orientation_{value}"] = lambda value=value: with_exif(base(), exif(value))
    for name, app1 in _corrupt_exif().items():
        builders[name] = lambda app1=app1: with_exif(base(), app1)
    return builders | _malformed()


_BUILDERS = _builders()
VARIANTS = tuple(_BUILDERS)


def variant(name: str) -> bytes:
    """The bytes of variant ``name`` (the same every call)."""
    return _BUILDERS[name]()
