"""Airflow: the DAG under `airflow dags test`, the real scheduler/api-server stacks, the UI plugin and
page, `make ui`, Docker Compose."""
