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
from collections import Counter

# Where the job and the consumer can be killed on purpose (README: "Why each crash point is safe").
POINTS = (
    "after_delta_before_kafka",  # the batch's Delta commits are done, its transaction is not begun
    "in_kafka_transaction",  # records sent inside the open transaction, commit not called
    "after_kafka_before_ledger",  # the transaction is committed, the ledger row is not written
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


def crash_point(spec: str, name: str) -> None:
    if not spec:
        return
    nth = parse(spec).get(name)
    if nth is None:
        return
    _hits[name] += 1
    if _hits[name] == nth:
        print(f"adattr: crash point {name} (#{nth}): SIGKILL", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
