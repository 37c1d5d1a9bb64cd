"""A seeded corpus of distinct photos and their near-duplicate variants, for issue 25's tests.

``write_corpus(folder, photos, variants_of, seed)`` writes ``photos`` distinct synthetic photos
(``bench/make_corpus.synthetic_photo``: gradients, blobs, edges and sensor noise, each from its own
seed) into class folders, and for the first ``variants_of`` of them one copy of each kind in
``KINDS`` beside them: JPEG quality 50-95, a resize by 0.5-2x, PNG and WebP re-encodes, a crop of
up to 5% a side, an EXIF-rotated copy (pixels turned, the orientation tag turning them back) and
brightness +-10%. It returns the originals' and the variants' file names (relative to ``folder``).
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

from bench.make_corpus import synthetic_photo

KINDS = ("quality", "resize", "png", "webp", "crop", "exif_rotated", "brightness")
CLASSES = ("alpha", "beta", "gamma")


def _jpeg(image: Any, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


def variant(image: Any, kind: str, rng: random.Random) -> tuple[str, bytes]:
    """(extension, bytes) of one near-duplicate of ``image``."""
    from PIL import Image, ImageEnhance

    width, height = image.size
    if kind == "quality":
        return "jpg", _jpeg(image, quality=rng.randint(50, 95))
    if kind == "resize":
        scale = rng.choice([rng.uniform(0.5, 0.9), rng.uniform(1.1, 2.0)])
        return "jpg", _jpeg(image.resize((round(width * scale), round(height * scale)), Image.Resampling.LANCZOS),
                            quality=90)
    if kind in ("png", "webp"):
        buf = io.BytesIO()
        image.save(buf, kind.upper(), **({"quality": 85} if kind == "webp" else {}))
        return kind, buf.getvalue()
    if kind == "crop":
        left, top, right, bottom = (rng.uniform(0.0, 0.05) for _ in range(4))
        box = (round(width * left), round(height * top), width - round(width * right), height - round(height * bottom))
        return "jpg", _jpeg(image.crop(box), quality=90)
    if kind == "exif_rotated":  # stored turned a quarter anticlockwise; orientation 6 turns it back upright
        exif = Image.Exif()
        exif[0x0112] = 6
        return "jpg", _jpeg(image.transpose(Image.Transpose.ROTATE_90), quality=90, exif=exif.tobytes())
    if kind == "brightness":
        return "jpg", _jpeg(ImageEnhance.Brightness(image).enhance(rng.choice([0.9, 1.1])), quality=90)
    raise ValueError(kind)


def write_variants(folder: Path, stem: str, image: Any, rng: random.Random) -> list[tuple[str, str]]:
    """Each ``variant`` of ``image``, in ``KINDS`` order, written as ``folder/<stem>_<kind>.<extension>``:
    (kind, name) each."""
    written = []
    for kind in KINDS:
        extension, data = variant(image, kind, rng)
        name = f"{stem}_{kind}.{extension}"
        (folder / name).write_bytes(data)
        written.append((kind, name))
    return written


def write_corpus(folder: Path, photos: int, variants_of: int, seed: int = 0) -> tuple[list[str], dict[str, list[str]]]:
    """Write the corpus (see the module); returns (originals, {original: its variants})."""
    rng = random.Random(seed)
    originals: list[str] = []
    variants: dict[str, list[str]] = {}
    for number in range(photos):
        image = synthetic_photo(random.Random(seed * 100_003 + number), (rng.randint(420, 640), rng.randint(320, 480)))
        label = CLASSES[number % len(CLASSES)]
        (folder / label).mkdir(parents=True, exist_ok=True)
        name = f"{label}/photo{number:05d}.jpg"
        (folder / name).write_bytes(_jpeg(image, quality=90))
        originals.append(name)
        if number < variants_of:
            variants[name] = [copy for _, copy in write_variants(folder, f"{label}/photo{number:05d}", image, rng)]
    return originals, variants
