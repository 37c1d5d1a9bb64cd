"""The card's "Load this version" section: short Keras (``tf.data``) and PyTorch snippets that read the version at
its published URI, with the reading API docs/loader.md and docs/readers.md document (``load_split``,
``RecordSource`` with ``ImageDataset``). tests/pipeline/test_card_agrees.py runs them on a built version."""

from __future__ import annotations

import json

from ..published.manifest import Manifest, image_shape
from ..records.schema import ordered_splits
from .render import Block, Code, Heading, Para

SIZE = (224, 224)  # (height, width) the snippets resize to when the build did not make every image one size
BATCH = 32


def _splits(manifest: Manifest) -> tuple[str, str | None]:
    """The split to train on (train, else the first with records) and one to validate on (validation, else test,
    else another with records; None when there is no other)."""
    names = [name for name in ordered_splits(manifest.splits) if manifest.splits[name].num_records]
    names = names or list(ordered_splits(manifest.splits)) or ["train"]
    train = "train" if "train" in names else names[0]
    others = [name for name in names if name != train]
    return train, next((name for name in ("validation", "test") if name in others), others[0] if others else None)


def _q(text: str) -> str:
    """``text`` as a Python string literal in double quotes (JSON's escapes are Python's)."""
    return json.dumps(text, ensure_ascii=False)


def _size(manifest: Manifest) -> tuple[int, int]:
    height, width, _ = image_shape(manifest)
    return (height, width) if height and width else SIZE


def keras_snippet(uri: str, manifest: Manifest) -> str:
    """``load_split`` of the version at ``uri``: batches a Keras model's ``fit`` takes as they are."""
    train, other = _splits(manifest)
    height, width = _size(manifest)
    multi = manifest.multi_label
    label = f"float32 [<={BATCH}, {len(manifest.classes)}] multi-hot" if multi else f"int64 [<={BATCH}]"
    lines = [
        "from image_tfrecords import label_names, load_split",
        "",
        f"VERSION = {_q(uri)}",
        "classes = label_names(VERSION)  # classes[label] is the class name",
        f"train = load_split(VERSION, {_q(train)}, image_size=({height}, {width}), channels=3, batch_size={BATCH}, "
        "shuffle=True, seed=0)",
    ]
    if other is not None:
        lines.append(f"validation = load_split(VERSION, {_q(other)}, image_size=({height}, {width}), channels=3, "
                     f"batch_size={BATCH})")
    lines += [
        f"images, labels = next(iter(train))  # uint8 [<={BATCH}, {height}, {width}, 3] (0..255), {label}",
        "print(int(train.cardinality()), \"batches per epoch;\", images.shape, labels.dtype.name)",
        "# model.fit(train" + (", validation_data=validation" if other is not None else "")
        + ", epochs=10)  # put keras.layers.Rescaling(1 / 255) first in the model",
    ]
    return "\n".join(lines)


def torch_snippet(uri: str, manifest: Manifest) -> str:
    """``RecordSource`` and ``ImageDataset`` of the version at ``uri`` in a ``DataLoader``."""
    train, _ = _splits(manifest)
    height, width = _size(manifest)
    lines = [
        "import torch",
        "",
        "from image_tfrecords import RecordSource",
        "from image_tfrecords.readers.torch_dataset import ImageDataset",
        "",
        f"VERSION = {_q(uri)}",
        f"source = RecordSource(VERSION, {_q(train)}, fields=(\"image\", \"label\"))",
        "classes = source.classes  # classes[label] is the class name",
        f"train = ImageDataset(source, image_size=({height}, {width}))  # image: uint8 [3, {height}, {width}], RGB",
    ]
    if manifest.multi_label:  # a record's label is a list of class ids: made multi-hot here
        lines += [
            "",
            "",
            "def multi_hot(records):",
            "    labels = torch.zeros(len(records), len(classes))",
            "    for i, record in enumerate(records):",
            "        for label in record[\"label\"]:",
            "            labels[i, label] = 1",
            "    return {\"image\": torch.stack([record[\"image\"] for record in records]), \"label\": labels}",
            "",
            "",
            f"loader = torch.utils.data.DataLoader(train, batch_size={BATCH}, shuffle=True, num_workers=2, "
            "collate_fn=multi_hot)",
        ]
        label = f"float32 [<={BATCH}, {len(manifest.classes)}] multi-hot"
    else:
        lines.append(f"loader = torch.utils.data.DataLoader(train, batch_size={BATCH}, shuffle=True, num_workers=2)")
        label = f"int64 [<={BATCH}]"
    lines += [
        "batch = next(iter(loader))",
        f"images, labels = batch[\"image\"], batch[\"label\"]  # uint8 [<={BATCH}, 3, {height}, {width}], {label}",
        "print(len(loader), \"batches per epoch;\", tuple(images.shape), labels.dtype)",
    ]
    return "\n".join(lines)


def load_blocks(uri: str, manifest: Manifest) -> list[Block]:
    """The section: where the version is, and the two snippets."""
    return [
        Heading("Load this version"),
        Para(f"The version as published at {uri} (pinned: a dataset URI without the version reads the version "
             "latest.json names). Keras, through tf.data (pip install \"image-tfrecords[loader]\"; every option in "
             "docs/loader.md):"),
        Code(keras_snippet(uri, manifest)),
        Para("PyTorch, without TensorFlow (pip install \"image-tfrecords[torch]\"; docs/readers.md):"),
        Code(torch_snippet(uri, manifest)),
    ]
