"""Where the read + state + classify phase of a 25,000-record batch goes (issue 13's profile).

The shipped job's stream unions two branches over one Kafka source (every record as read, and
the first sightings from ``dropDuplicatesWithinWatermark``), so each batch scans Kafka and parses
its records twice; the sink then persists the union and classifies. B1, the textbook job, parses
with ``from_json`` once and deduplicates. This runs each layer of that path as its own streaming
query over the same preloaded topic (the bench's traffic), in one Spark session, in turn, the
order reversed every round, and prints the median trigger time per batch (left out: the first
batch of each query, which pays the JIT and the state store's creation, and the topic's small
last one):

- ``scan``: Kafka -> noop (B0);
- ``parse``: + the job's coordinates and ``parse_events`` (VARIANT parse, every check);
- ``state``: + the first-sightings branch (filter to valid, watermark, dedup);
- ``union``: the job's stream (both branches, two scans and two parses) -> noop;
- ``classify``: the union into ``foreachBatch`` doing the sink's step: persist, ``classify`` and
  the per-partition statistics collected (no enrichment, no write);
- ``b1``: B1's read (``from_json``, dedup within the watermark) -> noop.

    .venv/bin/python infra/bench/read_split.py [--events 100000] [--batch 25000] [--rounds 2]

It starts (and stops) the embedded broker like the bench does; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.runtime.settings import Settings
from app.tools.bench import bench_stack, run_order, textbook_read
from app.tools.drills import Stack, chunks_of
from app.tools.generator import GenConfig, plan_traffic
from pipelines import job
from pipelines.offset_log import read_batch_meta
from pipelines.record_writes import batch_stats
from pipelines.sink import FIRST, RECORD
from pipelines.transforms import classify, first_sightings, parse_events, with_kafka_coordinates

VARIANTS = ("scan", "parse", "state", "union", "classify", "b1")


def stream_of(variant: str, kafka: DataFrame, settings: Settings) -> DataFrame:
    if variant == "scan":
        return kafka
    if variant == "b1":
        return textbook_read(kafka, settings)
    parsed = kafka.transform(with_kafka_coordinates).transform(
        parse_events(max_bytes=settings.max_record_bytes)
    )
    if variant == "parse":
        return parsed
    if variant == "state":
        return parsed.transform(first_sightings(watermark_delay=settings.watermark_delay))
    assert variant in ("union", "classify"), variant
    return job.attribution_stream(kafka, settings)


def classify_step(checkpoint: Path) -> Callable[[DataFrame, int], None]:
    """The sink's read + state + classify step, as ``pipelines.sink`` runs it (the watermark from
    the offset log; no prior decisions, no stored ids: a fresh generation)."""

    def each(batch_df: DataFrame, batch_id: int) -> None:
        watermark_ms = read_batch_meta(checkpoint, batch_id).watermark_ms
        batch_df.persist(StorageLevel.MEMORY_AND_DISK)
        records = batch_df.where(F.col("_branch") == RECORD).drop("_branch")
        firsts = batch_df.where(F.col("_branch") == FIRST).select(
            "kafka_topic", "kafka_partition", "kafka_offset"
        )
        rows = classify(records, firsts, watermark_ms=watermark_ms)
        rows.persist(StorageLevel.MEMORY_AND_DISK)
        batch_stats(rows)
        rows.unpersist()
        batch_df.unpersist()

    return each


def run(spark: SparkSession, s: Stack, variant: str, run_id: str) -> list[float]:
    """Seconds per batch (trigger execution) of one query over the whole topic."""
    kafka = job.read_events(spark, s.settings)
    frame = stream_of(variant, kafka, s.settings)
    checkpoint = s.dir / "checkpoints" / run_id
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint)).trigger(
        availableNow=True
    )
    if variant == "classify":
        query = writer.foreachBatch(classify_step(checkpoint)).start()
    else:
        query = writer.format("noop").start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"{variant}: {query.exception()}")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    full = max(p["numInputRows"] for p in batches)  # the union counts each record twice
    # The first pays the JIT and the state store's creation; the topic's remainder is smaller.
    return [
        p["durationMs"]["triggerExecution"] / 1000
        for p in batches[1:]
        if p["numInputRows"] >= 0.9 * full
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    from app.runtime.spark import build_spark

    s = bench_stack(Settings.from_env({}), "read-split", events=args.events, batch=args.batch)
    s.up()
    try:
        cfg = GenConfig(
            events=args.events, seed=3, users=100_000, ads=1000, malformed_ratio=0, step_ms=2
        )
        traffic = plan_traffic(cfg)
        for part in chunks_of(traffic.main, 10):
            s.produce(part)
        print(f"read-split: {len(traffic.main):,} records, {args.batch:,} per batch; {s.dir}")
        spark = build_spark(s.settings, "adattr-bench-read-split")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        took: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in run_order(tuple(variants), r):
                batches = run(spark, s, v, f"{v}-{r}")
                took[v].extend(batches)
                print(f"  round {r + 1} {v}: {[round(x, 2) for x in batches]}", flush=True)
        print(f"seconds per {args.batch:,}-record batch, median (range), batches 2..n:")
        for v in variants:
            xs = took[v]
            print(
                f"  {v:9s} {statistics.median(xs):6.2f}  ({min(xs):.2f}-{max(xs):.2f}, "
                f"{len(xs)} batches)  {args.batch / statistics.median(xs):,.0f} records/s"
            )
        spark.stop()
    finally:
        s.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
