"""Wall time per named step of a micro-batch: the sink's log line and the benchmark's split."""

from __future__ import annotations

import time
from collections.abc import Callable


class StepTimer:
    """``steps``: the batch's phases, marked one after another (their wall time); ``tables``:
    single writes and sources, which may run in threads inside a phase (their own duration)."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self.tables: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, name: str) -> None:
        self.mark_split(name, 0.0, name)

    def mark_split(self, part: str, part_seconds: float, rest: str) -> None:
        """Like ``mark(rest)``, with ``part_seconds`` of the time since the last mark noted as
        a phase of its own, ``part`` (work interleaved with the rest's, timed apart)."""
        now = time.monotonic()
        part_seconds = min(part_seconds, now - self._last)
        for name, seconds in ((part, part_seconds), (rest, now - self._last - part_seconds)):
            self.steps[name] = self.steps.get(name, 0.0) + seconds
        self._last = now

    def timed(self, name: str, write: Callable[[], object]) -> Callable[[], None]:
        """``write``, noting its own duration as ``name``."""

        def run() -> None:
            started = time.monotonic()
            write()
            self.tables[name] = time.monotonic() - started

        return run

    def since(self, name: str, started: float) -> None:
        """Notes ``name`` as having taken from ``started`` (``time.monotonic()``) until now."""
        self.tables[name] = time.monotonic() - started

    def describe(self) -> str:
        tables = " ".join(f"{k}={v:.2f}s" for k, v in self.tables.items())
        return " ".join(f"{k}={v:.2f}s" for k, v in self.steps.items()) + f" ({tables})"
