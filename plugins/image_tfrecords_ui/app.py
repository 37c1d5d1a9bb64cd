"""The read-only FastAPI app behind the "TFRecord datasets" page (mounted by the Airflow plugin).

Routes (relative to the mount prefix, e.g. ``/image-tfrecords``):

- ``GET /``: every published dataset and its newest versions under each destination root.
- ``GET /datasets/{root}/{dataset}``: all published versions of one dataset.
- ``GET /datasets/{root}/{dataset}/{version}/card``: the version's ``card.html``.
- ``GET /datasets/{root}/{dataset}/{version}/{file}``: ``card.md``, ``card/**/*.png``, ``manifest.json``,
  ``labels.csv``, ``rejects.csv`` (nothing else), streamed from the store.

The app proxies bytes: no credential or presigned URL reaches the browser, and error pages name no
endpoint. Store access and authentication are injected (``create_app``), so tests can run it on a
plain ``Storage`` without an Airflow API server. A signed-out browser (a GET that accepts HTML) is sent to
Airflow's sign-in page and back; any other client gets the 401 as Airflow's own API answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from image_tfrecords.readers import browse
from image_tfrecords.storage import Storage

log = logging.getLogger(__name__)
StorageFactory = Callable[[], Storage]
LoginUrl = Callable[[str], str]  # the sign-in page's URL, given the URL to come back to

INDEX_LIMIT = 10  # versions per dataset on the overview page
# No scripts, forms or foreign content on any page; the card (the pipeline's HTML) gets the same policy.
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'none'; "
            "base-uri 'none'; frame-ancestors 'self'")
ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="{color}" '
        'stroke-width="1.8" stroke-linecap="round" stroke-linejoin="round"><ellipse cx="12" cy="5" rx="8" ry="3"/>'
        '<path d="M4 5v14c0 1.7 3.6 3 8 3s8-1.3 8-3V5"/><path d="M4 12c0 1.7 3.6 3 8 3s8-1.3 8-3"/></svg>')
ICON_COLORS = {"light": "#d97706", "dark": "#fbbf24"}  # amber: legible on the nav's background and its highlight

_templates = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")),
                         autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)


def airflow_storage() -> Storage:
    """A Storage whose S3 client comes from the Airflow connection ``aws_default`` (as in the DAG)."""
    from image_tfrecords.airflow_glue import airflow_storage as storage

    return storage()


def airflow_access(dag_id: str = "image_tfrecords") -> list[Any]:
    """FastAPI dependencies: a logged-in Airflow user who may use the UI and read the DAG ``dag_id``.

    Airflow does not authenticate plugin apps itself (a mounted app inherits no dependency); these
    are the checks its own API uses: the JWT from the ``Authorization`` header or the UI's cookie.
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_dag, requires_access_view

    return [Depends(requires_access_view(AccessView.WEBSITE)),
            Depends(requires_access_dag("GET", param_dag_id=dag_id))]


def airflow_login_url(next_url: str) -> str:
    """Airflow's sign-in entry, ``/api/v2/auth/login?next=...`` under the API's base path: where Airflow's own UI
    sends a signed-out user. It checks ``next`` is on this server and hands over to the auth manager's login page."""
    from airflow.api_fastapi.app import API_ROOT_PATH

    return f"{API_ROOT_PATH.rstrip('/')}/api/v2/auth/login?{urlencode({'next': next_url})}"


def _signed_out_browser(request: Request, exc: StarletteHTTPException) -> bool:
    """A browser page load without a usable sign-in: no token, an expired or an unreadable one (a 403 of a token
    the server cannot read, as Airflow's UI takes it; a signed-in user who lacks access is not one)."""
    unusable = exc.status_code == 401 or (exc.status_code == 403 and exc.detail == "Invalid JWT token")
    return unusable and request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "")


