"""Rewrite the generated blocks of docs/ from the code that owns them (``make docs``).

A block is the text between ``<!-- generated: NAME -->`` and ``<!-- /generated -->``; NAME picks
its maker below. ``tests/project/test_readme.py`` fails while a block is out of date.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))

from image_tfrecords import options  # noqa: E402 - the package is importable from include/ only now

MAKERS: dict[str, Callable[[], str]] = {"params": options.params_table}
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- /generated -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated block made anew."""
    return BLOCK.sub(lambda m: m.group(1) + MAKERS[m.group(2)]().rstrip("\n") + "\n" + m.group(4), text)


def main() -> int:
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        if (new := render(text)) != text:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
