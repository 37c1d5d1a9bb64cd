# Airflow image for the `image_tfrecords` stack (see docker-compose.yaml).
#
# Extends the official image the way https://airflow.apache.org/docs/docker-stack/build.html
# describes: apt packages as root, pip as the `airflow` user. Three stages:
#   runtime - the official image plus the runtime lock, shared by the two below (installed once);
#   build   - runtime plus a C compiler: builds the package's wheel with its compiled parts;
#   (final) - runtime plus that wheel: no compiler in the image that runs.
#
# requirements.txt is the runtime lock only (Airflow, its Amazon, Postgres and Celery providers,
# and the package's own dependencies; no TensorFlow, no SeaweedFS, no test tools), every file
# hash-checked. It pins apache-airflow itself, so pip cannot up- or downgrade it; the base tag must
# match that pin (tests/airflow/test_docker_compose.py checks this). Regenerate it with `make lock`.
FROM apache/airflow:3.3.2-python3.11 AS runtime

# The base image already runs as `airflow`; say so, so that pip never runs as root here.
USER airflow

COPY --chown=airflow:root requirements.txt /requirements.txt
RUN pip install --no-cache-dir --require-hashes -r /requirements.txt


FROM runtime AS build

USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
USER airflow

# The package's wheel. Its dependencies come from the lock (--no-deps), and so does setuptools,
# which builds it (--no-build-isolation: nothing unpinned is fetched). pip builds in the source
# tree, so it builds a scratch copy that `airflow` owns.
COPY --chown=airflow:root pyproject.toml README.md /opt/image-tfrecords/
COPY --chown=airflow:root include/ /opt/image-tfrecords/include/
RUN src="$(mktemp -d)" \
    && cp -r /opt/image-tfrecords/. "$src" \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/wheels "$src" \
    && rm -rf "$src"
# The compiled parts are optional to setuptools (a failed compile only warns), so fail here when
# the wheel lacks one of those compiled.py names.
RUN python -c "import runpy, sys, zipfile; \
parts = runpy.run_path(sys.argv[1])['PARTS']; \
names = zipfile.ZipFile(sys.argv[2]).namelist(); \
lacking = [part for part, (module, _) in parts.items() \
if not any(n.startswith(module.replace('.', '/') + '.') and n.endswith('.so') for n in names)]; \
assert not lacking, f'the wheel lacks compiled parts: {lacking}'" \
    /opt/image-tfrecords/include/image_tfrecords/compiled.py /tmp/wheels/image_tfrecords-*.whl


FROM runtime

# The package, so that `image-tfrecords` is a command in every container; the build fails unless
# every compiled part imports here, in the image that runs (no compiler, same Python).
COPY --from=build --chown=airflow:root /tmp/wheels/ /opt/image-tfrecords/
RUN pip install --no-cache-dir --no-deps /opt/image-tfrecords/image_tfrecords-*.whl \
    && python -c "from image_tfrecords import compiled; assert not compiled.missing(), compiled.line()"
