"""The foreachBatch sink: one micro-batch in, idempotent Delta writes out.

Exactly-once design. Spark re-executes a micro-batch whose commit-log entry is missing (a crash
after some writes and before the commit), with the same batch id, the same offsets (from the
offset log) and the same state-store version. Every write below is therefore made a no-op on a
second execution, twice over:

1. Each table's MERGE carries Delta's ``txnAppId``/``txnVersion`` (app id = checkpoint
   generation, version = batch id), recorded atomically with the data: a table that already
   committed this batch skips it.
2. Each MERGE is also keyed by the record's identity, so it inserts nothing twice even without
   (1), e.g. on a replay under a new generation: bronze, quarantine and late rows by Kafka
   coordinates (topic, partition, offset), scoped to the batch's per-partition offset ranges;
   silver by ``event_id``; gold rows are *recomputed* from silver for the windows the batch
   touched and set, never incremented.

The writes run in a fixed order (bronze, quarantine, late, silver, gold, ledger) and the ledger
row is last, so "a ledger row exists" means "the batch is complete in every table". Everything a
batch decides (the watermark, the dimension version) comes from Spark's offset log entry for the
batch, so a re-execution decides the same.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import delta_txn
from pipelines.dimension import dim_snapshot
from pipelines.transforms import ACCEPTED, AD_EVENT_TYPES, LATE, classify, enrich, window_metrics
from schemas import ad_event as c

log = logging.getLogger("adattr.sink")
RECORD = "record"
FIRST = "first"


@dataclass(frozen=True)
class BatchMeta:
    watermark_ms: int
    timestamp_ms: int


def read_batch_meta(checkpoint: Path, batch_id: int) -> BatchMeta:
    """The watermark and timestamp Spark fixed for a batch before running it.

    The offset log entry (``offsets/<batchId>``: a version line, then this JSON, then the source
    offsets) is written before the batch runs and reused verbatim when it is re-executed.
    """
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise RuntimeError(f"unexpected offset log format in {path}")
    meta = json.loads(lines[1])
    return BatchMeta(int(meta.get("batchWatermarkMs", 0)), int(meta["batchTimestampMs"]))


@dataclass(frozen=True)
class SinkContext:
    warehouse: str
    checkpoint: Path
    app_id: str
    generation: int


class StepTimer:
    """Wall time per named step of a batch (for the log line and the benchmark's time split)."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.steps[name] = self.steps.get(name, 0.0) + now - self._last
        self._last = now

    def describe(self) -> str:
        return " ".join(f"{k}={v:.2f}s" for k, v in self.steps.items())


class AttributionSink:
    """``foreachBatch`` handler: ``(batch_df, batch_id) -> None``."""

    def __init__(self, spark: SparkSession, ctx: SinkContext) -> None:
        self.spark = spark
        self.ctx = ctx
        self.timer = StepTimer()
        self.last_counts = ""

    def path(self, name: str) -> str:
        return f"{self.ctx.warehouse}/{name}"

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started_ms = int(time.time() * 1000)
        self.timer = StepTimer()
        meta = read_batch_meta(self.ctx.checkpoint, batch_id)
        previous = read_batch_meta(self.ctx.checkpoint, batch_id - 1) if batch_id > 0 else None
        dim, dim_version = dim_snapshot(self.spark, self.ctx.warehouse, meta.timestamp_ms)
        self.timer.mark("dim")

        # The batch frame is a wrapped RDD over the Kafka read and the stateful operator: cache
        # it so neither runs more than once whatever is derived from it below.
        batch_df.persist(StorageLevel.MEMORY_AND_DISK)
        records = batch_df.where(F.col("_branch") == RECORD).drop("_branch")
        firsts = batch_df.where(F.col("_branch") == FIRST).select(
            "kafka_topic", "kafka_partition", "kafka_offset"
        )
        rows = enrich(classify(records, firsts, watermark_ms=meta.watermark_ms), dim).withColumns(
            {"generation": F.lit(self.ctx.generation), "batch_id": F.lit(batch_id).cast("long")}
        )
        rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            stats = (
                rows.groupBy("outcome", "kafka_topic", "kafka_partition")
                .agg(
                    F.count("*").alias("n"),
                    F.min("kafka_offset").alias("lo"),
                    F.max("kafka_offset").alias("hi"),
                    F.expr("unix_millis(min(event_time))").alias("t_lo"),
                    F.expr("unix_millis(max(event_time))").alias("t_hi"),
                )
                .collect()
            )
            self.timer.mark("read+state+classify")
            self._write(rows, stats, batch_id, meta, previous, dim_version, started_ms)
        finally:
            rows.unpersist()
            batch_df.unpersist()
        log.info("batch %d: %s | %s", batch_id, self.last_counts, self.timer.describe())

    def _write(
        self,
        rows: DataFrame,
        stats: list[Row],
        batch_id: int,
        meta: BatchMeta,
        previous: BatchMeta | None,
        dim_version: int,
        started_ms: int,
    ) -> None:
        ranges: dict[tuple[str, int], list[int]] = {}
        counts: dict[str, int] = {}
        for s in stats:
            r = ranges.setdefault((s.kafka_topic, s.kafka_partition), [s.lo, s.hi, 0])
            r[0], r[1], r[2] = min(r[0], s.lo), max(r[1], s.hi), r[2] + s.n
            counts[s.outcome] = counts.get(s.outcome, 0) + s.n
        by_coordinates = _coordinates_condition(ranges)

        # An empty source inserts nothing: skipping its MERGE is the same result, for free.
        if counts:
            self._insert_new(t.BRONZE, rows.select(*t.columns(t.BRONZE)), by_coordinates, batch_id)
        if any(reason in counts for reason in c.REASONS):
            quarantined = rows.where(F.col("outcome").isin(*c.REASONS)).withColumns(
                {
                    "reason": F.col("outcome"),
                    "raw_text": F.expr("make_valid_utf8(CAST(raw_value AS STRING))"),
                }
            )
            self._insert_new(
                t.QUARANTINE, quarantined.select(*t.columns(t.QUARANTINE)), by_coordinates, batch_id
            )
        if LATE in counts:
            late = rows.where(F.col("outcome") == LATE).withColumn(
                "watermark", F.timestamp_millis(F.lit(meta.watermark_ms))
            )
            self._insert_new(t.LATE, late.select(*t.columns(t.LATE)), by_coordinates, batch_id)

        accepted = [s for s in stats if s.outcome == ACCEPTED]
        if accepted:
            t_lo = min(s.t_lo for s in accepted)
            t_hi = max(s.t_hi for s in accepted)
            silver = rows.where(F.col("outcome") == ACCEPTED).withColumn(
                "dim_version", F.lit(dim_version)
            )
            # One row per event_id. A re-sent event carries its original event_time, so the
            # match is scoped to the batch's event-time span, which lets Delta skip older files.
            self._insert_new(
                t.SILVER,
                silver.select(*t.columns(t.SILVER)),
                "t.event_id = s.event_id AND t.event_time BETWEEN "
                f"timestamp_millis({t_lo}) AND timestamp_millis({t_hi})",
                batch_id,
            )
            self._update_gold(batch_id, meta.watermark_ms, (t_lo, t_hi))
        elif previous is None or meta.watermark_ms > previous.watermark_ms:
            self._update_gold(batch_id, meta.watermark_ms, None)

        counts["read"] = sum(counts.values())
        self.last_counts = " ".join(f"{k}={v:,}" for k, v in sorted(counts.items()))
        offsets = [(tp, p, lo, hi, n) for (tp, p), (lo, hi, n) in sorted(ranges.items())]
        millis = {
            "batch_timestamp": meta.timestamp_ms,
            "watermark": meta.watermark_ms,
            "started_at": started_ms,
            "finished_at": int(time.time() * 1000),
        }
        ledger_row = self.spark.createDataFrame(
            [(self.ctx.app_id, self.ctx.generation, batch_id, dim_version, offsets, counts)],
            "app_id string, generation int, batch_id long, dim_version long, "
            "offsets array<struct<kafka_topic:string,kafka_partition:int,from_offset:long,"
            "to_offset:long,records:long>>, counts map<string,long>",
        ).withColumns({k: F.timestamp_millis(F.lit(v)) for k, v in millis.items()})
        self._insert_new(
            t.LEDGER,
            ledger_row.select(*t.columns(t.LEDGER)),
            "t.app_id = s.app_id AND t.batch_id = s.batch_id",
            batch_id,
        )

    def _insert_new(self, name: str, source: DataFrame, condition: str, batch_id: int) -> None:
        from delta.tables import DeltaTable

        with delta_txn(self.spark, self.ctx.app_id, batch_id):
            (
                DeltaTable.forPath(self.spark, self.path(name))
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenNotMatchedInsertAll()
                .execute()
            )
        self.timer.mark(name)

    def _update_gold(self, batch_id: int, watermark_ms: int, span: tuple[int, int] | None) -> None:
        """Recomputes the 1-minute windows the batch touched from silver, and marks windows
        final once the watermark has passed their end."""
        from delta.tables import DeltaTable

        watermark = f"timestamp_millis({watermark_ms})"
        if span is None:
            source = self.spark.createDataFrame([], t.table(t.GOLD_1M).ddl)
        else:
            lo, hi = span
            silver = (
                self.spark.read.format("delta")
                .load(self.path(t.SILVER))
                .where(
                    (F.col("event_time") >= F.date_trunc("minute", F.timestamp_millis(F.lit(lo))))
                    & (
                        F.col("event_time")
                        < F.date_trunc("minute", F.timestamp_millis(F.lit(hi)))
                        + F.expr("INTERVAL 1 MINUTE")
                    )
                    & F.col("event_type").isin(*AD_EVENT_TYPES)
                )
            )
            source = window_metrics(silver).withColumns(
                {
                    "is_final": F.col("window_end") <= F.expr(watermark),
                    "generation": F.lit(self.ctx.generation),
                    "batch_id": F.lit(batch_id).cast("long"),
                }
            )
        with delta_txn(self.spark, self.ctx.app_id, batch_id):
            (
                DeltaTable.forPath(self.spark, self.path(t.GOLD_1M))
                .alias("t")
                .merge(source.alias("s"), "t.window_start = s.window_start AND t.ad_id = s.ad_id")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .whenNotMatchedBySourceUpdate(
                    condition=f"NOT t.is_final AND t.window_end <= {watermark}",
                    set={"is_final": "true"},
                )
                .execute()
            )
        self.timer.mark(t.GOLD_1M)


def _coordinates_condition(ranges: dict[tuple[str, int], list[int]]) -> str:
    key = (
        "t.kafka_topic = s.kafka_topic AND t.kafka_partition = s.kafka_partition "
        "AND t.kafka_offset = s.kafka_offset"
    )
    if not ranges:
        return key
    scope = " OR ".join(
        f"(t.kafka_partition = {p} AND t.kafka_offset BETWEEN {lo} AND {hi})"
        for (_, p), (lo, hi, _) in sorted(ranges.items())
    )
    return f"{key} AND ({scope})"
