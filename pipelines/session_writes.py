"""Closed user sessions: written once, by the batch whose watermark passes their end.

No event at or behind the watermark can be accepted any more, so a session that ends in
(previous watermark, this watermark] is complete in silver and can never change: the batch
writes it (an append when the high-water marks allow, else a MERGE on user and start within that
interval, with Delta's txn ids) and no later batch touches it.

Where the closing sessions come from:

- When every event silver may hold later than the batch's watermark is this generation's own
  (``HighWater.silver_unseen`` is false: silver held only its events when the run started, or the
  watermark has passed every event silver held then, as after a replay; so the sessions of silver
  change only by the events its batches accept) and every event the batch accepts is later than its
  watermark, the sessions still open are carried from batch to batch (``pipelines.carried_state``,
  as ``open_sessions``: the rows of the data of batch ``b`` that end after its watermark): the batch
  folds its accepted events into those open after the batch before and closes the ones its watermark
  passed. Such an event cannot reach a session that closed before it: that session ended at or
  before the watermark the event is later than. When the batch before left no usable marker, the
  open sessions are rebuilt from silver (which then holds this batch's events already, and any other
  generation's) and carried on from there.
- Otherwise (a replay's or a restart's first minutes in a generation that shares silver with
  another, until the watermark passes the events silver held), the closing sessions are
  recomputed from silver in every batch, and nothing is carried; the first batch after that
  finds no marker of the batch before and rebuilds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.carried_state import CarriedState, Marker
from pipelines.delta_writes import Tables
from pipelines.gold import folded_sessions, user_sessions
from pipelines.gold_writes import time_between
from pipelines.offset_log import BatchMeta

OPEN_SESSIONS = "open_sessions"
OPEN_SESSION_SCHEMA = (
    "session_start timestamp, session_end timestamp, user_id string, events long, "
    "impressions long, clicks long, conversions long, revenue decimal(24,6)"
)


def open_session_state(spark: SparkSession, checkpoint: Path) -> CarriedState:
    return CarriedState(spark, checkpoint, OPEN_SESSIONS, OPEN_SESSION_SCHEMA)


@dataclass(frozen=True)
class SessionCloser:
    """Closes the sessions of one batch (``__call__``), in a Spark session of its own
    (``spark``): a MERGE takes its Delta txn ids from its session's confs, and this runs beside
    the attribution chain."""

    tables: Tables
    spark: SparkSession
    store: CarriedState
    gap_seconds: int

    def __call__(
        self,
        batch_id: int,
        *,
        meta: BatchMeta,
        previous: BatchMeta | None,
        events: DataFrame | None,
        carried: bool,
        counts: dict[str, int],
        fresh: bool,
    ) -> None:
        """``events``: the batch's accepted events (None: none); ``carried``: whether the open
        sessions may be carried over (the first case of the module docstring)."""
        w_prev = previous.watermark_ms if previous is not None else 0
        w_cur = meta.watermark_ms
        if not carried:
            if w_cur > w_prev:
                with self._from_silver(w_prev, w_cur) as closed:
                    self._write(closed, batch_id, w_prev, w_cur, counts, fresh)
            return
        before = self.store.start(batch_id, previous, self.gap_seconds)
        data: str | None
        if before is None:  # no state to carry: silver, which holds this batch's events
            with self._from_silver(w_prev, None) as rebuilt:
                data = self.store.write_data(rebuilt)
        elif events is not None:
            data = self.store.write_data(
                folded_sessions(
                    self._open(before, ending_after_ms=w_prev),
                    events,
                    gap_seconds=self.gap_seconds,
                )
            )
        else:
            data = before.data
        marker = Marker(batch_id, w_cur, meta.timestamp_ms, self.gap_seconds, data)
        self.store.commit(marker)
        if w_cur > w_prev:
            open_before = self._open(marker, ending_after_ms=w_prev)
            if open_before is None:  # no session open
                counts["sessions_closed"] = 0
                return
            closed = open_before.where(F.col("session_end") <= F.timestamp_millis(F.lit(w_cur)))
            self._write(closed, batch_id, w_prev, w_cur, counts, fresh)

    def _open(self, marker: Marker, *, ending_after_ms: int) -> DataFrame | None:
        """The sessions of ``marker``'s data that end after ``ending_after_ms``; None when it has
        no data."""
        rows = self.store.rows(marker)
        if rows is None:
            return None
        return rows.where(F.col("session_end") > F.timestamp_millis(F.lit(ending_after_ms)))

    @contextmanager
    def _from_silver(self, after_ms: int, until_ms: int | None) -> Iterator[DataFrame]:
        """``sessions_from_silver``, unpersisted once used."""
        found = sessions_from_silver(
            self.tables,
            self.spark,
            after_ms=after_ms,
            until_ms=until_ms,
            gap_seconds=self.gap_seconds,
        )
        try:
            yield found
        finally:
            found.unpersist()

    def _write(
        self,
        closed: DataFrame,
        batch_id: int,
        w_prev: int,
        w_cur: int,
        counts: dict[str, int],
        fresh: bool,
    ) -> None:
        counts["sessions_closed"] = closed.count()
        if counts["sessions_closed"]:  # nothing closed: nothing to write, on any execution
            self.tables.insert_new(
                t.SESSIONS,
                self.tables.stamped(closed, batch_id),
                "t.user_id = s.user_id AND t.session_start = s.session_start "
                f"AND t.session_end > timestamp_millis({w_prev}) "
                f"AND t.session_end <= timestamp_millis({w_cur})",
                batch_id,
                fresh=fresh,
                spark=self.spark,
            )


def sessions_from_silver(
    tables: Tables,
    spark: SparkSession,
    *,
    after_ms: int,
    until_ms: int | None,
    gap_seconds: int,
) -> DataFrame:
    """The sessions of silver's events that end in ``(after, until]`` (no upper bound: None),
    persisted (the caller unpersists).

    Their last event lies in (after - gap, until - gap]: those users are the candidates. Their
    events are read back from a bounded horizon, widened only while a session found starts
    within one gap of the horizon (an earlier event might still belong to it)."""
    gap_ms = gap_seconds * 1000
    silver = tables.load(t.SILVER, spark).select("user_id", "event_type", "event_time", "revenue")
    ends = F.col("session_end") > F.timestamp_millis(F.lit(after_ms))
    last = F.col("event_time") > F.timestamp_millis(F.lit(after_ms - gap_ms))
    if until_ms is not None:
        ends &= F.col("session_end") <= F.timestamp_millis(F.lit(until_ms))
        last &= F.col("event_time") <= F.timestamp_millis(F.lit(until_ms - gap_ms))
    candidates = silver.where(last).select("user_id").distinct()
    reach = max(4 * gap_ms, (until_ms or after_ms) - after_ms)
    horizon = after_ms - gap_ms - reach
    earliest: int | None = None
    while True:
        read = F.col("event_time") >= F.timestamp_millis(F.lit(horizon))
        if until_ms is not None:
            read = time_between("event_time", horizon, until_ms)
        found = (
            user_sessions(
                silver.where(read).join(candidates, "user_id", "left_semi"),
                gap_seconds=gap_seconds,
            )
            .where(ends)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        cut = found.where(F.col("session_start") < F.timestamp_millis(F.lit(horizon + gap_ms)))
        if cut.isEmpty():
            return found
        if earliest is None:
            first = silver.agg(F.expr("unix_millis(min(event_time))")).first()
            earliest = int(first[0]) if first and first[0] is not None else horizon
        if horizon <= earliest:
            return found
        found.unpersist()
        horizon -= reach
        reach *= 2
