"""What the attributions MERGE costs as the table grows, with the table laid out as shipped and
partitioned by ``is_final`` (issue 13: the soak's attributions MERGE grew 1.6x in an hour).

Two tables shaped like ``gold_attributions`` start with ``--rows`` conversions, all final but
the last ``--delay`` seconds' (the watermark delay), as an hour or a day of the job leaves them
(each written once, compacted: one file per partition). Then ``--batches`` batches MERGE into
each in turn, alternating which goes first, the way the sink does: ``--per-batch`` new
conversions in the batch's ``--step`` seconds of event time, not final, and the rows the
watermark passed (read back from the table, not final yet), now final; keyed on conversion_id,
the target bounded to the source's time range, a final row left as it is, Delta's txn ids.
Prints per table the median and range of the source read and of the MERGE, and the files each
MERGE rewrote (Delta's own ``numTargetFilesRemoved``).

    .venv/bin/python infra/bench/final_partition.py --rows 10000 --batches 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.gold_writes import GoldUpdate, Merge
from pipelines.timing import StepTimer


def conversions(spark: SparkSession, first: int, n: int, seconds: float, batch: int) -> DataFrame:
    """``n`` conversions numbered from ``first``, evenly over ``seconds`` of event time from
    ``first``'s own (each conversion's time: its number times ``seconds / n``), not final."""
    every_ms = seconds * 1000 / n
    at = F.timestamp_millis((F.col("id") * F.lit(every_ms)).cast("long"))
    return spark.range(first, first + n).select(
        F.concat(F.lit("conv-"), F.col("id").cast("string")).alias("conversion_id"),
        at.alias("conversion_time"),
        F.concat(F.lit("user-"), (F.col("id") % 997).cast("string")).alias("user_id"),
        F.lit("adv-001").alias("advertiser_id"),
        F.lit(12.5).cast("decimal(18,6)").alias("revenue"),
        F.concat(F.lit("click-"), F.col("id").cast("string")).alias("click_id"),
        (at - F.expr("INTERVAL 20 SECONDS")).alias("click_time"),
        F.concat(F.lit("ad-"), (F.col("id") % 50).cast("string")).alias("ad_id"),
        F.lit("camp-1").alias("campaign_id"),
        F.lit("attributed").alias("status"),
        F.lit(False).alias("is_final"),
        F.lit(1).alias("generation"),
        F.lit(batch).cast("long").alias("batch_id"),
    )


class Attributions:
    def __init__(self, spark: SparkSession, warehouse: str, by_final: bool) -> None:
        self.spark = spark
        self.tables = Tables(spark, warehouse, "final-partition", 1)
        self.path = self.tables.path(t.ATTRIBUTIONS)
        self.by_final = by_final
        self.source_s: list[float] = []
        self.merge_s: list[float] = []
        self.rewritten: list[int] = []

    def create(self, rows: DataFrame, watermark_ms: int) -> None:
        from delta.tables import DeltaTable

        builder = (
            DeltaTable.create(self.spark).location(self.path).addColumns(t.schema(t.ATTRIBUTIONS))
        )
        for key, value in t.table(t.ATTRIBUTIONS).properties.items():
            builder = builder.property(key, value)
        if self.by_final:
            builder = builder.partitionedBy("is_final")
        builder.execute()
        final = F.col("conversion_time") <= F.timestamp_millis(F.lit(watermark_ms))
        rows.withColumn("is_final", final).repartition(1).write.format("delta").mode("append").save(
            self.path
        )

    def merge(self, new: DataFrame, w_prev: int, watermark_ms: int, batch: int) -> None:
        from delta.tables import DeltaTable

        # The sink's own rules: the rows the watermark passed, is_final and the stamp, the MERGE.
        update = GoldUpdate(
            self.tables,
            StepTimer(),
            batch,
            w_prev=w_prev,
            watermark_ms=watermark_ms,
            counts={},
            lookback_seconds=0,
        )
        started = time.monotonic()
        due = update._due(t.ATTRIBUTIONS, "conversion_time")
        assert due is not None, "every batch moves the watermark"
        source = update._final(new.unionByName(due), "conversion_time").persist(
            StorageLevel.MEMORY_AND_DISK
        )
        found = source.agg(
            F.expr("unix_millis(min(conversion_time))").alias("lo"),
            F.expr("unix_millis(max(conversion_time))").alias("hi"),
        ).first()
        assert found is not None
        self.source_s.append(time.monotonic() - started)
        started = time.monotonic()
        update._merge(
            Merge(
                t.ATTRIBUTIONS,
                source,
                keys=("conversion_id",),
                time_column="conversion_time",
                update=None,
                update_condition="NOT t.is_final",
                bounds=(int(found.lo), int(found.hi)),
            )
        )
        self.merge_s.append(time.monotonic() - started)
        source.unpersist()
        # The MERGE's own entry: auto compaction may have committed an OPTIMIZE after it.
        metrics = (
            DeltaTable.forPath(self.spark, self.path)
            .history(3)
            .where("operation = 'MERGE'")
            .orderBy(F.col("version").desc())
            .select("operationMetrics.numTargetFilesRemoved")
            .first()
        )
        self.rewritten.append(int(metrics[0] or 0) if metrics is not None else 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="conversions to start with")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--per-batch", type=int, default=40, help="new conversions per batch")
    parser.add_argument("--step", type=float, default=14.0, help="event seconds per batch")
    parser.add_argument("--delay", type=int, default=600, help="watermark delay, seconds")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="adattr-final-partition-"))
    settings = replace(
        Settings.from_env(os.environ), warehouse=str(root / "warehouse"), data_dir=root
    )
    spark = build_spark(settings, "adattr-bench-final-partition")
    every_s = args.step / args.per_batch  # event seconds between two conversions
    start_rows = conversions(spark, 0, args.rows, args.rows * every_s, 0)
    end_ms = int(args.rows * every_s * 1000)
    tables = [
        Attributions(spark, str(root / name), by_final)
        for name, by_final in (("shipped", False), ("by_final", True))
    ]
    w_prev = end_ms - args.delay * 1000
    for table in tables:
        table.create(start_rows, w_prev)
    for b in range(1, args.batches + 1):
        first = args.rows + (b - 1) * args.per_batch
        new = conversions(spark, first, args.per_batch, args.step, b)
        watermark = end_ms + int(b * args.step * 1000) - args.delay * 1000
        for table in tables if b % 2 else tables[::-1]:
            table.merge(new, w_prev, watermark, b)
        w_prev = watermark
    warm = min(2, args.batches - 1)  # the first MERGEs plan and compile anew
    for table in tables:
        cells = []
        for what, xs in (("source", table.source_s[warm:]), ("merge", table.merge_s[warm:])):
            cells.append(f"{what} {statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})")
        print(
            f"{'by is_final' if table.by_final else 'shipped'}: {args.rows:,} rows to start, "
            f"{len(table.merge_s) - warm} batches: "
            + ", ".join(cells)
            + f", files rewritten per MERGE median {statistics.median(table.rewritten[warm:])}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
