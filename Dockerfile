# Airflow image for the `image_tfrecords` stack (see docker-compose.yaml).
#
# Extends the official image the way https://airflow.apache.org/docs/docker-stack/build.html
# describes: copy the requirements file in and pip-install it as the `airflow` user, keeping
# apache-airflow itself pinned so pip cannot up- or downgrade it while resolving the rest.
#
# The base tag must match the `apache-airflow==` pin in requirements.txt
# (tests/test_docker_compose.py checks this).
FROM apache/airflow:3.3.2-python3.11

# The base image already runs as `airflow`; say so explicitly so that a later edit adding
# a `USER root` block (e.g. for apt packages) cannot leave pip running as root.
USER airflow

COPY --chown=airflow:root requirements.txt /requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /requirements.txt
