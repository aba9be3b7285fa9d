"""The bench's CPU measure counts a run's descendants (the Spark JVM is the worker's child), the
living and the reaped, not only the worker's own process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from app.runtime.processes import tree_cpu_seconds

# Burns about half a second of CPU, says so, then waits (alive) until its stdin closes.
BURNER = """
import sys, time
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
open(sys.argv[1], "w").write("done")
sys.stdin.read()
"""


def _burn(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    done = tmp_path / name
    child = subprocess.Popen([sys.executable, "-c", BURNER, str(done)], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not done.exists():
        assert child.poll() is None, "the burner ended early"
        assert time.monotonic() < deadline, "the burner never finished burning"
        time.sleep(0.02)
    return child


def test_a_living_child_and_a_reaped_one_both_count(tmp_path: Path) -> None:
    before = tree_cpu_seconds(os.getpid())
    own_before = time.process_time()
    child = _burn(tmp_path, "alive")
    try:
        alive = tree_cpu_seconds(os.getpid())
        assert alive - before >= 0.4, (before, alive)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    # reaped: its CPU is now in this process's cutime/cstime, so the total does not drop
    reaped = tree_cpu_seconds(os.getpid())
    assert reaped >= alive - 0.05, (alive, reaped)
    # the burn was the child's, not this process's
    assert time.process_time() - own_before < 0.4


def test_only_the_given_process_and_its_descendants_count(tmp_path: Path) -> None:
    end = time.process_time() + 1.0
    while time.process_time() < end:  # this process's own CPU, which the child's tree excludes
        pass
    child = _burn(tmp_path, "other")
    try:
        assert 0.4 <= tree_cpu_seconds(child.pid) < 0.9
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
