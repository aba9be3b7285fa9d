"""What /proc says about a process: alive or not, its children, its command line, its CPU. Runtime
level: the job's lease (``pipelines.lease``) asks it as much as the local broker, the cluster
and the drills do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Every process's pid and the fields of its ``/proc/<pid>/stat`` after the command name."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        yield int(stat.parent.name), fields


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    return [child for child, fields in _stats() if int(fields[1]) == pid]


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by a process and its living descendants, with
    the children each has already reaped."""
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    for pid, fields in _stats():
        parent[pid] = int(fields[1])
        used[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo.extend(child for child, ppid in parent.items() if ppid == pid)
    return total / os.sysconf("SC_CLK_TCK")
