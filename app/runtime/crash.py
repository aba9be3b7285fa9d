"""Named crash points, for the crash drills and the tests that prove each one safe.

``ADATTR_CRASH_AT=name[:n][,name[:n]...]`` makes the process SIGKILL itself the n-th time (the
first by default) it reaches ``crash_point(name)``: no clean-up, no flush, no finally blocks,
exactly what a power cut or an OOM kill does. Unset (the default), a crash point costs a
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

# Where the job and the consumer can be killed on purpose (README: "Why each crash point is safe").
POINTS = (
    "during_state_store_upload",  # the stateful operator is writing this batch's state files
    "before_delta_commit",  # the batch is read and classified, no table written yet
    "between_delta_commits",  # bronze, quarantine, late and silver committed; gold not yet
    "after_delta_before_kafka",  # the batch's Delta commits are done, its transaction is not begun
    "in_kafka_transaction",  # records sent inside the open transaction, commit not called
    "after_kafka_before_ledger",  # the transaction is committed, the ledger row is not written
    "after_ledger_before_commit_log",  # the batch is complete; Spark's commit log entry is not
    "consume_before_db_commit",  # the consumer applied a poll in its database, did not commit
)
_hits: Counter[str] = Counter()


def parse(spec: str) -> dict[str, int]:
    """``'a:2,b'`` -> ``{'a': 2, 'b': 1}``; unknown names are an error (a typo must not pass)."""
    points: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition(":")
        if name not in POINTS:
            raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
        if nth and (not nth.isdigit() or int(nth) < 1):
            raise ValueError(f"crash point {item!r}: the count after ':' must be 1 or more")
        points[name] = int(nth or 1)
    return points


def _reached(spec: str, name: str) -> bool:
    if not spec:
        return False
    nth = parse(spec).get(name)
    if nth is None:
        return False
    _hits[name] += 1
    return _hits[name] == nth


def _die(name: str, why: str = "") -> None:
    print(f"adattr: crash point {name}{why}: SIGKILL", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point(spec: str, name: str) -> None:
    if _reached(spec, name):
        _die(name)


def crash_when_file_appears(
    spec: str, name: str, directory: Path, matches: Callable[[str], bool]
) -> Callable[[], None]:
    """Arms a crash for work that happens inside Spark's tasks (no Python code of ours runs
    there): a thread watches ``directory`` and SIGKILLs the process the moment a file that
    ``matches`` appears, i.e. while the other tasks are still writing theirs. Returns the
    function that disarms it (a no-op when the point is not armed for this occurrence)."""
    if not _reached(spec, name):
        return lambda: None
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.002):
            for _, _, files in os.walk(directory):
                for file in files:
                    if matches(file):
                        _die(name, f" ({file} written)")

    threading.Thread(target=watch, name=f"crash-{name}", daemon=True).start()
    return done.set
