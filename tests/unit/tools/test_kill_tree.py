"""The drills' SIGKILL reaches the driver and the children it started in sessions of their own
(the Spark JVM runs in one, so that a group SIGTERM stops only the driver)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from app.tools.drills import kill_tree

# A "driver" that starts a "JVM" in a session of its own (which starts a worker of its own),
# writes their pids, and waits.
DRIVER = """
import subprocess, sys, time
jvm = subprocess.Popen(
    [sys.executable, "-c",
     "import subprocess, sys, time;"
     "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
     "open(sys.argv[1], 'w').write(str(w.pid)); time.sleep(600)", sys.argv[2]],
    start_new_session=True,
)
open(sys.argv[1], "w").write(str(jvm.pid))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, waiting for its parent to reap it


def _wait_for_file(path: Path) -> int:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)  # polling for the condition (the file), not standing in for it
    return int(path.read_text())


def test_kill_tree_kills_children_in_their_own_sessions(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path / "jvm"), str(tmp_path / "worker")],
        start_new_session=True,
    )
    jvm = _wait_for_file(tmp_path / "jvm")
    worker = _wait_for_file(tmp_path / "worker")
    assert os.getpgid(jvm) == jvm != os.getpgid(driver.pid)

    kill_tree(driver)  # type: ignore[arg-type]

    assert driver.returncode == -9
    deadline = time.monotonic() + 10
    while _alive(jvm) or _alive(worker):
        assert time.monotonic() < deadline, "a child outlived kill_tree"
        time.sleep(0.05)
