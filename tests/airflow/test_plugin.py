"""The "TFRecord datasets" page (plugins/image_tfrecords_ui) with FastAPI's TestClient, on datasets
published by the command line into a real SeaweedFS server."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from image_tfrecords.readers import browse
from image_tfrecords.storage import Storage
from tests.support import run_cli
from tools.seaweedfs import S3Server

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins"))  # as Airflow does with its plugins folder

from image_tfrecords_ui.app import airflow_access, airflow_login_url, create_app  # noqa: E402

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def drop_card(server: S3Server, storage: Storage, version_uri: str) -> None:
    """Make a published version look like one from before the pipeline wrote cards."""
    bucket, prefix = version_uri[len("s3://"):].split("/", 1)
    for name in ("card.html", "card.md"):
        server.client().delete_object(Bucket=bucket, Key=f"{prefix}/{name}")
    storage.delete_tree(f"{version_uri}/card")


def publish(server: S3Server, source: Path, destination: str, dataset: str, version: str) -> str:
    """Publish ``source`` with the command line (boto3's environment pointed at ``server``); returns the version."""
    result = run_cli("build", "--source", str(source), "--destination", destination, "--dataset", dataset,
                     "--version", version, "--workers", "1", "--no-progress",
                     env={**_base_env(), **server.env()})
    assert result.returncode == 0, result.stderr
    return version


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def subset(sample_dir: Path, target: Path, per_class: int) -> Path:
    for folder in sorted(p for p in sample_dir.iterdir() if p.is_dir()):
        for path in sorted(folder.iterdir())[:per_class]:
            (target / folder.name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / folder.name / path.name)
    return target


@pytest.fixture(scope="module")
def store(s3_server: S3Server, sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """s3://BUCKET/datasets: shapes v1 (card removed, as before cards existed), v2 (6 per class), v10 (all 60),
    an unpublished v11 (no _SUCCESS) and a build in _staging/; plus "empty", a folder with nothing published."""
    bucket = f"test-plugin-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    root = f"s3://{bucket}/datasets"
    tmp = tmp_path_factory.mktemp("plugin")
    storage = Storage(s3_server.client)
    publish(s3_server, subset(sample_dir, tmp / "tiny", 2), root, "shapes", "v1")
    publish(s3_server, subset(sample_dir, tmp / "half", 6), root, "shapes", "v2")
    publish(s3_server, sample_dir, root, "shapes", "v10")
    shapes = f"{root}/shapes"
    drop_card(s3_server, storage, f"{shapes}/v1")
    storage.write_bytes(f"{shapes}/v11/manifest.json", storage.read_bytes(f"{shapes}/v10/manifest.json"))
    storage.write_bytes(f"{shapes}/v11/card.html", b"<h1>unpublished</h1>")
    storage.write_bytes(f"{shapes}/_staging/v12/plan.json", b"{}")
    storage.write_bytes(f"{root}/empty/_staging/v1/plan.json", b"{}")
    return {"root": root, "shapes": shapes, "storage": storage, "bucket": bucket}


@pytest.fixture
def client(store: dict, s3_server: S3Server) -> Iterator[TestClient]:
    app = create_app([store["root"]], lambda: Storage(s3_server.client))
    with TestClient(app) as test_client:
        yield test_client


def versions_shown(html: str) -> list[str]:
    return re.findall(r'<tr class="version" data-version="([^"]+)"', html)


def row(html: str, version: str) -> str:
    return html.split(f'data-version="{version}"', 1)[1].split("</tr>", 1)[0]


def test_destination_roots_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(browse.DESTINATION_ENV, raising=False)
    assert browse.destination_roots() == ["s3://datasets/image-tfrecords"]
    monkeypatch.setenv(browse.DESTINATION_ENV, " s3://a/x/ , /data/out,")
    assert browse.destination_roots() == ["s3://a/x", "/data/out"]


def test_index_lists_published_versions_newest_first(client: TestClient, store: dict) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert versions_shown(html) == ["v10", "v2", "v1"]  # natural order: v10 after v2; v11 is unpublished
    assert re.findall(r'<h2 class="dataset"[^>]*>(\w+)', html) == ["shapes"]  # "empty" holds only _staging/
    assert "_staging" not in html and "v12" not in html
    manifest = json.loads(store["storage"].read_bytes(f"{store['shapes']}/v10/manifest.json"))
    newest = row(html, "v10")
    assert '<td class="num records">60</td>' in newest
    assert '<td class="num rejected">0</td>' in newest
    assert "3: circles, squares, triangles" in newest
    for split, info in manifest["splits"].items():
        assert f"{split} {info['num_records']}" in newest
    checks = newest.split('<td class="checks">', 1)[1].split("</td>", 1)[0]  # what its build checked
    assert 'class="gate off">gate off<' in checks
    flags = manifest["build"]["quality_flags"]
    # each flag's records and their share of all 60 records, as the card writes them (published.counts.share)
    assert flags and all(f"{flag} {count} ({100 * count / 60:.1f}%)" in checks for flag, count in flags.items())
    assert '<td class="num records">18</td>' in row(html, "v2")
    assert [v for v in versions_shown(html) if 'class="badge latest"' in row(html, v)] == ["v10"]
    assert "latest <code>v10</code>" in html
    assert 'href="/datasets/0/shapes/v2/card"' in row(html, "v2")  # the cards the builds wrote
    assert 'class="card"' not in row(html, "v1")  # no card, no link


def test_list_dataset_limits_and_dataset_page(client: TestClient, store: dict) -> None:
    storage = store["storage"]
    info = browse.list_dataset(storage, store["root"], "shapes", limit=2)
    assert info is not None and [v.version for v in info.versions] == ["v10", "v2"] and info.truncated
    assert info.latest == "v10" and info.versions[0].latest and not info.versions[1].latest
    assert browse.list_dataset(storage, store["root"], "empty") is None
    page = client.get("/datasets/0/shapes")
    assert page.status_code == 200 and versions_shown(page.text) == ["v10", "v2", "v1"]
    assert client.get("/datasets/0/empty").status_code == 404


def test_card_and_allowed_files_are_served(client: TestClient, store: dict) -> None:
    shapes, storage = store["shapes"], store["storage"]
    card = client.get("/datasets/0/shapes/v10/card")
    assert card.status_code == 200 and card.content == storage.read_bytes(f"{shapes}/v10/card.html")
    assert card.headers["content-type"] == "text/html; charset=utf-8"
    assert "<h1>Dataset card: shapes v10</h1>" in card.text
    assert "default-src 'none'" in card.headers["content-security-policy"]  # no script runs
    assert card.headers["x-content-type-options"] == "nosniff"
    pngs = [f"card/{f.key}" for f in storage.iter_files(f"{shapes}/v10/card") if f.key.endswith(".png")]
    assert "card/records.png" in pngs and any(p.startswith("card/samples/") for p in pngs)
    assert all(f"]({png})" in client.get("/datasets/0/shapes/v10/card.md").text for png in pngs)
    expected = {
        "card.html": "text/html; charset=utf-8",
        "card.md": "text/markdown; charset=utf-8",
        "manifest.json": "application/json",
        "dataset_info.json": "application/json",  # TFDS's metadata
        "features.json": "application/json",
        "labels.csv": "text/csv; charset=utf-8",
        "rejects.csv": "text/csv; charset=utf-8",
        **{png: "image/png" for png in pngs},
    }
    for name, kind in expected.items():
        response = client.get(f"/datasets/0/shapes/v10/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == kind, name
        assert response.content == storage.read_bytes(f"{shapes}/v10/{name}"), name


@pytest.mark.parametrize("path", [
    "/datasets/0/shapes/v10/train-00000-of-00001.tfrecord",  # shards are not served
    "/datasets/0/shapes/v10/_SUCCESS",
    "/datasets/0/shapes/v10/plan.json",
    "/datasets/0/shapes/v11/manifest.json",  # not published
    "/datasets/0/shapes/v11/card",
    "/datasets/0/shapes/v1/card",  # published, without a card
    "/datasets/0/shapes/v1/card/records.png",
    "/datasets/0/shapes/v2/card/missing.png",
    "/datasets/0/shapes/v2/card/records.txt",
    "/datasets/0/shapes/_staging/card",
    "/datasets/0/_staging/v12/manifest.json",
    "/datasets/0/shapes/v2/..%2F..%2Flatest.json",
    "/datasets/0/shapes/v2/%2E%2E/manifest.json",
    "/datasets/0/shapes/..%2Fshapes/v2/card",
    "/datasets/0/..%2F..%2Fetc/passwd/card",
    "/datasets/0/shapes/v2/card/..%2F..%2Fv10%2Fcard.html",
    "/datasets/0/shapes/v2/card/samples/..%2F..%2F..%2Fv10%2Fcard%2Frecords.png",
    "/datasets/0/shapes/v2/card/samples/%2E%2E/records.png",
    "/datasets/0/shapes/v2/card/a/b/c/d.png",  # deeper than the card's layout
    "/datasets/0/shapes/v2/card/.hidden.png",
    "/datasets/0/shapes/.hidden/card",
    "/datasets/1/shapes/v2/card",  # one root only
    "/datasets/-1/shapes/v2/card",
    "/datasets/x/shapes/v2/card",
    "/datasets/0/nope",
    "/nope",
])
def test_everything_else_is_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404, (path, response.text[:300])
    assert response.headers["content-type"].startswith("text/html")
    assert "Not found" in response.text


def test_several_roots_local_and_s3(store: dict, s3_server: S3Server, sample_dir: Path, tmp_path: Path) -> None:
    run = run_cli("build", "--source", str(subset(sample_dir, tmp_path / "src", 1)), "--destination",
                  str(tmp_path / "out"), "--dataset", "local", "--version", "20260101T000000Z", "--workers", "1",
                  "--no-progress")
    assert run.returncode == 0, run.stderr
    app = create_app([store["root"], str(tmp_path / "out")], lambda: Storage(s3_server.client))
    with TestClient(app) as client:
        html = client.get("/").text
        assert versions_shown(html) == ["v10", "v2", "v1", "20260101T000000Z"]
        assert 'href="/datasets/1/local/20260101T000000Z/manifest.json"' in html
        manifest = client.get("/datasets/1/local/20260101T000000Z/manifest.json")
        assert manifest.status_code == 200 and manifest.json()["num_records"] == 3


def test_a_version_published_with_the_old_manifest_name_is_listed_and_served(sample_dir: Path, tmp_path: Path) -> None:
    """Versions before 0.2.0 named our manifest dataset_info.json (no TFDS files beside it)."""
    run = run_cli("build", "--source", str(subset(sample_dir, tmp_path / "src", 1)), "--destination",
                  str(tmp_path / "out"), "--dataset", "old", "--version", "v1", "--workers", "1", "--no-progress")
    assert run.returncode == 0, run.stderr
    version = tmp_path / "out" / "old" / "v1"
    for tfds_file in ("dataset_info.json", "features.json", "image.class.label.labels.txt"):
        (version / tfds_file).unlink()
    (version / "manifest.json").rename(version / "dataset_info.json")
    app = create_app([str(tmp_path / "out")], Storage)
    with TestClient(app) as client:
        html = client.get("/").text
        assert versions_shown(html) == ["v1"] and "is missing or invalid" not in html
        assert 'href="/datasets/0/old/v1/dataset_info.json"' in html
        manifest = client.get("/datasets/0/old/v1/dataset_info.json")
        assert manifest.status_code == 200 and manifest.json()["num_records"] == 3


def test_no_credential_or_endpoint_in_any_response(store: dict, s3_server: S3Server) -> None:
    secrets = [s3_server.secret_key, s3_server.access_key, s3_server.endpoint.split("//", 1)[1]]
    wrong = S3Server(s3_server.endpoint, s3_server.access_key, "wrong-secret-value")
    closed = S3Server("http://127.0.0.1:9", "nobody", "nobody-secret")  # nothing listens on port 9
    cases = [
        (s3_server, [store["root"]], ["/", "/datasets/0/shapes", "/datasets/0/shapes/v2/card",
                                      "/datasets/0/shapes/v10/manifest.json", "/datasets/0/shapes/v11/card"]),
        (s3_server, ["s3://no-such-bucket-here/x"], ["/", "/datasets/0/shapes", "/datasets/0/shapes/v2/card"]),
        (wrong, [store["root"]], ["/", "/datasets/0/shapes", "/datasets/0/shapes/v2/card"]),
        (closed, [store["root"]], ["/", "/datasets/0/shapes/v2/card"]),
    ]
    for server, roots, paths in cases:
        factory = (lambda srv: lambda: Storage(lambda: _client(srv)))(server)
        with TestClient(create_app(roots, factory)) as client:
            for path in paths:
                response = client.get(path)
                text = response.text + json.dumps(dict(response.headers))
                # the test server's access key is "tfrecords": the package's name (in the card's load snippets) aside
                text = text.replace("image_tfrecords", "").replace("image-tfrecords", "")
                assert not [s for s in [*secrets, wrong.secret_key, "nobody-secret", "127.0.0.1:9"] if s in text], path
                if server is not s3_server:
                    assert response.status_code in (200, 502), (path, response.status_code)
                    assert "cannot be read" in text or "does not answer" in text or "refused" in text, text[:500]
                    assert 'data-version="' not in text


def _client(server: S3Server):  # type: ignore[no-untyped-def]
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key, region_name=server.region,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                      connect_timeout=2, read_timeout=5))


def test_airflow_auth_is_required(store: dict, s3_server: S3Server) -> None:
    app = create_app([store["root"]], lambda: Storage(s3_server.client), dependencies=airflow_access())
    with TestClient(app) as client:
        for path in ("/", "/datasets/0/shapes/v2/card", "/datasets/0/shapes/v2/labels.csv"):
            response = client.get(path)
            assert response.status_code == 401 and response.json() == {"detail": "Not authenticated"}


def test_a_signed_out_browser_is_sent_to_sign_in_and_back(store: dict, s3_server: S3Server) -> None:
    """Mounted as the API server mounts it: a page load that accepts HTML, without a token, is redirected to
    Airflow's sign-in entry naming the page it asked for; any other client still gets the 401."""
    from fastapi import FastAPI

    server = FastAPI()
    server.mount("/image-tfrecords", create_app([store["root"]], lambda: Storage(s3_server.client),
                                                dependencies=airflow_access(), login_url=airflow_login_url))
    with TestClient(server, follow_redirects=False) as client:
        for path in ("/", "/datasets/0/shapes", "/datasets/0/shapes/v2/card?x=1"):
            page = f"http://testserver/image-tfrecords{path}"
            response = client.get(f"/image-tfrecords{path}", headers={"Accept": BROWSER_ACCEPT})
            assert response.status_code == 307, (path, response.status_code, response.text)
            assert response.headers["location"] == "/api/v2/auth/login?" + urlencode({"next": page})
            assert response.headers["cache-control"] == "no-store"
            for accept in ("application/json", "*/*"):
                response = client.get(f"/image-tfrecords{path}", headers={"Accept": accept})
                assert response.status_code == 401 and response.json() == {"detail": "Not authenticated"}, accept


def test_plugin_loads_from_the_plugins_folder() -> None:
    from airflow._shared.plugins_manager.plugins_manager import _load_plugins_from_plugin_directory

    plugins, errors = _load_plugins_from_plugin_directory(str(ROOT / "plugins"))
    assert errors == {}
    assert [p.name for p in plugins] == ["image_tfrecords"]
    (view,) = plugins[0].external_views
    assert view["name"] == "TFRecord datasets" and view["url_route"] == "tfrecord-datasets"
    assert view["href"] == "image-tfrecords/" and view["destination"] == "nav"
