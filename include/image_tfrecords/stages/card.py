"""Stage 7: render the dataset card (card.md, card.html, card/*.png) of the validated build."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from .. import layout
from ..config import BuildConfig
from ..documents import read_json, read_rows, write_json
from ..imaging import record_image
from ..progress import summarized
from ..reading import read_source
from ..storage import Storage, join
from .staging import CARD, CARD_INDEX, LABELS, MANIFEST, REJECTS, staged


def _rows(storage: Storage, uri: str) -> Callable[[], Iterator[dict[str, str]]]:
    """A callable giving a fresh iterator over the CSV rows at ``uri`` each time."""
    def rows() -> Iterator[dict[str, str]]:
        with read_rows(storage, uri) as it:
            yield from it
    return rows


@summarized
def card_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Render the card into staging (``card-files/``, listed in ``card-files.json``)."""
    from ..card import PreviousVersion, build_card

    manifest = read_json(storage, staged(cfg, MANIFEST))
    previous = None
    if manifest["previous_version"]:
        earlier = join(cfg.dataset_uri, manifest["previous_version"])
        previous = PreviousVersion(layout.read_manifest(storage, earlier), _rows(storage, join(earlier, layout.LABELS)))

    def fetch_image(row: dict[str, str]) -> bytes | None:
        """The record's image bytes, from the source (None if it changed or vanished since the build)."""
        try:
            data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
            if hashlib.sha256(data).hexdigest() != row["sha256"]:
                return None
            return record_image(data, row, cfg.image_options, cfg.max_pixels, viewable=True)
        except Exception:  # RejectedImage, ValueError, Pillow's errors: no sample rather than no card
            return None

    files = build_card(manifest, _rows(storage, staged(cfg, LABELS)), _rows(storage, staged(cfg, REJECTS)),
                       previous, fetch_image)
    for name in sorted(files):
        storage.write_bytes(staged(cfg, CARD, name), files[name])
    write_json(storage, staged(cfg, CARD_INDEX), sorted(files))
    return {"files": len(files), "bytes": sum(map(len, files.values()))}
