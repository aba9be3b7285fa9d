"""What the tables held when a run of the job started: the proof that lets a batch append.

A keyed MERGE (or Delta's ``txnAppId``/``txnVersion``) makes a write idempotent, but both cost a
reconstruction of the target's snapshot (three Spark jobs, ~1 s on two cores) on every batch. A
plain append costs one job. It is just as exact whenever no row with the batch's keys can exist
yet, and that is decidable once per run:

- Within one run of the query, Spark executes each batch id once; only the first batch of a run
  can be a re-execution of a batch an earlier run (maybe) wrote part of.
- So whatever the tables held when the run started bounds everything that is not this run's own.
  A batch whose Kafka offsets all lie above the highest offset bronze, quarantine, late and silver
  held at the start cannot meet a row of an earlier run, an earlier generation or a rewound
  checkpoint: it appends. One that overlaps (the re-executed first batch, a replay, a checkpoint
  rewound under another app id) takes the keyed MERGE with Delta's txn ids, as before.
- Silver is keyed by ``event_id``, and a duplicate can sit at any offset. Within one checkpoint
  generation the dedup state remembers every event id it accepted (across restarts), so silver
  appends when it held only this app id's events at the start: the ledger holds rows of this app
  id only and silver no row of another generation. After a replay or a checkpoint rewound under
  another app id the dedup state has not seen every event silver holds: silver is a keyed MERGE
  until the batch's watermark reaches the latest event time silver held at the start, and each
  such batch classifies with silver's event ids (``classify(stored=...)``), so a re-send of an
  event the state never saw is a duplicate in the ledger too, not an accepted record the MERGE
  then drops. Then no event a batch above the marks accepts can have a row yet: it is later
  than the watermark (only a re-read record keeps an earlier decision instead), and a re-sent
  event carries its original event time (the MERGE's event-time scope assumes as much), so
  silver held no row of it at the start; a row this run added, its dedup state saw (a re-read
  record it kept accepted added none: silver held it already). Events the dedup state let through
  that the dimension then refused (quarantined as ``unknown_ad``) are looked up the same way,
  once another app id or generation wrote, until the watermark passes the latest of them
  (``unknown_until_ms``): a copy of one is a duplicate, as the state would have made it.
- The ledger is keyed by (app id, batch id): a batch above the highest this app id had appends.
- Closed sessions are written in the watermark interval ``(w_prev, w_cur]`` of their end: a
  batch appends when every session the table held at the start ended at or before ``w_prev``.

Three marks are of another kind: how far the 1-minute table may be behind silver
(``minutes_behind``), the sliding-hour table behind the 1-minute table (``hours_behind``) and
the attributions behind silver's conversions (``conversions_behind``), which the run's first
gold pass covers (``pipelines.hourly_pass``).

The marks are read as the run starts (``pipelines.job.start``, before its query does), so
before anything of the run is written, under the checkpoint's run lock
(``pipelines.job.exclusive``), so no other writer can add rows behind them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.transforms import refused_events

NEVER = -(2**62)


@dataclass(frozen=True)
class HighWater:
    offsets: dict[tuple[str, int], int]  # highest Kafka offset held, per (topic, partition)
    ledger_batch: int  # highest batch id of this app id in the ledger (-1: none)
    session_end_ms: int  # latest session_end held (NEVER: no session)
    silver_exclusive: bool  # silver held only this app id's events
    silver_until_ms: int  # latest event time silver held (NEVER: no row)
    # The time span of the 1-minute rows at or after the latest end of a final hourly row (all
    # of them when none is final; None: no such row): every hour the runs before may have left
    # behind holds one of them (pipelines/hourly_pass.py).
    hours_behind: tuple[int, int] | None = None
    hours_final_ms: int = NEVER  # that latest end (NEVER: no final hourly row)
    # The time span of silver's events at or after the latest end of a final 1-minute row (all
    # of them when none is final; None: no such event): every minute the runs before may have
    # left behind holds one of them.
    minutes_behind: tuple[int, int] | None = None
    minutes_final_ms: int = NEVER  # that latest end (NEVER: no final 1-minute row)
    # The time span of silver's conversions at or after the latest conversion time of a final
    # attribution (all of them when none is final; None: no such conversion): every
    # attribution the runs before may have left unwritten (``pipelines.pending_rows``)
    # is one of theirs.
    conversions_behind: tuple[int, int] | None = None
    attributions_final_ms: int = NEVER  # that latest time (NEVER: no final attribution)
    # The latest event time of an event quarantined as ``unknown_ad`` (the dimension check
    # follows the dedup state), when this run's dedup state may not have seen them all: the
    # ledger held rows of another app id or silver rows of another generation (NEVER: no such
    # event, or none it did not see).
    unknown_until_ms: int = NEVER

    def records_fresh(self, ranges: dict[tuple[str, int], list[int]]) -> bool:
        """Whether a batch reading these (from, to, n) offset ranges can append its records."""
        return all(lo > self.offsets.get(tp, -1) for tp, (lo, _hi, _n) in ranges.items())

    def silver_unseen(self, watermark_ms: int) -> bool:
        """Whether silver may hold an event, later than this watermark, that this run's dedup
        state never saw (a batch under it must look such events up in silver, and carries no
        state: ``pipelines.click_state``, ``pipelines.session_writes``)."""
        return not self.silver_exclusive and self.silver_until_ms > watermark_ms

    def ids_unseen(self, watermark_ms: int) -> bool:
        """Whether an event later than this watermark may have been decided (accepted into
        silver or quarantined as ``unknown_ad``) where this run's dedup state never saw it: a
        batch under it looks its records' event ids up in the tables
        (``PriorDecisions.stored_ids``)."""
        return self.silver_unseen(watermark_ms) or self.unknown_until_ms > watermark_ms

    def silver_fresh(self, ranges: dict[tuple[str, int], list[int]], watermark_ms: int) -> bool:
        """Whether a batch reading these offset ranges, under this watermark, can append to
        silver."""
        return self.records_fresh(ranges) and not self.silver_unseen(watermark_ms)

    def ledger_fresh(self, batch_id: int) -> bool:
        return batch_id > self.ledger_batch

    def sessions_fresh(self, w_prev_ms: int) -> bool:
        return self.session_end_ms <= w_prev_ms


def read_high_water(spark: SparkSession, warehouse: str, app_id: str, generation: int) -> HighWater:
    """The marks, from thirteen small queries run four at once (and, once another app id or
    generation wrote, a fourteenth after them): each first loads its table's snapshot (~0.7 s
    of mostly driver-side work on a cold run), one after another seven cost ~5 s."""

    def load(name: str) -> DataFrame:
        return spark.read.format("delta").load(f"{warehouse}/{name}")

    def offsets_of(name: str) -> list[Row]:
        return (
            load(name)
            .groupBy("kafka_topic", "kafka_partition")
            .agg(F.max("kafka_offset").alias("hi"))
            .collect()
        )

    def ledger() -> Row | None:
        return (
            load(t.LEDGER)
            .agg(
                F.max(F.when(F.col("app_id") == app_id, F.col("batch_id"))).alias("mine"),
                F.count(F.when(F.col("app_id") != app_id, 1)).alias("others"),
            )
            .first()
        )

    def silver() -> Row | None:
        return (
            load(t.SILVER)
            .agg(
                F.count("*").alias("rows"),
                F.count(F.when(F.col("generation") != generation, 1)).alias("foreign"),
                F.expr("unix_millis(max(event_time))").alias("until"),
            )
            .first()
        )

    def unknown_until() -> int:
        found = (
            refused_events(load(t.QUARANTINE)).agg(F.expr("unix_millis(max(event_time))")).first()
        )
        return int(found[0]) if found is not None and found[0] is not None else NEVER

    def sessions() -> Row | None:
        return load(t.SESSIONS).agg(F.expr("unix_millis(max(session_end))")).first()

    def behind(
        final_of: str, rows_of: str, at: str, end_of: str = "window_end", kind: str | None = None
    ) -> tuple[tuple[int, int] | None, int]:
        """The latest ``end_of`` of a final row of ``final_of`` and the span of ``at`` of the
        rows of ``rows_of`` (of ``event_type`` ``kind``, if given) at or after it."""
        final = load(final_of).where("is_final").agg(F.expr(f"unix_millis(max({end_of}))"))
        row = final.first()
        end = int(row[0]) if row is not None and row[0] is not None else NEVER
        rows = load(rows_of)
        if kind is not None:
            rows = rows.where(F.col("event_type") == kind)
        if end != NEVER:
            rows = rows.where(F.col(at) >= F.timestamp_millis(F.lit(end)))
        span = rows.agg(F.expr(f"unix_millis(min({at}))"), F.expr(f"unix_millis(max({at}))"))
        found = span.first()
        if found is None or found[0] is None:
            return None, end
        return (int(found[0]), int(found[1])), end

    with ThreadPoolExecutor(4, thread_name_prefix="adattr-high-water") as pool:
        per_table = [pool.submit(offsets_of, name) for name in t.RECORD_TABLES]
        ledger_f, silver_f, sessions_f = (pool.submit(f) for f in (ledger, silver, sessions))
        hours_f = pool.submit(behind, t.CTR_1H, t.GOLD_1M, "window_start")
        minutes_f = pool.submit(behind, t.GOLD_1M, t.SILVER, "event_time")
        conversions_f = pool.submit(
            behind, t.ATTRIBUTIONS, t.SILVER, "event_time", "conversion_time", "conversion"
        )
        offsets: dict[tuple[str, int], int] = {}
        for future in per_table:
            for r in future.result():
                tp = (r.kafka_topic, int(r.kafka_partition))
                offsets[tp] = max(offsets.get(tp, -1), int(r.hi))
        mine, held, ended = ledger_f.result(), silver_f.result(), sessions_f.result()
    assert mine is not None and held is not None
    silver_exclusive = held.rows == 0 or (
        mine.mine is not None and mine.others == 0 and held.foreign == 0
    )
    # The quarantine's unknown_ad events, read only where another app id or generation wrote
    # (a replay's or a rewound checkpoint's runs): they cost a cold start ~0.5 s, and a run
    # whose ledger and silver hold its own work alone met every such event in its dedup state.
    # (Like silver's mark, this misses a generation that left neither a ledger row nor a
    # silver row, having crashed in its first batch.)
    refused = unknown_until() if mine.others > 0 or held.foreign > 0 else NEVER
    return HighWater(
        offsets,
        int(mine.mine) if mine.mine is not None else -1,
        int(ended[0]) if ended and ended[0] is not None else NEVER,
        silver_exclusive,
        int(held.until) if held.until is not None else NEVER,
        *hours_f.result(),
        *minutes_f.result(),
        *conversions_f.result(),
        refused,
    )
