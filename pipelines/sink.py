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
from dataclasses import dataclass
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

    def timed(self, name: str, write: Callable[[], None]) -> Callable[[], None]:
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
        if self.high_water is None:  # the run's first batch, before it writes anything
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
            self._write(rows, stats, batch_id, meta, previous, dim_version, started_ms)
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

        def attribution_chain() -> None:
            reattributed = self._update_attributions(
                rows if accepted else None, batch_id, meta.watermark_ms, advanced, counts
            )
            gold_span = _cover(span, reattributed)
            chain["wrote_gold"] = gold_span is not None or advanced
            if chain["wrote_gold"]:
                self._update_gold(batch_id, meta.watermark_ms, gold_span)
                self._update_ctr(batch_id, meta.watermark_ms, gold_span)

        chain: dict[str, bool] = {}
        gold = [self.timer.timed("attribution+1m+ctr", attribution_chain)]
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
        kafka_outcome = self._publish(batch_id, wrote_gold=chain["wrote_gold"])
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

    def _txn(
        self, batch_id: int, spark: SparkSession | None = None
    ) -> AbstractContextManager[None]:
        """Delta's idempotent-write marker around one write (none in the at-least-once mode)."""
        if not self.ctx.exactly_once:
            return nullcontext()
        return delta_txn(spark or self.spark, self.ctx.app_id, batch_id)

    def _committed(self, name: str) -> None:
        """Notes the table's version after this batch's write (the version that holds it; the
        same as before when Delta skipped an already committed batch)."""
        self.versions[name] = _table_version(self.spark, self.path(name))

    def _load(self, name: str, spark: SparkSession | None = None) -> DataFrame:
        return (spark or self.spark).read.format("delta").load(self.path(name))

    def _stamped(self, assignments: dict[str, str], batch_id: int) -> dict[str, str | Column]:
        """A MERGE update that also stamps the row with this batch: every row a batch changes
        carries its (generation, batch_id), which is how the publisher finds them again."""
        return {
            **assignments,
            "generation": str(self.ctx.generation),
            "batch_id": f"CAST({batch_id} AS BIGINT)",
        }

    def _provenance(self, df: DataFrame, batch_id: int) -> DataFrame:
        return df.withColumns(
            {"generation": F.lit(self.ctx.generation), "batch_id": F.lit(batch_id).cast("long")}
        )

    def _update_attributions(
        self,
        rows: DataFrame | None,
        batch_id: int,
        watermark_ms: int,
        advanced: bool,
        counts: dict[str, int],
    ) -> tuple[int, int] | None:
        """(Re)attributes the conversions this batch can have changed and returns their
        conversion-time span: its new conversions, and the pending (not final) ones that one of
        its new clicks now precedes within the lookback, so a click that arrives after its
        conversion gives the answer event-time order would have. A final attribution is never
        touched: its conversion time is at or behind the watermark, so no click that could
        precede it can be accepted any more."""
        from delta.tables import DeltaTable

        lookback = self.ctx.lookback_seconds
        span = None
        source = None
        affected = None
        if rows is not None:
            new = rows.where(F.col("outcome") == ACCEPTED)
            pending = (
                self._load(t.ATTRIBUTIONS)
                .where(~F.col("is_final"))
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
                source = attribute(affected, clicks, lookback_seconds=lookback)
        if source is None and not advanced:
            if affected is not None:
                affected.unpersist()
            return None
        if source is None:
            source = self.spark.createDataFrame([], t.schema(t.ATTRIBUTIONS)).select(
                *ATTRIBUTION_COLUMNS
            )
        watermark = f"timestamp_millis({watermark_ms})"
        source = self._provenance(
            source.withColumn("is_final", F.col("conversion_time") <= F.expr(watermark)), batch_id
        )
        with self._txn(batch_id):
            (
                DeltaTable.forPath(self.spark, self.path(t.ATTRIBUTIONS))
                .alias("t")
                .merge(source.alias("s"), "t.conversion_id = s.conversion_id")
                .whenMatchedUpdateAll(condition="NOT t.is_final")
                .whenNotMatchedInsertAll()
                .whenNotMatchedBySourceUpdate(
                    condition=f"NOT t.is_final AND t.conversion_time <= {watermark}",
                    set=self._stamped({"is_final": "true"}, batch_id),
                )
                .execute()
            )
        if affected is not None:
            affected.unpersist()
        self._committed(t.ATTRIBUTIONS)
        return span

    def _update_gold(self, batch_id: int, watermark_ms: int, span: tuple[int, int] | None) -> None:
        """Recomputes the 1-minute windows of the span from silver and the attributions, and
        marks windows final once the watermark has passed their end. A window of the span that
        the recomputation no longer produces (its only conversion was re-attributed to another
        ad) is deleted."""
        from delta.tables import DeltaTable

        watermark = f"timestamp_millis({watermark_ms})"
        if span is None:
            source = self.spark.createDataFrame([], t.schema(t.GOLD_1M)).drop(
                "is_final", "generation", "batch_id"
            )
            in_span = "false"
        else:
            lo, hi = _minute(span[0]), _minute(span[1]) + MINUTE_MS
            in_span = (
                f"t.window_start >= timestamp_millis({lo}) "
                f"AND t.window_start < timestamp_millis({hi})"
            )
            source = window_metrics(
                self._load(t.SILVER).where(_time_between("event_time", lo, hi)),
                self._load(t.ATTRIBUTIONS).where(_time_between("conversion_time", lo, hi)),
            )
        source = self._provenance(
            source.withColumn("is_final", F.col("window_end") <= F.expr(watermark)), batch_id
        )
        with self._txn(batch_id):
            (
                DeltaTable.forPath(self.spark, self.path(t.GOLD_1M))
                .alias("t")
                .merge(source.alias("s"), "t.window_start = s.window_start AND t.ad_id = s.ad_id")
                .whenMatchedUpdate(set=_update_keeping_final(t.GOLD_1M))
                .whenNotMatchedInsertAll()
                # Emptied (its only conversion went to another ad): zero, not deleted, so the
                # change is a row like any other (found again, published as a zero update).
                .whenNotMatchedBySourceUpdate(
                    condition=f"NOT t.is_final AND {in_span}",
                    set=self._stamped(
                        {
                            **{n: "0" for n in ("impressions", "clicks", "conversions")},
                            "spend": "CAST(0 AS DECIMAL(24,9))",
                            "revenue": "CAST(0 AS DECIMAL(24,6))",
                            "is_final": f"t.window_end <= {watermark}",
                        },
                        batch_id,
                    ),
                )
                .whenNotMatchedBySourceUpdate(
                    condition=f"NOT t.is_final AND t.window_end <= {watermark}",
                    set=self._stamped({"is_final": "true"}, batch_id),
                )
                .execute()
            )
        self._committed(t.GOLD_1M)

    def _update_ctr(self, batch_id: int, watermark_ms: int, span: tuple[int, int] | None) -> None:
        """Recomputes the sliding hours that contain a minute of the span, from the 1-minute
        windows just written."""
        from delta.tables import DeltaTable

        watermark = f"timestamp_millis({watermark_ms})"
        if span is None:
            source = self.spark.createDataFrame([], t.schema(t.CTR_1H)).drop(
                "is_final", "generation", "batch_id"
            )
            scope = "false"
        else:
            # The windows containing minute m start in (m - 1 hour, m], on 5-minute boundaries.
            first = (_minute(span[0]) - HOUR_MS) // SLIDE_MS * SLIDE_MS + SLIDE_MS
            last = _minute(span[1]) // SLIDE_MS * SLIDE_MS
            minutes = self._load(t.GOLD_1M).where(
                _time_between("window_start", first, last + HOUR_MS)
            )
            source = campaign_ctr(minutes).where(
                _time_between("window_start", first, last + SLIDE_MS)
            )
            scope = (
                f"t.window_start >= timestamp_millis({first}) "
                f"AND t.window_start <= timestamp_millis({last})"
            )
        source = self._provenance(
            source.withColumn("is_final", F.col("window_end") <= F.expr(watermark)), batch_id
        )
        with self._txn(batch_id):
            (
                DeltaTable.forPath(self.spark, self.path(t.CTR_1H))
                .alias("t")
                .merge(
                    source.alias("s"),
                    "t.window_start = s.window_start AND t.campaign_id = s.campaign_id "
                    f"AND {scope}",
                )
                .whenMatchedUpdate(set=_update_keeping_final(t.CTR_1H))
                .whenNotMatchedInsertAll()
                .whenNotMatchedBySourceUpdate(
                    condition=f"NOT t.is_final AND t.window_end <= {watermark}",
                    set=self._stamped({"is_final": "true"}, batch_id),
                )
                .execute()
            )
        self._committed(t.CTR_1H)

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
