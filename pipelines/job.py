"""Wiring of the attribution job: the streaming query, its checkpoint generation, the run loop.

The query is Kafka (read_committed) -> parse -> two branches unioned into one foreachBatch:
every record as read (for bronze, quarantine, late) and the first sightings of each valid
``event_id`` from ``dropDuplicatesWithinWatermark`` (Spark's RocksDB- or HDFS-backed state
store). The sink joins the two, so the state store decides duplicates while the sink decides
lateness from the batch's own watermark, and no record is dropped unseen.

A checkpoint *generation* is one checkpoint folder plus the Delta app id that goes with it.
Batch ids restart at 0 in a new checkpoint, so the app id changes with it (a fresh random one
per generation): reusing one would make Delta skip real writes as "already committed". A
generation also fixes where it starts reading (``startingOffsets``, only read by Spark when the
checkpoint is new): the earliest offsets for the first, chosen offsets for a replay.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics
from app.runtime.settings import Settings
from pipelines.dimension import DimSnapshots
from pipelines.high_water import read_high_water
from pipelines.lease import Lease, LeaseHeldError, LeaseLost
from pipelines.metrics import JobMetrics
from pipelines.publish import PlainPublisher, Publisher, TransactionalPublisher
from pipelines.report import BatchReport
from pipelines.sink import FIRST, RECORD, AttributionSink, SinkContext
from pipelines.tables import create_tables
from pipelines.transforms import first_sightings, parse_events, with_kafka_coordinates

QUERY_NAME = "adattr-attribution"


class JobFailedError(RuntimeError):
    pass


# Spark's Kafka source stops the query when offsets its checkpoint names are gone from the topic
# (``failOnDataLoss``, never turned off here: skipping them would lose records silently).
_DATA_LOSS = "failOnDataLoss"
_OFFSET_CHANGED = re.compile(r"Partition (\S+) offset was changed from (\d+) to (\d+)")


def failure_message(error: str, settings: Settings) -> str:
    """What the job says when its streaming query fails: Spark's reason without the dump of the
    query's plan that follows it, and for Kafka's data-loss check what happened and what to do.
    A checkpoint and the tables it wrote hold one topic's history: Kafka offsets are their keys."""
    text = error.split("=== Streaming Query ===")[0].strip()
    text = re.sub(r"\s*SQLSTATE: \w+$", "", text)
    text = re.sub(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ", "", text)
    if _DATA_LOSS not in text:
        return f"the streaming query failed: {text}"
    found = re.search(r"Reason: (.*)", text)
    reason = found.group(1).strip() if found else text.splitlines()[0]
    held = (
        f"checkpoint in {settings.checkpoints.resolve()} and the tables in "
        f"{settings.warehouse_uri} belong to the old topic"
    )
    fresh = "an empty ADATTR_CHECKPOINTS and ADATTR_WAREHOUSE"
    changed = _OFFSET_CHANGED.search(reason)
    if changed and int(changed.group(3)) < int(changed.group(2)):
        return (
            f"topic {settings.input_topic} ends before offsets the job has already read "
            f"({reason}): the topic was deleted and re-created (or truncated) since, and its "
            f"offsets now name other records. The job wrote nothing. The {held}: run the new "
            f"topic's job on {fresh}, or restore the old topic."
        )
    return (
        f"Kafka no longer holds records the job has read or has still to read from topic "
        f"{settings.input_topic} ({reason}), and the job never skips records. If the topic was "
        f"deleted and re-created, the {held}: run the new topic's job on {fresh}. If the records "
        "aged out (retention) before the job read them, they cannot be counted: `adattr replay` "
        "starts a new generation from offsets Kafka still holds (README: Replays)."
    )


class JobRunningError(RuntimeError):
    pass


EARLIEST = "earliest"


@dataclass(frozen=True)
class Generation:
    number: int
    app_id: str
    checkpoint: Path
    starting_offsets: str = EARLIEST  # "earliest" or Spark's JSON {"topic": {"0": 12, ...}}


def current_generation(checkpoints: Path) -> Generation:
    """The generation in use, or generation 1 on a first run."""
    root = checkpoints / "attribution"
    marker = root / "generation.json"
    if marker.exists():
        data = json.loads(marker.read_text())
        return Generation(
            data["number"],
            data["app_id"],
            root / f"gen-{data['number']:04d}",
            data.get("starting_offsets", EARLIEST),
        )
    return new_generation(checkpoints, 1)


def new_generation(
    checkpoints: Path, number: int, starting_offsets: str = EARLIEST, why: str = "first run"
) -> Generation:
    root = checkpoints / "attribution"
    root.mkdir(parents=True, exist_ok=True)
    gen = Generation(number, f"adattr-{uuid.uuid4()}", root / f"gen-{number:04d}", starting_offsets)
    record = {
        "number": gen.number,
        "app_id": gen.app_id,
        "starting_offsets": starting_offsets,
        "why": why,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with (root / "generations.jsonl").open("a") as history:  # every generation, for operators
        history.write(json.dumps(record) + "\n")
    tmp = root / "generation.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(root / "generation.json")  # atomic: a crash leaves the old or the new one
    return gen


@contextmanager
def exclusive(checkpoints: Path, lease_seconds: float = 30) -> Iterator[Lease]:
    """One job (or replay) at a time on a checkpoint: two would race on every batch. The lock
    is the kernel's, so a SIGKILLed holder releases it; it holds on one machine (and on a
    shared file system that honours locks). The lease (``pipelines.lease``) holds across
    machines on any shared storage: the job checks it before each batch writes."""
    root = checkpoints / "attribution"
    root.mkdir(parents=True, exist_ok=True)
    with (root / "run.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise JobRunningError(
                f"the job is already running on {checkpoints} (pid {holder}); stop it first"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        lease = Lease(root / "lease", lease_seconds)
        try:
            lease.acquire()
        except LeaseHeldError as exc:
            raise JobRunningError(f"the job is already running on {checkpoints}: {exc}") from None
        try:
            yield lease
        finally:
            lease.release()


def has_ledger(spark: SparkSession, warehouse: str) -> bool:
    from delta.tables import DeltaTable

    from pipelines import tables as t

    return bool(DeltaTable.isDeltaTable(spark, f"{warehouse}/{t.LEDGER}"))


FETCH_MAX_WAIT_MS = 20


def read_events(
    spark: SparkSession, settings: Settings, starting_offsets: str = EARLIEST
) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .options(**KafkaConnection.of(settings).spark_options())
        .option("subscribe", settings.input_topic)
        .option("startingOffsets", starting_offsets)
        # Only committed records: an aborted or still-open producer transaction is never read.
        .option("kafka.isolation.level", "read_committed")
        # How long the broker may hold a fetch that finds nothing (Kafka's default: 500 ms). A
        # read task's last poll makes the client send the next fetch ahead, at the end of the
        # committed data; read_committed, only the next transaction commit releases it. Spark
        # then asks the same broker for the partition's offset range, which queues behind the
        # parked fetch: 0.5 s of idle per task, both branches of the stream read the source,
        # ~1.9 s of a 1,000-record batch's 3.2 s read+state phase. What is read is unchanged:
        # poll still retries until records arrive or its own timeout (README "Performance").
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
    )
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    return reader.load()


def attribution_stream(kafka: DataFrame, settings: Settings) -> DataFrame:
    """The streaming frame handed to the sink: records and first sightings, tagged by branch."""
    records = kafka.transform(with_kafka_coordinates).transform(
        parse_events(max_bytes=settings.max_record_bytes)
    )
    firsts = records.transform(first_sightings(watermark_delay=settings.watermark_delay))
    return records.withColumn("_branch", F.lit(RECORD)).unionByName(
        firsts.withColumn("_branch", F.lit(FIRST)), allowMissingColumns=True
    )


def start(
    spark: SparkSession,
    settings: Settings,
    *,
    available_now: bool,
    observer: Callable[[BatchReport], None] | None = None,
    metrics: JobMetrics | None = None,
    guard: Callable[[], None] | None = None,
) -> StreamingQuery:
    """Starts the query; ``guard`` (the lease's check) runs before each batch writes anything
    and again before its Kafka transaction, and raises to stop the job."""
    _settle_stopped()
    warehouse = settings.warehouse_uri
    dims = DimSnapshots(spark, warehouse)
    dims.require()  # fail early if dim_ads is missing
    create_tables(spark, warehouse)
    gen = current_generation(settings.checkpoints)
    kafka = KafkaConnection.of(settings)
    exactly_once = settings.delivery == "exactly-once"
    # While the producer starts (mostly waiting on the broker), what the run's first batch
    # read before: the tables' high-water marks (nothing of this run is written before its
    # first batch, so they are the same now), and the dimension version in force now, cached
    # (a batch uses it unless dim_ads has a newer version by the batch's timestamp, or the
    # batch's is older, a re-execution's: then ``at`` reads the version in force then).
    with ThreadPoolExecutor(2, thread_name_prefix="adattr-start") as pool:
        warmed = pool.submit(dims.at, int(time.time() * 1000))
        marks = pool.submit(read_high_water, spark, warehouse, gen.app_id, gen.number)
        ensure_topics(kafka, app_topics(settings))
        publisher: Publisher = (
            TransactionalPublisher(
                kafka,
                output_topic=settings.output_topic,
                control_topic=settings.control_topic,
                transactional_id=settings.publisher_transactional_id,
                app_id=gen.app_id,
                generation=gen.number,
            )
            if exactly_once
            else PlainPublisher(kafka, output_topic=settings.output_topic)
        )
        warmed.result()
        high_water = marks.result()
    observers = [o for o in (observer, metrics.batch_done if metrics else None) if o is not None]
    if metrics is not None:
        metrics.watch(publisher)

    def notify(report: BatchReport) -> None:
        for each in observers:
            each(report)

    sink = AttributionSink(
        spark,
        SinkContext(
            warehouse,
            gen.checkpoint.resolve(),
            gen.app_id,
            gen.number,
            lookback_seconds=settings.attribution_lookback_seconds,
            session_gap_seconds=settings.session_gap_seconds,
            publisher=publisher,
            crash_at=settings.crash_at,
            exactly_once=exactly_once,
            observer=notify if observers else None,
            guard=guard,
            compact_files=settings.compact_files if settings.compaction == "job" else 0,
            hourly_every=settings.hourly_every,
        ),
        dims=dims,
        high_water=high_water,
    )
    writer = (
        attribution_stream(read_events(spark, settings, gen.starting_offsets), settings)
        .writeStream.queryName(QUERY_NAME)
        .foreachBatch(sink)
        .option("checkpointLocation", str(gen.checkpoint.resolve()))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.trigger_interval)
    query = writer.start()
    _sinks[query.id] = sink
    _queries[query.id] = query
    return query


# The sink of each query this process started, until ``finish`` (a query stopped without it
# keeps its sink here; the tests' crash-like stops do).
_sinks: dict[str, AttributionSink] = {}
_queries: dict[str, StreamingQuery] = {}


def _settle_stopped() -> None:
    """A sink of this process whose query stopped without ``finish`` (a failure outside the
    run loop, the tests' crash-like stops) may still have a pass in flight
    (``pipelines.pass_beside``): it lands, or fails, before a new query reads the tables' high
    water or writes anything. Sinks of queries still running are theirs to join."""
    for query_id, sink in list(_sinks.items()):
        query = _queries.get(query_id)
        if query is None or not query.isActive:
            del _sinks[query_id]
            _queries.pop(query_id, None)
            sink.abandon()


def finish(query: StreamingQuery) -> None:
    """After ``query`` stopped between batches (or drained the topic, available-now): the
    writes its batches left to the stop (the sliding hours' pass, ``pipelines.hourly_pass``).
    Nothing after a failed query but waiting for a pass in flight (``pipelines.pass_beside``),
    under the checkpoint's lease still: its next run's first batch makes what is owed."""
    sink = _sinks.get(query.id)
    if sink is None or query.isActive:
        return
    del _sinks[query.id]
    _queries.pop(query.id, None)
    if query.exception() is not None:
        sink.abandon()
        return
    try:
        sink.finish()
    except LeaseLost as exc:  # another job took the checkpoint over: it makes the pass
        raise JobFailedError(str(exc)) from None
    except Exception as exc:  # a Spark or Delta failure inside the pass's writes
        first = _first_line(exc)
        raise JobFailedError(
            f"the pass owed at the stop failed ({first}): every batch is committed and "
            "published; the attributions, 1-minute and hourly tables catch up at the next run's "
            "first batch"
        ) from exc


def _first_line(exc: BaseException) -> str:
    """An error's first line: for a JVM exception PySpark does not convert (py4j's "An error
    occurred while calling o123.execute."), the Java exception's own."""
    java = getattr(exc, "java_exception", None)
    text = str(exc)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # the JVM gone: py4j's own words
            pass
    return (text.strip().splitlines() or [type(exc).__name__])[0]


def run(
    spark: SparkSession | Callable[[], SparkSession],
    settings: Settings,
    *,
    available_now: bool,
    before_start: Callable[[], None] | None = None,
    metrics: JobMetrics | None = None,
) -> SparkSession:
    """Runs the job until the topic is drained (available-now) or until SIGTERM/SIGINT, which
    stop it at a batch boundary, and returns its session. Raises JobFailedError if the query
    fails, JobRunningError if another job holds the checkpoint.

    ``spark`` may be the function that builds the session: it is called once the checkpoint is
    this job's, so a start that another job keeps out is refused in a second, without a JVM."""
    with exclusive(settings.checkpoints, settings.checkpoint_lease_seconds) as lease:
        session = spark() if callable(spark) else spark
        if before_start is not None:  # e.g. a replay's new generation, made under the lock
            before_start()
        lost: list[LeaseLost] = []

        def guard() -> None:
            try:
                lease.check()
            except LeaseLost as exc:
                lost.append(exc)
                raise

        try:
            _run(session, settings, available_now=available_now, metrics=metrics, guard=guard)
        except Exception:
            if lost:  # the query failed because the lease is lost: say that, not Spark's dump
                raise JobFailedError(str(lost[0])) from None
            raise
    return session


def stop_between_batches(query: StreamingQuery, timeout_s: float | None = 60.0) -> None:
    """Stops ``query`` once none of its batches is running, or after ``timeout_s`` (None: never)
    whatever it runs. A batch stopped halfway has its writes interrupted (py4j prints each
    interrupted call's traceback) and is redone by the next run; between batches nothing is
    half-done. Polled often: a query that falls behind its trigger rests only until the next
    trigger time (under a second with the job's 1 s trigger) between two batches."""
    deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    finish(query)


def _run(
    spark: SparkSession,
    settings: Settings,
    *,
    available_now: bool,
    metrics: JobMetrics | None,
    guard: Callable[[], None],
) -> None:
    query = start(spark, settings, available_now=available_now, metrics=metrics, guard=guard)
    reported = -1
    stop_requested: list[int] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.append(signum)

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while query.isActive:
            query.awaitTermination(1)
            progress = query.lastProgress
            if metrics is not None and progress is not None and progress["batchId"] != reported:
                metrics.progress(progress)
                reported = progress["batchId"]
            if stop_requested:  # however long the batch in flight takes
                stop_between_batches(query, timeout_s=None)
    except StreamingQueryException as exc:  # awaitTermination raises the query's own failure
        raise JobFailedError(failure_message(str(exc), settings)) from None
    finally:
        try:  # still under the handlers above: a SIGTERM now waits for the pass too
            finish(query)  # nothing after a failure, or a second time after a requested stop
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    error = query.exception()
    if error is not None:
        raise JobFailedError(failure_message(str(error), settings))
