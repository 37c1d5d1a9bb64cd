"""TF-slim's label file, read and written the way its ``research/slim/datasets/dataset_utils.py`` does
(``read_label_file`` / ``write_label_file``, tensorflow/models): the seed converters' code, with TF 2's
``tf.io.gfile`` in place of TF 1's ``tf.gfile``."""

from __future__ import annotations

import os
from collections.abc import Mapping

LABELS_FILENAME = "labels.txt"  # dataset_utils.LABELS_FILENAME


def read_label_file(dataset_dir: str, filename: str = LABELS_FILENAME) -> dict[int, str]:
    """{id: class name} as TF-slim reads it: the whole file through gfile in binary mode, decoded as
    UTF-8, split at ``\\n`` with empty lines dropped, each line split at its first ``:`` into an int and
    the rest (kept as it is, never stripped)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(os.path.join(dataset_dir, filename), "rb") as f:
        text = f.read().decode()
    labels_to_class_names = {}
    for line in filter(None, text.split("\n")):
        colon = line.index(":")
        labels_to_class_names[int(line[:colon])] = line[colon + 1:]
    return labels_to_class_names


def write_label_file(labels_to_class_names: Mapping[int, str], dataset_dir: str,
                     filename: str = LABELS_FILENAME) -> None:
    """As TF-slim writes it: one ``"%d:%s\\n"`` line per entry of the mapping, in its order, text mode."""
    import tensorflow as tf

    with tf.io.gfile.GFile(os.path.join(dataset_dir, filename), "w") as f:
        for label, class_name in labels_to_class_names.items():
            f.write("%d:%s\n" % (label, class_name))  # noqa: UP031 - the seed's own formatting
