"""`adattr run | replay | summary`: the attribution job, a new checkpoint generation from chosen
offsets, spend per campaign."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from app.cli.commands import Add, Subcommands
from app.runtime.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.metrics import serve
    from app.runtime.spark import build_spark
    from pipelines import job
    from pipelines.dimension import DimensionMissingError
    from pipelines.metrics import JobMetrics
    from pipelines.publish import PublishError

    metrics = JobMetrics() if settings.metrics_port else None
    spark_start_s = 0.0

    def session() -> SparkSession:
        """What the job needs once the checkpoint is its own: its metrics endpoint and its
        Spark session. A start that another job keeps out binds no port and starts no JVM."""
        nonlocal spark_start_s
        if metrics is not None:
            serve(metrics.registry, settings)
        began = time.monotonic()
        spark = build_spark(settings, "adattr-attribution")
        spark_start_s = time.monotonic() - began
        return spark

    started = time.monotonic()
    try:
        spark = job.run(session, settings, available_now=args.available_now, metrics=metrics)
    except (DimensionMissingError, job.JobFailedError, job.JobRunningError, PublishError) as exc:
        print(f"adattr run: {exc}", file=sys.stderr)
        return 1
    # The whole command's time, and how much of it the Spark session's start (the JVM) took.
    print(
        f"run: stopped after {time.monotonic() - started:.1f}s "
        f"({spark_start_s:.1f}s of it starting Spark)"
    )
    return cmd_summary(args, settings, spark)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.kafka_io import KafkaConnection
    from app.runtime.spark import build_spark
    from app.tools import replay as r
    from pipelines import job
    from pipelines.dimension import DimensionMissingError
    from pipelines.publish import PublishError

    topic, kafka = settings.input_topic, KafkaConnection.of(settings)
    partitions = r.describe_topic(kafka, topic)  # checks before Spark
    if args.from_offsets:
        chosen: dict[int, int] | None = r.parse_offsets(args.from_offsets, topic, partitions)
        why = f"replay --from-offsets {args.from_offsets}"
    elif args.from_timestamp:
        ms = r.parse_timestamp(args.from_timestamp)
        chosen = r.offsets_at(kafka, topic, partitions, ms)
        why = f"replay --from-timestamp {args.from_timestamp}"
    else:
        chosen, why = None, "replay --from-earliest"
    upto: dict[int, int] = {}  # per partition, the offsets some batch read
    start: dict[int, int] = {}  # per partition, where the new generation starts
    made: list[job.Generation] = []

    def session() -> SparkSession:
        """Built under the checkpoint's lock: a refusal needs no JVM, and no job adds to the
        ledger while the replay is planned from it."""
        spark = build_spark(settings, "adattr-replay")
        warehouse = settings.warehouse_uri
        if job.has_ledger(spark, warehouse):
            upto.update(r.ledger_read_upto(spark, warehouse, topic))
        start.update(r.plan(topic=topic, partitions=partitions, chosen=chosen, read_upto=upto))
        return spark

    def new_generation() -> None:
        old = job.current_generation(settings.checkpoints)
        gen = job.new_generation(
            settings.checkpoints, old.number + 1, r.spark_starting_offsets(topic, start), why
        )
        made.append(gen)
        print(f"replay: generation {gen.number} ({gen.app_id}) replaces {old.number}; {why}")
        for p, offset in sorted(start.items()):
            at = "earliest" if offset == r.EARLIEST else str(offset)
            print(f"  {topic}[{p}] from {at} (held {partitions[p].low}..{partitions[p].high - 1})")
        print(f"  offsets read again: up to {r.rereads(start, partitions, upto):,}")

    started = time.monotonic()
    try:
        spark = job.run(
            session, settings, available_now=not args.keep_running, before_start=new_generation
        )
    except (DimensionMissingError, job.JobFailedError, job.JobRunningError, PublishError) as exc:
        print(f"adattr replay: {exc}", file=sys.stderr)
        return 1
    print(
        f"replay: generation {made[0].number} caught up in {time.monotonic() - started:.1f}s; "
        "`adattr run` continues it, `adattr audit` checks it"
    )
    return cmd_summary(args, settings, spark)


def cmd_summary(args: argparse.Namespace, settings: Settings, spark: object = None) -> int:
    from app.runtime.spark import build_spark
    from app.tools.verify import campaign_summary

    session = spark or build_spark(settings, "adattr-summary")
    rows = campaign_summary(session, settings.warehouse_uri)  # type: ignore[arg-type]
    print(
        f"{'campaign':<12} {'impressions':>12} {'clicks':>8} {'spend':>16} "
        f"{'conversions':>11} {'revenue':>14} {'(pending)':>9}"
    )
    for campaign, imps, clicks, spend, conversions, revenue, pending in rows:
        print(
            f"{campaign:<12} {imps:>12,} {clicks:>8,} {spend:>16.6f} "
            f"{conversions:>11,} {revenue:>14.2f} {pending:>9,}"
        )
    return 0


def add_commands(sub: Subcommands, add: Add) -> None:
    run = add("run", cmd_run, "run the attribution job (until SIGTERM/SIGINT)")
    run.add_argument(
        "--available-now", action="store_true", help="process everything in the topic, then exit"
    )
    replay = add(
        "replay",
        cmd_replay,
        "start a new checkpoint generation that re-reads the input from chosen offsets; "
        "tables stay exact (see README: Replays)",
    )
    where = replay.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-offsets",
        metavar="JSON",
        help='e.g. \'{"ad-events":{"0":1200,"3":0}}\'; partitions not named are not replayed',
    )
    where.add_argument(
        "--from-timestamp", metavar="ISO", help="e.g. 2026-11-20T10:00:00Z (Kafka record time)"
    )
    where.add_argument("--from-earliest", action="store_true", help="everything Kafka holds")
    replay.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the job running after catching up (default: stop when caught up)",
    )
    add("summary", cmd_summary, "print spend per campaign from gold_ad_metrics_1m")
