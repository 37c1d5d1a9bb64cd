"""Turn folders of labelled images into validated, published TFRecord datasets.

Plain Python: the DAG in ``dags/`` and the command line both call ``stages``; Airflow is imported by
one module only, ``airflow_glue``, inside its functions. Heavy libraries (Pillow, boto3, TensorFlow,
pandas) are imported where they are used.

The reading side is exported here lazily (PEP 562): ``from image_tfrecords import load_split``
imports ``readers.loader`` on first use (``RecordSource``: ``readers.record_source``, with numpy), so
``import image_tfrecords`` imports nothing (not even ``typing``).
"""

from __future__ import annotations

import importlib

__version__ = "0.7.4"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (PEP 781)
if TYPE_CHECKING:
    from .readers.decode import decode_image
    from .readers.loader import label_names, labels, load_split
    from .readers.record_source import DamagedRecordError, RecordSource

_LAZY = {"label_names": "readers.loader", "labels": "readers.loader", "load_split": "readers.loader",
         "RecordSource": "readers.record_source", "DamagedRecordError": "readers.record_source",
         "decode_image": "readers.decode"}
__all__ = ["DamagedRecordError", "RecordSource", "__version__", "decode_image", "label_names", "labels", "load_split"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
