"""What a 1-minute gold write costs as the sink's keyed MERGE and as an overwrite of the source's
time range (``replaceWhere``), from the same source (issue 13: fewer, cheaper gold commits).

Builds a table shaped like ``gold_ad_metrics_1m`` (20 appends, 20,000 rows, deletion vectors on,
as the shipped table) and a Delta table of raw events (10 per minute and ad), then writes each
round's source, the events of 6 minutes counted per window and ad (300 rows, half of them
updating rows the table holds, half new), four ways, alternating order every round:

- ``merge``: the sink's keyed MERGE (on window and ad, the target bounded to the source's time
  range, a final row stays final), Delta txn ids from the session;
- ``merge_join``: the same, its source first joined with the table's rows in the range (what
  ``recomputed_or_current`` does in the sink, and what an overwrite needs to keep a final row
  final);
- ``replace_join``: that joined source written with ``replaceWhere`` on the range, Delta txn ids
  as writer options;
- ``replace``: the plain source written the same way (what an overwrite costs when the rows'
  finality follows from the watermark alone).

Prints the median wall time per write and its range; then checks that the table holds each key
once and that a ``replace`` repeated with a committed txn version commits nothing (Delta skips
it, as it skips a MERGE).

    .venv/bin/python infra/bench/replace_cost.py --rounds 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from merge_cost import ADS, MINUTE_MS, minutes
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from pipelines.delta_writes import delta_txn

APP_ID = "replace-cost"
FIRST = 380  # the table holds minutes 0..399: a source from here on overlaps its end


class ReplaceCost:
    def __init__(self, spark: SparkSession, table: str, events: str) -> None:
        self.spark = spark
        self.table = table
        self.events = events
        self.batch = 0

    def _range(self) -> tuple[int, int]:
        first = FIRST + 2 * self.batch
        return first * MINUTE_MS, (first + 6) * MINUTE_MS

    def _in_range(self, column: str) -> str:
        lo, hi = self._range()
        return f"{column} >= timestamp_millis({lo}) AND {column} < timestamp_millis({hi})"

    def source(self, *, joined: bool) -> DataFrame:
        """The round's 300 rows: 6 minutes of events counted per window and ad; the first half
        of the minutes final. ``joined``: a row the table holds final stays final."""
        lo, _ = self._range()
        w = F.window("event_time", "1 minute")
        counted = (
            self.spark.read.format("delta")
            .load(self.events)
            .where(self._in_range("event_time"))
            .groupBy(w.alias("w"), "ad_id")
            .agg(
                F.count_if(F.col("event_type") == "impression").alias("impressions"),
                F.count_if(F.col("event_type") == "click").alias("clicks"),
            )
            .select(
                F.col("w.start").alias("window_start"),
                F.col("w.end").alias("window_end"),
                "ad_id",
                F.lit("c-1").alias("campaign_id"),
                F.lit("a-1").alias("advertiser_id"),
                "impressions",
                "clicks",
                F.lit(1).cast("decimal(24,9)").alias("spend"),
                F.lit(0).cast("long").alias("conversions"),
                F.lit(0).cast("decimal(24,6)").alias("revenue"),
                (F.col("w.end") <= F.timestamp_millis(F.lit(lo + 3 * MINUTE_MS))).alias("is_final"),
                F.lit(1).alias("generation"),
                F.lit(self.batch).cast("long").alias("batch_id"),
            )
        )
        if not joined:
            return counted
        current = (
            self.spark.read.format("delta")
            .load(self.table)
            .where(self._in_range("window_start"))
            .select("window_start", "ad_id", F.col("is_final").alias("was_final"))
        )
        return (
            counted.join(current, ["window_start", "ad_id"], "left")
            .withColumn("is_final", F.col("is_final") | F.coalesce("was_final", F.lit(False)))
            .select(*counted.columns)
        )

    def merge(self, *, joined: bool) -> float:
        from delta.tables import DeltaTable

        self.batch += 1
        source = self.source(joined=joined)
        lo, hi = self._range()
        condition = (
            "t.window_start = s.window_start AND t.ad_id = s.ad_id AND t.window_start BETWEEN "
            f"timestamp_millis({lo}) AND timestamp_millis({hi})"
        )
        update: dict[str, str | Column] = {c: f"s.{c}" for c in source.columns}
        update["is_final"] = "t.is_final OR s.is_final"
        started = time.monotonic()
        with delta_txn(self.spark, APP_ID, self.batch):
            (
                DeltaTable.forPath(self.spark, self.table)
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedUpdate(set=update)
                .whenNotMatchedInsertAll()
                .execute()
            )
        return time.monotonic() - started

    def overwrite(self, *, joined: bool, again: bool = False) -> float:
        if not again:
            self.batch += 1
        source = self.source(joined=joined)
        started = time.monotonic()
        (
            source.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", self._in_range("window_start"))
            .option("txnAppId", APP_ID)
            .option("txnVersion", self.batch)
            .save(self.table)
        )
        return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="adattr-replace-cost-"))
    settings = replace(
        Settings.from_env(os.environ), warehouse=str(root / "warehouse"), data_dir=root
    )
    spark = build_spark(settings, "adattr-bench-replace-cost")
    table = str(root / "warehouse" / "minutes")
    events = str(root / "warehouse" / "events")
    columns = ", ".join(
        f"{f.name} {f.dataType.simpleString()}" for f in minutes(spark, 0, 1, 0).schema
    )
    spark.sql(
        f"CREATE TABLE delta.`{table}` ({columns}) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    for i in range(20):
        minutes(spark, 20 * i, 20, 0).write.format("delta").mode("append").save(table)
    cost = ReplaceCost(spark, table, events)
    variants: list[tuple[str, Callable[[], float]]] = [
        ("merge", lambda: cost.merge(joined=False)),
        ("merge_join", lambda: cost.merge(joined=True)),
        ("replace_join", lambda: cost.overwrite(joined=True)),
        ("replace", lambda: cost.overwrite(joined=False)),
    ]
    # Every write of the run (two warm-ups and the rounds, per variant) reads fresh events.
    writes = len(variants) * (args.rounds + 2)
    event_minute = (F.col("id") / (ADS * 10)).cast("long") + FIRST
    spark.range((2 * writes + 8) * ADS * 10).select(
        F.timestamp_millis(event_minute * MINUTE_MS + F.col("id") % 1000).alias("event_time"),
        F.concat(F.lit("ad-"), ((F.col("id") / 10).cast("long") % ADS).cast("string")).alias(
            "ad_id"
        ),
        F.when(F.col("id") % 5 == 0, "click").otherwise("impression").alias("event_type"),
    ).write.format("delta").save(events)
    for _, write in variants:  # warm-up: each variant's first writes plan and compile anew
        write()
        write()
    took: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, write in variants if r % 2 == 0 else variants[::-1]:
            took[name].append(write())
    for name, _ in variants:
        xs = took[name]
        print(
            f"{name}: median {statistics.median(xs):.3f} s per write, range "
            f"{min(xs):.3f}-{max(xs):.3f} s ({len(xs)} writes)"
        )
    rows = spark.read.format("delta").load(table)
    n, keys = rows.count(), rows.select("window_start", "ad_id").distinct().count()
    print(f"table: {n:,} rows, {keys:,} distinct (window, ad) keys")
    from delta.tables import DeltaTable

    before = DeltaTable.forPath(spark, table).history(1).first()
    cost.overwrite(joined=False, again=True)
    after = DeltaTable.forPath(spark, table).history(1).first()
    assert before is not None and after is not None
    print(f"a replace repeated with its txn version: version {before.version} -> {after.version}")
    return 0 if n == keys and before.version == after.version else 1


if __name__ == "__main__":
    raise SystemExit(main())
