"""Turn folders of labelled images into validated, published TFRecord datasets.

Plain Python: the DAG in ``dags/`` and the command line both call ``stages``; Airflow is imported by
one module only, ``airflow_glue``, inside its functions. Heavy libraries (Pillow, boto3, TensorFlow,
pandas) are imported where they are used.

The reading side is exported here lazily (PEP 562): ``from image_tfrecords import load_split``
imports ``readers.loader`` on first use, so ``import image_tfrecords`` imports nothing (not even ``typing``).
"""

from __future__ import annotations

import importlib

__version__ = "0.6.0"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (PEP 781)
if TYPE_CHECKING:
    from .readers.loader import label_names, labels, load_split

_LAZY = {"label_names": "readers.loader", "labels": "readers.loader", "load_split": "readers.loader"}
__all__ = ["__version__", "label_names", "labels", "load_split"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
