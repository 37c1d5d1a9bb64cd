"""Airflow plugin: a "TFRecord datasets" page in the UI's navigation, listing published datasets.

The page is the read-only FastAPI app of ``image_tfrecords_ui`` (logic in
``include/image_tfrecords/readers/browse.py``), mounted at ``/image-tfrecords`` and embedded in the UI by
an external view with a ``url_route``. The app is built only when the API server asks for it, so
schedulers, DAG processors and workers that load plugins never import FastAPI for it.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/image-tfrecords"


@cache
def _app() -> Any:
    from image_tfrecords_ui.app import airflow_access, airflow_login_url, create_app

    return create_app(dependencies=airflow_access(), login_url=airflow_login_url)


class ImageTFRecordsPlugin(AirflowPlugin):
    """Registers the page's FastAPI app and its navigation entry."""

    name = "image_tfrecords"
    external_views: ClassVar[list[dict[str, Any]]] = [{
        "name": "TFRecord datasets",
        "href": URL_PREFIX.lstrip("/") + "/",  # relative to the UI's base URL
        "url_route": "tfrecord-datasets",  # shown inside the UI at /plugin/tfrecord-datasets
        "destination": "nav",
        "icon": URL_PREFIX.lstrip("/") + "/icon.svg",
        "icon_dark_mode": URL_PREFIX.lstrip("/") + "/icon-dark.svg",
        "nav_top_level": True,  # its own toolbar entry rather than one in the "Plugins" menu
    }]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [{"app": _app(), "url_prefix": URL_PREFIX, "name": "TFRecord datasets"}]
