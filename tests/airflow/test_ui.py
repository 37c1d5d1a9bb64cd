"""`make ui` (tools/ui.py): airflow standalone with the DAGs, the datasets page and the S3 connection,
started for real, checked through the REST API, and stopped with nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _airflow_processes(home: Path) -> list[str]:
    """Processes whose environment names ``home`` as AIRFLOW_HOME (what the run started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"AIRFLOW_HOME={home}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_make_ui_serves_the_dags_and_the_datasets_page_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IMAGE_TFRECORDS_S3_ENDPOINT"}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "ui.py"), "--check", "--work", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = (tmp_path / "standalone.log").read_text(errors="replace") if (tmp_path / "standalone.log").exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + log[-5000:]
    assert "the DAGs are listed and the datasets page answers" in result.stdout
    assert not _airflow_processes(tmp_path / "airflow")
