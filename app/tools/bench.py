"""``adattr bench``: throughput, latency and the cost of exactly-once, side by side in one run.

Workload (after the Yahoo Streaming Benchmark, on adattr's own contract): JSON ad events of
~250 bytes, 100 campaigns x 10 ads, 2% duplicates, 0.1% late, preloaded into a topic of its
own. Variants, each a fresh process (``python -m app.tools.bench worker``) reading that same topic
into fresh tables, run in turn (B0s B0k B1 B2 B3, then B0k ... B0s, ...) so drift hits all:

- ``B0s`` the Spark Kafka source (read_committed) into Spark's ``noop`` sink: the read ceiling;
- ``B0k`` a plain confluent-kafka consumer loop (read_committed) counting records;
- ``B1`` the textbook peer: the job a data engineer writes from the Spark docs (``from_json``,
  ``dropDuplicatesWithinWatermark``, a broadcast join with ``dim_ads``, a 1-minute count per ad
  MERGEd into one Delta table per batch with Delta's txn ids): no quarantine, no late capture,
  no attribution, no sessions, no ledger, no Kafka output;
- ``B2`` the full pipeline, at-least-once: the same transforms and state, plain Delta appends
  instead of keyed MERGEs, no Delta txn ids, a plain Kafka producer (``ADATTR_DELIVERY``);
- ``B3`` the full exactly-once pipeline as shipped.

Sustained rate excludes warm-up: micro-batches are capped (``maxOffsetsPerTrigger`` = 1/8 of the
topic), the first data batch is dropped, and so is a last one under half the largest (the
topic's tail: the ~200 late records, produced last, after eight full batches of the full run),
and the rate is records / wall time of the rest (Spark's own per-batch ``triggerExecution``).
Latency: the job runs with a 1 s trigger on an empty topic while a paced producer sends at ~50%
of B3's median rate; a read_committed consumer notes when each batch's commit marker becomes
visible; per record, latency = that moment - the record's Kafka timestamp (its send time), the
first 10 s (a third of a short run) excluded. Fixed cost: in the latency worker's process once
its run has stopped, on a topic and tables of its own (``--fixed-only``: a process of its own).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from pipelines.report import BatchReport

_T = TypeVar("_T")

VARIANTS = ("B0s", "B0k", "B1", "B2", "B3")
# The soak's slices: cost per 5 minutes of a run (a shorter run: a sixth of it).
SOAK_SLICE_S = 300.0
# Records per data batch of the fixed-cost rounds.
FIXED_SIZE = 1000
# How often the soak looks for the driver's latest garbage collection (and the heap after it).
HEAP_SAMPLE_S = 1.0
LABELS = {
    "B0s": "B0 Spark Kafka source, no-op sink",
    "B0k": "B0 confluent-kafka consumer loop",
    "B1": "B1 textbook job, one Delta table",
    "B2": "B2 full pipeline, at-least-once",
    "B3": "B3 full pipeline, exactly-once (shipped)",
}


# -- the worker: one measured run in its own process ----------------------------------------------


def _peak_jvm(spark: Any) -> dict[str, float]:
    """Peak resident memory of the driver JVM (the whole local-mode Spark) and its peak heap."""
    jvm = spark._jvm
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    hwm_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm_kb = int(line.split()[1])
    pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    heap = sum(
        p.getPeakUsage().getUsed() for p in pools if str(p.getType().toString()) == "Heap memory"
    )
    return {"peak_rss_mb": hwm_kb / 1024, "peak_heap_mb": heap / 2**20}


def heap_after_gc(spark: Any) -> tuple[str, float] | None:
    """The driver JVM's latest garbage collection (young or full) and the heap in use right
    after it, in MB (every heap pool, from the collectors' own record), or None before the
    first. A young collection leaves the old generation's garbage for a later old one (G1's
    mixed, Parallel GC's full), so over a long run the least of these is nearest what the run
    keeps alive: a leak shows as its rise, the garbage a batch makes does not."""
    latest = None
    for bean in spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans():
        info = bean.getLastGcInfo()
        if info is not None and (latest is None or info.getEndTime() > latest[1].getEndTime()):
            latest = (str(bean.getName()), info)
    if latest is None:
        return None
    name, info = latest
    used = sum(u.getUsed() for u in info.getMemoryUsageAfterGc().values())
    return f"{name} #{info.getId()}", used / 2**20


def sustained_rate(
    progress: list[dict[str, Any]], records: dict[int, int] | None = None
) -> dict[str, Any]:
    """Records / wall time over the data batches but the first (warm-up) and the topic's tail: a
    last batch under half the largest holds what was left of the topic, not what the cap lets
    in, and at a sustained rate every batch is full, so its fixed cost is left out too.
    ``records`` (batch id -> records read, from the sink) replaces Spark's ``numInputRows``,
    which counts the pipeline's two branches over the one Kafka source twice."""

    def read(p: dict[str, Any]) -> int:
        return records.get(int(p["batchId"]), 0) if records is not None else int(p["numInputRows"])

    batches = [
        (read(p), int(p["durationMs"].get("triggerExecution", 0))) for p in progress if read(p) > 0
    ]
    measured = batches[1:] if len(batches) > 1 else batches  # the first is warm-up
    tail = len(measured) > 1 and measured[-1][0] < max(n for n, _ in batches) / 2
    if tail:
        measured = measured[:-1]
    rows = sum(n for n, _ in measured)
    seconds = sum(ms for _, ms in measured) / 1000
    return {
        "batches": len(batches),
        "tail_records_excluded": batches[-1][0] if tail else 0,
        "records_measured": rows,
        "seconds_measured": seconds,
        "events_per_s": rows / seconds if seconds else 0.0,
        "records_total": sum(n for n, _ in batches),
        "batch_records_ms": batches,  # every data batch, so a run can be counted another way
    }


CONSUME_TIMEOUT_S = 0.05


def _consumer_loop(settings: Any) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    from app.runtime.kafka_io import KafkaConnection, consumer_config
    from app.tools.replay import describe_topic

    kafka = KafkaConnection.of(settings)
    parts = describe_topic(kafka, settings.input_topic)
    consumer = Consumer(
        consumer_config(
            kafka,
            "adattr-bench",
            committed_only=True,
            **{"enable.partition.eof": True, "fetch.max.bytes": 52_428_800},
        )
    )
    consumer.assign(
        [TopicPartition(settings.input_topic, p, info.low) for p, info in parts.items()]
    )
    seen, ended = 0, 0
    # Timed from the first record on (connecting and the first fetch are the warm-up): the
    # client prefetches, so a later start would time its local queue, not the broker.
    started = time.monotonic()
    t_warm, n_warm = started, 0
    first_fetch = 0  # records in hand when the call that brought the first one returned
    while ended < len(parts):
        # A short timeout: consume() returns when it has 10,000 messages *or* the timeout has
        # passed, so the call that meets the partitions' ends waits it out whole (5 s until
        # 2026-12-05: 200,000 records in ~5.1 s, the "39,000 events/s" of every run then).
        for msg in consumer.consume(10_000, timeout=CONSUME_TIMEOUT_S):
            if msg.error() is not None:
                ended += 1  # partition EOF
                continue
            seen += 1
            if seen == 1:
                t_warm, n_warm = time.monotonic(), 1
        if seen and not first_fetch:
            first_fetch = seen
    ended_at = time.monotonic()
    consumer.close()
    timed_from = "first record"
    if seen == first_fetch:
        # Every record came with the first (a small topic: the quick bench's 4,000 records are
        # one fetch), or none came: timed from the first record, the rest took microseconds of
        # a loop over memory (17.8M "events/s" once). Timed from the assignment instead,
        # connecting and the fetch included: a lower bound, and said so.
        t_warm, n_warm, timed_from = started, 0, "assignment (every record in one fetch)"
    took = ended_at - t_warm
    return {
        "records_total": seen,
        "records_measured": seen - n_warm,
        "seconds_measured": took,
        "timed_from": timed_from,
        "events_per_s": (seen - n_warm) / took if took else 0.0,
        "batches": 0,
    }


def worker(variant: str, out: Path, dim: Path | None) -> None:
    """Runs one variant against the topic named by the ADATTR_* environment; writes JSON."""
    from app.runtime.settings import Settings

    settings = Settings.from_env(os.environ)
    started = time.monotonic()
    if variant == "B0k":
        result = _consumer_loop(settings)
        out.write_text(json.dumps({"variant": variant, **result}))
        return
    from app.runtime.spark import build_spark
    from pipelines import job

    spark = build_spark(settings, f"adattr-bench-{variant}")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    steps: list[dict[str, float]] = []
    read: dict[int, int] = {}

    def observe(report: BatchReport) -> None:
        steps.append(report.steps)
        read[report.batch_id] = report.records

    if dim is not None and variant in ("B1", "B2", "B3"):
        from app.tools.dim_csv import read_dim_csv
        from pipelines.dimension import upsert_dim_ads

        upsert_dim_ads(spark, settings.warehouse_uri, read_dim_csv(dim))
    from app.runtime.processes import tree_cpu_seconds

    cpu_before = tree_cpu_seconds(os.getpid())
    if variant == "B1":
        query = textbook_job(spark, settings)
    elif variant == "B0s":
        query = (
            job.read_events(spark, settings)
            .writeStream.format("noop")
            .option("checkpointLocation", str(settings.checkpoints / "b0"))
            .trigger(availableNow=True)
            .start()
        )
    else:
        query = job.start(spark, settings, available_now=True, observer=observe)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"{variant}: the query failed: {query.exception()}")
    result = {
        "variant": variant,
        **sustained_rate([json.loads(p.json) for p in query.recentProgress], read or None),
        "wall_s": time.monotonic() - started,
        # the query's whole run, its first batch included (the JVM's start and the dimension's
        # load before it are not)
        "cpu_s": tree_cpu_seconds(os.getpid()) - cpu_before,
        "steps": steps,
        **_peak_jvm(spark),
    }
    out.write_text(json.dumps(result))


