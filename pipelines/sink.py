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

A batch without accepted events changes gold only by finalising: between passes it keeps the
attributions its watermark passed for the next pass; a pass finalises by an UPDATE of the rows
not final yet whose end the watermark passed (``GoldUpdate._finalise``; that condition alone
makes it a no-op on a second execution, so it carries no txn ids, and it commits nothing when
it changes nothing), or MERGEs the attribution rows kept since the last pass.

Three gold tables, the sliding hours and the attributions and 1-minute windows as tables, are
written by a pass every few batches (``pipelines.hourly_pass``); a batch between passes
publishes the attribution rows and 1-minute windows it computed, the values the pass then
writes.

The writes run in a fixed order (bronze, quarantine, late, silver, gold, ledger) and the ledger
row is the batch's last (but for a pass that keeps, whose writes may land after it, beside the
next batch), so "a ledger row exists" means "the batch is complete in every table" but the three
the passes write, which a crash between passes (or with a pass in flight beside the next batch,
``pipelines.pass_beside``) leaves to the next run's first batch. Everything a
batch decides (the watermark, the dimension version) comes from Spark's offset log entry for the
batch, so a re-execution decides the same; so does a replay's lateness floor, the latest watermark
in any generation's offset log (``pipelines.transforms.late_before``), which the batch's own
entry, the newest of its generation's, cannot raise above its own watermark.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from app.runtime.crash import crash_point, crash_when_file_appears
from pipelines import tables as t
from pipelines.click_state import ClickState
from pipelines.compaction import Compactor
from pipelines.delta_writes import Tables, described, run_concurrently
from pipelines.dimension import DimSnapshots
from pipelines.gold_writes import GoldUpdate
from pipelines.high_water import NEVER, HighWater
from pipelines.hourly_pass import HourlyPasses, union
from pipelines.ledger import write_ledger
from pipelines.left_windows import LeftWindows
from pipelines.offset_log import BatchMeta, latest_watermark, read_batch_meta
from pipelines.pass_beside import PassBeside
from pipelines.publish import Publisher
from pipelines.published_rows import changed_records, rows_of
from pipelines.record_writes import (
    PriorDecisions,
    accepted_span,
    batch_stats,
    ranges_and_counts,
    record_writes,
)
from pipelines.report import BatchReport
from pipelines.session_writes import SessionCloser, open_session_state
from pipelines.timing import StepTimer
from pipelines.transforms import ACCEPTED, classify, enrich, late_before, lateness
from schemas.ad_metrics import PUBLISHED

log = logging.getLogger("adattr.sink")
RECORD = "record"
FIRST = "first"
# The batch's phase that finds the gold rows it changed and pulls them to the driver to publish.
CHANGED_ROWS = "changed_rows"


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
    # Called after each batch (the benchmark, the job's metrics).
    observer: Callable[[BatchReport], None] | None = None
    # Raises when this job must not write (its lease on the checkpoint is lost): called before
    # a batch writes anything (its state store files included) and before its Kafka transaction.
    guard: Callable[[], None] | None = None
    # The job compacts the tables a batch appends its records to once this many files have
    # piled up in one, and at a run's first batch any other table it writes that earlier runs
    # left holding this many (pipelines/compaction.py); 0: Delta's auto compaction does, or
    # nobody.
    compact_files: int = 0
    # The sliding-hour table is brought up to date every this many batches (and by a run's
    # first batch and at its stop: pipelines/hourly_pass.py); 1: by every batch.
    hourly_every: int = 1


