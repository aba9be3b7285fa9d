"""The foreachBatch sink: one micro-batch in, idempotent Delta writes out.

Exactly-once design. Spark re-executes a micro-batch whose commit-log entry is missing (a crash
after some writes and before the commit), with the same batch id, the same offsets (from the
offset log) and the same state-store version. Every write below is therefore made a no-op on a
second execution, twice over:

1. Each table's MERGE carries Delta's ``txnAppId``/``txnVersion`` (app id = checkpoint
   generation, version = batch id), recorded atomically with the data: a table that already
   committed this batch skips it.
2. Each MERGE is also keyed by the record's identity, so it inserts nothing twice even without
   (1), e.g. on a replay under a new generation: bronze, quarantine and late rows by Kafka
   coordinates (topic, partition, offset), scoped to the batch's per-partition offset ranges;
   silver by ``event_id``; gold rows are *recomputed* from silver for the windows the batch
   touched and set, never incremented.

The writes run in a fixed order (bronze, quarantine, late, silver, gold, ledger) and the ledger
row is last, so "a ledger row exists" means "the batch is complete in every table". Everything a
batch decides (the watermark, the dimension version) comes from Spark's offset log entry for the
batch, so a re-execution decides the same.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from app.crash import crash_point, crash_when_file_appears
from pipelines import tables as t
from pipelines.delta_writes import delta_txn
from pipelines.dimension import DimSnapshots
from pipelines.gold import (
    ATTRIBUTION_COLUMNS,
    attribute,
    campaign_ctr,
    recomputed_or_current,
    reopened,
    user_sessions,
    window_metrics,
)
from pipelines.high_water import HighWater, read_high_water
from pipelines.publish import Publisher
from pipelines.transforms import ACCEPTED, LATE, classify, enrich
from schemas import ad_event as c
from schemas.ad_metrics import PUBLISHED

log = logging.getLogger("adattr.sink")
RECORD = "record"
FIRST = "first"


@dataclass(frozen=True)
class BatchMeta:
    watermark_ms: int
    timestamp_ms: int


def read_batch_meta(checkpoint: Path, batch_id: int) -> BatchMeta:
    """The watermark and timestamp Spark fixed for a batch before running it.

    The offset log entry (``offsets/<batchId>``: a version line, then this JSON, then the source
    offsets) is written before the batch runs and reused verbatim when it is re-executed.
    """
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise RuntimeError(f"unexpected offset log format in {path}")
    meta = json.loads(lines[1])
    return BatchMeta(int(meta.get("batchWatermarkMs", 0)), int(meta["batchTimestampMs"]))


@dataclass(frozen=True)
class SinkContext:
    warehouse: str
    checkpoint: Path
    app_id: str
    generation: int
    lookback_seconds: int
    session_gap_seconds: int
    publisher: Publisher | None = None
    crash_at: str = ""
    # False only for the benchmark's at-least-once baseline: no Delta txn, plain appends.
    exactly_once: bool = True
    # Called after each batch with its id, records read and step times (for the benchmark).
    observer: Callable[[int, int, dict[str, float]], None] | None = None


@dataclass(frozen=True)
class Merge:
    """One gold table's keyed MERGE: its source rows, their key and time columns, and what a
    matched row gets (None: every column)."""

    name: str
    source: DataFrame
    keys: tuple[str, ...]
    time_column: str
    update: dict[str, str | Column] | None
    update_condition: str | None = None
    bounds: tuple[int, int] | None = None


class StepTimer:
    """Wall time per named step of a batch (for the log line and the benchmark's time split)."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self.tables: dict[str, float] = {}
        self._last = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.steps[name] = self.steps.get(name, 0.0) + now - self._last
        self._last = now

    def timed(self, name: str, write: Callable[[], object]) -> Callable[[], None]:
        """``write``, noting its own duration as ``name`` (writes run in threads: the phases
        around them are marked with their wall time)."""

        def run() -> None:
            started = time.monotonic()
            write()
            self.tables[name] = time.monotonic() - started

        return run

    def describe(self) -> str:
        tables = " ".join(f"{k}={v:.2f}s" for k, v in self.tables.items())
        return " ".join(f"{k}={v:.2f}s" for k, v in self.steps.items()) + f" ({tables})"


class AttributionSink:
    """``foreachBatch`` handler: ``(batch_df, batch_id) -> None``."""

    def __init__(self, spark: SparkSession, ctx: SinkContext) -> None:
        self.spark = spark
        self.ctx = ctx
        self.timer = StepTimer()
        self.last_counts = ""
        self.versions: dict[str, int] = {}
        self._replayed: dict[tuple[str, int], int] | None = None
        self.dims = DimSnapshots(spark, ctx.warehouse)
        self.high_water: HighWater | None = None
        # Closed sessions are computed and written beside the attribution chain, in a session
        # of their own: a MERGE takes its Delta txn ids from its session's confs.
        self.side = spark.newSession()

    def _prior_decisions(self, batch_id: int) -> DataFrame | None:
        """Decisions of earlier generations on offsets this batch reads again (a replay), or
        None when no other generation read them (the normal case: no cost at all)."""
        if self._replayed is None:
            ledger = self._load(t.LEDGER).where(F.col("app_id") != self.ctx.app_id)
            self._replayed = {
                (r.kafka_topic, r.kafka_partition): int(r.upto)
                for r in ledger.select(F.explode("offsets").alias("o"))
                .groupBy("o.kafka_topic", "o.kafka_partition")
                .agg(F.max("o.to_offset").alias("upto"))
                .collect()
            }
        if not self._replayed or not _rereads(self.ctx.checkpoint, batch_id, self._replayed):
            return None
        seen = " OR ".join(
            f"(kafka_topic = '{topic}' AND kafka_partition = {p} AND kafka_offset <= {upto})"
            for (topic, p), upto in sorted(self._replayed.items())
        )
        keys = ["kafka_topic", "kafka_partition", "kafka_offset"]
        accepted = (
            self._load(t.SILVER).where(seen).select(*keys, F.lit(ACCEPTED).alias("prior_outcome"))
        )
        late = self._load(t.LATE).where(seen).select(*keys, F.lit(LATE).alias("prior_outcome"))
        return accepted.unionByName(late)

    def _stored_ids(self) -> DataFrame:
        """Event ids silver already holds, with where they were read: a replay's fresh dedup
        state does not remember events an earlier generation accepted, silver does."""
        return self._load(t.SILVER).select(
            "event_id",
            F.struct("kafka_topic", "kafka_partition", "kafka_offset").alias("stored_at"),
        )

    def path(self, name: str) -> str:
        return f"{self.ctx.warehouse}/{name}"

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started_ms = int(time.time() * 1000)
        self.timer = StepTimer()
        self.versions = {}
        meta = read_batch_meta(self.ctx.checkpoint, batch_id)
        previous = read_batch_meta(self.ctx.checkpoint, batch_id - 1) if batch_id > 0 else None
        first_of_run = self.high_water is None
        if first_of_run:  # before the run writes anything
            self.high_water = read_high_water(
                self.spark, self.ctx.warehouse, self.ctx.app_id, self.ctx.generation
            )
            log.info("high water at the start of this run: %s", self.high_water)
        dim, dim_version = self.dims.at(meta.timestamp_ms)
        self.timer.mark("dim")

        # The batch frame is a wrapped RDD over the Kafka read and the stateful operator: cache
        # it so neither runs more than once whatever is derived from it below.
        batch_df.persist(StorageLevel.MEMORY_AND_DISK)
        records = batch_df.where(F.col("_branch") == RECORD).drop("_branch")
        firsts = batch_df.where(F.col("_branch") == FIRST).select(
            "kafka_topic", "kafka_partition", "kafka_offset"
        )
        prior = self._prior_decisions(batch_id)
        classified = classify(
            records,
            firsts,
            watermark_ms=meta.watermark_ms,
            prior=prior,
            stored=self._stored_ids() if prior is not None else None,
        )
        rows = enrich(classified, dim).withColumns(
            {"generation": F.lit(self.ctx.generation), "batch_id": F.lit(batch_id).cast("long")}
        )
        rows.persist(StorageLevel.MEMORY_AND_DISK)
        # The first action below runs the stateful operator, whose tasks write this batch's
        # state store version (batch id + 1) under the checkpoint.
        version = batch_id + 1
        disarm = crash_when_file_appears(
            self.ctx.crash_at,
            "during_state_store_upload",
            self.ctx.checkpoint / "state",
            lambda f: f.startswith((f"{version}.", f"{version}_", f".{version}.")),
        )
        try:
            stats = (
                rows.groupBy("outcome", "kafka_topic", "kafka_partition")
                .agg(
                    F.count("*").alias("n"),
                    F.min("kafka_offset").alias("lo"),
                    F.max("kafka_offset").alias("hi"),
                    F.expr("unix_millis(min(event_time))").alias("t_lo"),
                    F.expr("unix_millis(max(event_time))").alias("t_hi"),
                )
                .collect()
            )
            disarm()
            self.timer.mark("read+state+classify")
            self._write(
                rows, stats, batch_id, meta, previous, dim_version, started_ms, first_of_run
            )
        finally:
            rows.unpersist()
            batch_df.unpersist()
        log.info("batch %d: %s | %s", batch_id, self.last_counts, self.timer.describe())
        if self.ctx.observer is not None:
            self.ctx.observer(batch_id, sum(st.n for st in stats), dict(self.timer.steps))

    def _write(
        self,
        rows: DataFrame,
        stats: list[Row],
        batch_id: int,
        meta: BatchMeta,
        previous: BatchMeta | None,
        dim_version: int,
        started_ms: int,
        first_of_run: bool,
    ) -> None:
        ranges: dict[tuple[str, int], list[int]] = {}
        counts: dict[str, int] = {}
        for s in stats:
            r = ranges.setdefault((s.kafka_topic, s.kafka_partition), [s.lo, s.hi, 0])
            r[0], r[1], r[2] = min(r[0], s.lo), max(r[1], s.hi), r[2] + s.n
            counts[s.outcome] = counts.get(s.outcome, 0) + s.n
        # Outcomes add up to what was read; the derived counts below are added after this.
        counts["read"] = sum(counts.values())
        by_coordinates = _coordinates_condition(ranges)
        crash_point(self.ctx.crash_at, "before_delta_commit")
        hw = self.high_water
        assert hw is not None
        fresh = hw.records_fresh(ranges)
        # Bronze, quarantine, late and silver depend on nothing but the batch: written together.
        writes: list[tuple[str, DataFrame, str, bool]] = []
        if counts["read"]:  # an empty source inserts nothing: skipping it is the same result
            writes.append((t.BRONZE, rows, by_coordinates, fresh))
        if any(reason in counts for reason in c.REASONS):
            quarantined = rows.where(F.col("outcome").isin(*c.REASONS)).withColumns(
                {
                    "reason": F.col("outcome"),
                    "raw_text": F.expr("make_valid_utf8(CAST(raw_value AS STRING))"),
                }
            )
            writes.append((t.QUARANTINE, quarantined, by_coordinates, fresh))
        if LATE in counts:
            late = rows.where(F.col("outcome") == LATE).withColumn(
                "watermark", F.timestamp_millis(F.lit(meta.watermark_ms))
            )
            writes.append((t.LATE, late, by_coordinates, fresh))
        accepted = [s for s in stats if s.outcome == ACCEPTED]
        span = None
        if accepted:
            span = (min(s.t_lo for s in accepted), max(s.t_hi for s in accepted))
            silver = rows.where(F.col("outcome") == ACCEPTED).withColumn(
                "dim_version", F.lit(dim_version)
            )
            # One row per event_id. A re-sent event carries its original event_time, so the
            # match is scoped to the batch's event-time span, which lets Delta skip older files.
            writes.append(
                (
                    t.SILVER,
                    silver,
                    "t.event_id = s.event_id AND t.event_time BETWEEN "
                    f"timestamp_millis({span[0]}) AND timestamp_millis({span[1]})",
                    hw.silver_fresh(ranges),
                )
            )
        self._concurrently(
            [
                self.timer.timed(
                    name,
                    partial(
                        self._insert_new,
                        self.spark,
                        name,
                        df.select(*t.columns(name)),
                        cond,
                        batch_id,
                        fresh=new,
                    ),
                )
                for name, df, cond, new in writes
            ],
            # A keyed MERGE takes its txn ids from the session's confs: those run one by one.
            together=all(new for *_, new in writes),
        )
        self.timer.mark("records")

        crash_point(self.ctx.crash_at, "between_delta_commits")
        # Everything below is derived from silver. A watermark that moved finalises rows (and
        # closes sessions) even in a batch without new events.
        w_prev = previous.watermark_ms if previous is not None else 0
        advanced = meta.watermark_ms > w_prev

        wm = meta.watermark_ms
        gold: list[Callable[[], None]] = []
        if accepted or advanced:
            gold.append(
                self.timer.timed(
                    "attributions+1m+ctr",
                    lambda: self._update_gold(
                        rows if accepted else None, span, batch_id, w_prev, wm, counts
                    ),
                )
            )
        if advanced:
            sessions_fresh = hw.sessions_fresh(w_prev)
            gold.append(
                self.timer.timed(
                    t.SESSIONS,
                    lambda: self._close_sessions(
                        batch_id, w_prev, meta.watermark_ms, counts, fresh=sessions_fresh
                    ),
                )
            )
        self._concurrently(gold, together=True)
        self.timer.mark("gold")

        crash_point(self.ctx.crash_at, "after_delta_before_kafka")
        # A gold MERGE without source rows commits nothing, so this execution's commits say
        # what there is to publish; except in a run's first batch, which may re-execute a batch
        # whose gold rows an earlier execution committed (and did not publish): then the
        # published tables are searched for the batch's rows whatever this execution wrote.
        wrote_gold = bool(PUBLISHED.keys() & self.versions.keys()) or (
            first_of_run and (bool(accepted) or advanced)
        )
        kafka_outcome = self._publish(batch_id, wrote_gold=wrote_gold)
        crash_point(self.ctx.crash_at, "after_kafka_before_ledger")
        self.last_counts = " ".join(f"{k}={v:,}" for k, v in sorted(counts.items()))
        offsets = [(tp, p, lo, hi, n) for (tp, p), (lo, hi, n) in sorted(ranges.items())]
        millis = {
            "batch_timestamp": meta.timestamp_ms,
            "watermark": meta.watermark_ms,
            "started_at": started_ms,
            "finished_at": int(time.time() * 1000),
        }
        ledger_row = self.spark.createDataFrame(
            [
                (
                    self.ctx.app_id,
                    self.ctx.generation,
                    batch_id,
                    dim_version,
                    offsets,
                    counts,
                    self.versions,
                    self.ctx.publisher.transactional_id if self.ctx.publisher else None,
                    kafka_outcome,
                )
            ],
            "app_id string, generation int, batch_id long, dim_version long, "
            "offsets array<struct<kafka_topic:string,kafka_partition:int,from_offset:long,"
            "to_offset:long,records:long>>, counts map<string,long>, "
            "delta_versions map<string,long>, kafka_transactional_id string, kafka_outcome string",
        ).withColumns({k: F.timestamp_millis(F.lit(v)) for k, v in millis.items()})
        self._insert_new(
            self.spark,
            t.LEDGER,
            ledger_row.select(*t.columns(t.LEDGER)),
            "t.app_id = s.app_id AND t.batch_id = s.batch_id",
            batch_id,
            fresh=hw.ledger_fresh(batch_id),
        )
        self.timer.mark("ledger")
        crash_point(self.ctx.crash_at, "after_ledger_before_commit_log")

    @staticmethod
    def _concurrently(writes: list[Callable[[], None]], *, together: bool) -> None:
        """Runs independent writes at once (Spark's scheduler is thread-safe, and a Delta
        commit's fixed cost is mostly waiting), or one by one; the first failure is raised."""
        if not together or len(writes) < 2:
            for write in writes:
                write()
            return
        with ThreadPoolExecutor(len(writes), thread_name_prefix="adattr-write") as pool:
            for future in [pool.submit(write) for write in writes]:
                future.result()

    def _publish(self, batch_id: int, *, wrote_gold: bool) -> str:
        """Publishes every gold row this batch changed (found by its stamp, so a re-execution
        finds the same rows) in one Kafka transaction with the batch's marker."""
        publisher = self.ctx.publisher
        if publisher is None:
            return "disabled"
        if not wrote_gold:
            return "nothing-to-publish"
        changed = self._changed_records(batch_id)

        def records() -> Iterator[tuple[bytes, bytes]]:
            for row in changed.toLocalIterator():
                yield row.k.encode(), row.v.encode()

        outcome = publisher.publish(batch_id, records, crash_at=self.ctx.crash_at)
        self.timer.mark("kafka")
        return outcome

    def _changed_records(self, batch_id: int) -> DataFrame:
        mine = (F.col("generation") == self.ctx.generation) & (F.col("batch_id") == batch_id)
        frames = []
        for name, (keys, columns) in PUBLISHED.items():
            changed = self._load(name).where(mine)
            key = F.concat_ws(
                "|",
                F.lit(name),
                *[
                    F.date_format(k, ISO) if "time" in k or "window" in k else F.col(k)
                    for k in keys
                ],
            )
            # Deterministic: the same row of the same batch of the same generation always gets
            # the same id, so a republished record is recognisably the same record.
            record_id = F.sha2(
                F.concat_ws("|", key, F.lit(self.ctx.app_id), F.lit(batch_id).cast("string")), 256
            )
            value = F.to_json(
                F.struct(
                    record_id.alias("record_id"),
                    F.lit(name).alias("table"),
                    F.lit(self.ctx.app_id).alias("app_id"),
                    F.col("generation"),
                    F.col("batch_id"),
                    F.struct(*keys, *columns).alias("row"),
                ),
                # Nulls stay (an unattributed conversion has click_id null, not absent).
                {"timestampFormat": ISO, "ignoreNullFields": "false"},
            )
            frames.append(changed.select(key.alias("k"), value.alias("v")))
        return frames[0].unionByName(frames[1])

    def _insert_new(
        self,
        spark: SparkSession,
        name: str,
        source: DataFrame,
        condition: str,
        batch_id: int,
        *,
        fresh: bool,
    ) -> None:
        """Inserts the source's rows that the table does not hold yet: a plain append when no
        row with their keys can exist (``fresh``, see ``pipelines.high_water``; and always in the
        at-least-once baseline), otherwise a MERGE keyed by ``condition`` with Delta's txn ids."""
        from delta.tables import DeltaTable

        if fresh or not self.ctx.exactly_once:
            # An append does not cast to the table's types as a MERGE does.
            typed = source.select(*[F.col(f.name).cast(f.dataType) for f in t.schema(name).fields])
            typed.write.format("delta").mode("append").save(self.path(name))
            self._committed(name)
            return
        with delta_txn(spark, self.ctx.app_id, batch_id):
            (
                DeltaTable.forPath(spark, self.path(name))
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenNotMatchedInsertAll()
                .execute()
            )
        self._committed(name)

    def _txn(self, batch_id: int) -> AbstractContextManager[None]:
        """Delta's idempotent-write marker around one write (none in the at-least-once mode)."""
        if not self.ctx.exactly_once:
            return nullcontext()
        return delta_txn(self.spark, self.ctx.app_id, batch_id)

    def _committed(self, name: str) -> None:
        """Notes the table's version after this batch's write (the version that holds it; the
        same as before when Delta skipped an already committed batch)."""
        self.versions[name] = _table_version(self.spark, self.path(name))

    def _load(self, name: str, spark: SparkSession | None = None) -> DataFrame:
        return (spark or self.spark).read.format("delta").load(self.path(name))

    def _provenance(self, df: DataFrame, batch_id: int) -> DataFrame:
        """Every row a batch writes or changes carries its (generation, batch_id): how the
        publisher finds a batch's gold rows again."""
        return df.withColumns(
            {"generation": F.lit(self.ctx.generation), "batch_id": F.lit(batch_id).cast("long")}
        )

    def _attribution_source(
        self,
        rows: DataFrame | None,
        batch_id: int,
        w_prev: int,
        watermark_ms: int,
        counts: dict[str, int],
    ) -> tuple[Merge | None, tuple[int, int] | None]:
        """The attributions MERGE (None: nothing to write) and the conversion-time span of the
        conversions this batch (re)attributes: its new conversions, and the pending (not final)
        ones that one of its new clicks now precedes within the lookback, so a click that
        arrives after its conversion gives the answer event-time order would have. A final
        attribution is never touched: its conversion time is at or behind the watermark, so no
        click that could precede it can be accepted any more. Those the watermark passed in
        this batch become final."""
        if rows is None and watermark_ms <= w_prev:
            return None, None  # no new conversion, nothing became final
        lookback = self.ctx.lookback_seconds
        span = None
        recomputed = None
        affected = None
        if rows is not None:
            new = rows.where(F.col("outcome") == ACCEPTED)
            # Every attribution at or behind the previous watermark is final (see _due).
            pending = (
                self._load(t.ATTRIBUTIONS)
                .where(~F.col("is_final") & _after("conversion_time", w_prev))
                .select(
                    F.col("conversion_id").alias("event_id"),
                    F.col("conversion_time").alias("event_time"),
                    "user_id",
                    "advertiser_id",
                    "revenue",
                )
            )
            reopen = reopened(
                pending, new.where(F.col("event_type") == "click"), lookback_seconds=lookback
            )
            affected = (
                new.where(F.col("event_type") == "conversion")
                .select(*pending.columns)
                .unionByName(reopen)
                .dropDuplicates(["event_id"])
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
            found = affected.agg(
                F.count("*").alias("n"),
                F.expr("unix_millis(min(event_time))").alias("lo"),
                F.expr("unix_millis(max(event_time))").alias("hi"),
            ).first()
            if found is not None and found.n:
                span = (int(found.lo), int(found.hi))
                counts["attributions_computed"] = int(found.n)
                clicks = (
                    self._load(t.SILVER)
                    .where(
                        (F.col("event_type") == "click")
                        & (
                            F.col("event_time")
                            >= F.timestamp_millis(F.lit(span[0]))
                            - F.expr(f"INTERVAL {lookback} SECONDS")
                        )
                        & (F.col("event_time") < F.timestamp_millis(F.lit(span[1])))
                    )
                    .join(affected.select("user_id").distinct(), "user_id", "left_semi")
                )
                recomputed = attribute(affected, clicks, lookback_seconds=lookback)
        try:
            keys = ("conversion_id",)
            due = self._due(t.ATTRIBUTIONS, "conversion_time", w_prev, watermark_ms)
            if recomputed is None and due is None:
                return None, span
            source = self._final(
                recomputed_or_current(recomputed, due, keys=keys, values=ATTRIBUTION_COLUMNS[1:]),
                "conversion_time",
                watermark_ms,
                batch_id,
            )
            merge = self._prepared(
                Merge(
                    t.ATTRIBUTIONS,
                    source,
                    keys=keys,
                    time_column="conversion_time",
                    update=None,  # every column; a final attribution stays as it is
                    update_condition="NOT t.is_final",
                ),
                counts,
            )
        finally:
            if affected is not None:
                affected.unpersist()
        return merge, span

    def _due(
        self,
        name: str,
        end: str,
        w_prev: int,
        w_cur: int,
        also: Column | None = None,
    ) -> DataFrame | None:
        """The table's rows that are not final but whose end this batch's watermark passed,
        (w_prev, w_cur] (or any of ``also``); None when there can be none. Every row ending at
        or before the previous watermark is final already: the batch that moved the watermark
        past it wrote it final or finalised it (a replay's first batch has w_prev = 0: the
        whole table). So a batch reads, and rewrites, only the files of the rows it changes."""
        if w_cur <= w_prev and also is None:
            return None
        due = _after(end, w_prev) & ~_after(end, w_cur)
        return self._load(name).where(~F.col("is_final") & (due if also is None else due | also))

    def _final(self, source: DataFrame, end: str, watermark_ms: int, batch_id: int) -> DataFrame:
        """A gold MERGE source with is_final (the watermark has passed the row's end) and the
        batch's stamp."""
        final = F.col(end) <= F.timestamp_millis(F.lit(watermark_ms))
        return self._provenance(source.withColumn("is_final", final), batch_id)

    def _prepared(
        self, merge: Merge, counts: dict[str, int], bounds: tuple[int, int] | None = None
    ) -> Merge | None:
        """The MERGE with the time bounds of its source: ``bounds`` when the caller knows them
        (a recomputation: rarely without rows, and then the MERGE commits a version that
        changes nothing), else the source's own, read from it once it is cached; None when it
        has no rows (then nothing is committed: on any execution of the batch, the same)."""
        if bounds is not None:
            return replace(merge, bounds=bounds)
        started = time.monotonic()
        source = merge.source.persist(StorageLevel.MEMORY_AND_DISK)
        found = source.agg(
            F.count("*").alias("n"),
            F.expr(f"unix_millis(min({merge.time_column}))").alias("lo"),
            F.expr(f"unix_millis(max({merge.time_column}))").alias("hi"),
        ).first()
        self.timer.tables[f"{merge.name}:source"] = time.monotonic() - started
        if found is None or not found.n:
            source.unpersist()
            return None
        counts[f"{merge.name}_rows"] = int(found.n)
        return replace(merge, source=source, bounds=(int(found.lo), int(found.hi)))

    def _merge_gold(self, merge: Merge, batch_id: int) -> None:
        """One keyed MERGE of a gold table, with Delta's txn ids: the source rows are set, never
        added to. The condition also bounds the target to the source's time range (a row's key
        fixes its time, so no row outside it can match): Delta reads and rewrites only the
        files that can hold a matching row."""
        from delta.tables import DeltaTable

        assert merge.bounds is not None, "a prepared MERGE"
        started = time.monotonic()
        lo, hi = merge.bounds
        condition = " AND ".join(f"t.{k} = s.{k}" for k in merge.keys) + (
            f" AND t.{merge.time_column} BETWEEN timestamp_millis({lo}) AND timestamp_millis({hi})"
        )
        builder = (
            DeltaTable.forPath(self.spark, self.path(merge.name))
            .alias("t")
            .merge(merge.source.alias("s"), condition)
        )
        if merge.update is None:
            builder = builder.whenMatchedUpdateAll(condition=merge.update_condition)
        else:
            builder = builder.whenMatchedUpdate(condition=merge.update_condition, set=merge.update)
        with self._txn(batch_id):
            builder.whenNotMatchedInsertAll().execute()
        self._committed(merge.name)
        self.timer.tables[f"{merge.name}:merge"] = time.monotonic() - started

    def _update_gold(
        self,
        rows: DataFrame | None,
        span: tuple[int, int] | None,
        batch_id: int,
        w_prev: int,
        watermark_ms: int,
        counts: dict[str, int],
    ) -> None:
        """The attributions, the 1-minute windows (which count attributed conversions) and the
        sliding hours (sums of 1-minute windows), in that order: recomputed where the batch's
        events can have changed them, finalised where the watermark passed their end. (Run
        at once, from sources that anticipate each other's results, they took longer here: on
        two cores their jobs only queue behind each other.)"""
        attributions, reattributed = self._attribution_source(
            rows, batch_id, w_prev, watermark_ms, counts
        )
        self._run(attributions, batch_id)
        span = _cover(span, reattributed)
        if span is None and watermark_ms <= w_prev:
            return
        minute_keys = ("window_start", "ad_id")
        minute_rows = self._minute_windows(w_prev, watermark_ms, span)
        if minute_rows is not None:
            lo, hi = (_minute(span[0]), _minute(span[1]) + MINUTE_MS) if span else (0, 0)
            minutes = Merge(
                t.GOLD_1M,
                self._final(minute_rows, "window_end", watermark_ms, batch_id),
                keys=minute_keys,
                time_column="window_start",
                update=_update_keeping_final(t.GOLD_1M),
            )
            bounds = _widen((lo, hi), w_prev, watermark_ms, MINUTE_MS) if span else None
            self._run(self._prepared(minutes, counts, bounds), batch_id)
        hours = None
        first = last = 0
        if span is not None:
            # The windows containing minute m start in (m - 1 hour, m], on 5-minute boundaries.
            first = (_minute(span[0]) - HOUR_MS) // SLIDE_MS * SLIDE_MS + SLIDE_MS
            last = _minute(span[1]) // SLIDE_MS * SLIDE_MS
            hours = campaign_ctr(
                self._load(t.GOLD_1M).where(_time_between("window_start", first, last + HOUR_MS))
            ).where(_time_between("window_start", first, last + SLIDE_MS))
        due_hours = self._due(t.CTR_1H, "window_end", w_prev, watermark_ms)
        if hours is None and due_hours is None:
            return
        hour_keys = ("window_start", "campaign_id")
        hour_values = tuple(c for c in t.columns(t.CTR_1H) if c not in {*hour_keys, *_DERIVED})
        hour_merge = Merge(
            t.CTR_1H,
            self._final(
                recomputed_or_current(hours, due_hours, keys=hour_keys, values=hour_values),
                "window_end",
                watermark_ms,
                batch_id,
            ),
            keys=hour_keys,
            time_column="window_start",
            update=_update_keeping_final(t.CTR_1H),
        )
        bounds = _widen((first, last), w_prev, watermark_ms, HOUR_MS) if span else None
        self._run(self._prepared(hour_merge, counts, bounds), batch_id)

    def _run(self, merge: Merge | None, batch_id: int) -> None:
        if merge is None:
            return
        try:
            self._merge_gold(merge, batch_id)
        finally:
            merge.source.unpersist()

    def _minute_windows(
        self, w_prev: int, watermark_ms: int, span: tuple[int, int] | None
    ) -> DataFrame | None:
        """The 1-minute MERGE's rows (before is_final and the stamp): the windows of the span
        recomputed from silver and the attributions, the windows due to be finalised, and the
        span's windows the recomputation no longer produces (their only conversion was
        re-attributed to another ad), set to zero, not deleted, so the change is a row like
        any other (found again, published as a zero update)."""
        keys = ("window_start", "ad_id")
        values = tuple(c for c in t.columns(t.GOLD_1M) if c not in {*keys, *_DERIVED})
        if span is None:
            due = self._due(t.GOLD_1M, "window_end", w_prev, watermark_ms)
            return None if due is None else due.select(*keys, *values)
        lo, hi = _minute(span[0]), _minute(span[1]) + MINUTE_MS
        recomputed = window_metrics(
            self._load(t.SILVER).where(_time_between("event_time", lo, hi)),
            self._load(t.ATTRIBUTIONS).where(_time_between("conversion_time", lo, hi)),
        )
        return recomputed_or_current(
            recomputed,
            self._due(
                t.GOLD_1M,
                "window_end",
                w_prev,
                watermark_ms,
                also=_time_between("window_start", lo, hi),
            ),
            keys=keys,
            values=values,
            emptied=_time_between("window_start", lo, hi),
            zeros={
                **{n: F.lit(0).cast("long") for n in ("impressions", "clicks", "conversions")},
                "spend": F.lit(0).cast("decimal(24,9)"),
                "revenue": F.lit(0).cast("decimal(24,6)"),
            },
        )

    def _close_sessions(
        self, batch_id: int, w_prev: int, w_cur: int, counts: dict[str, int], *, fresh: bool
    ) -> None:
        """Writes, once, every session the watermark closed in this batch: those ending in
        (previous watermark, this watermark]. No event at or behind the watermark can be
        accepted any more, so such a session is complete in silver and can never change.

        Its last event lies in (w_prev - gap, w_cur - gap]: those users are the candidates. Their
        events are read back from a bounded horizon, widened only while a closing session starts
        within one gap of the horizon (an earlier event might still belong to it).

        Runs beside the attribution chain, in the sink's side session."""
        spark = self.side
        gap_ms = self.ctx.session_gap_seconds * 1000
        silver = self._load(t.SILVER, spark).select(
            "user_id", "event_type", "event_time", "revenue"
        )
        candidates = (
            silver.where(
                (F.col("event_time") > F.timestamp_millis(F.lit(w_prev - gap_ms)))
                & (F.col("event_time") <= F.timestamp_millis(F.lit(w_cur - gap_ms)))
            )
            .select("user_id")
            .distinct()
        )
        reach = max(4 * gap_ms, w_cur - w_prev)
        horizon = w_prev - gap_ms - reach
        earliest: int | None = None
        while True:
            closed = (
                user_sessions(
                    silver.where(_time_between("event_time", horizon, w_cur)).join(
                        candidates, "user_id", "left_semi"
                    ),
                    gap_seconds=self.ctx.session_gap_seconds,
                )
                .where(
                    (F.col("session_end") > F.timestamp_millis(F.lit(w_prev)))
                    & (F.col("session_end") <= F.timestamp_millis(F.lit(w_cur)))
                )
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
            cut = closed.where(F.col("session_start") < F.timestamp_millis(F.lit(horizon + gap_ms)))
            if cut.isEmpty():
                break
            if earliest is None:
                first = silver.agg(F.expr("unix_millis(min(event_time))")).first()
                earliest = int(first[0]) if first and first[0] is not None else horizon
            if horizon <= earliest:
                break
            closed.unpersist()
            horizon -= reach
            reach *= 2
        counts["sessions_closed"] = closed.count()
        if counts["sessions_closed"]:  # nothing closed: nothing to write, on any execution
            self._insert_new(
                spark,
                t.SESSIONS,
                self._provenance(closed, batch_id),
                "t.user_id = s.user_id AND t.session_start = s.session_start "
                f"AND t.session_end > timestamp_millis({w_prev}) "
                f"AND t.session_end <= timestamp_millis({w_cur})",
                batch_id,
                fresh=fresh,
            )
        closed.unpersist()


ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
MINUTE_MS = 60_000
SLIDE_MS = 5 * MINUTE_MS
HOUR_MS = 60 * MINUTE_MS


def _update_keeping_final(name: str) -> dict[str, str | Column]:
    """Every column from the source, except that a final row stays final (a replay restarts
    the watermark at zero; it must not reopen what an earlier generation closed)."""
    columns: dict[str, str | Column] = {c: f"s.{c}" for c in t.columns(name)}
    return {**columns, "is_final": "t.is_final OR s.is_final"}


# Columns the sink sets on every gold row it writes, not part of a recomputation.
_DERIVED = ("is_final", "generation", "batch_id")


def _widen(span: tuple[int, int], w_prev: int, w_cur: int, width: int) -> tuple[int, int]:
    """A time range holding ``span`` and the starts of the rows of ``width`` that end in
    (w_prev, w_cur] (a superset is safe: it only reads more files)."""
    return min(span[0], w_prev - width), max(span[1], w_cur)


def _after(column: str, ms: int) -> Column:
    return F.col(column) > F.timestamp_millis(F.lit(ms))


def _minute(ms: int) -> int:
    return ms // MINUTE_MS * MINUTE_MS


def _time_between(column: str, lo_ms: int, hi_ms: int) -> Column:
    """lo <= column < hi, in epoch milliseconds."""
    return (F.col(column) >= F.timestamp_millis(F.lit(lo_ms))) & (
        F.col(column) < F.timestamp_millis(F.lit(hi_ms))
    )


def _cover(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    if a is None or b is None:
        return a or b
    return (min(a[0], b[0]), max(a[1], b[1]))


def _table_version(spark: SparkSession, path: str) -> int:
    """The table's latest version, from the Delta log this process already holds in memory
    (a few ms; ``DeltaTable.history(1)`` runs a Spark job, ~0.3 s per table per batch)."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(  # type: ignore[union-attr]
        spark._jsparkSession, path
    )
    return int(log.unsafeVolatileSnapshot().version())


def source_offsets(checkpoint: Path, batch_id: int) -> dict[str, dict[str, int]]:
    """The end offsets (exclusive) of a batch per topic and partition, from its offset log."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    return json.loads(lines[2]) if len(lines) > 2 else {}


def _rereads(checkpoint: Path, batch_id: int, upto: dict[tuple[str, int], int]) -> bool:
    """Whether the batch can read an offset at or before ``upto`` (per topic, partition). Its
    range starts where the previous batch ended (the generation's start for batch 0, which a
    replay always rereads)."""
    if batch_id == 0:
        return True
    start = source_offsets(checkpoint, batch_id - 1)
    return any(
        start.get(topic, {}).get(str(partition), 0) <= last
        for (topic, partition), last in upto.items()
    )


def _coordinates_condition(ranges: dict[tuple[str, int], list[int]]) -> str:
    key = (
        "t.kafka_topic = s.kafka_topic AND t.kafka_partition = s.kafka_partition "
        "AND t.kafka_offset = s.kafka_offset"
    )
    if not ranges:
        return key
    scope = " OR ".join(
        f"(t.kafka_partition = {p} AND t.kafka_offset BETWEEN {lo} AND {hi})"
        for (_, p), (lo, hi, _) in sorted(ranges.items())
    )
    return f"{key} AND ({scope})"
