"""The dataset card's two charts, drawn with Pillow: stacked horizontal bars and a stacked histogram.

Pillow only (already needed for images), so rendering a card costs milliseconds rather than the
second matplotlib takes to import. The PNG bytes depend only on the arguments: Pillow's bundled
default font, fixed sizes, no metadata.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from functools import cache
from typing import Any

COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
WIDTH, PAD, BAR, ROW = 800, 12, 20, 28
INK, GRID, AXIS = (34, 34, 34), (225, 225, 225), (120, 120, 120)
LABEL_LIMIT = 40


@cache
def _font(size: int = 12) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def short(text: str, limit: int = LABEL_LIMIT) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def nice_ticks(high: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to at least ``high`` (steps of 1, 2 or 5 times a power of ten)."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"


def _width(text: str) -> int:
    return int(_font().getlength(text))


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def _legend(draw: Any, names: Sequence[str], top: int) -> None:
    """Colour keys and names, centred on one line."""
    items = [short(n, 24) for n in names]
    total = sum(16 + _width(t) + 18 for t in items)
    x = max(PAD, (WIDTH - total) // 2)
    for i, text in enumerate(items):
        draw.rectangle((x, top + 2, x + 11, top + 13), fill=COLOURS[i % len(COLOURS)])
        draw.text((x + 16, top), text, fill=INK, font=_font())
        x += 16 + _width(text) + 18


def _title(draw: Any, text: str) -> None:
    text = short(text, 90)
    draw.text(((WIDTH - _width(text) * 14 // 12) // 2, PAD), text, fill=INK, font=_font(14))


def records_chart(classes: Sequence[str], splits: Sequence[str], counts: dict[tuple[str, str], int],
                  title: str) -> bytes:
    """Horizontal bars, one per class (in the given order), stacked by split, one colour per split."""
    from PIL import Image, ImageDraw

    labels = [short(c) for c in classes]
    left = PAD + max([_width(t) for t in labels] + [0]) + 10
    right, top = WIDTH - 3 * PAD, 44
    height = top + ROW * max(len(classes), 1) + 70
    totals = [sum(counts.get((c, s), 0) for s in splits) for c in classes]
    ticks = nice_ticks(max([*totals, 1]))
    scale = (right - left) / ticks[-1]
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    _title(draw, title)
    bottom = top + ROW * max(len(classes), 1)
    for tick in ticks:
        x = left + round(tick * scale)
        draw.line((x, top, x, bottom), fill=GRID)
        draw.text((x - _width(_label(tick)) // 2, bottom + 4), _label(tick), fill=INK, font=_font())
    for row, (name, label) in enumerate(zip(classes, labels, strict=True)):
        y = top + row * ROW + (ROW - BAR) // 2
        draw.text((left - 8 - _width(label), y + 3), label, fill=INK, font=_font())
        x = float(left)
        for i, split in enumerate(splits):
            value = counts.get((name, split), 0)
            if value:
                draw.rectangle((round(x), y, round(x + value * scale), y + BAR), fill=COLOURS[i % len(COLOURS)])
            x += value * scale
    draw.line((left, top, left, bottom), fill=AXIS)
    draw.line((left, bottom, right, bottom), fill=AXIS)
    draw.text(((left + right - _width("records")) // 2, bottom + 22), "records", fill=INK, font=_font())
    _legend(draw, splits, bottom + 44)
    return _png(image)


def shards_chart(sizes: dict[str, list[int]], bins: int = 20) -> bytes:
    """A histogram of shard sizes in MB (10^6 bytes), stacked by split."""
    from PIL import Image, ImageDraw

    splits = [s for s, values in sizes.items() if values]
    values = [v / 1e6 for s in splits for v in sizes[s]]
    low, high = min(values), max(values)
    if high - low < 1e-6:
        low, high = low * 0.9 - 1e-3, high * 1.1 + 1e-3
    width = (high - low) / bins
    counts = [[0] * bins for _ in splits]
    for i, split in enumerate(splits):
        for v in sizes[split]:
            counts[i][min(bins - 1, int((v / 1e6 - low) / width))] += 1
    stacks = [sum(c[b] for c in counts) for b in range(bins)]
    yticks = [t for t in nice_ticks(max(stacks), 4) if t == int(t)] or [0.0, 1.0]
    left, right, top, bottom = PAD + 48, WIDTH - 3 * PAD, 44, 280
    image = Image.new("RGB", (WIDTH, bottom + 74), "white")
    draw = ImageDraw.Draw(image)
    _title(draw, "Shard sizes")
    yscale = (bottom - top) / yticks[-1]
    for tick in yticks:
        y = bottom - round(tick * yscale)
        draw.line((left, y, right, y), fill=GRID)
        draw.text((left - 8 - _width(_label(tick)), y - 7), _label(tick), fill=INK, font=_font())
    step = (right - left) / bins
    for b in range(bins):
        y = float(bottom)
        for i in range(len(splits)):
            if counts[i][b]:
                top_y = y - counts[i][b] * yscale
                draw.rectangle((round(left + b * step) + 1, round(top_y), round(left + (b + 1) * step) - 1, round(y)),
                               fill=COLOURS[i % len(COLOURS)])
                y = top_y
    for b in range(0, bins + 1, 5):
        text = f"{low + b * width:.3g}"
        x = round(left + b * step)
        draw.line((x, bottom, x, bottom + 4), fill=AXIS)
        draw.text((x - _width(text) // 2, bottom + 6), text, fill=INK, font=_font())
    draw.line((left, top, left, bottom), fill=AXIS)
    draw.line((left, bottom, right, bottom), fill=AXIS)
    label = "shard size (MB); height: number of shards"
    draw.text(((left + right - _width(label)) // 2, bottom + 24), label, fill=INK, font=_font())
    _legend(draw, splits, bottom + 48)
    return _png(image)
