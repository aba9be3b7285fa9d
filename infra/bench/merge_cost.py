"""What one gold MERGE costs, and which Spark jobs it runs (issue 13's profile).

Builds a table shaped like ``gold_ad_metrics_1m`` (20 appends, 20,000 rows), then MERGEs
300-row sources into it the way the sink does (keyed on window and ad, the target bounded to the
source's time range, Delta txn ids from the session), half of each source updating rows, half
inserting. Each VARIANT (``name:key=value,key=value``: session confs set for its MERGEs only)
runs in turn with the shipped settings (``base``), alternating order every round, and prints the
median wall time per MERGE, its range and how many Spark jobs a MERGE ran. For the jobs' names
(Delta names them: snapshot state, source materialisation, scan, rewrite) and times, run it with
``PYSPARK_SUBMIT_ARGS='--conf spark.eventLog.enabled=true --conf
spark.eventLog.dir=file:///tmp/ev pyspark-shell'`` and read the event log.

    .venv/bin/python infra/bench/merge_cost.py --rounds 10 \\
        'snap1:spark.databricks.delta.snapshotPartitions=1'

A conf a variant sets is put back to the session's own value afterwards, not unset (unset
would fall back to Delta's default, not adattr's).
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
from pipelines.delta_writes import delta_txn

MINUTE_MS = 60_000
ADS = 50


def minutes(spark: SparkSession, first: int, count: int, batch: int) -> DataFrame:
    """``count`` minutes from minute ``first``, one row per ad: gold_ad_metrics_1m's columns."""
    m = (F.col("id") / ADS).cast("long") + first
    return spark.range(count * ADS).select(
        F.timestamp_millis(m * MINUTE_MS).alias("window_start"),
        F.timestamp_millis((m + 1) * MINUTE_MS).alias("window_end"),
        F.concat(F.lit("ad-"), (F.col("id") % ADS).cast("string")).alias("ad_id"),
        F.lit("c-1").alias("campaign_id"),
        F.lit("a-1").alias("advertiser_id"),
        (F.col("id") % 7).alias("impressions"),
        (F.col("id") % 3).alias("clicks"),
        F.lit(1).cast("decimal(24,9)").alias("spend"),
        F.lit(0).cast("long").alias("conversions"),
        F.lit(0).cast("decimal(24,6)").alias("revenue"),
        F.lit(False).alias("is_final"),
        F.lit(1).alias("generation"),
        F.lit(batch).cast("long").alias("batch_id"),
    )


class MergeCost:
    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self.batch = 0
        self.jobs = 0

    def merge(self, conf: dict[str, str]) -> float:
        """One MERGE with ``conf`` set; its wall time in seconds (its job count in ``jobs``)."""
        from delta.tables import DeltaTable

        before = {k: self.spark.conf.get(k, None) for k in conf}
        for k, v in conf.items():
            self.spark.conf.set(k, v)
        self.batch += 1
        first = 380 + 2 * self.batch  # overlaps the table's end: updates and inserts
        source = minutes(self.spark, first, 6, self.batch).persist(StorageLevel.MEMORY_AND_DISK)
        source.count()
        tracker = self.spark.sparkContext.statusTracker()
        known = set(tracker.getJobIdsForGroup(None))
        condition = (
            "t.window_start = s.window_start AND t.ad_id = s.ad_id AND t.window_start BETWEEN "
            f"timestamp_millis({first * MINUTE_MS}) AND timestamp_millis({(first + 6) * MINUTE_MS})"
        )
        started = time.monotonic()
        with delta_txn(self.spark, "merge-cost", self.batch):
            (
                DeltaTable.forPath(self.spark, self.path)
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )
        took = time.monotonic() - started
        self.jobs = len(set(tracker.getJobIdsForGroup(None)) - known)
        source.unpersist()
        for k, old in before.items():
            if old is None:
                self.spark.conf.unset(k)
            else:
                self.spark.conf.set(k, old)
        return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("variants", nargs="*", metavar="NAME:KEY=VALUE,...")
    args = parser.parse_args()
    variants: list[tuple[str, dict[str, str]]] = [("base", {})]
    for text in args.variants:
        name, _, pairs = text.partition(":")
        variants.append((name, dict(p.split("=", 1) for p in pairs.split(",") if p)))
    root = Path(tempfile.mkdtemp(prefix="adattr-merge-cost-"))
    settings = replace(
        Settings.from_env(os.environ), warehouse=str(root / "warehouse"), data_dir=root
    )
    spark = build_spark(settings, "adattr-bench-merge-cost")
    path = str(root / "warehouse" / t.GOLD_1M)
    for i in range(20):
        minutes(spark, 20 * i, 20, 0).write.format("delta").mode("append").save(path)
    cost = MergeCost(spark, path)
    for _, conf in variants:  # warm-up: each variant's first MERGEs plan and compile anew
        cost.merge(conf)
        cost.merge(conf)
    took: dict[str, list[float]] = {name: [] for name, _ in variants}
    jobs: dict[str, int] = {}
    for r in range(args.rounds):
        for name, conf in variants if r % 2 == 0 else variants[::-1]:
            took[name].append(cost.merge(conf))
            jobs[name] = cost.jobs
    for name, _ in variants:
        xs = took[name]
        print(
            f"{name}: median {statistics.median(xs):.3f} s per MERGE, range "
            f"{min(xs):.3f}-{max(xs):.3f} s ({len(xs)} MERGEs), {jobs[name]} Spark jobs each"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
