"""Make a small, deterministic demo image folder (one folder per class); no download needed."""

from __future__ import annotations

import io
import os
import random

CLASSES = ("circles", "squares", "triangles")


def _draw(shape: str, rng: random.Random, size: tuple[int, int]):  # -> PIL.Image.Image
    from PIL import Image, ImageDraw

    w, h = size
    background = tuple(rng.randrange(0, 256) for _ in range(3))
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(60, 160)):  # texture, so files are not trivially small
        x, y = rng.randrange(w), rng.randrange(h)
        draw.point((x, y), fill=tuple(rng.randrange(0, 256) for _ in range(3)))
    colour = tuple(rng.randrange(0, 256) for _ in range(3))
    r = rng.randint(min(w, h) // 6, min(w, h) // 3)
    cx, cy = rng.randint(r, w - r), rng.randint(r, h - r)
    if shape == "circles":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "squares":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    return image


def make_sample(out: str, per_class: int = 20, seed: int = 0, png_every: int = 5) -> int:
    """Write ``per_class`` images for each class under ``out``; returns how many were written.

    The same arguments always give the same bytes; existing files are overwritten in place.
    """
    rng = random.Random(seed)
    written = 0
    for shape in CLASSES:
        folder = os.path.join(out, shape)
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            image = _draw(shape, rng, (rng.randint(96, 200), rng.randint(96, 200)))
            buf = io.BytesIO()
            if i % png_every == png_every - 1:
                image.save(buf, "PNG")
                name = f"{shape[:-1]}_{i:03d}.png"
            else:
                image.save(buf, "JPEG", quality=90)
                name = f"{shape[:-1]}_{i:03d}.jpg"
            with open(os.path.join(folder, name), "wb") as f:
                f.write(buf.getvalue())
            written += 1
    return written