def textbook_read(kafka: Any, settings: Any) -> Any:
    """B1's read of the Kafka source: ``from_json``, the valid ones deduplicated."""
    from pyspark.sql import functions as F

    schema = "event_id string, event_type string, event_time string, ad_id string"
    return (
        kafka.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
        .select(
            "e.event_id",
            "e.ad_id",
            F.to_timestamp("e.event_time", "yyyy-MM-dd'T'HH:mm:ss.SSSX").alias("event_time"),
        )
        .where(F.col("event_id").isNotNull() & F.col("event_time").isNotNull())
        .withWatermark("event_time", settings.watermark_delay)
        .dropDuplicatesWithinWatermark(["event_id"])
    )


def textbook_job(spark: Any, settings: Any) -> Any:
    """B1: one keyed MERGE per batch into one table, as the Spark and Delta docs show it."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from pipelines import job
    from pipelines import tables as t
    from pipelines.delta_writes import delta_txn

    warehouse = settings.warehouse_uri
    target = f"{warehouse}/b1_ad_counts_1m"
    # Auto compaction, as the job's MERGEd tables have it (the session leaves it to tables).
    DeltaTable.createIfNotExists(spark).location(target).addColumns(
        cast(
            StructType,
            StructType.fromDDL(
                "window_start timestamp, ad_id string, campaign_id string, events long"
            ),
        )
    ).property("delta.autoOptimize.autoCompact", "true").execute()
    dim = spark.read.format("delta").load(f"{warehouse}/{t.DIM_ADS}")
    events = textbook_read(job.read_events(spark, settings), settings).join(
        F.broadcast(dim.select("ad_id", "campaign_id")), "ad_id"
    )

    def write(batch: Any, batch_id: int) -> None:
        counts = batch.groupBy(
            F.window("event_time", "1 minute").start.alias("window_start"), "ad_id", "campaign_id"
        ).agg(F.count("*").alias("events"))
        with delta_txn(spark, "adattr-bench-b1", batch_id):
            (
                DeltaTable.forPath(spark, target)
                .alias("t")
                .merge(counts.alias("s"), "t.window_start = s.window_start AND t.ad_id = s.ad_id")
                .whenMatchedUpdate(set={"events": "t.events + s.events"})
                .whenNotMatchedInsertAll()
                .execute()
            )

    return (
        events.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(settings.checkpoints / "b1"))
        .trigger(availableNow=True)
        .start()
    )


def fixed_cost_worker(
    rounds: int, size: int, out: Path, *, spark: Any = None, settings: Any = None
) -> None:
    """What a micro-batch costs apart from its data: the job with a 1 s trigger on an empty
    topic; ``rounds`` times, ``size`` records are sent at once (their event times move the
    watermark), Spark runs a batch for them and then, the watermark having moved, a batch with
    no records (``noDataMicroBatches``). Each batch's time is Spark's own triggerExecution.

    In a process of its own by default; the full and quick bench run it in the latency worker's
    session after that run (``settings`` its own tables, checkpoints and topics): one JVM start
    fewer, and the round that warms the job up is still left out of the figures."""
    from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics
    from app.runtime.settings import Settings
    from app.runtime.spark import build_spark
    from app.tools.generator import GenConfig, plan_traffic, produce
    from pipelines import job
    from pipelines.dimension import upsert_dim_ads

    settings = settings or Settings.from_env(os.environ)
    kafka = KafkaConnection.of(settings)
    ensure_topics(kafka, app_topics(settings))
    traffic = plan_traffic(
        GenConfig.for_settings(
            settings,
            events=size * (rounds + 1),
            seed=13,
            users=100_000,
            ads=1000,
            malformed_ratio=0,
            duplicate_ratio=0,
            late_ratio=0,
            step_ms=200,
        )
    )
    gc.freeze()  # as in latency_worker
    spark = spark or build_spark(settings, "adattr-bench-fixed")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    upsert_dim_ads(spark, settings.warehouse_uri, traffic.dim_rows)
    read: dict[int, int] = {}
    steps: dict[int, dict[str, float]] = {}

    def observe(report: BatchReport) -> None:
        read[report.batch_id] = report.records
        steps[report.batch_id] = report.steps

    query = job.start(spark, settings, available_now=False, observer=observe)
    records = traffic.main[: size * (rounds + 1)]
    warm: set[int] = set()
    for i in range(rounds + 1):  # the first round warms the job up and is not counted
        seen = len(read)
        chunk = records[i * size : (i + 1) * size]
        produce(chunk, kafka, settings.input_topic, progress=False)
        deadline = time.monotonic() + 300
        # until the batch of these records and the no-data batch after it have both run
        while not (sum(read.values()) >= (i + 1) * size and len(read) >= seen + 2):
            if query.exception() is not None:
                raise SystemExit(f"the job failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"round {i}: the job did not run its batches within 300 s")
            query.awaitTermination(1)
        if i == 0:
            warm = set(read)
    # The observer runs inside a batch; Spark posts the batch's progress after it returns. Wait
    # for every observed batch's progress (the last one's was missing once: one round uncounted).
    progress = _progress_of(query, set(read), timeout=120)
    data: list[float] = []
    empty: list[float] = []
    data_steps: list[dict[str, float]] = []
    empty_steps: list[dict[str, float]] = []
    for b, p in sorted(progress.items()):
        if b not in warm:
            seconds = int(p["durationMs"].get("triggerExecution", 0)) / 1000
            (data if read[b] else empty).append(seconds)
            (data_steps if read[b] else empty_steps).append(steps[b])
    job.stop_between_batches(query)
    counted = set(progress) - warm
    warehouse = settings.local_warehouse
    assert warehouse is not None, "the bench's warehouse is a local folder (_run_env)"
    delta_ms = delta_write_split(
        warehouse, job.current_generation(settings.checkpoints).app_id, counted
    )
    out.write_text(
        json.dumps(
            {
                "size": size,
                "rounds": rounds,
                "data_batches_s": data,
                "empty_batches_s": empty,
                "data_median_s": statistics.median(data) if data else None,
                "empty_median_s": statistics.median(empty) if empty else None,
                # the sink's own phases, median per batch (the rest is Spark's, around it)
                "data_split_s": _median_steps(data_steps),
                "empty_split_s": _median_steps(empty_steps),
                # Delta's own split of the counted batches' writes
                "delta_ms": delta_ms,
            }
        )
    )


def _progress_of(query: Any, batches: set[int], timeout: float) -> dict[int, dict[str, Any]]:
    """The progress of each of ``batches``, once Spark has posted all of them."""
    deadline = time.monotonic() + timeout
    while True:
        posted = {int(p["batchId"]): p for p in (json.loads(p.json) for p in query.recentProgress)}
        if batches <= set(posted):
            return {b: posted[b] for b in batches}
        if query.exception() is not None:
            raise SystemExit(f"the job failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no progress for batches {sorted(batches - set(posted))}")
        query.awaitTermination(0.2)


def _median_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    names = {k for s in steps for k in s}
    return {k: round(statistics.median(s.get(k, 0.0) for s in steps), 3) for k in sorted(names)}


def latency_worker(
    rate: float,
    seconds: float,
    out: Path,
    slice_seconds: float,
    fixed: tuple[int, dict[str, str], Path] | None = None,
) -> None:
    """The job with a 1 s trigger on an empty topic, fed at ``rate`` records/s for
    ``seconds``; per record, the time until its batch's marker is visible read_committed. Per
    slice of ``slice_seconds`` (the soak: whether cost grows with time), the batches' durations,
    the latencies of the records sent in it, and at its end the data files of every table.
    With ``fixed`` (rounds, the fixed-cost run's settings over this process's environment, its
    result file), ``fixed_cost_worker`` follows in the same session."""
    from confluent_kafka import Consumer, TopicPartition

    from app.runtime.kafka_io import KafkaConnection, app_topics, consumer_config, ensure_topics
    from app.runtime.settings import Settings
    from app.runtime.spark import build_spark, held_executions
    from app.tools.generator import GenConfig, plan_traffic, produce
    from pipelines import job
    from pipelines import tables as t
    from pipelines.dimension import upsert_dim_ads
    from pipelines.publish import Marker

    settings = Settings.from_env(os.environ)
    kafka = KafkaConnection.of(settings)
    ensure_topics(kafka, app_topics(settings))
    n = int(rate * seconds)
    traffic = plan_traffic(
        GenConfig.for_settings(
            settings, events=n, seed=11, users=100_000, ads=1000, malformed_ratio=0, step_ms=2
        )
    )
    # The plan lives as long as the run: kept out of the collections the sink runs after every
    # batch (a job's process holds no such plan; walking it would bill the bench's own memory
    # to the job's batches).
    gc.freeze()
    spark = build_spark(settings, "adattr-bench-latency")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000000")
    warehouse = settings.warehouse_uri
    upsert_dim_ads(spark, warehouse, traffic.dim_rows)
    visible: dict[int, float] = {}
    stop = threading.Event()
    files: list[tuple[float, dict[str, int]]] = []  # (when, data files per table)
    heap: dict[str, tuple[float, float]] = {}  # collection -> (when seen, MB in use after it)
    local = settings.local_warehouse

    def count_files() -> None:
        if local is not None:
            files.append((time.time(), files_per_table(local)))

    def sample_files() -> None:
        while not stop.wait(slice_seconds):
            count_files()

    def sample_heap() -> None:  # every collection once (they come every few seconds)
        while not stop.wait(HEAP_SAMPLE_S):
            latest = heap_after_gc(spark)
            if latest is not None:
                heap.setdefault(latest[0], (time.time(), latest[1]))

    gen = job.current_generation(settings.checkpoints)

    def watch() -> None:
        consumer = Consumer(consumer_config(kafka, "adattr-bench-lat", committed_only=True))
        consumer.assign([TopicPartition(settings.control_topic, 0, 0)])
        while not stop.is_set():
            msg = consumer.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            marker = Marker(**json.loads(msg.value() or b"{}"))
            if marker.app_id == gen.app_id:
                visible.setdefault(marker.batch_id, time.time())
        consumer.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    query = job.start(spark, settings, available_now=False)
    samplers = [threading.Thread(target=f, daemon=True) for f in (sample_files, sample_heap)]
    for sampler in samplers:
        sampler.start()
    produce(
        traffic.main,
        kafka,
        settings.input_topic,
        rate=rate,
        progress=False,
    )
    sent = len(traffic.main)
    deadline = time.monotonic() + 120

    def read() -> int:
        ledger = spark.read.format("delta").load(f"{warehouse}/{t.LEDGER}")
        total = ledger.selectExpr("coalesce(sum(counts['read']), 0) AS n").first()
        return int(total.n) if total is not None else 0

    while read() < sent and time.monotonic() < deadline:  # until every record is in a batch
        query.awaitTermination(1)
    progress = [json.loads(p.json) for p in query.recentProgress]
    job.stop_between_batches(query)
    stop.set()
    watcher.join()
    for sampler in samplers:
        sampler.join()
    # Every execution of the run has ended: a job still held is one filed after its execution
    # ended, kept for the driver's life (a leak of one per batch ran the job out of heap).
    held = held_executions(spark)
    count_files()
    bronze = spark.read.format("delta").load(f"{warehouse}/{t.BRONZE}")
    sent_at = {
        (r.kafka_partition, r.kafka_offset): r.ts
        for r in bronze.selectExpr(
            "kafka_partition", "kafka_offset", "unix_millis(kafka_timestamp) / 1000 AS ts"
        ).collect()
    }
    first = min(sent_at.values()) if sent_at else 0.0
    warm = min(10.0, seconds / 3)
    latencies = []
    sent_and_latency: list[tuple[float, float]] = []
    for row in spark.read.format("delta").load(f"{warehouse}/{t.LEDGER}").collect():
        shown = visible.get(row.batch_id)
        if shown is None:
            continue
        for o in row.offsets:
            for off in range(o.from_offset, o.to_offset + 1):
                ts = sent_at.get((o.kafka_partition, off))
                if ts is not None and ts - first >= warm:  # warm-up excluded
                    latencies.append(shown - float(ts))
                    sent_and_latency.append((float(ts), shown - float(ts)))
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0

    out.write_text(
        json.dumps(
            {
                "rate": rate,
                "seconds": seconds,
                "records": len(latencies),
                "p50": pct(0.50),
                "p95": pct(0.95),
                "p99": pct(0.99),
                "max": latencies[-1] if latencies else 0.0,
                "slice_seconds": slice_seconds,
                # after every record sent is in a batch (the slices' counts are taken on the
                # clock: on a slow machine a short run's last slice can end before a first commit)
                "files_end": files[-1][1] if files else {},
                "held_executions_end": held,
                "slices": soak_slices(
                    sent_and_latency,
                    [_batch_of(p) for p in progress],
                    files,
                    list(heap.values()),
                    start=first,
                    slice_seconds=slice_seconds,
                    count=max(1, round(seconds / slice_seconds)),
                ),
            }
        )
    )
    if fixed is not None:
        rounds, env, fixed_out = fixed
        spark.catalog.clearCache()  # the run's cached state: the next starts as a fresh process
        fixed_settings = Settings.from_env({**os.environ, **env})
        fixed_cost_worker(rounds, FIXED_SIZE, fixed_out, spark=spark, settings=fixed_settings)


def files_per_table(warehouse: Path) -> dict[str, int]:
    """The data files of each table's newest version with a checksum file (Delta writes one
    after each commit, with the count), read from disk: counting costs the job nothing."""
    from pipelines import tables as t

    counts: dict[str, int] = {}
    for table in t.TABLES:
        log = warehouse / table.name / "_delta_log"
        for crc in sorted(log.glob("*.crc"), reverse=True) if log.is_dir() else []:
            try:
                counts[table.name] = int(json.loads(crc.read_text())["numFiles"])
                break
            except (OSError, ValueError, KeyError):
                continue  # being written: the one before
    return counts


# Delta's own timing of a write, in its commit's operationMetrics (milliseconds), as reported.
DELTA_TIMES = {
    "executionTimeMs": "execution",
    "materializeSourceTimeMs": "copying the source",
    "scanTimeMs": "scan",
    "rewriteTimeMs": "rewrite",
}


def delta_write_split(warehouse: Path, app_id: str, batches: set[int]) -> dict[str, dict[str, Any]]:
    """How Delta itself split the time of the writes of ``batches`` (of the job's ``app_id``),
    per table and operation ("gold_ad_metrics_1m MERGE"): how many commits, and the median of
    each of ``DELTA_TIMES`` Delta reported (ms). A commit is the batch's by its Delta txn
    (app id, version = batch id), or, without one, by the note its commit carries (the
    finalising UPDATEs, ``pipelines.delta_writes.noted``); read from the commit files (the
    commitInfo action holds the metrics), so it costs the job nothing. Appends and
    compactions report no times."""
    from pipelines import tables as t

    wanted = {(app_id, b) for b in batches}
    found: dict[str, list[dict[str, str]]] = {}
    for table in t.TABLES:
        log = warehouse / table.name / "_delta_log"
        for commit in log.glob("*.json") if log.is_dir() else []:
            if not commit.stem.isdigit():  # e.g. a compacted log, a v2 checkpoint
                continue
            actions = [json.loads(line) for line in commit.read_text().splitlines()]
            txn = next((a["txn"] for a in actions if "txn" in a), None)
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
            if info is None or "executionTimeMs" not in info.get("operationMetrics", {}):
                continue
            if txn is not None:
                batch = (txn["appId"], txn["version"])
            else:  # a write without txn ids notes its batch (pipelines.delta_writes.noted)
                note = _json_object(info.get("userMetadata"))
                batch = (str(note.get("app_id")), _int_or_none(note.get("batch_id")))
            if batch not in wanted:
                continue
            found.setdefault(f"{table.name} {info['operation']}", []).append(
                info["operationMetrics"]
            )
    return {
        key: {
            "n": len(metrics),
            **{
                label: statistics.median(int(m[name]) for m in metrics)
                for name, label in DELTA_TIMES.items()
                if all(name in m for m in metrics)
            },
        }
        for key, metrics in sorted(found.items())
    }


def _json_object(text: str | None) -> dict[str, Any]:
    """``text`` as a JSON object; {} when it is none (someone else's note, or no note)."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _batch_of(progress: dict[str, Any]) -> tuple[float, float, int]:
    """(start, seconds, input rows) of one micro-batch from Spark's progress."""
    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    seconds = int(progress["durationMs"].get("triggerExecution", 0)) / 1000
    return start, seconds, int(progress["numInputRows"])


def _quantile(xs: list[float], q: float) -> float | None:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


def soak_slices(
    latencies: list[tuple[float, float]],
    batches: list[tuple[float, float, int]],
    files: list[tuple[float, dict[str, int]]],
    heap: list[tuple[float, float]],
    *,
    start: float,
    slice_seconds: float,
    count: int,
) -> list[dict[str, Any]]:
    """Cost over time, in ``count`` slices of ``slice_seconds`` from ``start`` (epoch seconds):
    the durations of the micro-batches that started in each (those with input, and all), the
    latencies of the records sent in it ((sent, latency) pairs), the driver's heap in use after
    the garbage collections seen in it ((when, MB) pairs: median and least), and the data files
    per table at the first count taken at or after its end (the last count, for a slice that
    ends after it). Nothing outside the slices counts (the warm-up before ``start``, the batches
    that drain the topic after the last send)."""

    def index(at: float) -> int:
        return int((at - start) // slice_seconds) if at >= start else -1

    slices = []
    for i in range(count):
        lats = [x for at, x in latencies if index(at) == i]
        mine = [(sec, rows) for at, sec, rows in batches if index(at) == i]
        data = [sec for sec, rows in mine if rows > 0]
        kept = [mb for at, mb in heap if index(at) == i]
        end = start + (i + 1) * slice_seconds
        later = [counts for at, counts in files if at >= end]
        counted = later[0] if later else (files[-1][1] if files else {})
        slices.append(
            {
                "slice": i,
                "from_s": i * slice_seconds,
                "to_s": (i + 1) * slice_seconds,
                "batches": len(mine),
                "data_batches": len(data),
                "batch_p50_s": _quantile(data, 0.5),
                "batch_p95_s": _quantile(data, 0.95),
                "any_batch_p50_s": _quantile([sec for sec, _ in mine], 0.5),
                "records": len(lats),
                "latency_p50_s": _quantile(lats, 0.5),
                "latency_p99_s": _quantile(lats, 0.99),
                "collections": len(kept),
                "heap_after_gc_p50_mb": _quantile(kept, 0.5),
                "heap_after_gc_min_mb": min(kept, default=None),
                "files": counted,
            }
        )
    return slices


# -- the orchestrator ------------------------------------------------------------------------------


def _run_worker(env: dict[str, str], out: Path, *args: str, log: Path) -> dict[str, Any]:
    with log.open("wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "app.tools.bench", *args, "--out", str(out)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        ).returncode
    if rc != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"bench worker {' '.join(args)} failed ({rc}); {log}:\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def phase_medians(steps: list[dict[str, float]]) -> dict[str, float]:
    """Seconds per batch (median over data batches) in each phase of the sink."""
    rows = []
    for s in steps[1:] or steps:
        rows.append(
            {
                "read+state": s.get("read+state+classify", 0.0) + s.get("dim", 0.0),
                "records (bronze..silver)": s.get("records", 0.0),
                "gold + sessions": s.get("gold", 0.0),
                "changed rows to the driver": s.get("changed_rows", 0.0),
                "Kafka transaction": s.get("kafka", 0.0),
                "hourly pass": s.get("hourly", 0.0),
                "ledger": s.get("ledger", 0.0),
                "release": s.get("release", 0.0),
            }
        )
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}


def _run_env(s: Any, run: str, *, own_input: bool = False) -> dict[str, str]:
    """The environment of one measured run: its own tables, checkpoints and output topics, and
    (latency and fixed cost: they produce as they go) its own input topic, uncapped."""
    topic = s.settings.input_topic
    env = dict(s.env)  # the stack's: the caller's environment, its overrides, no crash point
    env["ADATTR_WAREHOUSE"] = str(s.dir / run / "warehouse")
    env["ADATTR_CHECKPOINTS"] = str(s.dir / run / "checkpoints")
    env["ADATTR_OUTPUT_TOPIC"] = f"{topic}-{run}-out"
    env["ADATTR_CONTROL_TOPIC"] = f"{topic}-{run}-control"
    if own_input:
        env["ADATTR_INPUT_TOPIC"] = f"{topic}-{run}"
        env["ADATTR_MAX_OFFSETS_PER_TRIGGER"] = "0"
    return env


def bench_stack(base: Any, name: str, *, events: int, batch: int) -> Any:
    """A drill stack set up as the bench runs the job (not started): a 1 s trigger, ``batch``
    records per micro-batch at most, and the shipped defaults where the drills shrink them."""
    from app.tools.drills import Stack

    s = Stack(base, name, events=events, seed=3, batch=batch, root="bench")
    keys = ("WATERMARK_DELAY", "ATTRIBUTION_LOOKBACK", "SESSION_GAP", "SHUFFLE_PARTITIONS")
    s.override({f"ADATTR_{key}": None for key in keys})  # the shipped defaults
    return s


def bench(
    base: Any,
    *,
    quick: bool,
    events: int | None,
    repeats: int | None,
    only_fixed: bool = False,
    publish_rows: int = 0,
    soak_minutes: float | None = None,
    soak_rate: float | None = None,
) -> int:

    n = events or (4_000 if quick else 200_000)
    reps = repeats or (1 if quick else 3)
    batch = max(1000, n // (2 if quick else 8))
    rounds = 2 if quick else 6
    s = bench_stack(base, "bench", events=n, batch=batch)
    s.up()
    try:
        if publish_rows:
            print(f"bench: publishing only; results under {s.dir}", flush=True)
            cost = _publish_cost(s, publish_rows)
            (s.dir / "result.json").write_text(json.dumps({"publish": cost}, indent=1))
            print(
                f"publish, {cost['rows']:,} changed gold rows in one transaction: rows to the "
                f"driver {cost['pull_s']:.1f}s alone (first time {cost['pull_cold_s']:.1f}s); "
                "pulled again, sent and committed "
                f"{cost['publish_s']:.1f}s ({cost['rows'] / cost['publish_s']:,.0f} rows/s, "
                f"{cost['mb']:.0f} MB of values)"
            )
            print(f"bench: wrote {s.dir / 'result.json'}")
            return 0
        if soak_minutes is not None:
            print(f"bench: soak; results under {s.dir}", flush=True)
            soak = _soak(s, soak_minutes, soak_rate, n=n, batch=batch)
            (s.dir / "result.json").write_text(json.dumps({"soak": soak}, indent=1))
            print_soak(soak)
            print(f"bench: wrote {s.dir / 'result.json'}")
            return 0
        if only_fixed:
            print(f"bench: fixed cost only; results under {s.dir}", flush=True)
            fixed = _fixed_cost(s, rounds)
            (s.dir / "result.json").write_text(json.dumps({"fixed_cost": fixed}, indent=1))
            print_fixed(fixed)
            print(f"bench: wrote {s.dir / 'result.json'}")
            return 0
        print(f"bench: {n:,} events, {reps} repeat(s); results under {s.dir}", flush=True)
        results = _throughput(s, n, reps, batch)
        b3 = statistics.median(r["events_per_s"] for r in results["B3"])
        rate = round(b3 * 0.5)
        seconds = 15.0 if quick else 90.0
        print(
            f"bench: latency at {rate:,} events/s (50% of B3) for {seconds:.0f}s, 1 s trigger, "
            f"then the fixed cost in the same JVM, {rounds} rounds of {FIXED_SIZE:,} records "
            "then a batch of none ..."
        )
        latency = _latency_run(s, "latency", rate, seconds, seconds / 3, fixed_rounds=rounds)
        fixed = json.loads((s.dir / "fixed.json").read_text())  # written by that worker
    finally:
        s.down()
    summary = summarise(results, latency, fixed, n=n, reps=reps, quick=quick)
    (s.dir / "result.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print_table(summary)
    chart(summary, s.dir / "bench.png")
    print(f"bench: wrote {s.dir / 'result.json'} and {s.dir / 'bench.png'}")
    return 0


def _publish_cost(s: Any, rows: int) -> dict[str, Any]:
    """The job's publishing path alone (``changed_records`` to the driver, then one Kafka
    transaction, as the sink does), for a batch that changed ``rows`` rows of the 1-minute gold
    table: the driver pulls every changed row and one producer sends it."""
    from pyspark.sql import functions as F

    from app.runtime.kafka_io import KafkaConnection
    from app.runtime.spark import build_spark
    from pipelines import tables as t
    from pipelines.delta_writes import Tables
    from pipelines.publish import TransactionalPublisher
    from pipelines.published_rows import changed_records, rows_of

    spark = build_spark(s.settings, "adattr-bench-publish")
    warehouse = s.settings.warehouse_uri
    t.create_tables(spark, warehouse)
    generation, batch, app_id = 1, 7, f"adattr-bench-publish-{s.id}"
    minute = F.col("id") % 1440  # one row per (minute of a day, ad): a key per row
    spark.range(rows).select(
        F.timestamp_seconds(F.lit(1_795_564_800) + minute * 60).alias("window_start"),
        F.timestamp_seconds(F.lit(1_795_564_860) + minute * 60).alias("window_end"),
        F.concat(F.lit("ad-"), (F.col("id") / 1440).cast("long")).alias("ad_id"),
        F.concat(F.lit("cmp-"), F.col("id") % 50).alias("campaign_id"),
        F.concat(F.lit("adv-"), F.col("id") % 10).alias("advertiser_id"),
        (F.col("id") % 997).alias("impressions"),
        (F.col("id") % 31).alias("clicks"),
        (F.col("id") / 7).cast("decimal(24,9)").alias("spend"),
        (F.col("id") % 3).alias("conversions"),
        (F.col("id") / 3).cast("decimal(24,6)").alias("revenue"),
        F.lit(False).alias("is_final"),
        F.lit(generation).alias("generation"),
        F.lit(batch).cast("long").alias("batch_id"),
    ).write.format("delta").mode("append").save(f"{warehouse}/{t.GOLD_1M}")
    tables = Tables(spark, warehouse, app_id, generation)
    pull_s = []
    for _ in range(2):  # the first pays the JVM's warm-up, the second is what a batch pays
        started = time.monotonic()
        pulled = sum(len(r.v) for r in rows_of(changed_records(tables, batch)))
        pull_s.append(time.monotonic() - started)
    publisher = TransactionalPublisher(
        KafkaConnection.of(s.settings),
        output_topic=s.settings.output_topic,
        control_topic=s.settings.control_topic,
        transactional_id=app_id,
        app_id=app_id,
        generation=generation,
    )

    def records() -> Any:
        for row in rows_of(changed_records(tables, batch)):
            yield row.k.encode(), row.v.encode()

    started = time.monotonic()
    outcome = publisher.publish(batch, records)
    publish_s = time.monotonic() - started
    publisher.close()
    spark.stop()
    if outcome != f"committed:{rows}":
        raise SystemExit(f"publish: expected committed:{rows}, got {outcome}")
    return {
        "rows": rows,
        "pull_cold_s": pull_s[0],
        "pull_s": pull_s[1],
        "publish_s": publish_s,
        "mb": pulled / 1e6,
    }


def _throughput(
    s: Any, n: int, reps: int, batch: int, variants: tuple[str, ...] = VARIANTS
) -> dict[str, list[dict[str, Any]]]:
    """Each variant over the same preloaded topic, ``reps`` times, alternating the order."""
    return alternating_runs(s, preload(s, n, batch), reps, variants)


def preload(s: Any, n: int, batch: int) -> Path:
    """Produces the bench's traffic of ``n`` events to the stack's input topic; returns the
    dimension's CSV (``batch``: the micro-batch size, for the message only)."""
    from app.tools.dim_csv import write_dim_csv
    from app.tools.drills import chunks_of
    from app.tools.generator import GenConfig, plan_traffic

    cfg = GenConfig(events=n, seed=3, users=100_000, ads=1000, malformed_ratio=0, step_ms=2)
    traffic = plan_traffic(cfg)
    records = traffic.main + traffic.tail  # the late ones last, behind the watermark
    sizes = [len(v) for _, v in records[:1000]]
    print(
        f"bench: preloading {len(records):,} records ({len(traffic.tail)} late; mean value "
        f"{statistics.mean(sizes):.0f} B), {batch:,} per micro-batch",
        flush=True,
    )
    for part in chunks_of(records, 10):
        s.produce(part)
    dim_csv: Path = s.dir / "dim.csv"
    write_dim_csv(dim_csv, traffic.dim_rows)
    return dim_csv


def alternating_runs(
    s: Any, dim_csv: Path, reps: int, variants: tuple[str, ...], tag: str = ""
) -> dict[str, list[dict[str, Any]]]:
    """Each variant over the stack's topic from its start, ``reps`` times, in ``run_order``;
    each run in fresh tables and checkpoints named ``<tag><variant>-<repeat>``, with the
    stack's settings (``s.overrides``: the batch size among them)."""
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(reps):
        for variant in run_order(variants, rep):
            run = f"{tag}{variant}-{rep + 1}"
            env = _run_env(s, run)
            env["ADATTR_DELIVERY"] = "at-least-once" if variant == "B2" else "exactly-once"
            print(f"bench: run {rep + 1}/{reps} {LABELS[variant]} ...", end="", flush=True)
            r = _run_worker(
                env,
                s.dir / f"{run}.json",
                "worker",
                variant,
                "--dim",
                str(dim_csv),
                log=s.dir / f"{run}.log",
            )
            results[variant].append(r)
            since = f", timed from the {r['timed_from']}" if "timed_from" in r else ""
            print(f" {r['events_per_s']:,.0f} events/s ({r['records_total']:,} records{since})")
    return results


def run_order(variants: tuple[_T, ...], rep: int) -> list[_T]:
    """The order of the variants in repeat ``rep`` (from 0): rotated by one each repeat, so no
    variant runs twice in a row (reversing put the last variant's runs back to back at every
    turn, where one slow spell of the machine hit both), and B3 runs right after B2 (B3/B2 is
    the cost of exactly-once) in each of the first four repeats (the full run has
    three)."""
    k = rep % len(variants) if variants else 0
    return list(variants[k:] + variants[:k])


def _soak(s: Any, minutes: float, rate: float | None, *, n: int, batch: int) -> dict[str, Any]:
    """The shipped job for ``minutes`` at ``rate`` (default: half of B3's sustained rate,
    measured first in one run over the bench's topic), in slices (5 minutes, or a sixth of a
    shorter run)."""
    b3 = None
    if rate is None:
        print("bench: soak: B3's sustained rate first (one run) ...", flush=True)
        b3 = _throughput(s, n, 1, batch, variants=("B3",))["B3"][0]["events_per_s"]
        rate = round(b3 * 0.5)
    seconds = minutes * 60
    slice_s = SOAK_SLICE_S if seconds >= 6 * SOAK_SLICE_S else seconds / 6
    print(
        f"bench: soak at {rate:,.0f} events/s for {minutes:g} min, 1 s trigger, "
        f"slices of {slice_s:.0f}s ...",
        flush=True,
    )
    result = _latency_run(s, "soak", rate, seconds, slice_s)
    return {**result, "minutes": minutes, "b3_events_per_s": b3}


def _latency_run(
    s: Any, run: str, rate: float, seconds: float, slice_s: float, *, fixed_rounds: int = 0
) -> dict[str, Any]:
    """The latency worker on its own input topic and tables (``run``): the shipped job fed at
    ``rate`` events/s for ``seconds``, reported per ``slice_s`` slice; then, with
    ``fixed_rounds``, the fixed cost in the same process on tables and topics of its own
    (its result in ``fixed.json``)."""
    env = _run_env(s, run, own_input=True)
    args = ["--rate", str(rate), "--seconds", str(seconds), "--slice", str(slice_s)]
    if fixed_rounds:
        own = {k: v for k, v in _run_env(s, "fixed", own_input=True).items() if env.get(k) != v}
        args += ["--fixed-rounds", str(fixed_rounds), "--fixed-env", json.dumps(own)]
        args += ["--fixed-out", str(s.dir / "fixed.json")]
    return _run_worker(
        env,
        s.dir / f"{run}.json",
        "latency",
        *args,
        log=s.dir / f"{run}.log",
    )


def _fixed_cost(s: Any, rounds: int) -> dict[str, Any]:
    print(f"bench: fixed cost, {rounds} rounds of {FIXED_SIZE:,} records then a batch of none ...")
    return _run_worker(
        _run_env(s, "fixed", own_input=True),
        s.dir / "fixed.json",
        "fixed",
        "--rounds",
        str(rounds),
        "--size",
        str(FIXED_SIZE),
        log=s.dir / "fixed.log",
    )


def summarise(
    results: dict[str, list[dict[str, Any]]],
    latency: dict[str, Any],
    fixed: dict[str, Any],
    **meta: Any,
) -> dict[str, Any]:
    rates = {v: [r["events_per_s"] for r in rs] for v, rs in results.items()}
    med = {v: statistics.median(x) for v, x in rates.items()}
    return {
        **meta,
        "rates": {
            v: {"median": med[v], "min": min(x), "max": max(x), "runs": x} for v, x in rates.items()
        },
        "ratios": {
            "B3/B1": med["B3"] / med["B1"] if med["B1"] else None,
            "B3/B2": med["B3"] / med["B2"] if med["B2"] else None,
            "B3/B0s": med["B3"] / med["B0s"] if med["B0s"] else None,
        },
        "latency": latency,
        "fixed_cost": fixed,
        "peak_rss_mb": {
            v: max(r.get("peak_rss_mb", 0) for r in rs) for v, rs in results.items() if v != "B0k"
        },
        "split": {
            v: phase_medians([s for r in results[v] for s in r["steps"]]) for v in ("B2", "B3")
        },
    }


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'variant':<44} {'events/s (median)':>18} {'range':>22} {'peak RSS':>10}")
    for v in VARIANTS:
        r = summary["rates"][v]
        rss = summary["peak_rss_mb"].get(v)
        print(
            f"{LABELS[v]:<44} {r['median']:>18,.0f} "
            f"{r['min']:>10,.0f} - {r['max']:>9,.0f} {f'{rss:,.0f} MB' if rss else '-':>10}"
        )
    ratios = summary["ratios"]
    print(
        f"B3/B1 (textbook peer): {ratios['B3/B1']:.2f}   "
        f"B3/B2 (cost of exactly-once): {ratios['B3/B2']:.2f}   "
        f"B3/B0 (Spark read): {ratios['B3/B0s']:.2f}"
    )
    lat = summary["latency"]
    print(
        f"latency at {lat['rate']:,.0f} events/s, 1 s trigger, {lat['records']:,} records: "
        f"p50 {lat['p50']:.2f}s  p95 {lat['p95']:.2f}s  p99 {lat['p99']:.2f}s"
    )
    print_held(lat)
    print_fixed(summary["fixed_cost"])
    for v, split in summary["split"].items():
        parts = "  ".join(f"{k} {x:.2f}s" for k, x in split.items())
        print(f"{v} per batch (median): {parts}")


def print_fixed(fixed: dict[str, Any]) -> None:
    def spread(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.2f}s, {min(xs):.2f}-{max(xs):.2f}s" if xs else "-"

    print(
        f"fixed cost, batch of {fixed['size']:,} records: {spread(fixed['data_batches_s'])}; "
        f"batch of none (watermark moved): {spread(fixed['empty_batches_s'])}"
    )
    for kind in ("data", "empty"):
        split = fixed.get(f"{kind}_split_s") or {}
        parts = "  ".join(f"{k} {x:.2f}s" for k, x in split.items())
        print(f"  {kind} batch, sink phases (median): {parts}")
    for key, times in (fixed.get("delta_ms") or {}).items():
        parts = "  ".join(f"{k} {x:,.0f}" for k, x in times.items() if k != "n")
        print(f"  Delta's own split, {key} x{times['n']} (median ms): {parts}")


def print_soak(soak: dict[str, Any]) -> None:
    def sec(x: float | None) -> str:
        return f"{x:.2f}" if x is not None else "-"

    def mb(x: float | None) -> str:
        return f"{x:.0f}" if x is not None else "-"

    measured = soak.get("b3_events_per_s")
    print(
        f"\nsoak at {soak['rate']:,.0f} events/s"
        + (f" (50% of B3's {measured:,.0f})" if measured else "")
        + f" for {soak['minutes']:g} min, 1 s trigger; per slice of {soak['slice_seconds']:.0f}s:"
    )
    slices = soak["slices"]
    names = sorted({name for x in slices for name in x["files"]})
    short = {n: n.replace("_ad_events", "").replace("gold_", "").replace("_ad", "") for n in names}
    print(
        f"{'slice':>5} {'min':>9} {'batches':>8} {'batch p50':>10} {'p95':>6} "
        f"{'latency p50':>12} {'p99':>6} {'heap MB':>8} {'min':>5}  files: "
        + " ".join(short[n] for n in names)
    )
    digits = 0 if soak["slice_seconds"] >= 60 else 1  # minutes of sub-minute slices
    for x in slices:
        span = f"{x['from_s'] / 60:.{digits}f}-{x['to_s'] / 60:.{digits}f}"
        files = " ".join(f"{x['files'].get(n, 0):>{len(short[n])}}" for n in names)
        print(
            f"{x['slice']:>5} {span:>9} {x['data_batches']:>8} {sec(x['batch_p50_s']):>10} "
            f"{sec(x['batch_p95_s']):>6} {sec(x['latency_p50_s']):>12} "
            f"{sec(x['latency_p99_s']):>6} {mb(x.get('heap_after_gc_p50_mb')):>8} "
            f"{mb(x.get('heap_after_gc_min_mb')):>5}         {files}"
        )
    print(
        "  (heap MB: the driver's Java heap in use after the slice's collections, median and"
        " least; the least is nearest what the run keeps alive)"
    )
    first, last = slices[0], slices[-1]
    for key, label in (("batch_p50_s", "batch p50"), ("latency_p50_s", "latency p50")):
        if first[key] and last[key] is not None:
            print(f"last slice / first, {label}: {last[key] / first[key]:.2f}")
    # The first slice starts with an empty old generation: its least says nothing of a leak.
    least = [x["heap_after_gc_min_mb"] for x in slices[1:] if x.get("heap_after_gc_min_mb")]
    if least:
        print(
            f"least heap after a collection, slices 1-{len(slices) - 1}: "
            f"{min(least):.0f}-{max(least):.0f} MB"
        )
    print(
        f"whole run, {soak['records']:,} records: latency p50 {soak['p50']:.2f}s "
        f"p99 {soak['p99']:.2f}s"
    )
    print_held(soak)


def print_held(run: dict[str, Any]) -> None:
    """The run's SQL executions still holding finished jobs once it stopped (a leak keeps one
    per batch; none or one is what a run leaves)."""
    held = run.get("held_executions_end")
    if held is None:  # a result written before the figure was
        return
    print(f"SQL executions holding finished jobs after the run: {len(held)}")
    for line in held[:5]:
        print(f"  {line}")


def chart(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4))
    meds = [summary["rates"][v]["median"] for v in VARIANTS]
    lows = [m - summary["rates"][v]["min"] for v, m in zip(VARIANTS, meds, strict=True)]
    highs = [summary["rates"][v]["max"] - m for v, m in zip(VARIANTS, meds, strict=True)]
    left.bar(
        VARIANTS,
        meds,
        yerr=[lows, highs],
        capsize=4,
        color=["#999", "#bbb", "#c93", "#6a9", "#36c"],
    )
    left.set_yscale("log")  # a consumer loop and a full pipeline differ by orders of magnitude
    left.set_ylabel("events/s (median, range; log scale)")
    left.set_title(f"throughput, {summary['n']:,} events, {summary['reps']} repeat(s)")
    for i, m in enumerate(meds):
        left.text(i, m, f"{m:,.0f}", ha="center", va="bottom", fontsize=8)
    split = summary["split"]
    names = list(next(iter(split.values())).keys()) if split else []
    bottom = [0.0] * len(split)
    for name in names:
        vals = [split[v][name] for v in split]
        right.bar(list(split), vals, bottom=bottom, label=name)
        bottom = [b + x for b, x in zip(bottom, vals, strict=True)]
    right.set_ylabel("seconds per micro-batch (median)")
    lat = summary["latency"]
    right.set_title(f"batch time split; latency p50 {lat['p50']:.1f}s p99 {lat['p99']:.1f}s")
    # Beside the bars, not over them (the split has eight phases).
    right.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.tools.bench")
    # The job's own per-batch lines (phases and tables) land in the run's log file.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("worker")
    w.add_argument("variant", choices=VARIANTS)
    w.add_argument("--out", required=True)
    w.add_argument("--dim", help="dim_ads CSV to load first (B2, B3)")
    fix = sub.add_parser("fixed")
    fix.add_argument("--rounds", type=int, required=True)
    fix.add_argument("--size", type=int, required=True)
    fix.add_argument("--out", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--rate", type=float, required=True)
    lat.add_argument("--seconds", type=float, required=True)
    lat.add_argument("--slice", type=float, required=True, help="seconds per soak slice")
    lat.add_argument("--out", required=True)
    lat.add_argument("--fixed-rounds", type=int, default=0, help="then the fixed cost")
    lat.add_argument("--fixed-env", default="{}", help="its settings (JSON: ADATTR_* values)")
    lat.add_argument("--fixed-out", help="its result file")
    args = parser.parse_args(argv)
    if args.what == "worker":
        worker(args.variant, Path(args.out), Path(args.dim) if args.dim else None)
    elif args.what == "fixed":
        fixed_cost_worker(args.rounds, args.size, Path(args.out))
    else:
        fixed = None
        if args.fixed_rounds:
            fixed = (args.fixed_rounds, json.loads(args.fixed_env), Path(args.fixed_out))
        latency_worker(args.rate, args.seconds, Path(args.out), args.slice, fixed)


if __name__ == "__main__":
    main()
