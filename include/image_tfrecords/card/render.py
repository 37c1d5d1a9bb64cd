"""The dataset card's output: a small document model rendered to Markdown and self-contained HTML,
and sample thumbnails (Pillow); the charts are in ``plot``.

Every function's output depends only on its arguments: PNGs have fixed sizes and no metadata. Every
string from the data is escaped for the format it lands in.
"""

from __future__ import annotations

import base64
import html
import io
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

THUMB, GAP, BACKGROUND = 96, 4, (240, 240, 240)


# -- document model, rendered to Markdown and HTML ---------------------------------------------------
@dataclass(frozen=True)
class Img:
    path: str  # relative to the card, under card/
    alt: str


Cell = str | int | Img | None


@dataclass(frozen=True)
class Table:
    """A table; ``legend``: what each column of ``header`` holds (column name -> meaning), rendered under it."""

    header: tuple[str, ...]
    rows: list[tuple[Cell, ...]]
    legend: dict[str, str] = field(default_factory=dict)

    def legend_text(self) -> str:
        """"Columns: name: meaning; ..." for each column named in ``legend`` (a name shown twice, once)."""
        named = [name for name in dict.fromkeys(self.header) if name in self.legend]
        return "Columns: " + "; ".join(f"{name}: {self.legend[name]}" for name in named) + "." if named else ""


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Code:
    """A block of code shown as it is (Markdown: a fenced block; HTML: ``pre``)."""

    text: str
    language: str = "python"


@dataclass(frozen=True)
class Section:
    """Blocks that a later stage may replace in the rendered card (``replace_section``): rendered between
    two comments naming it, invisible in Markdown and HTML alike."""

    name: str
    blocks: list[Heading | Para | Table | Img | Code]


Block = Heading | Para | Table | Img | Code | Section

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]+")
# Backslash-escape what could start markup inside a line: emphasis, code, links, HTML, table pipes,
# entities, strikethrough, math, mentions, emoji and GFM autolinks (``http:``, ``www.``). Underscores
# between two letters or digits cannot start emphasis and stay as they are.
_MD_SPECIAL = re.compile(r"[\\`*{}\[\]<>|&~$@]|:(?=\S)|(?<=[wW]{3})\.|(?<![^\W_])_|_(?![^\W_])")
_NUMBER = re.compile(r"[+-]?[\d,]*\.?\d+")


def md_escape(text: str) -> str:
    """Inline Markdown text that renders literally (CommonMark/GFM backslash escapes, one line)."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), _CONTROL.sub(" ", text))


def html_escape(text: str) -> str:
    """HTML text; ``://`` becomes ``&#58;//`` so that no URL from the data appears verbatim in the page."""
    return html.escape(_CONTROL.sub(" ", text), quote=True).replace("://", "&#58;//")


def _fmt(value: Cell) -> str:
    return f"{value:,}" if isinstance(value, int) else "" if value is None else str(value)


def _is_number(value: Cell) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and _NUMBER.fullmatch(value) is not None)


def _numeric(table: Table) -> list[bool]:
    """Which columns hold only numbers (blank cells aside): those are right-aligned."""
    return [any(r[i] not in (None, "") for r in table.rows)
            and all(_is_number(r[i]) for r in table.rows if r[i] not in (None, ""))
            for i in range(len(table.header))]


def _marks(name: str) -> tuple[str, str]:
    return f"<!-- section {name} -->", f"<!-- end of section {name} -->"


def replace_section(document: str, name: str, blocks: list[Block], html_format: bool) -> str:
    """``document`` (a rendered card.md, or card.html when ``html_format``) with section ``name``'s blocks
    replaced by ``blocks`` (no images); unchanged when it has no such section (a card from before it)."""
    start, end = _marks(name)
    head, found, rest = document.partition(start + "\n")
    if not found or end not in rest:
        return document
    inner = "\n".join(_html_body(blocks, {})) + "\n" if html_format else render_md(blocks)
    return head + start + "\n" + inner + end + rest.split(end, 1)[1]


