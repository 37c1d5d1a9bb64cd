"""The "TFRecord datasets" page: a read-only FastAPI app the Airflow plugin mounts (see ``app.py``)."""

from .app import create_app

__all__ = ["create_app"]
