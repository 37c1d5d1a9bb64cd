"""Turn folders of labelled images into validated, published TFRecord datasets.

Pure Python (no Airflow import): the DAG in ``dags/`` and the command line both call
``stages``. Heavy libraries (Pillow, boto3) are imported where they are used.
"""

__version__ = "0.1.0"