def _base(request: Request) -> str:
    """The mount prefix as the browser sees it (``root_path`` includes Airflow's base path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _templates.get_template(template).render(base=_base(request), **context)
    return HTMLResponse(html, status_code=status, headers={
        "Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _guarded(request: Request, make: Callable[[], Response]) -> Response:
    """``make()``, or a 404 page for NotFound, or a 502 page naming no endpoint for a store error."""
    try:
        return make()
    except browse.NotFound as exc:
        return _page(request, "error.html", 404, title="Not found", message=_sentence(str(exc)))
    except Exception as exc:
        log.exception("TFRecord datasets page: %s failed", request.url.path)
        return _page(request, "error.html", 502, title="The dataset store cannot be read",
                     message=_sentence(browse.safe_error(exc)) + " The API server's log has the details.")


def _icon(color: str) -> Response:
    return Response(ICON.format(color=color), media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


def _root_index(text: str, roots: Sequence[str]) -> int:
    if not text.isdigit() or int(text) >= len(roots):
        raise browse.NotFound("no such destination")
    return int(text)


def create_app(roots: Sequence[str] | None = None, storage_factory: StorageFactory = airflow_storage,
               dependencies: Sequence[Any] | None = None, login_url: LoginUrl | None = None) -> FastAPI:
    """The app; ``roots`` default to $IMAGE_TFRECORDS_DESTINATION (read now), dependencies to none. With
    ``login_url``, a signed-out browser is redirected to it (coming back to the page it asked for)."""
    roots = list(roots) if roots is not None else browse.destination_roots()
    app = FastAPI(title="TFRecord datasets", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=list(dependencies or []))

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if login_url is not None and _signed_out_browser(request, exc):
            return RedirectResponse(login_url(str(request.url)), headers={"Cache-Control": "no-store"})
        if exc.status_code in (401, 403):  # the JSON answer Airflow's own API gives
            return JSONResponse({"detail": exc.detail}, exc.status_code, headers=getattr(exc, "headers", None))
        missing = exc.status_code in (404, 405)
        return _page(request, "error.html", exc.status_code, title="Not found" if missing else "Error",
                     message="There is no such page." if missing else str(exc.detail))

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> Response:
        storage = storage_factory()
        listing = [browse.list_root(storage, i, root, INDEX_LIMIT) for i, root in enumerate(roots)]
        return _page(request, "index.html", roots=listing)

    @app.get("/icon.svg")
    def icon() -> Response:
        return _icon(ICON_COLORS["light"])

    @app.get("/icon-dark.svg")
    def icon_dark() -> Response:
        return _icon(ICON_COLORS["dark"])

    @app.get("/datasets/{root}/{dataset}", response_class=HTMLResponse)
    def dataset_page(request: Request, root: str, dataset: str) -> Response:
        def page() -> Response:
            index = _root_index(root, roots)
            info = browse.list_dataset(storage_factory(), roots[index], dataset)
            if info is None:
                raise browse.NotFound("no such dataset")
            return _page(request, "dataset.html", ds=info, root_index=index)

        return _guarded(request, page)

    def serve(request: Request, root: str, dataset: str, version: str, path: str) -> Response:
        def stream() -> Response:
            index = _root_index(root, roots)
            chunks, kind = browse.open_file(storage_factory(), roots[index], dataset, version, path)
            return StreamingResponse(chunks, media_type=kind, headers={
                "Content-Security-Policy": PAGE_CSP,
                "X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=300"})

        return _guarded(request, stream)

    @app.get("/datasets/{root}/{dataset}/{version}/card")
    def card(request: Request, root: str, dataset: str, version: str) -> Response:
        return serve(request, root, dataset, version, browse.CARD)

    @app.get("/datasets/{root}/{dataset}/{version}/card/{image:path}")
    def card_image(request: Request, root: str, dataset: str, version: str, image: str) -> Response:
        return serve(request, root, dataset, version, f"card/{image}")

    @app.get("/datasets/{root}/{dataset}/{version}/{name}")
    def version_file(request: Request, root: str, dataset: str, version: str, name: str) -> Response:
        return serve(request, root, dataset, version, name)

    return app
