"""What one small Spark job costs in the job's own session, warm (issue 13: a micro-batch runs
~70-86 jobs; is their cost Spark's scheduling or the work around each?).

In a session built as the job builds it (``build_spark``: local Spark, the job's confs), times
three queries of 1,000 rows, each many times after a warm-up (median, ms): a job on an RDD the
plan already made (scheduling and one task, no planning), a one-partition scan collected (one
job), and a two-partition aggregate (a shuffle: one job per stage under AQE). It does so under
the shipped confs, with adaptive execution off and with code generation on, in rounds that
alternate the three (a JVM gets faster for minutes after its start, so the first round of each
is the slowest):

    .venv/bin/python infra/bench/job_cost.py [--rounds 4]

Run it alone: on two cores anything else running shows in every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from app.runtime.settings import Settings
from app.runtime.spark import build_spark

MODES = {
    "shipped (AQE on, codegen off)": {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    },
    "AQE off": {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    },
    "codegen on": {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.codegen.wholeStage": "true",
        "spark.sql.codegen.factoryMode": "FALLBACK",
    },
}


def median_ms(run: Callable[[], object], times: int = 30, warm_up: int = 5) -> float:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        took.append(time.perf_counter() - started)
    return statistics.median(took[warm_up:]) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    spark = build_spark(Settings.from_env(dict(os.environ)), "adattr-job-cost")
    scan = spark.range(0, 1000, 1, 1)
    aggregate = spark.range(0, 1000, 1, 2).selectExpr("id % 10 AS k").groupBy("k").count()
    planned = scan._jdf.queryExecution().toRdd()
    queries: dict[str, Callable[[], object]] = {
        "a planned job": planned.count,
        "scan collected": scan.collect,
        "aggregate collected": aggregate.collect,
    }
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for mode, conf in MODES.items():
            for key, value in conf.items():
                spark.conf.set(key, value)
            for name, query in queries.items():
                results.setdefault((mode, name), []).append(median_ms(query))
    print(f"{'mode':<32} {'query':<22} median ms per round")
    for (mode, name), per_round in results.items():
        print(f"{mode:<32} {name:<22} {', '.join(f'{ms:.0f}' for ms in per_round)}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
