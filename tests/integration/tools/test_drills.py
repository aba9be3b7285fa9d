"""The short version of the single-node drills, as a user runs it: `adattr drill crash`, with the
broker drill's outage and the replay drill's replay in the same run.

Each drill generates its own traffic and truth, hurts the job, then verifies every table
against the truth, audits the ledger and reconciles every table from bronze, exiting 1 on any
discrepancy (those checks' own ability to fail is pinned in test_job.py). The crash drill here
hits two crash points no other test does (inside Spark's state commit; between two Delta
commits of one batch), plus one random SIGKILL (CI's time budget: each kill is a job start,
~25 s); the full drill (README) hits all seven and kills at random five times. It then runs the
replay drill's replay (`drill replay` is that replay after a run without crashes) on the
tables the crashes left: every table must be unchanged by it. The broker drill's outage runs
inside it too, in its last run (`drill broker` is that outage in a run without crashes).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.stack.broker import free_port
from tests.builders import adattr_env, drill_passed, run_adattr

pytestmark = pytest.mark.integration


def _env(tmp_path: Path, bootstrap: str, controller: int = 0) -> dict[str, str]:
    return adattr_env(
        bootstrap_servers=bootstrap,
        kafka_controller_port=str(controller or free_port()),
        data_dir=str(tmp_path / "data"),
        spark_master="local[2]",
    )


def test_crash_drill_with_a_broker_outage_then_a_replay(tmp_path: Path) -> None:
    """The drill starts its own broker (none runs at the address it is given), as the outage
    needs: the named crash points, a random kill, the broker drill's outage in the last run,
    the replay, then the checks."""
    points = "during_state_store_upload,between_delta_commits"
    done = run_adattr(
        _env(tmp_path, f"127.0.0.1:{free_port()}"),
        *("drill", "crash", "--kills", "1", "--seed", "5", "--events", "1000", "--points", points),
        *("--broker-outage", "5", "--replay"),
        timeout=1200,
    )
    out = drill_passed(done, "crash")
    assert out.count(": killed;") == 2
    assert out.count("SIGKILL to the process tree") == 1
    outage = out.index("broker SIGKILLed with the job running")
    assert out.index("SIGKILL to the process tree") < outage < out.index("broker restarted")
    assert re.search(r"the job (rode it out|stopped .*; restarting)", out)
    replayed = re.search(r"replay --from-offsets .*: \d+s, every table unchanged", out)
    assert replayed and replayed.start() > out.index("finished: "), out
    assert replayed.start() < out.index("verify: OK"), "the checks come after the replay"
