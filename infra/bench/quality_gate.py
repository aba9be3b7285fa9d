"""What the in-pipeline quality gate costs: parse + validate the same records with and without
it, alternating, and print the medians.

    .venv/bin/python infra/bench/quality_gate.py [records]   # default 300,000
"""

from __future__ import annotations

import statistics
import sys
import time

from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from app.tools.generator import GenConfig, plan_traffic
from pipelines.transforms import parse_events


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    spark = build_spark(Settings.from_env({}), "adattr-bench-quality-gate")
    traffic = plan_traffic(GenConfig(events=n, users=10_000, ads=100))
    rows = [(i % 4, i, value) for i, (_, value) in enumerate(traffic.main)]
    raw = spark.createDataFrame(rows, "kafka_partition int, kafka_offset long, raw_value binary")
    raw = raw.repartition(4).cache()
    raw.count()
    timings: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):
        for gate in (False, True):
            parsed = raw.transform(parse_events(max_bytes=16384, quality_gate=gate))
            started = time.monotonic()
            parsed.groupBy("reject_reason").count().agg(F.sum("count")).collect()
            timings[gate].append(time.monotonic() - started)
    without, with_gate = statistics.median(timings[False]), statistics.median(timings[True])
    print(
        f"parse+validate {n:,} records, median of 3: without gate {without:.2f}s, with gate "
        f"{with_gate:.2f}s: the gate costs {with_gate - without:+.2f}s "
        f"({(with_gate / without - 1) * 100:+.1f}%)"
    )
    print(
        f"runs without: {[round(x, 2) for x in timings[False]]}, with: "
        f"{[round(x, 2) for x in timings[True]]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