def render_md(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Section):
            start, end = _marks(block.name)
            out += [start, render_md(block.blocks) + end, ""]
            continue
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + md_escape(block.text))
        elif isinstance(block, Para):
            out.append(md_escape(block.text))
        elif isinstance(block, Img):
            out.append(f"![{md_escape(block.alt)}]({block.path})")
        elif isinstance(block, Code):
            fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", block.text)), default=0))
            out += [fence + block.language, _CONTROL_BUT_NEWLINE.sub(" ", block.text), fence]
        else:
            def cell(value: Cell) -> str:
                return f"![{md_escape(value.alt)}]({value.path})" if isinstance(value, Img) else md_escape(
                    _fmt(value))
            out.append("| " + " | ".join(md_escape(h) for h in block.header) + " |")
            out.append("|" + "|".join("---:" if n else "---" for n in _numeric(block)) + "|")
            out.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in block.rows)
            if legend := block.legend_text():
                out += ["", md_escape(legend)]
        out.append("")
    return "\n".join(out)


_STYLE = """body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0}
main{max-width:1100px;margin:0 auto;padding:1em 1.5em}h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;
padding-bottom:.2em;margin-top:1.6em}table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ddd;
padding:.25em .6em;text-align:left;vertical-align:middle}th{background:#f5f5f5}td.n{text-align:right;
font-variant-numeric:tabular-nums}img{max-width:100%;height:auto}td img{display:block}p{margin:.5em 0}
p.legend{color:#555;font-size:.92em;max-width:60em}pre{background:#f5f5f5;border:1px solid #ddd;padding:.6em .8em;
overflow-x:auto;font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def render_html(blocks: list[Block], title: str, pngs: dict[str, bytes]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html_escape(title)}</title>\n<style>\n{_STYLE}\n</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(_html_body(blocks, pngs)) + "\n</main>\n</body>\n</html>\n")


def _html_body(blocks: list[Block], pngs: dict[str, bytes]) -> list[str]:
    """The HTML lines of ``blocks`` (``pngs``: the images they show, by path)."""
    def img(value: Img) -> str:
        png = pngs[value.path]
        width, height = png_size(png)
        return (f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{html_escape(value.alt)}" '
                f'width="{width}" height="{height}">')

    body: list[str] = []
    for block in blocks:
        if isinstance(block, Section):
            start, end = _marks(block.name)
            body += [start, *_html_body(block.blocks, pngs), end]
        elif isinstance(block, Heading):
            body.append(f"<h{block.level}>{html_escape(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            body.append(f"<p>{html_escape(block.text)}</p>")
        elif isinstance(block, Img):
            body.append(f"<p>{img(block)}</p>")
        elif isinstance(block, Code):
            code = html.escape(_CONTROL_BUT_NEWLINE.sub(" ", block.text), quote=True).replace("://", "&#58;//")
            body.append(f'<pre><code class="language-{html_escape(block.language)}">{code}</code></pre>')
        else:
            numeric = _numeric(block)
            body.append("<table><thead><tr>" + "".join(f"<th>{html_escape(h)}</th>" for h in block.header)
                        + "</tr></thead><tbody>")
            for row in block.rows:
                body.append("<tr>" + "".join(
                    f'<td class="n">{html_escape(_fmt(v))}</td>' if numeric[i] else
                    f"<td>{img(v) if isinstance(v, Img) else html_escape(_fmt(v))}</td>"
                    for i, v in enumerate(row)) + "</tr>")
            body.append("</tbody></table>")
            if legend := block.legend_text():
                body.append(f'<p class="legend">{html_escape(legend)}</p>')
    return body


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def thumbnail(data: bytes, size: int = THUMB) -> Any:
    """A Pillow RGB image of at most ``size`` x ``size``, or None if ``data`` does not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale
            if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
                rgba = image.convert("RGBA")
                flat = Image.new("RGB", rgba.size, BACKGROUND)
                flat.paste(rgba, mask=rgba.getchannel("A"))
            else:
                flat = image.convert("RGB")
            flat.thumbnail((size, size), Image.Resampling.LANCZOS)
            return flat
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def thumbnail_strip(thumbs: Sequence[Any], size: int = THUMB, gap: int = GAP) -> bytes:
    """One row of thumbnails, each centred in a ``size`` square, as PNG bytes."""
    from PIL import Image

    strip = Image.new("RGB", (gap + len(thumbs) * (size + gap), size + 2 * gap), (255, 255, 255))
    for i, thumb in enumerate(thumbs):
        x = gap + i * (size + gap) + (size - thumb.width) // 2
        strip.paste(thumb, (x, gap + (size - thumb.height) // 2))
    buf = io.BytesIO()
    strip.save(buf, "PNG", compress_level=1)  # 6 ms a strip against 14 at level 6, for 12% more bytes
    return buf.getvalue()
