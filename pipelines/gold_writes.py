"""One batch's gold writes: attributions, 1-minute windows and sliding hours, each a keyed MERGE
with Delta's txn ids, recomputed from silver where the batch's events can have changed them and
finalised where the watermark passed their end (the functions of ``pipelines.gold`` applied to
bounded slices of silver; in a batch without accepted events, finalised by an UPDATE whose own
condition makes it idempotent). Rows are set, never added to, so a re-executed or replayed
batch writes the same rows. The sliding hours, and the attributions and 1-minute windows as
tables, are written by the batches that make a pass (``pipelines.hourly_pass``): the attribution
rows and 1-minute windows kept since the last one (``pipelines.pending_rows``), or every minute
changed since then recomputed; a batch between passes publishes the attribution rows and 1-minute
windows it computed.

Every row ending at or before the previous batch's watermark is final already (the batch that
moved the watermark past it wrote it final or finalised it), so a batch reads and rewrites only
the rows ending in (previous watermark, its watermark] and the windows of its own events; each
MERGE condition bounds the target to its source's time range (a row's key fixes its time), which
lets Delta skip every other file.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.click_state import CarriedClicks
from pipelines.delta_writes import Tables, noted, run_concurrently
from pipelines.gold import (
    ATTRIBUTED,
    ATTRIBUTION_COLUMNS,
    CLICK_COLUMNS,
    attribute,
    campaign_ctr,
    merged,
    recomputed_or_current,
    reopened,
    window_metrics,
)
from pipelines.high_water import NEVER
from pipelines.hourly_pass import HourlyPass, hull, union
from pipelines.left_windows import Left, LeftWindows
from pipelines.pending_rows import PendingRows, portable_json
from pipelines.published_rows import records_of
from pipelines.timing import StepTimer
from pipelines.transforms import ACCEPTED

MINUTE_MS = 60_000
SLIDE_MS = 5 * MINUTE_MS
HOUR_MS = 60 * MINUTE_MS
# Columns the sink sets on every gold row it writes, not part of a recomputation.
_DERIVED = ("is_final", "generation", "batch_id")
# A span holding every minute (``GoldUpdate.unpassed`` not known).
ANY_MINUTE = (-(2**62), 2**62)
# A 1-minute window's key.
_MINUTE_KEYS = ("window_start", "ad_id")
# The attributions source's flag on the rows it recomputes (not a column of the table).
_RECOMPUTED = "_recomputed"
# The ad and campaign a pending conversion was attributed to before a new click reopened it
# (null on the batch's new conversions): the windows it may leave.
_OLD_AD, _OLD_CAMPAIGN = "_old_ad", "_old_campaign"


class _Rows(NamedTuple):
    """How many rows, and their time span (epoch ms)."""

    n: int
    span: tuple[int, int]


@dataclass(frozen=True)
class Merge:
    """One gold table's keyed MERGE: its source rows, their key and time columns, what a
    matched row gets (None: every column), and the time range of its source rows (a
    recomputation knows it: rarely without rows, and then the MERGE commits a version that
    changes nothing)."""

    name: str
    source: DataFrame
    keys: tuple[str, ...]
    time_column: str
    update: dict[str, str | Column] | None
    update_condition: str | None = None
    bounds: tuple[int, int] | None = None
    # A boolean source column marking the rows to count apart (``GoldUpdate._summarised``),
    # not a column of the table: dropped before the MERGE (the cached source keeps it).
    flag: str | None = None
    # With the batch's Delta txn ids (a MERGE of rows that are the same whatever runs it again
    # can do without, and then does not take the batch's version from a later pass).
    txn: bool = True


class GoldUpdate:
    """The gold MERGEs of one batch, whose watermark moved from ``w_prev`` to ``watermark_ms``;
    row counts go to ``counts`` (the ledger; a ``detached`` update's, the pass's log line),
    durations to ``timer``. ``sessions``: two Spark
    sessions besides the tables' own, for the writes that run at the same time as others (the
    finalising writes of a batch of none that passes): each takes its commit's note from its
    session's confs, as a MERGE its Delta txn ids, so in one shared session the first to finish
    would unset the others'. ``carried_clicks``:
    the latest clicks the batch may attribute with (``pipelines.click_state``; None: it reads
    silver's lookback). ``hourly``: the batch's pass over the sliding hours (None: it leaves
    them to a later batch)."""

    def __init__(
        self,
        tables: Tables,
        timer: StepTimer,
        batch_id: int,
        *,
        w_prev: int,
        watermark_ms: int,
        counts: dict[str, int],
        lookback_seconds: int,
        sessions: tuple[SparkSession, ...] = (),
        carried_clicks: CarriedClicks | None = None,
        hourly: HourlyPass | None = None,
        unpassed: tuple[int, int] | None = ANY_MINUTE,
        left_windows: LeftWindows | None = None,
        earlier_left: list[Left] | None = None,
        pending: PendingRows | None = None,
        minutes: PendingRows | None = None,
    ) -> None:
        self.tables = tables
        self.spark = tables.spark
        self.sessions = sessions
        self.timer = timer
        self.batch_id = batch_id
        self.w_prev = w_prev
        self.watermark_ms = watermark_ms
        self.counts = counts
        self.lookback = lookback_seconds
        self.carried_clicks = carried_clicks
        self.hourly = hourly
        # A batch that leaves the 1-minute table to a pass: the minutes the batches since the
        # last pass changed (their events' and re-attributed conversions' span, epoch ms; None:
        # none), the only ones whose windows the table may not hold as they are. Not given:
        # any minute may have changed, and every due window is recomputed.
        self.unpassed = unpassed
        # The records that publish what the batch changed in a table, where it has them
        # without reading the table's rows stamped with the batch afterwards (the sink reads
        # the other tables'): the attribution rows and 1-minute windows of a batch that
        # leaves those tables to a pass.
        self.records: dict[str, list[Row]] = {}
        # The minutes whose windows the batch changed (its events', its re-attributed
        # conversions'), which a later pass must recompute; None: none.
        self.changed_minutes: tuple[int, int] | None = None
        # Where the windows its re-attributed conversions leave are kept until it is done
        # (None: not kept, a re-execution would not know them).
        self.left_windows = left_windows
        # A run's first batch: the windows earlier runs' re-attributions may have left behind
        # (``LeftWindows.everywhere``), candidates for its pass.
        self.earlier_left = earlier_left or []
        # The attribution rows the batches since the last pass set, which every read of the
        # table sees and the pass writes (``pipelines.pending_rows``; the sink gives
        # every batch the run's; one given none keeps its own in a new set).
        # The batch adds its own to a copy: the run's change once it is done.
        self.pending = pending.copy() if pending is not None else PendingRows(t.ATTRIBUTIONS)
        # The 1-minute windows the batches since the last pass published, which a pass that
        # keeps writes (``HourlyPass.kept``); kept alike.
        self.minutes = minutes.copy() if minutes is not None else PendingRows(t.GOLD_1M)

    @property
    def advanced(self) -> bool:
        return self.watermark_ms > self.w_prev

    @property
    def settles(self) -> bool:
        """Whether a pass has 1-minute or hourly rows to finalise (``_settled``)."""
        return self._settled() > self.w_prev

    @property
    def publishes(self) -> bool:
        """Whether the batch publishes the attribution rows and 1-minute windows it computed
        and keeps them (between passes, and a pass that keeps: ``HourlyPass.kept``), rather
        than MERGEing them before its transaction and publishing the rows stamped with it."""
        return self.hourly is None or self.hourly.kept

    @property
    def due(self) -> bool:
        """Whether a batch without accepted events has anything to write."""
        return self.advanced or self.hourly is not None

    def on(self, spark: SparkSession) -> GoldUpdate:
        """The same update, reading and writing through another session."""
        other = copy.copy(self)
        other.spark = spark
        return other

    def detached(self, spark: SparkSession) -> GoldUpdate:
        """The same update for writes made after the batch (``pipelines.pass_beside``), through
        ``spark``, with counts, timings and table versions of its own (the batch's ledger row
        may be written first)."""
        other = self.on(spark)
        other.tables = copy.copy(self.tables)
        other.tables.versions = {}
        other.timer = StepTimer()
        other.counts = {}
        return other

    def since(self, w_prev: int) -> GoldUpdate:
        """The same update, finalising what the watermark passed since ``w_prev``."""
        other = copy.copy(self)
        other.w_prev = w_prev
        return other

    def run(self, rows: DataFrame | None, span: tuple[int, int] | None) -> None:
        """The attributions and the 1-minute windows (which count attributed conversions) for
        the batch's classified ``rows`` (None: no accepted event) and its accepted events' time
        ``span``; the batch's hourly pass comes after its Kafka transaction (``pass_hours``: the
        table is published to no one).

        Every batch computes the attribution rows a MERGE would set and keeps them with those
        of the batches since the last pass (``pending``), which every read of the table sees.
        A batch that makes a pass that recomputes (``hourly``, not ``kept``) MERGEs them all,
        then the 1-minute windows of its events and of every batch since the last pass, and
        finalises what the watermark passed since then. (Two MERGEs at once, from sources that
        anticipate each other's results, took longer here: on two cores their jobs only queue
        behind each other.) One that leaves the tables to a later pass, or makes a pass that
        keeps, publishes the attribution rows and the windows of its own events and of its
        watermark's move from what it computed (``records``) and keeps them (``pending``,
        ``minutes``; a pass that keeps writes them after the transaction: ``pass_kept``).
        Such a batch is never a run's first, so never a re-execution (a run's first batch
        passes).

        A batch without accepted events recomputes nothing but what a pass owes: it finalises
        the rows its watermark passed, which depend on nothing but each table's own rows;
        between passes it keeps the attributions and publishes both; a pass writes the tables
        at once, each in its own session (the attributions by a MERGE of the rows kept, or an
        UPDATE when none are; the others by an UPDATE, the hours by a MERGE when minutes
        changed since the last pass)."""
        if rows is None:
            self._finalise_all()
            return
        assert span is not None, "a batch with accepted events has their time span"
        # A pass that recomputes, with nothing kept, MERGEs its own rows as computed; any other
        # batch keeps them.
        keep = self.publishes or bool(self.pending)
        attributions, reattributed, left = self._attributions(rows, span, keep=keep)
        minutes = hull(span, reattributed)
        self.changed_minutes = minutes
        self._run(attributions)
        if self.hourly is not None and not self.hourly.kept:
            self._write_pending()
            left = sorted({*left, *self.earlier_left})
            candidates = self._left_windows(left) if left else None
            self.since(self.hourly.since_ms)._minutes(
                hull(minutes, self.hourly.pending), candidates
            )
            return
        candidates = self._left_windows(left) if left else None
        self.records[t.GOLD_1M] = self._publish_minutes(minutes, candidates)

    def _finalise_all(self) -> None:
        """A batch without accepted events: the attributions, the 1-minute windows and the
        hours its watermark passed (and the minutes a pass owes)."""
        plan = self.hourly
        if plan is None or plan.kept:  # a kept pass writes after the transaction: pass_kept
            if self.advanced:
                self._keep_finalised()
                self.records[t.GOLD_1M] = self._publish_minutes(None)
            return
        owed = plan.pending  # minutes changed since the last pass
        if plan.conversions is not None:  # a run's first pass: what the table may lack
            _, kept, reattributed, _ = self._attribution_source(None, None, keep=True)
            owed = union(owed, reattributed)
            self._hold(kept)
        elif self.advanced and self.pending:
            self._keep_finalised()
        at_once = len(self.sessions) >= 2
        one, two = (
            (self.on(self.sessions[0]), self.on(self.sessions[1])) if at_once else (self, self)
        )
        writes = []
        if self.pending:
            writes.append(self._write_pending)
        elif self.advanced:
            writes.append(lambda: self._finalise(t.ATTRIBUTIONS, "conversion_time"))
        if owed is not None:  # minutes changed since the last pass: then the hours
            pending = owed

            earlier = self._left_windows(self.earlier_left) if self.earlier_left else None

            def minutes_then_hours() -> None:
                one.since(plan.since_ms)._minutes(pending, earlier)
                two.pass_hours(None)

            writes.append(minutes_then_hours)
        else:
            minutes = one.since(plan.since_ms)
            if minutes.settles:
                writes.append(lambda: minutes._finalise(t.GOLD_1M, "window_end"))
            writes.append(lambda: two.pass_hours(None))
        run_concurrently(writes, together=at_once)

    def pass_kept(self, guard: Callable[[], None] = lambda: None) -> None:
        """A pass that keeps (``HourlyPass.kept``), after the batch's Kafka transaction, beside
        the next batch (``pipelines.pass_beside``): the attribution rows and the 1-minute
        windows kept since the last pass (the batch's own among them), each by one keyed MERGE
        with the batch's Delta txn ids, then the hours holding a minute changed since then,
        from the 1-minute table; ``guard`` before each (the checkpoint's lease).

        The windows kept are every one a batch since the last pass changed or finalised: each
        batch published (and kept) the windows of its events and re-attributed conversions and
        those its watermark passed (``_publish_minutes``), so the MERGE of the latest row per
        window leaves the table as a MERGE in every batch would have, stamps included. A crash
        that re-executes the batch (before Spark's commit log) makes it its next run's first,
        which passes by recomputing (what it finds committed under this batch's txn ids
        stands); a later one leaves the tables to that batch as a crash between passes does."""
        plan = self.hourly
        assert plan is not None and plan.kept, "a pass that keeps"
        guard()
        self._write_pending()
        guard()
        self._write_kept_minutes()
        guard()
        self.pass_hours(self.changed_minutes)

    def pass_stop(self, guard: Callable[[], None] = lambda: None) -> None:
        """The pass owed at the stop (``hourly``): the attribution rows kept since the last
        pass, then the 1-minute windows changed since then (their values and finality
        published already, by the batches that changed them: the windows kept, or recomputed
        after a run's first batch that did not pass by keeping), then the hours."""
        plan = self.hourly
        assert plan is not None, "a pass to make"
        if plan.kept:
            self.pass_kept(guard)
            return
        self._write_pending()
        at = self.since(plan.since_ms)
        if plan.pending is not None:
            at._minutes(plan.pending)
        elif at.settles:
            at._finalise(t.GOLD_1M, "window_end")
        self.pass_hours(None)

    def _keep_finalised(self) -> None:
        """A batch without accepted events: the attributions its watermark passed, final and
        with the batch's stamp, kept (``_hold``)."""
        due = self._due(t.ATTRIBUTIONS, "conversion_time")
        assert due is not None, "a watermark that moved"
        self._hold(self._collect(self._final(due, "conversion_time")))

    def _collect(self, rows: DataFrame, flag: str | None = None, step: str = "kept") -> list[Row]:
        """``rows`` (the attributions table's columns, and ``flag`` beside them) on the driver
        by one job, each with the record that publishes it, its JSON as kept
        (``pipelines.pending_rows``) and its conversion time (``_at``, epoch ms); the
        job's time is the timer's ``step``."""
        started = time.monotonic()
        flags = (flag,) if flag is not None else ()
        ms = F.expr("unix_millis(conversion_time)")
        found = records_of(
            self.tables,
            t.ATTRIBUTIONS,
            rows.select(*t.columns(t.ATTRIBUTIONS), *flags).select(
                "*", portable_json(t.ATTRIBUTIONS).alias("_json"), ms.alias("_at")
            ),
            self.batch_id,
            extra=(
                "conversion_id",
                "_at",
                "_json",
                "status",
                "advertiser_id",
                "ad_id",
                "campaign_id",
                *flags,
            ),
        ).collect()
        self.timer.since(f"{t.ATTRIBUTIONS}:{step}", started)
        return found

    def _hold(self, found: list[Row]) -> None:
        """Keeps the attribution rows ``found`` (``_collect``) with those of the batches since
        the last pass (``pending``), and counts them. A batch between passes publishes them
        (``records``: the rows its MERGE would have set, so the records a MERGE's rows read
        back would have been) and first keeps the windows they are counted in beside the
        checkpoint (``LeftWindows.remember``: the table does not hold them until the pass)."""
        if not found:
            return
        self.counts[f"{t.ATTRIBUTIONS}_rows"] = len(found)
        if self.publishes:
            counted = [
                (int(r._at), str(r.advertiser_id or ""), str(r.ad_id), str(r.campaign_id or ""))
                for r in found
                if r.status == ATTRIBUTED
            ]
            if counted and self.left_windows is not None:
                self.left_windows.remember(self.batch_id, [], counted=counted)
            self.records[t.ATTRIBUTIONS] = found
        self.pending.add([(r.conversion_id, r._at, r._json) for r in found])

    def _write_pending(self) -> None:
        """A pass: one keyed MERGE of the attribution rows kept since the last pass (each with
        the stamp of the batch that set it), with the batch's Delta txn ids; a final row stays
        as it is. Nothing when none are kept."""
        self._write_kept(
            self.pending,
            ("conversion_id",),
            "conversion_time",
            update=None,  # every column; a final attribution stays as it is
            update_condition="NOT t.is_final",
        )

    def _write_kept_minutes(self) -> None:
        """A pass that keeps: one keyed MERGE of the 1-minute windows kept since the last pass
        (each with the stamp of the batch that published it), with the batch's Delta txn ids;
        a final row stays final. Nothing when none are kept."""
        self._write_kept(
            self.minutes, _MINUTE_KEYS, "window_start", update=_update_keeping_final(t.GOLD_1M)
        )

    def _write_kept(
        self,
        kept: PendingRows,
        keys: tuple[str, ...],
        time_column: str,
        *,
        update: dict[str, str | Column] | None,
        update_condition: str | None = None,
    ) -> None:
        if not kept:
            return
        self._run(
            Merge(
                kept.name,
                kept.frame(self.spark),
                keys=keys,
                time_column=time_column,
                update=update,
                update_condition=update_condition,
                bounds=kept.bounds_ms(),
            )
        )
        self.counts[f"{kept.name}_kept_rows"] = len(kept)

    def _attributions_table(self, where: Column) -> DataFrame:
        """The attributions (of conversion times where ``where`` holds) as the MERGE of the rows
        kept since the last pass leaves them (``pipelines.gold.merged``): what a MERGE in every
        batch would have left. ``where`` may only test ``conversion_time`` (a row's key fixes
        it), so it holds for a kept row and the table's row alike."""
        table = self._load(t.ATTRIBUTIONS).where(where)
        if not self.pending:
            return table
        kept = self.pending.frame(self.spark).where(where)
        return merged(table, kept, keys=("conversion_id",))

    def _publish_minutes(
        self,
        span: tuple[int, int] | None,
        candidates: DataFrame | None = None,
    ) -> list[Row]:
        """For a batch that leaves the 1-minute table to a later pass (or makes a pass that
        keeps): the windows of its events' ``span`` (None: none) and the windows its watermark
        passed, with ``is_final`` and the batch's stamp, as the records that publish them: the
        rows its MERGE would have set, so the records a MERGE's rows read back would have been
        (each recomputed from silver and the attributions, never added to); kept for the pass,
        which writes them (``minutes``), or writes the same values recomputed (a run's first).
        ``candidates``: the windows the batch's re-attributed conversions were counted in
        before (``_left_windows``).

        Exact with a table the batches since the last pass have not written. Every minute
        changed since the last pass lies in the span of some batch's events (or re-attributed
        conversions) since then (``unpassed``), so a window outside it is the table's row as
        that pass left it, and one inside it is recomputed: the batch's own events' windows,
        and the due ones some batch since the pass changed; the due ones no batch changed
        (with the watermark's delay behind the events, nearly all) are read from the table
        and only finalised and stamped, as a MERGE in every batch would have (a batch of none
        then recomputes nothing: for its windows it reads the 1-minute table alone). A window
        only grows, but for one a re-attributed conversion leaves: the recomputation no longer
        produces it when that conversion was all it held, and it is set to zero, not deleted,
        whether the table holds it yet (the range's rows) or only the topic does
        (``candidates``). Such a zero, rare, is written to the table at once (a keyed MERGE of
        those rows alone, the same whenever it runs again: no txn ids, so a later pass of the
        batch's id is not skipped; not final, as a pass leaves a row it has not finalised, so
        the latest final end still bounds what a crash can leave behind), so the table holds
        every row the topic has ever carried, and the later recomputations and the pass set it
        zero again. The windows count the attributions as the pass will write them: the table's
        with the rows kept since the last pass (``pending``, the batch's own among them)."""
        started = time.monotonic()
        due = (F.col("window_end") > F.timestamp_millis(F.lit(self.w_prev))) & (
            F.col("window_end") <= F.timestamp_millis(F.lit(self.watermark_ms))
        )
        wanted = due if self.advanced else F.lit(False)
        if span is not None:
            lo, hi = _minute(span[0]), _minute(span[1]) + MINUTE_MS
            wanted = wanted | time_between("window_start", lo, hi)
        # A due window no batch since the last pass changed is the table's row as that pass
        # left it: only those some batch changed are recomputed (with the watermark's delay,
        # rarely any: the due windows are the delay behind the events).
        reach = union(span, _overlap(self._due_minutes(), self.unpassed))
        if reach is not None:
            windows = self._minute_windows(reach, candidates, flag=_RECOMPUTED)
        elif self.advanced:
            windows = recomputed_or_current(
                None,
                self._due(t.GOLD_1M, "window_end"),
                keys=_MINUTE_KEYS,
                values=_values(t.GOLD_1M, _MINUTE_KEYS),
                flag=_RECOMPUTED,
            )
        else:
            return []
        source = self._final(windows, "window_end").where(wanted)
        rows = source.select(
            *[F.col(f.name).cast(f.dataType) for f in t.schema(t.GOLD_1M).fields],
            _RECOMPUTED,
            F.expr("unix_millis(window_start)").alias("_at"),
        )
        found = records_of(
            self.tables,
            t.GOLD_1M,
            rows.withColumn("_json", portable_json(t.GOLD_1M)),
            self.batch_id,
            extra=(_RECOMPUTED, "_at", "ad_id", "_json"),
        ).collect()
        if found:
            self.counts[f"{t.GOLD_1M}_rows"] = len(found)
        # Kept for the pass (``pipelines.pending_rows``), the latest row per window.
        self.minutes.add(((r._at, r.ad_id), r._at, r._json) for r in found)
        self.timer.since(f"{t.GOLD_1M}:published", started)
        # Zeros the table lacks can only be the candidates' (others are its own zero rows),
        # and only in the recomputed range (outside it the rows are the table's, as they are).
        zeros: list[int] = []
        if candidates is not None and reach is not None:
            lo, hi = _minute(reach[0]), _minute(reach[1]) + MINUTE_MS
            zeros = [r._at for r in found if not r[_RECOMPUTED] and lo <= r._at < hi]
        if zeros:
            self._run(
                Merge(
                    t.GOLD_1M,
                    rows.where(~F.col(_RECOMPUTED) & time_between("window_start", lo, hi))
                    .drop("_at")
                    .withColumn("is_final", F.lit(False)),
                    keys=_MINUTE_KEYS,
                    time_column="window_start",
                    update=_update_keeping_final(t.GOLD_1M),
                    bounds=(min(zeros), max(zeros)),
                    flag=_RECOMPUTED,
                    txn=False,
                )
            )
        return found

    def _due_minutes(self) -> tuple[int, int] | None:
        """The first and last start (epoch ms) of the 1-minute windows whose end the batch's
        watermark passed, (w_prev, w_cur] (None: none)."""
        lo, hi = _minute(self.w_prev), _minute(self.watermark_ms) - MINUTE_MS
        return (lo, hi) if self.advanced and lo <= hi else None

    def _left_windows(self, left: list[Left]) -> DataFrame:
        """The 1-minute windows (keys and dimension columns, zero values) the conversions of
        ``left`` were counted in before their re-attribution (the time made a window in Spark,
        from epoch milliseconds: no local time zone on the way)."""
        found = self.spark.createDataFrame(
            left, "at long, advertiser_id string, ad_id string, campaign_id string"
        )
        start = F.timestamp_millis(F.floor(F.col("at") / MINUTE_MS) * MINUTE_MS)
        zero = F.lit(0).cast("long")
        values = {
            "window_start": start,
            "window_end": start + F.expr("INTERVAL 1 MINUTE"),
            "impressions": zero,
            "clicks": zero,
            "spend": F.lit(0).cast("decimal(24,9)"),
            "conversions": zero,
            "revenue": F.lit(0).cast("decimal(24,6)"),
            "is_final": F.lit(False),
        }
        columns = []
        for f in t.schema(t.GOLD_1M).fields:
            if f.name in values:
                column = values[f.name]
            elif f.name in found.columns:
                column = F.col(f.name)
            else:  # the stamp
                column = F.lit(None)
            columns.append(column.cast(f.dataType).alias(f.name))
        return found.select(*columns)

    def pass_hours(self, span: tuple[int, int] | None) -> None:
        """The batch's hourly pass (``hourly``; none: nothing), once the 1-minute table holds
        the batch's rows: the hours holding a minute of ``span`` (the batch's accepted events:
        hours sum impressions and clicks alone, so a re-attributed conversion changes none) or
        of the minutes changed since the last pass recomputed from the 1-minute table, and
        the hours the watermark passed since then finalised (by an UPDATE when no minute
        changed)."""
        if self.hourly is None:
            return
        at = self.since(self.hourly.since_ms)
        changed = union(self.hourly.pending, span)
        if changed is not None:
            at._hours(changed)
        elif at.settles:
            at._finalise(t.CTR_1H, "window_end")

    def _attributions(
        self, rows: DataFrame, span: tuple[int, int], *, keep: bool
    ) -> tuple[Merge | None, tuple[int, int] | None, list[Left]]:
        """The attributions MERGE (None when ``keep``: its rows are kept, ``_hold``; or when
        there is nothing to write; otherwise its source cached: ``_run`` it), the
        conversion-time span it (re)attributes and the re-attributed conversions' ads before
        (``_attribution_source``), kept first where a re-execution finds them
        (``left_windows``)."""
        attributions, kept, reattributed, found = self._attribution_source(rows, span, keep=keep)
        left = [
            (int(r.at), str(r.advertiser_id or ""), str(r[_OLD_AD]), str(r[_OLD_CAMPAIGN] or ""))
            for r in found
        ]
        if self.left_windows is not None:
            left = self.left_windows.remember(self.batch_id, left)
        self._hold(kept)
        return attributions, reattributed, left

    def _minutes(self, span: tuple[int, int], candidates: DataFrame | None = None) -> None:
        minute_rows = self._minute_windows(span, candidates)
        lo, hi = _minute(span[0]), _minute(span[1]) + MINUTE_MS
        minutes = Merge(
            t.GOLD_1M,
            self._final(minute_rows, "window_end", upto=self._settled()),
            keys=_MINUTE_KEYS,
            time_column="window_start",
            update=_update_keeping_final(t.GOLD_1M),
            bounds=self._widen((lo, hi), MINUTE_MS),
        )
        self._run(minutes)

    def _hours(self, span: tuple[int, int]) -> None:
        first, last = hour_starts(span)
        hours = sliding_hours(self._load(t.GOLD_1M), span)
        due_hours = self._due(t.CTR_1H, "window_end")
        hour_keys = ("window_start", "campaign_id")
        hour_values = _values(t.CTR_1H, hour_keys)
        hour_merge = Merge(
            t.CTR_1H,
            self._final(
                recomputed_or_current(hours, due_hours, keys=hour_keys, values=hour_values),
                "window_end",
                upto=self._settled(),
            ),
            keys=hour_keys,
            time_column="window_start",
            update=_update_keeping_final(t.CTR_1H),
            bounds=self._widen((first, last), HOUR_MS),
        )
        self._run(hour_merge)

    def _finalise(self, name: str, end: str) -> None:
        """The table's rows that the watermark passed in this batch, (w_prev, w_cur], become
        final and carry the batch's stamp; nothing else changes (w_cur: ``_upto``). One
        UPDATE: the same rows and values as a MERGE of those rows read back from the table
        (what a batch with events does, its finalised rows among its recomputed ones), for
        ~0.5 s less (a 300-row finalisation into a 20,000-row table: UPDATE 0.77 s, MERGE
        1.33 s, medians of 8).

        Without Delta's txn ids: the UPDATE selects its rows by their not being final yet, so
        run again (the batch re-executed) it finds them final and changes nothing, and an
        UPDATE that changes nothing commits nothing, as for a MERGE without source rows (what
        there is to publish is read off the batch's commits). With txn ids Delta would commit
        a version even then, so a count of the due rows had to come first: one scan of the
        table more than the UPDATE's own. The SQL form returns how many rows it changed; the
        commit notes the batch instead (``noted``)."""
        started = time.monotonic()
        after = f"timestamp_millis({int(self.w_prev)})"
        upto = f"timestamp_millis({int(self._upto(name))})"
        path = self.tables.path(name).replace("`", "``")
        stamp = f"generation = {int(self.tables.generation)}, batch_id = {int(self.batch_id)}"
        with noted(self.spark, self.tables.app_id, self.batch_id):
            changed = self.spark.sql(
                f"UPDATE delta.`{path}` SET is_final = true, {stamp} "
                f"WHERE `{end}` > {after} AND `{end}` <= {upto} AND NOT is_final"
            ).first()
        n = int(changed[0]) if changed is not None else 0
        self.timer.since(f"{name}:update", started)
        if not n:
            return
        self.counts[f"{name}_rows"] = n
        self.tables.committed(name)

    def _load(self, name: str) -> DataFrame:
        return self.tables.load(name, self.spark)

    def _attribution_source(
        self, rows: DataFrame | None, span: tuple[int, int] | None, *, keep: bool
    ) -> tuple[Merge | None, list[Row], tuple[int, int] | None, list[Row]]:
        """The attributions MERGE (None: nothing to write, or ``keep``), its rows on the driver
        when ``keep`` (``_collect``: to ``_hold``; otherwise none), the conversion-time span of
        the conversions this batch (re)attributes and the pending ones among them that were
        attributed (their conversion time ``at`` in epoch ms, advertiser, and ad and campaign
        before: ``_OLD_AD``, ``_OLD_CAMPAIGN``; one job more). Those it (re)attributes
        are its new conversions, and the pending (not final)
        ones that one of its new clicks now precedes within the lookback, so a click that
        arrives after its conversion gives the answer event-time order would have. A final
        attribution is never touched: its conversion time is at or behind the watermark, so no
        click that could precede it can be accepted any more. Those the watermark passed in
        this batch become final. ``span``: the batch's accepted events' time span (``rows``
        and ``span`` None: a batch without accepted events).

        A run's first pass also re-attributes the conversions of silver the table may lack or
        hold as a run that died left it (``HourlyPass.conversions``): those the batches since
        the last pass kept and never wrote (``pipelines.pending_rows``). Each is
        attributed from silver's clicks as it would have been by then: a conversion's
        attribution depends on the clicks accepted before its watermark passed it, all in
        silver, never on the order they came in.

        One job finds them, attributes them and counts the source (its rows flagged
        recomputed or not), or collects it (``keep``: the count and spans from its rows, no job
        more): their clicks are read for a span that holds every one of them,
        from the batch's first accepted event (a new conversion, or a pending one after a new
        click) to its last plus the lookback (a pending one no later than a new click's
        lookback)."""
        # Every attribution at or behind the previous watermark is final (see _due).
        pending = (
            self._attributions_table(_after("conversion_time", self.w_prev))
            .where(~F.col("is_final"))
            .select(
                F.col("conversion_id").alias("event_id"),
                F.col("conversion_time").alias("event_time"),
                "user_id",
                "advertiser_id",
                "revenue",
                F.col("ad_id").alias(_OLD_AD),
                F.col("campaign_id").alias(_OLD_CAMPAIGN),
            )
        )
        unattributed = [F.lit(None).cast("string").alias(c) for c in (_OLD_AD, _OLD_CAMPAIGN)]
        chosen: DataFrame | None = None
        reach: tuple[int, int] | None = None
        if rows is not None:
            assert span is not None, "a batch with accepted events has their time span"
            new = rows.where(F.col("outcome") == ACCEPTED)
            reopen = reopened(
                pending, new.where(F.col("event_type") == "click"), lookback_seconds=self.lookback
            )
            conversions = new.where(F.col("event_type") == "conversion")
            chosen = conversions.select(*pending.columns[:5], *unattributed).unionByName(reopen)
            reach = (span[0], span[1] + self.lookback * 1000)
        behind = self.hourly.conversions if self.hourly is not None else None
        if behind is not None:
            lo, hi = behind
            found = (
                self._load(t.SILVER)
                .where(
                    (F.col("event_type") == "conversion") & time_between("event_time", lo, hi + 1)
                )
                .select(*pending.columns[:5], *unattributed)
            )
            if chosen is None:
                chosen = found
            else:  # a reopened one keeps its ad before
                anew = found.join(chosen.select("event_id"), "event_id", "left_anti")
                chosen = chosen.unionByName(anew)
            reach = union(reach, (lo, hi + 1))
        if chosen is None:
            return None, [], None, []
        assert reach is not None
        affected = chosen.dropDuplicates(["event_id"]).persist(
            StorageLevel.MEMORY_AND_DISK  # read twice: conversions, their users
        )
        try:
            recomputed = attribute(
                affected, self._clicks(affected, reach), lookback_seconds=self.lookback
            )
            keys = ("conversion_id",)
            # A run's first pass writes a row at or before the latest watermark any batch was
            # planned under final: that batch may have published it final (a replay starts
            # again at 0).
            settled = self.hourly.settled_ms if self.hourly is not None and behind else NEVER
            source = self._final(
                recomputed_or_current(
                    recomputed,
                    self._due(t.ATTRIBUTIONS, "conversion_time"),
                    keys=keys,
                    values=ATTRIBUTION_COLUMNS[1:],
                    flag=_RECOMPUTED,
                ),
                "conversion_time",
                upto=max(self.watermark_ms, settled),
            )
            merge: Merge | None = None
            kept: list[Row] = []
            if keep:
                # Its time is the source's too (computed by this job): not "kept" alone.
                kept = self._collect(source, flag=_RECOMPUTED, step="source+kept")
                at = [int(r._at) for r in kept if r[_RECOMPUTED]]
                recomputed_rows = _Rows(len(at), (min(at), max(at))) if at else None
            else:
                merge, recomputed_rows = self._summarised(
                    Merge(
                        t.ATTRIBUTIONS,
                        source,
                        keys=keys,
                        time_column="conversion_time",
                        update=None,  # every column; a final attribution stays as it is
                        update_condition="NOT t.is_final",
                        flag=_RECOMPUTED,
                    )
                )
            # Cached by the job above (the source's).
            left = (
                affected.where(F.col(_OLD_AD).isNotNull())
                .select(
                    F.expr("unix_millis(event_time)").alias("at"),
                    "advertiser_id",
                    _OLD_AD,
                    _OLD_CAMPAIGN,
                )
                .collect()
            )
        finally:
            affected.unpersist()
        if recomputed_rows is None:
            return merge, kept, None, left
        self.counts["attributions_computed"] = recomputed_rows.n
        return merge, kept, recomputed_rows.span, left

    def _clicks(self, affected: DataFrame, span: tuple[int, int]) -> DataFrame:
        """The clicks that can be attributed the ``affected`` conversions (``span`` holds their
        conversion times): their users' clicks in the lookback before them, from silver; or,
        when the batch carries the latest clicks up to a time before every one of them
        (``pipelines.click_state``), those and silver's clicks after that time."""
        since = F.timestamp_millis(F.lit(span[0])) - F.expr(f"INTERVAL {self.lookback} SECONDS")
        when = (F.col("event_time") >= since) & (
            F.col("event_time") < F.timestamp_millis(F.lit(span[1]))
        )
        silver_clicks = self._load(t.SILVER).where(F.col("event_type") == "click")
        carried = self.carried_clicks
        if carried is None or span[0] <= carried.cutoff_ms:  # none, or not before them all
            clicks = silver_clicks.where(when)
        else:
            after = F.col("event_time") > F.timestamp_millis(F.lit(carried.cutoff_ms))
            clicks = silver_clicks.where(when & after).select(*CLICK_COLUMNS)
            if carried.rows is not None:
                clicks = clicks.unionByName(carried.rows)
        return clicks.join(affected.select("user_id").distinct(), "user_id", "left_semi")

    def _minute_windows(
        self,
        span: tuple[int, int],
        candidates: DataFrame | None = None,
        flag: str | None = None,
    ) -> DataFrame:
        """The 1-minute MERGE's rows (before is_final and the stamp): the windows of the span
        recomputed from silver and the attributions, the windows due to be finalised, and the
        span's windows the recomputation no longer produces (their only conversion was
        re-attributed to another ad), set to zero, not deleted, so the change is a row like
        any other (found again, published as a zero update)."""
        keys = _MINUTE_KEYS
        values = _values(t.GOLD_1M, keys)
        lo, hi = _minute(span[0]), _minute(span[1]) + MINUTE_MS
        attributions = self._attributions_table(time_between("conversion_time", lo, hi))
        recomputed = window_metrics(
            self._load(t.SILVER).where(time_between("event_time", lo, hi)), attributions
        )
        current = self._due(t.GOLD_1M, "window_end", also=time_between("window_start", lo, hi))
        if candidates is not None:  # windows the topic may hold and the table not yet
            assert current is not None, "a range of the table"
            inside = candidates.where(time_between("window_start", lo, hi))
            current = current.unionByName(inside).dropDuplicates(list(keys))
        return recomputed_or_current(
            recomputed,
            current,
            keys=keys,
            values=values,
            emptied=time_between("window_start", lo, hi),
            zeros={
                **{n: F.lit(0).cast("long") for n in ("impressions", "clicks", "conversions")},
                "spend": F.lit(0).cast("decimal(24,9)"),
                "revenue": F.lit(0).cast("decimal(24,6)"),
            },
            flag=flag,
        )

    def _due(self, name: str, end: str, also: Column | None = None) -> DataFrame | None:
        """The table's rows that are not final but whose end this batch's watermark passed,
        (w_prev, w_cur] (w_cur: ``_upto``; or any of ``also``); None when there can be none.
        Every row ending at or before the previous watermark is final already: the batch that
        moved the watermark past it wrote it final or finalised it (a replay's first batch has
        w_prev = 0: the whole table). So a batch reads, and rewrites, only the files of the
        rows it changes."""
        upto = self._upto(name)
        if upto <= self.w_prev and also is None:
            return None
        due = _after(end, self.w_prev) & ~_after(end, upto)
        when = due if also is None else due | also
        if name == t.ATTRIBUTIONS:  # with the rows kept since the last pass
            return self._attributions_table(when).where(~F.col("is_final"))
        return self._load(name).where(~F.col("is_final") & when)

    def _final(self, source: DataFrame, end: str, upto: int | None = None) -> DataFrame:
        """A gold MERGE source with is_final (the watermark, or ``upto``, has passed the row's
        end) and the batch's stamp."""
        upto = self.watermark_ms if upto is None else upto
        final = F.col(end) <= F.timestamp_millis(F.lit(upto))
        return self.tables.stamped(source.withColumn("is_final", final), self.batch_id)

    def _settled(self) -> int:
        """Up to where a pass writes 1-minute and hourly rows final, and finalises those not
        final yet (``_due``): the batch's watermark, or for a run's first pass the latest
        watermark a batch of any generation was planned under (``HourlyPass.settled_ms``: at
        or past every watermark a batch published under), if later. A batch between passes
        publishes the windows its watermark passed final while the table waits for the pass;
        after a crash, a replay's watermark starts again at 0, and its first pass would
        otherwise write (and publish) those windows open again, where a MERGE in every batch
        had left them final."""
        settled = self.hourly.settled_ms if self.hourly is not None else NEVER
        return max(self.watermark_ms, settled)

    def _upto(self, name: str) -> int:
        """Up to where a batch finalises the rows of ``name`` that are not final yet: its
        watermark for the attributions (those a run's first pass writes final past it are the
        ones it re-attributes, ``_attribution_source``), ``_settled`` for the 1-minute and
        hourly rows."""
        return self.watermark_ms if name == t.ATTRIBUTIONS else self._settled()

    def _widen(self, span: tuple[int, int], width: int) -> tuple[int, int]:
        """A time range holding ``span`` and the starts of the rows of ``width`` that end in
        (w_prev, w_cur] (w_cur: ``_settled``; a superset is safe: it only reads more files)."""
        return min(span[0], self.w_prev - width), max(span[1], self._settled())

    def _summarised(self, merge: Merge) -> tuple[Merge | None, _Rows | None]:
        """The MERGE with its source cached and bounded by its own time range (None when it has
        no rows: then nothing is committed, on any execution of the batch the same), and the
        count and time span of its rows where its ``flag`` column holds (None: none), all read
        by one job."""
        assert merge.flag is not None, "a source with rows to count apart"
        flag = merge.flag
        started = time.monotonic()
        source = merge.source.persist(StorageLevel.MEMORY_AND_DISK)
        at = merge.time_column
        found = source.agg(
            F.count("*").alias("n"),
            F.expr(f"unix_millis(min({at}))").alias("lo"),
            F.expr(f"unix_millis(max({at}))").alias("hi"),
            F.count_if(F.col(flag)).alias("f_n"),
            F.expr(f"unix_millis(min(CASE WHEN {flag} THEN {at} END))").alias("f_lo"),
            F.expr(f"unix_millis(max(CASE WHEN {flag} THEN {at} END))").alias("f_hi"),
        ).first()
        self.timer.since(f"{merge.name}:source", started)
        if found is None or not found.n:
            source.unpersist()
            return None, None
        self.counts[f"{merge.name}_rows"] = int(found.n)
        flagged = _Rows(int(found.f_n), (int(found.f_lo), int(found.f_hi))) if found.f_n else None
        return replace(merge, source=source, bounds=(int(found.lo), int(found.hi))), flagged

    def _run(self, merge: Merge | None) -> None:
        if merge is None:
            return
        try:
            self._merge(merge)
        finally:
            merge.source.unpersist()

    def _merge(self, merge: Merge) -> None:
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
        source = merge.source if merge.flag is None else merge.source.drop(merge.flag)
        builder = (
            DeltaTable.forPath(self.spark, self.tables.path(merge.name))
            .alias("t")
            .merge(source.alias("s"), condition)
        )
        if merge.update is None:
            builder = builder.whenMatchedUpdateAll(condition=merge.update_condition)
        else:
            builder = builder.whenMatchedUpdate(condition=merge.update_condition, set=merge.update)
        if merge.txn:
            with self.tables.txn(self.batch_id, self.spark):
                builder.whenNotMatchedInsertAll().execute()
        else:
            builder.whenNotMatchedInsertAll().execute()
        self.tables.committed(merge.name)
        self.timer.since(f"{merge.name}:merge", started)


def _values(name: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """A gold table's columns a recomputation sets: all but its key and the sink's own."""
    return tuple(c for c in t.columns(name) if c not in {*keys, *_DERIVED})


def _overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    """The minutes (their starts, epoch ms) of both spans (None: none)."""
    if a is None or b is None:
        return None
    lo, hi = max(_minute(a[0]), _minute(b[0])), min(_minute(a[1]), _minute(b[1]))
    return (lo, hi) if lo <= hi else None


def _update_keeping_final(name: str) -> dict[str, str | Column]:
    """Every column from the source, except that a final row stays final (a replay restarts
    the watermark at zero; it must not reopen what an earlier generation closed)."""
    columns: dict[str, str | Column] = {c: f"s.{c}" for c in t.columns(name)}
    return {**columns, "is_final": "t.is_final OR s.is_final"}


def _after(column: str, ms: int) -> Column:
    return F.col(column) > F.timestamp_millis(F.lit(ms))


def hour_starts(span: tuple[int, int]) -> tuple[int, int]:
    """The first and last start (epoch ms) of the sliding hours holding a minute of ``span``:
    the windows containing minute m start in (m - 1 hour, m], on 5-minute boundaries."""
    first = (_minute(span[0]) - HOUR_MS) // SLIDE_MS * SLIDE_MS + SLIDE_MS
    return first, _minute(span[1]) // SLIDE_MS * SLIDE_MS


def sliding_hours(minutes: DataFrame, span: tuple[int, int]) -> DataFrame:
    """The sliding hours holding a minute of ``span``, summed from the 1-minute rows of
    ``minutes`` that lie in them (the hourly MERGE's recomputation)."""
    first, last = hour_starts(span)
    return campaign_ctr(minutes.where(time_between("window_start", first, last + HOUR_MS))).where(
        time_between("window_start", first, last + SLIDE_MS)
    )


def _minute(ms: int) -> int:
    return ms // MINUTE_MS * MINUTE_MS


def time_between(column: str, lo_ms: int, hi_ms: int) -> Column:
    """lo <= column < hi, in epoch milliseconds."""
    return (F.col(column) >= F.timestamp_millis(F.lit(lo_ms))) & (
        F.col(column) < F.timestamp_millis(F.lit(hi_ms))
    )
