"""Closed user sessions: written once, by the batch whose watermark passes their end.

No event at or behind the watermark can be accepted any more, so a session that ends in
(previous watermark, this watermark] is complete in silver and can never change: the batch
writes it (an append when the high-water marks allow, else a MERGE on user and start within that
interval, with Delta's txn ids) and no later batch touches it.
"""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.gold import user_sessions
from pipelines.gold_writes import time_between


def close_sessions(
    tables: Tables,
    spark: SparkSession,
    batch_id: int,
    *,
    w_prev: int,
    w_cur: int,
    gap_seconds: int,
    counts: dict[str, int],
    fresh: bool,
) -> None:
    """Writes every session ending in (w_prev, w_cur] and counts them (``sessions_closed``).

    Their last event lies in (w_prev - gap, w_cur - gap]: those users are the candidates. Their
    events are read back from a bounded horizon, widened only while a closing session starts
    within one gap of the horizon (an earlier event might still belong to it).

    Runs beside the attribution chain in a Spark session of its own (``spark``): a MERGE takes
    its Delta txn ids from its session's confs."""
    gap_ms = gap_seconds * 1000
    silver = tables.load(t.SILVER, spark).select("user_id", "event_type", "event_time", "revenue")
    candidates = (
        silver.where(
            (F.col("event_time") > F.timestamp_millis(F.lit(w_prev - gap_ms)))
            & (F.col("event_time") <= F.timestamp_millis(F.lit(w_cur - gap_ms)))
        )
        .select("user_id")
        .distinct()
    )
    reach = max(4 * gap_ms, w_cur - w_prev)
    horizon = w_prev - gap_ms - reach
    earliest: int | None = None
    while True:
        closed = (
            user_sessions(
                silver.where(time_between("event_time", horizon, w_cur)).join(
                    candidates, "user_id", "left_semi"
                ),
                gap_seconds=gap_seconds,
            )
            .where(
                (F.col("session_end") > F.timestamp_millis(F.lit(w_prev)))
                & (F.col("session_end") <= F.timestamp_millis(F.lit(w_cur)))
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        cut = closed.where(F.col("session_start") < F.timestamp_millis(F.lit(horizon + gap_ms)))
        if cut.isEmpty():
            break
        if earliest is None:
            first = silver.agg(F.expr("unix_millis(min(event_time))")).first()
            earliest = int(first[0]) if first and first[0] is not None else horizon
        if horizon <= earliest:
            break
        closed.unpersist()
        horizon -= reach
        reach *= 2
    try:
        counts["sessions_closed"] = closed.count()
        if counts["sessions_closed"]:  # nothing closed: nothing to write, on any execution
            tables.insert_new(
                t.SESSIONS,
                tables.stamped(closed, batch_id),
                "t.user_id = s.user_id AND t.session_start = s.session_start "
                f"AND t.session_end > timestamp_millis({w_prev}) "
                f"AND t.session_end <= timestamp_millis({w_cur})",
                batch_id,
                fresh=fresh,
                spark=spark,
            )
    finally:
        closed.unpersist()