class AttributionSink:
    """``foreachBatch`` handler: ``(batch_df, batch_id) -> None``."""

    def __init__(
        self,
        spark: SparkSession,
        ctx: SinkContext,
        *,
        dims: DimSnapshots,
        high_water: HighWater,
    ) -> None:
        self.spark = spark
        self.ctx = ctx
        self.tables = Tables(
            spark, ctx.warehouse, ctx.app_id, ctx.generation, exactly_once=ctx.exactly_once
        )
        self.timer = StepTimer()
        self.last_counts = ""
        self.kafka_outcome = ""
        self.decisions = PriorDecisions(self.tables, ctx.checkpoint)
        # The dimension's snapshots, and what the tables held when this run started
        # (pipelines/high_water.py): both read by the job's start, before anything of the run
        # is written.
        self.dims = dims
        self.high_water = high_water
        log.info("high water at the start of this run: %s", high_water)
        self.first_of_run = True
        # Closed sessions are computed and written beside the attribution chain, in a session
        # of their own: a MERGE takes its Delta txn ids from its session's confs.
        self.side = spark.newSession()
        self.sessions = SessionCloser(
            self.tables,
            self.side,
            open_session_state(self.side, ctx.checkpoint),
            ctx.session_gap_seconds,
        )
        # Gold tables finalised at once (a batch without accepted events), one session each.
        self.gold_sessions = (spark.newSession(), spark.newSession())
        # The latest clicks, folded beside the attribution chain (pipelines/click_state.py).
        self.clicks = ClickState(
            self.tables, spark.newSession(), ctx.checkpoint, ctx.lookback_seconds
        )
        self.compactor = (
            Compactor(self.tables, spark, ctx.compact_files, ctx.guard)
            if ctx.compact_files
            else None
        )
        # Where the windows a batch's re-attributed conversions leave are kept till it is done.
        self.left_windows = LeftWindows(ctx.checkpoint)
        # The gold passes: the attributions, the 1-minute table and the sliding hours
        # (pipelines/hourly_pass.py).
        settled = latest_watermark(ctx.checkpoint.parent)
        # The latest watermark a batch of any generation was planned under: a replay (its
        # watermark from zero) classifies the lateness of records no generation read under it
        # too, so no final window takes a new event (``pipelines.transforms.late_before``).
        self.settled_ms = NEVER if settled is None else settled
        # A keeping pass's writes, beside the next batch (pipelines/pass_beside.py), in a
        # session of their own.
        self.beside = PassBeside()
        self.pass_session = spark.newSession()
        self.hourly = HourlyPasses(
            ctx.hourly_every,
            union(high_water.minutes_behind, high_water.hours_behind),
            max(
                high_water.minutes_final_ms,
                high_water.hours_final_ms,
                high_water.attributions_final_ms,
            ),
            conversions=high_water.conversions_behind,
            settled_ms=self.settled_ms,
        )

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self._guard()
        started_ms = int(time.time() * 1000)
        self.timer = StepTimer()
        self.tables.versions = {}
        meta = read_batch_meta(self.ctx.checkpoint, batch_id)
        previous = read_batch_meta(self.ctx.checkpoint, batch_id - 1) if batch_id > 0 else None
        first_of_run, self.first_of_run = self.first_of_run, False
        dim, dim_version = self.dims.at(meta.timestamp_ms)
        self.timer.mark("dim")

        # The batch frame is a wrapped RDD over the Kafka read and the stateful operator: cache
        # it so neither runs more than once whatever is derived from it below.
        batch_df.persist(StorageLevel.MEMORY_AND_DISK)
        records = batch_df.where(F.col("_branch") == RECORD).drop("_branch")
        firsts = batch_df.where(F.col("_branch") == FIRST).select(
            "kafka_topic", "kafka_partition", "kafka_offset"
        )
        read_before = self.decisions.read_before(batch_id)
        prior = self.decisions.prior(read_before)
        # The decided event ids (silver's, the quarantine's unknown_ad), where the dedup state
        # may not know them all: offsets an earlier generation read, or any batch while the
        # tables may hold such events it never saw.
        unseen = prior is not None or self.high_water.ids_unseen(meta.watermark_ms)
        late_at = lateness(meta.watermark_ms, self.settled_ms, read_before)
        classified = classify(
            records,
            firsts,
            watermark_ms=late_at,
            prior=prior,
            stored=self.decisions.stored_ids(meta.watermark_ms) if unseen else None,
        )
        rows = self.tables.stamped(enrich(classified, dim), batch_id)
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
            stats = batch_stats(rows)
            disarm()
            self.timer.mark("read+state+classify")
            self._write(
                rows,
                stats,
                batch_id,
                meta,
                previous,
                dim_version,
                started_ms,
                first_of_run,
                late_at,
            )
        finally:
            rows.unpersist()
            batch_df.unpersist()
        # Python objects of a batch left in reference cycles (PySpark's foreachBatch wrapper
        # leaves some whatever the function does) keep the JVM objects they stand for alive on
        # the driver: the batch's frames and plans, with their Delta snapshots. Python frees
        # cycles only when its collector runs, which can be rarely in a process with many
        # long-lived objects: the driver's heap then kept every batch's (README "Performance").
        # Collected here, each batch's are released by the end of the next.
        gc.collect()
        self.timer.mark("release")
        log.info("batch %d: %s | %s", batch_id, self.last_counts, self.timer.describe())
        if self.ctx.observer is not None:
            self.ctx.observer(_report(batch_id, stats, dict(self.timer.steps), self.kafka_outcome))

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
        late_at: Column,
    ) -> None:
        ranges, counts = ranges_and_counts(stats)
        crash_point(self.ctx.crash_at, "before_delta_commit")
        hw = self.high_water
        span = accepted_span(stats)
        # Bronze, quarantine, late and silver depend on nothing but the batch: written together.
        writes = record_writes(
            rows,
            ranges,
            counts,
            span,
            watermark_ms=meta.watermark_ms,
            late_at=late_at,
            dim_version=dim_version,
            high_water=hw,
        )
        run_concurrently(
            [
                self._timed(
                    w.name,
                    partial(
                        self.tables.insert_new, w.name, w.rows, w.condition, batch_id, fresh=w.fresh
                    ),
                )
                for w in writes
            ],
            # A keyed MERGE takes its txn ids from the session's confs: those run one by one.
            together=all(w.fresh for w in writes),
        )
        self.timer.mark("records")
        if self.compactor is not None:
            compacted = self.compactor.after_writes(w.name for w in writes)
            if compacted:
                self.timer.tables["compaction"] = sum(compacted.values())
                self.timer.mark("compaction")

        if self.beside.batch_id is not None:  # the pass the batch before left in flight
            self.beside.join()
            self.timer.mark("hourly")  # how long it held this batch up
        crash_point(self.ctx.crash_at, "between_delta_commits")
        # Everything below is derived from silver. A watermark that moved finalises rows (and
        # closes sessions) even in a batch without new events.
        w_prev = previous.watermark_ms if previous is not None else 0
        # State is carried while every event silver may hold later than the watermark is this
        # generation's own: always in a generation whose silver is its own only, and after a
        # replay (or beside another app id's rows) once the watermark has passed every event
        # silver held when the run started (``HighWater.silver_unseen``). The latest clicks:
        # the batch attributes with the marker of the batch before it (when it has events to
        # attribute) and folds its own into it.
        own = not hw.silver_unseen(meta.watermark_ms)
        clicks_start = self.clicks.start(batch_id, previous) if own else None
        hourly = self.hourly.plan(batch_id, meta.watermark_ms, own=own)
        gold_update = GoldUpdate(
            self.tables,
            self.timer,
            batch_id,
            w_prev=w_prev,
            watermark_ms=meta.watermark_ms,
            counts=counts,
            lookback_seconds=self.ctx.lookback_seconds,
            sessions=self.gold_sessions,
            carried_clicks=self.clicks.carried(clicks_start) if span is not None else None,
            hourly=hourly,
            unpassed=self.hourly.pending if hourly is None or hourly.kept else None,
            left_windows=self.left_windows,
            earlier_left=self.left_windows.everywhere() if first_of_run else None,
            pending=self.hourly.attributions,
            minutes=self.hourly.minutes,
        )
        gold: list[Callable[[], None]] = []
        if span is not None or gold_update.due:
            gold.append(
                self._timed(
                    "attributions+1m+ctr",
                    lambda: gold_update.run(rows if span is not None else None, span),
                )
            )
        # The open sessions are carried over in the same case, when every accepted event is
        # later than the watermark too (pipelines/session_writes.py).
        carried = own and (span is None or span[0] > meta.watermark_ms)
        if carried or gold_update.advanced:
            accepted = rows.where(F.col("outcome") == ACCEPTED) if span is not None else None
            gold.append(
                self._timed(
                    t.SESSIONS,
                    partial(
                        self.sessions,
                        batch_id,
                        meta=meta,
                        previous=previous,
                        events=accepted,
                        carried=carried,
                        counts=counts,
                        fresh=hw.sessions_fresh(w_prev),
                    ),
                )
            )
        if own:  # last: Spark runs the jobs submitted first first
            gold.append(
                self._timed(
                    "latest_clicks",
                    partial(self.clicks.fold, batch_id, meta=meta, start=clicks_start),
                )
            )
        run_concurrently(gold, together=True)
        self.timer.mark("gold")

        crash_point(self.ctx.crash_at, "after_delta_before_kafka")
        self._guard()
        # A gold MERGE without source rows commits nothing, so this execution's commits say
        # what there is to publish; except in a run's first batch, which may re-execute a batch
        # whose gold rows an earlier execution committed (and did not publish): then the
        # published tables are searched for the batch's rows whatever this execution wrote.
        # A batch that left the 1-minute table to a pass publishes the windows it computed, a
        # batch of none the attributions it finalised as it read them (``GoldUpdate.records``).
        given = gold_update.records
        from_tables = tuple(n for n in PUBLISHED if n not in given)
        wrote_gold = bool(from_tables & self.tables.versions.keys()) or (
            first_of_run and (span is not None or gold_update.advanced)
        )
        kafka_outcome = self.kafka_outcome = self._publish(
            batch_id, from_tables if wrote_gold else (), [r for rs in given.values() for r in rs]
        )
        if hourly is not None and hourly.kept:
            # A pass that keeps published what it writes: its writes run beside the next batch
            # (pipelines/pass_beside.py), which waits for them before its own gold writes.
            self._guard()
            beside = gold_update.detached(self.pass_session)
            self.beside.start(
                batch_id,
                described(self.pass_session, "hourly", partial(self._pass_kept, beside)),
                landed=partial(self._landed, batch_id, beside),
            )
        elif span is not None and hourly is not None:
            # A data batch's other pass: its hours after its transaction, which they would
            # delay by ~2 s (the table is published to no one), before its ledger row.
            self._guard()
            described(self.spark, "hourly", lambda: gold_update.pass_hours(span))()
            self.timer.mark("hourly")
        crash_point(self.ctx.crash_at, "after_kafka_before_ledger")
        self.last_counts = " ".join(f"{k}={v:,}" for k, v in sorted(counts.items()))
        write_ledger(
            self.tables,
            batch_id,
            dim_version=dim_version,
            ranges=ranges,
            counts=counts,
            transactional_id=self.ctx.publisher.transactional_id if self.ctx.publisher else None,
            kafka_outcome=kafka_outcome,
            millis={
                "batch_timestamp": meta.timestamp_ms,
                # What the records it keeps in bronze were decided late under (``late_before``:
                # reconcile decides them again).
                "watermark": late_before(meta.watermark_ms, self.settled_ms),
                "started_at": started_ms,
                "finished_at": int(time.time() * 1000),
            },
            fresh=hw.ledger_fresh(batch_id),
        )
        self.timer.mark("ledger")
        crash_point(self.ctx.crash_at, "after_ledger_before_commit_log")
        # The minutes a later pass covers: the batch's events' and its re-attributed
        # conversions'. The windows re-attributions left stay until the pass over them lands.
        since_batch = self.hourly.since_batch
        self.hourly.done(
            batch_id,
            meta.watermark_ms,
            gold_update.changed_minutes,
            hourly,
            gold_update.pending,
            gold_update.minutes,
        )
        if self.beside.batch_id != batch_id:
            self.left_windows.forget_before(min(batch_id, self.hourly.since_batch))
        else:
            self.left_windows.forget_before(min(batch_id, since_batch))

    def _pass_kept(self, update: GoldUpdate) -> None:
        update.pass_kept(self._guard)

    def abandon(self) -> None:
        """The query stopped without ``finish`` (it failed, or a test stopped it crash-like):
        the pass in flight, if any, lands or fails before anything else writes the tables."""
        self.beside.settle()

    def _landed(self, batch_id: int, update: GoldUpdate) -> None:
        """Batch ``batch_id``'s pass, run beside the next batch, has landed."""
        self.left_windows.forget_before(min(batch_id + 1, self.hourly.since_batch))
        log.info(
            "pass of batch %d, beside the next: %s | %s",
            batch_id,
            update.counts,
            update.timer.describe(),
        )

    def finish(self) -> None:
        """Once the query has stopped between batches: the hourly pass the batches since the
        last one owe (``pipelines.hourly_pass``), as the last batch would have made it, with
        its id and watermark (and its Delta txn ids: a MERGE the last batch made itself is not
        made twice)."""
        self.beside.join()
        owed = self.hourly.at_stop()
        if owed is None:
            return
        batch_id, watermark_ms, plan = owed
        self._guard()
        self.timer = StepTimer()
        counts: dict[str, int] = {}
        GoldUpdate(
            self.tables,
            self.timer,
            batch_id,
            w_prev=plan.since_ms,
            watermark_ms=watermark_ms,
            counts=counts,
            lookback_seconds=self.ctx.lookback_seconds,
            hourly=plan,
            pending=self.hourly.attributions,
            minutes=self.hourly.minutes,
        ).pass_stop(self._guard)
        self.hourly.done(batch_id, watermark_ms, None, plan)
        self.left_windows.forget_before(batch_id + 1)
        log.info("hourly pass after batch %d: %s | %s", batch_id, counts, self.timer.describe())

    def _timed(self, name: str, write: Callable[[], object]) -> Callable[[], None]:
        """``write``, timed as ``name`` and its Spark jobs described by it."""
        return self.timer.timed(name, described(self.spark, name, write))

    def _guard(self) -> None:
        if self.ctx.guard is not None:
            self.ctx.guard()

    def _publish(self, batch_id: int, tables: tuple[str, ...], given: list[Row]) -> str:
        """Publishes every gold row this batch changed in one Kafka transaction with the
        batch's marker: the rows of the published ``tables`` stamped with the batch (found by
        the stamp, so a re-execution finds the same rows), and the records the batch's gold
        update made as it wrote (``given``: ``GoldUpdate.records``)."""
        publisher = self.ctx.publisher
        if publisher is None:
            return "disabled"
        if not tables and not given:
            return "nothing-to-publish"
        # The phase is split in two: finding and pulling the changed rows (Spark's and Delta's
        # work: reading the batch's new table versions), and the transaction around them.
        started = time.monotonic()
        changed = changed_records(self.tables, batch_id, tables) if tables else None
        pulling = time.monotonic() - started

        def records() -> Iterator[tuple[bytes, bytes]]:
            nonlocal pulling
            for row in given:
                yield row.k.encode(), row.v.encode()
            if changed is None:
                return
            asked = time.monotonic()
            for row in rows_of(changed):
                pulling += time.monotonic() - asked
                yield row.k.encode(), row.v.encode()
                asked = time.monotonic()
            pulling += time.monotonic() - asked

        outcome = publisher.publish(batch_id, records, crash_at=self.ctx.crash_at)
        self.timer.mark_split(CHANGED_ROWS, pulling, "kafka")
        return outcome


def _report(batch_id: int, stats: list[Row], steps: dict[str, float], kafka: str) -> BatchReport:
    outcomes: dict[str, int] = {}
    newest: dict[tuple[str, int], tuple[int, int]] = {}
    for s in stats:
        outcomes[s.outcome] = outcomes.get(s.outcome, 0) + s.n
        key = (s.kafka_topic, s.kafka_partition)
        newest[key] = max(newest.get(key, (-1, 0)), (s.hi, s.k_hi))
    return BatchReport(batch_id, outcomes, steps, kafka, newest, time.time())
