"""What the hourly step's source costs as the table of 1-minute windows fills up: the sliding
hours (``pipelines.gold.campaign_ctr``) over a Delta table of MINUTES minutes of ADS ads (10
per campaign), bounded and filtered as ``GoldUpdate._hours`` does for a batch spanning the last
three minutes, in a session with the job's settings. Prints the median and range of ROUNDS
runs (after two warm-ups) and how many windows each returned.

    .venv/bin/python infra/bench/hourly_source.py --minutes 60 --ads 1000 --rounds 10

To compare with another revision's ``campaign_ctr``, run it with that revision's pipelines/
checked out (``git checkout REV -- pipelines/gold.py``, then ``git checkout HEAD -- ...``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from pipelines.gold_writes import HOUR_MS, MINUTE_MS, sliding_hours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--ads", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="adattr-hourly-source-"))
    settings = replace(
        Settings.from_env(os.environ), warehouse=str(root / "warehouse"), data_dir=root
    )
    spark = build_spark(settings, "adattr-bench-hourly-source")
    path = str(root / "warehouse" / "minutes")
    base = 1_700_000_000_000 // HOUR_MS * HOUR_MS
    minute = (F.col("id") / args.ads).cast("long") * MINUTE_MS + base
    ad = F.col("id") % args.ads
    spark.range(args.minutes * args.ads).select(
        F.timestamp_millis(minute).alias("window_start"),
        F.concat(F.lit("cmp-"), (ad / 10).cast("long").cast("string")).alias("campaign_id"),
        (F.col("id") % 7).alias("impressions"),
        (F.col("id") % 3).alias("clicks"),
    ).write.format("delta").save(path)
    span = (base + (args.minutes - 3) * MINUTE_MS, base + (args.minutes - 1) * MINUTE_MS)

    def run() -> tuple[float, int]:
        started = time.monotonic()
        hours = sliding_hours(spark.read.format("delta").load(path), span)
        n = len(hours.collect())
        return time.monotonic() - started, n

    run()
    run()
    took = [run() for _ in range(args.rounds)]
    xs = [s for s, _ in took]
    print(
        f"{args.minutes} minutes x {args.ads} ads: median {statistics.median(xs):.3f} s, range "
        f"{min(xs):.3f}-{max(xs):.3f} s ({len(xs)} runs, {took[0][1]} windows each)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
