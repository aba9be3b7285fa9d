"""The README quick start's main command (`make demo` runs `adattr demo`), as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_generates_runs_and_verifies(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADATTR_")},
        "ADATTR_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ADATTR_WAREHOUSE": str(tmp_path / "warehouse"),
        "ADATTR_CHECKPOINTS": str(tmp_path / "checkpoints"),
        "ADATTR_DATA_DIR": str(tmp_path / "data"),
        "ADATTR_INPUT_TOPIC": "quickstart-events",
        "ADATTR_SPARK_MASTER": "local[2]",
    }
    adattr = Path(sys.executable).with_name("adattr")
    done = subprocess.run(
        [str(adattr), "demo", "--events", "3000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verify: OK" in done.stdout
    assert "cmp-000" in done.stdout  # the per-campaign summary
    # A second demo resets what the first created and verifies again.
    again = subprocess.run(
        [str(adattr), "demo", "--events", "1000", "--seed", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "verify: OK" in again.stdout


def test_demo_refuses_to_wipe_data_it_did_not_create(kafka_bootstrap: str, tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    (warehouse / "precious").mkdir(parents=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADATTR_")},
        "ADATTR_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ADATTR_WAREHOUSE": str(warehouse),
        "ADATTR_CHECKPOINTS": str(tmp_path / "checkpoints"),
        "ADATTR_DATA_DIR": str(tmp_path / "data"),
        "ADATTR_INPUT_TOPIC": "quickstart-refuse",
    }
    adattr = Path(sys.executable).with_name("adattr")
    done = subprocess.run(
        [str(adattr), "demo"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 1
    assert "holds data it did not create" in done.stderr or "data it did not create" in done.stderr
    assert (warehouse / "precious").exists()
