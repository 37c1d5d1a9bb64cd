"""labels.csv columns that become record features (``columns``), and multi-label rows (a ``labels`` column).

``columns`` declares the extra columns and their types, e.g.
``{"caption": "string", "weight": "float", "tags": "string_list"}``. Each becomes a feature of the same
name: ``string`` (bytes), ``int64``, ``float`` (float32), or a variable-length list of one of those
(``*_list``, items split on ``label_separator``; an empty cell is an empty list). Values are checked
when the listing is read: a bad one (``"abc"`` for a float, an empty int64) makes its file a reject
(``bad_metadata``), never a failed build. Values are kept in labels.csv in a normal form (numbers as
Python writes them, list items stripped), so a record's features follow from its row alone.

A labels.csv with a ``labels`` column (instead of ``label``) is *multi-label*: each cell holds one or
more class names separated by ``label_separator``. A record's label set is written sorted and without
repeats (``cat|dog``); its ``image/class/label`` is the variable-length list of their ids.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

TYPES = ("string", "int64", "float", "string_list", "int64_list", "float_list")
_ALIASES = {"str": "string", "bytes": "string", "text": "string", "int": "int64", "float32": "float",
            "str_list": "string_list", "int_list": "int64_list"}
DTYPE = {"string": "string", "int64": "int64", "float": "float"}  # base type -> manifest dtype
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
# labels.csv columns the build writes itself, and the loader's decoded "image": a metadata column cannot take them
RESERVED = frozenset({"image", "filename", "label", "labels", "label_id", "split", "sha256", "width", "height",
                      "channels", "format", "num_bytes", "source_format", "transform", "encoded_sha256",
                      "encoded_bytes", "shard", "shard_position"})
_INT64 = range(-(1 << 63), 1 << 63)
_FLOAT32_MAX = 3.4028234663852886e38


class BadValue(ValueError):
    """A metadata value that does not have its column's type."""


def check_columns(columns: Any) -> dict[str, str]:
    """Validate a ``columns`` declaration; returns it with type aliases resolved."""
    if not isinstance(columns, Mapping):
        raise ConfigError(f"columns must be an object of column name -> type, not {columns!r}")
    out: dict[str, str] = {}
    for name, kind in columns.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"column name {name!r} must start with a letter or '_' and use letters, digits, "
                              "'_', '.' or '-' (at most 100)")
        if name in RESERVED:
            raise ConfigError(f"column {name!r} is a labels.csv column the build writes; rename it in labels.csv")
        kind = _ALIASES.get(kind, kind) if isinstance(kind, str) else kind
        if kind not in TYPES:
            raise ConfigError(f"column {name!r} has type {kind!r}; types are {', '.join(TYPES)}")
        out[name] = kind
    return out


def check_separator(separator: Any) -> str:
    if not isinstance(separator, str) or len(separator) != 1 or separator.isalnum() or separator in "\"\r\n":
        raise ConfigError(f"label_separator must be one character that is not a letter, digit, quote or line "
                          f"break, not {separator!r}")
    return separator


def _number(kind: str, text: str) -> str:
    """The normal form of one int64 or float value."""
    if "_" in text:
        raise BadValue(f"{text!r} is not a {'whole number' if kind == 'int64' else 'float'}")
    if kind == "int64":
        try:
            value = int(text, 10)
        except ValueError:
            raise BadValue(f"{text!r} is not a whole number") from None
        if value not in _INT64:
            raise BadValue(f"{text} is out of the int64 range")
        return str(value)
    try:
        value = float(text)
    except ValueError:
        raise BadValue(f"{text!r} is not a float") from None
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise BadValue(f"{text} is out of the float32 range")
    return repr(value)


def normal_value(kind: str, raw: str | None, separator: str) -> str:
    """The labels.csv form of one metadata cell; BadValue if it does not have the column's type."""
    text = "" if raw is None else raw
    if kind == "string":
        return text
    if kind.endswith("_list"):
        base = kind[: -len("_list")]
        items = [item.strip() for item in text.split(separator)] if text.strip() else []
        if base == "string":
            return separator.join(items)
        return separator.join(_number(base, item) for item in items)
    if not text.strip():
        raise BadValue(f"empty value, {kind} expected")
    return _number(kind, text.strip())


def feature_value(kind: str, text: str, separator: str) -> Any:
    """The feature value of a normal-form cell: bytes, int, float or a list of them."""
    if kind == "string":
        return text.encode()
    if kind == "int64":
        return int(text)
    if kind == "float":
        return float(text)
    items = text.split(separator) if text else []
    if kind == "string_list":
        return [item.encode() for item in items]
    if kind == "int64_list":
        return array("q", [int(item) for item in items])
    return array("d", [float(item) for item in items])


def feature_entry(kind: str) -> dict[str, Any]:
    """The manifest's ``features`` entry of a column."""
    base = kind[: -len("_list")] if kind.endswith("_list") else kind
    return {"dtype": DTYPE[base], "shape": [None] if kind.endswith("_list") else []}


def label_set(cell: str | None, separator: str) -> list[str]:
    """The sorted distinct class names of a ``labels`` cell."""
    return sorted({name.strip() for name in (cell or "").split(separator) if name.strip()})
