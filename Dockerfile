# Airflow image for the `image_tfrecords` stack (see docker-compose.yaml).
#
# Extends the official image the way https://airflow.apache.org/docs/docker-stack/build.html
# describes: copy the requirements file in and pip-install it as the `airflow` user.
#
# requirements.txt is the runtime lock only (Airflow, its Amazon, Postgres and Celery providers,
# and the package's own dependencies; no TensorFlow, no SeaweedFS, no test tools), every file
# hash-checked. It pins apache-airflow itself, so pip cannot up- or downgrade it; the base tag must
# match that pin (tests/test_docker_compose.py checks this). Regenerate it with `make lock`.
FROM apache/airflow:3.3.2-python3.11

# The base image already runs as `airflow`; say so explicitly so that a later edit adding
# a `USER root` block (e.g. for apt packages) cannot leave pip running as root.
USER airflow

COPY --chown=airflow:root requirements.txt /requirements.txt
RUN pip install --no-cache-dir --require-hashes -r /requirements.txt

# The package itself, so that `image-tfrecords` is a command in every container. Its dependencies
# came from the lock above (--no-deps), and setuptools, which builds it, is pinned there too
# (--no-build-isolation: nothing unpinned is fetched). pip builds in the source tree, so it builds
# a scratch copy that `airflow` owns. docker-compose.yaml puts the mounted ./include first on
# PYTHONPATH, so edits there take effect without rebuilding this installed copy. The package's C
# parts (images/_thumbstats.c, source/_lstat.c) are optional: where the base image has no C compiler
# they are left out and inspection and listing use their Python fallbacks (the same answers, slower);
# build-essential added in a `USER root` step builds them.
COPY --chown=airflow:root pyproject.toml README.md /opt/image-tfrecords/
COPY --chown=airflow:root include/ /opt/image-tfrecords/include/
RUN src="$(mktemp -d)" \
    && cp -r /opt/image-tfrecords/. "$src" \
    && pip install --no-cache-dir --no-deps --no-build-isolation "$src" \
    && rm -rf "$src"
