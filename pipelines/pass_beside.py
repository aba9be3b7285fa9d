"""A keeping pass's writes beside the next batch (``pipelines.hourly_pass``, ``HourlyPass.kept``).

A pass that keeps has published what it writes before it writes it: its MERGEs of the rows kept
since the last pass and the hours (``GoldUpdate.pass_kept``) change what the tables hold, never
what the topic carries. So they need not hold up the stream: they run in a thread of their own,
in a Spark session of their own (a MERGE takes its Delta txn ids from its session's confs),
while the next batch reads Kafka, runs the dedup state and writes its records, which touch no
gold table. That batch waits for them (``join``) before its gold writes, the first step that
reads or writes a table the pass writes; so does the stop's pass.

Why the batch's ledger row may come first. Its row says the batch's records, state and Kafka
transaction are complete; the gold tables' rows of the batches between passes are not in the
tables either until a pass writes them. A run that dies with the pass in flight leaves the tables
as a run that dies between passes does, and its next run's first batch passes over every row
that can be behind (``HighWater.minutes_behind``, ``conversions_behind``, ``hours_behind``), as
for any crash between passes. The windows that re-attributions left (``pipelines.left_windows``)
are forgotten only once the pass that covers them has landed, as the candidates that pass needs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pipelines.lease import LeaseLost

log = logging.getLogger("adattr.sink")


class PassBeside:
    """At most one pass in flight: ``start`` it, ``join`` it (its failure raised there)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._landed: Callable[[], None] | None = None
        self.batch_id: int | None = None  # the batch whose pass is in flight

    def start(self, batch_id: int, write: Callable[[], None], landed: Callable[[], None]) -> None:
        """Runs ``write`` (batch ``batch_id``'s pass) in a thread; ``landed`` runs in the
        joining thread once it has succeeded."""
        assert self._thread is None, "one pass in flight at most"

        def run() -> None:
            try:
                write()
            except BaseException as e:  # raised again in the batch that joins
                log.error("the pass of batch %d failed: %s", batch_id, e)
                self._error = e

        self.batch_id, self._landed, self._error = batch_id, landed, None
        # A daemon: a process that dies or exits with the pass in flight leaves it to the next
        # run's first batch (module docstring), as a crash between passes does.
        self._thread = threading.Thread(target=run, name=f"adattr-pass-{batch_id}", daemon=True)
        self._thread.start()

    def join(self) -> float:
        """Waits for the pass in flight, if any; the seconds waited (0.0: none in flight).
        Raises what the pass raised."""
        if self._thread is None:
            return 0.0
        started = time.monotonic()
        self._thread.join()
        waited = time.monotonic() - started
        batch_id, landed, error = self.batch_id, self._landed, self._error
        self._thread, self._landed, self._error, self.batch_id = None, None, None, None
        if isinstance(error, LeaseLost):  # another job took the checkpoint over: say that
            raise error
        if error is not None:
            first = next(iter(str(error).splitlines()), type(error).__name__)
            raise RuntimeError(f"the pass of batch {batch_id} failed: {first}") from error
        assert landed is not None
        landed()
        return waited

    def settle(self) -> None:
        """Waits for the pass in flight, if any, whatever it ends in (a query that failed or
        was stopped without its stop's pass: its next run's first batch makes what it owed, and
        nothing it writes may still be running then); a failure is logged, not raised."""
        try:
            self.join()
        except Exception as exc:
            log.warning("%s; the next run's first batch passes over it", exc)
