"""Make the benchmark's image corpus: flowers-shaped, reproducible from a seed, from this repository alone.

    python bench/make_corpus.py OUT [--images 3670] [--seed 0] [--png-share 0.05] [--photos DIR | --synthetic]

One folder per class with the TensorFlow "flowers" proportions (daisy 633, dandelion 898, roses 641,
sunflowers 699, tulips 799), JPEGs (quality 85-95) and a few PNGs, 400-640 pixels on the long side.

Pixels come from real photographs when they can be had: a folder given with ``--photos``, or the
JPEG wallpapers of Debian's ``mate-backgrounds`` package, fetched once with ``apt-get download``
into ``.bench/photos`` (no root needed). Without them (no apt-get, no network) the photos are
synthetic: smooth gradients, soft blobs and edges under sensor-like noise, so that JPEG sizes and
decode costs are those of photos rather than of flat colours. The output says which source it used.
The same arguments and the same photo source give byte-identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CLASSES = {"daisy": 633, "dandelion": 898, "roses": 641, "sunflowers": 699, "tulips": 799}
PHOTOS_CACHE = Path(__file__).resolve().parent.parent / ".bench" / "photos"
MAX_PHOTO_BYTES = 4_000_000


def debian_photos(cache: Path = PHOTOS_CACHE) -> list[str]:
    """JPEG photos from Debian's mate-backgrounds, unpacked once into ``cache``; [] if it cannot be had.

    The package's tree is kept as it is, so the photos sort as they do in the package; ``cache``
    appears whole or not at all (unpacked beside it, then renamed), so an interrupted download never
    leaves a partial set that would give other bytes.
    """
    found = sorted(glob.glob(str(cache / "**" / "*.jpg"), recursive=True))
    if found or not shutil.which("apt-get") or not shutil.which("dpkg"):
        return found
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.parent, prefix=".photos-") as tmp:
        try:
            subprocess.run(["apt-get", "download", "mate-backgrounds"], cwd=tmp, check=True, timeout=300,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deb = glob.glob(os.path.join(tmp, "mate-backgrounds_*.deb"))[0]
            unpacked = Path(tmp) / "unpacked"
            subprocess.run(["dpkg", "-x", deb, str(unpacked)], check=True, timeout=300)
        except (OSError, IndexError, subprocess.SubprocessError):
            return []
        try:
            unpacked.rename(cache)  # replaces an empty folder; fails on a full one
        except OSError:
            if not glob.glob(str(cache / "**" / "*.jpg"), recursive=True):  # not another process's photos
                shutil.rmtree(cache, ignore_errors=True)
                with contextlib.suppress(OSError):
                    unpacked.rename(cache)
    return sorted(glob.glob(str(cache / "**" / "*.jpg"), recursive=True))


def debian_version(cache: Path = PHOTOS_CACHE) -> str:
    """The unpacked package's version (from its Debian changelog), or ''."""
    import gzip

    try:
        with gzip.open(cache / "usr" / "share" / "doc" / "mate-backgrounds" / "changelog.Debian.gz", "rt") as f:
            return f.readline().split("(", 1)[1].split(")", 1)[0]
    except (OSError, IndexError):
        return ""


def synthetic_photo(rng: random.Random, size: tuple[int, int] = (1280, 960)) -> Any:
    """A photo-like RGB image: a gradient sky, soft coloured blobs with edges, and per-pixel noise."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    width, height = size
    top, bottom = np.array([rng.randrange(256) for _ in range(3)]), np.array([rng.randrange(256) for _ in range(3)])
    ramp = np.linspace(0.0, 1.0, height)[:, None, None]
    base = (top * (1 - ramp) + bottom * ramp) * np.ones((1, width, 1))
    image = Image.fromarray(base.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(12, 30)):
        x, y, r = rng.randrange(width), rng.randrange(height), rng.randint(20, 260)
        colour = tuple(rng.randrange(256) for _ in range(3))
        if rng.random() < 0.5:
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        else:
            draw.polygon([(x + rng.randint(-r, r), y + rng.randint(-r, r)) for _ in range(5)], fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(1.0, 4.0)))
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(4, 12), (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(image, dtype=np.float64) + noise, 0, 255).astype(np.uint8), "RGB")


def photo_sources(photos_dir: str | None, synthetic: bool, seed: int) -> tuple[str, list[Any]]:
    """(description, RGB images) to cut crops from."""
    from PIL import Image

    if not synthetic:
        paths = (sorted(glob.glob(os.path.join(photos_dir, "**", "*.jpg"), recursive=True)) if photos_dir
                 else debian_photos())
        paths = [p for p in paths if os.path.getsize(p) < MAX_PHOTO_BYTES]
        if paths:
            where = photos_dir or f"Debian mate-backgrounds {debian_version()}".rstrip()
            return f"{len(paths)} photos from {where}", [Image.open(p).convert("RGB") for p in paths]
        if photos_dir:
            sys.exit(f"no .jpg photos under {photos_dir}")
    rng = random.Random(f"synthetic-{seed}")
    why = "asked for" if synthetic else "no photo package available"
    return f"12 synthetic photos ({why})", [synthetic_photo(rng) for _ in range(12)]


def make_corpus(out: str, images: int = sum(CLASSES.values()), seed: int = 0, png_share: float = 0.05,
                photos_dir: str | None = None, synthetic: bool = False) -> tuple[int, int, str]:
    """Write the corpus into ``out``; returns (images, bytes, photo source)."""
    from PIL import Image

    source, photos = photo_sources(photos_dir, synthetic, seed)
    rng = random.Random(seed)
    total = sum(CLASSES.values())
    counts = {name: max(1, round(n * images / total)) for name, n in CLASSES.items()}
    written = 0
    for name, count in counts.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for i in range(count):
            photo = rng.choice(photos)
            width, height = photo.size
            crop_w = max(32, int(width * rng.uniform(0.15, 0.6)))
            crop_h = max(32, min(height, int(crop_w / rng.uniform(0.75, 1.33))))
            x, y = rng.randrange(0, width - crop_w + 1), rng.randrange(0, height - crop_h + 1)
            crop = photo.crop((x, y, x + crop_w, y + crop_h))
            scale = rng.randint(400, 640) / max(crop.size)
            img = crop.resize((max(1, int(crop.width * scale)), max(1, int(crop.height * scale))),
                              Image.Resampling.BILINEAR)
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            buf = io.BytesIO()
            if rng.random() < png_share:
                img.save(buf, "PNG")
                ext = "png"
            else:
                img.save(buf, "JPEG", quality=rng.randint(85, 95))
                ext = "jpg"
            with open(os.path.join(out, name, f"{rng.getrandbits(40):010x}_{i:05d}.{ext}"), "wb") as f:
                f.write(buf.getvalue())
            written += buf.tell()
    return sum(counts.values()), written, source


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--images", type=int, default=sum(CLASSES.values()))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png-share", type=float, default=0.05)
    parser.add_argument("--photos", help="folder of .jpg photos to cut from (default: Debian mate-backgrounds)")
    parser.add_argument("--synthetic", action="store_true", help="synthetic photos only (offline, no package)")
    args = parser.parse_args(argv)
    count, nbytes, source = make_corpus(args.out, args.images, args.seed, args.png_share, args.photos,
                                        args.synthetic)
    print(f"{count} images, {nbytes / 1e6:.1f} MB in {args.out} (pixels: {source})")


if __name__ == "__main__":
    main()
