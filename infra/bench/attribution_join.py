"""What a stream-stream join would cost for last-click attribution (issue 4's alternative).

Runs, over the input topic, only the part of the work a time-bounded stream-stream join does:
parse, clicks enriched with their advertiser (stream-static join with dim_ads), then conversions
LEFT OUTER JOIN clicks on user and advertiser with ``conversion - lookback <= click <
conversion``, watermarks on both sides, into Spark's no-op sink. It does *not* pick the last
click, dedup, or write anything, so its time is a lower bound for the join design. Compare
with the ``gold_attributions=`` step of the shipped job's batch log line over the same topic.

    ADATTR_INPUT_TOPIC=... .venv/bin/python infra/bench/attribution_join.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from pipelines.job import read_events
from pipelines.transforms import parse_events, with_kafka_coordinates


def main() -> int:
    settings = Settings.from_env(os.environ)
    spark = build_spark(settings, "adattr-bench-attribution-join")
    dim = spark.read.format("delta").load(settings.table_path("dim_ads"))
    events = (
        read_events(spark, settings)
        .transform(with_kafka_coordinates)
        .transform(parse_events(max_bytes=settings.max_record_bytes))
        .where(F.col("reject_reason").isNull())
    )
    delay = settings.watermark_delay
    lookback = settings.attribution_lookback_seconds
    clicks = (
        events.where(F.col("event_type") == "click")
        .drop("advertiser_id")
        .join(F.broadcast(dim.select("ad_id", "advertiser_id")), "ad_id")
        .select(
            F.col("event_id").alias("click_id"),
            F.col("event_time").alias("click_time"),
            F.col("user_id").alias("click_user"),
            F.col("advertiser_id").alias("click_advertiser"),
        )
        .withWatermark("click_time", delay)
    )
    conversions = (
        events.where(F.col("event_type") == "conversion")
        .select("event_id", "event_time", "user_id", "advertiser_id")
        .withWatermark("event_time", delay)
    )
    joined = conversions.join(
        clicks,
        (F.col("user_id") == F.col("click_user"))
        & (F.col("advertiser_id") == F.col("click_advertiser"))
        & (F.col("click_time") < F.col("event_time"))
        & (F.col("click_time") >= F.col("event_time") - F.expr(f"INTERVAL {lookback} SECONDS")),
        "left_outer",
    )
    checkpoint = Path(settings.data_dir) / "bench-attribution-join" / str(int(time.time()))
    started = time.monotonic()
    query = (
        joined.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint.resolve()))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.monotonic() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    out = sum(p["sink"].get("numOutputRows", 0) for p in query.recentProgress)
    for p in query.recentProgress:
        print(f"batch {p['batchId']}: {p['durationMs']}", file=sys.stderr)
    print(f"stream-stream join: {elapsed:.1f}s for {rows:,} input rows, {out:,} joined rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
