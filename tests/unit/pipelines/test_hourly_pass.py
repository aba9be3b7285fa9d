"""The sliding-hour table brought up to date by a pass every few batches, by a run's first batch
and at its stop (``pipelines.hourly_pass``): which batch passes, and on real Delta tables that
a pass leaves what a pass in every batch would have left, after a crash between passes too."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import Tables, table_version
from pipelines.gold import campaign_ctr
from pipelines.gold_writes import GoldUpdate, _overlap
from pipelines.high_water import NEVER, read_high_water
from pipelines.hourly_pass import HourlyPass, HourlyPasses, hull, union
from pipelines.timing import StepTimer

T0 = datetime(2026, 11, 20, 10, 0)  # the session time zone is UTC
MINUTE_MS = 60_000
T0_MS = int((T0 - datetime(1970, 1, 1)).total_seconds() * 1000)


def test_a_run_passes_first_then_every_nth_batch_and_under_a_replays_watermarks() -> None:
    passes = HourlyPasses(3, behind=(100, 900), final_ms=600)
    # A run's first batch passes over what earlier runs may have left, every due hour.
    first = passes.plan(7, 1_000, own=True)
    assert first == HourlyPass(0, (100, 900))
    passes.done(7, 1_000, (1_500, 1_600), first)
    # Then only every third batch, over the accepted events of the batches since.
    assert passes.plan(8, 1_100, own=True) is None
    passes.done(8, 1_100, (1_700, 1_800), None)
    # Silver holds events later than the watermark the generation never saw: it passes.
    assert passes.plan(10, 1_200, own=False) == HourlyPass(1_000, (1_700, 1_800))
    passes.done(10, 1_200, None, HourlyPass(1_000, (1_700, 1_800)))
    passes.done(11, 1_300, None, passes.plan(11, 1_300, own=True))  # a batch of none
    # A batch that could have left its pass to a later one keeps what it computed, as the
    # batches between passes do, and writes it after its transaction; one that could not
    # (batch 10) recomputes.
    assert passes.plan(12, 1_400, own=True) == HourlyPass(1_200, None, kept=True)
    passes.done(12, 1_400, (2_000, 2_100), HourlyPass(1_200, None, kept=True))
    # The stop passes when a batch since the last pass accepted events or moved the
    # watermark, as the last batch would have; not when the table is up to date.
    assert passes.at_stop() is None
    passes.done(13, 1_400, None, passes.plan(13, 1_400, own=True))
    assert passes.at_stop() is None
    passes.done(14, 1_500, None, passes.plan(14, 1_500, own=True))
    owed = passes.at_stop()
    assert owed == (14, 1_500, HourlyPass(1_400, None, kept=True))
    passes.done(*owed[:2], None, owed[2])
    assert passes.at_stop() is None


def test_a_batch_under_an_hour_made_final_before_the_run_passes_itself() -> None:
    """A replay's watermark starts below the hours an earlier generation made final: its
    events may change their minutes, so every batch passes until its watermark reaches the
    latest final end the run started with (then a crash between passes can leave behind only
    hours the next run's first pass looks at)."""
    passes = HourlyPasses(5, behind=None, final_ms=10_000)
    plans = []
    for b, w in enumerate((0, 4_000, 9_999, 10_000, 12_000, 15_000)):
        plan = passes.plan(b, w, own=True)
        plans.append(None if plan is None else plan.kept)
        passes.done(b, w, (w + 1, w + 500), plan)
    # (Those under the final end recompute: only batch 5 could have left its pass to a later
    # batch, and keeps.)
    assert plans == [False, False, False, None, None, True]
    # A run's first pass writes rows final up to the latest watermark a batch of any
    # generation was planned under (the topic may carry them final, the table not yet): the batches
    # pass until their watermark reaches that too, whether or not attributions are behind.
    for conversions in ((0, 1), None):
        passes = HourlyPasses(
            5, behind=None, final_ms=10_000, conversions=conversions, settled_ms=12_000
        )
        assert passes.plan(0, 0, own=True) == HourlyPass(0, None, conversions, 12_000)
        passes.done(0, 0, None, HourlyPass(0, None, conversions, 12_000))
        assert passes.plan(1, 11_000, own=True) is not None
        assert passes.plan(2, 12_000, own=True) is None


def test_every_batch_passes_when_every_is_one_and_a_run_without_batches_owes_nothing() -> None:
    passes = HourlyPasses(1, behind=None, final_ms=NEVER)
    assert passes.at_stop() is None
    for b in range(3):
        plan = passes.plan(b, 1_000 * (b + 1), own=True)
        assert plan == HourlyPass(1_000 * b if b else 0, None)
        passes.done(b, 1_000 * (b + 1), (5_000, 6_000), plan)
    assert passes.at_stop() is None


def test_spans_join_whole_and_overlap_by_the_minutes_both_touch() -> None:
    m = 60_000
    assert union(None, None) is None and union(None, (1, 2)) == (1, 2) == union((1, 2), None)
    assert hull((5, 9), None) == (5, 9) and hull((5, 9), (1, 7)) == (1, 9) == hull((1, 7), (5, 9))
    # The minutes (their starts) of both: a span's end inside a minute touches that minute.
    assert _overlap((m + 5, 3 * m + 1), (3 * m + 59_999, 9 * m)) == (3 * m, 3 * m)
    assert _overlap((0, 9 * m), (2 * m + 1, 4 * m)) == (2 * m, 4 * m)
    assert _overlap((m, 2 * m - 1), (2 * m, 3 * m)) is None
    assert _overlap(None, (0, m)) is None and _overlap((0, m), None) is None


def test_passes_every_few_batches_leave_the_hours_a_pass_in_every_batch_leaves(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Batches write 1-minute rows (set, as the 1-minute MERGE does) for minutes after their
    watermark; hourly passes every second batch. After each pass the hourly table equals the
    hours summed from the 1-minute table, final where the watermark passed their end; between
    passes it does not change. A run that ends between passes without its stop (a crash)
    leaves the rest to the next run's first batch, which finds it from the tables alone."""
    wh = str(tmp_path)
    t.create_tables(spark, wh)
    tables = Tables(spark, wh, "app-h", 4)
    minutes = tables.path(t.GOLD_1M)
    rng = random.Random(11)
    held: dict[tuple[int, str], tuple[int, int]] = {}  # (minute, ad) -> impressions, clicks

    def watermark(b: int) -> int:
        return T0_MS + 7 * b * MINUTE_MS

    def write_minutes(b: int) -> tuple[int, int]:
        """Batch b's 1-minute rows: events in the 15 minutes after its watermark."""
        touched = {
            (watermark(b) // MINUTE_MS * MINUTE_MS + m * MINUTE_MS, f"ad-{rng.randrange(6)}")
            for m in rng.sample(range(1, 16), 5)
        }
        for key in touched:
            i, c = held.get(key, (0, 0))
            held[key] = (i + rng.randrange(1, 4), c + rng.randrange(0, 2))
        source = spark.createDataFrame(
            [
                (
                    datetime(1970, 1, 1) + timedelta(milliseconds=m),
                    datetime(1970, 1, 1) + timedelta(milliseconds=m + MINUTE_MS),
                    ad,
                    f"cmp-{int(ad[-1]) % 2}",
                    "adv",
                    *held[(m, ad)],
                    Decimal(1),
                    0,
                    Decimal(0),
                    False,
                    4,
                    b,
                )
                for m, ad in sorted(touched)
            ],
            t.schema(t.GOLD_1M),
        )
        from delta.tables import DeltaTable

        (
            DeltaTable.forPath(spark, minutes)
            .alias("t")
            .merge(source.alias("s"), "t.window_start = s.window_start AND t.ad_id = s.ad_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        lo = min(m for m, _ in touched)
        return lo, max(m for m, _ in touched) + MINUTE_MS - 1

    def hourly_table() -> list[tuple[object, ...]]:
        return sorted(
            tuple(r)
            for r in tables.load(t.CTR_1H)
            .select("window_start", "campaign_id", "impressions", "clicks", "ctr", "is_final")
            .collect()
        )

    def wanted(w: int) -> list[tuple[object, ...]]:
        hours = campaign_ctr(tables.load(t.GOLD_1M)).withColumn(
            "is_final", F.col("window_end") <= F.timestamp_millis(F.lit(w))
        )
        return sorted(
            tuple(r)
            for r in hours.select(
                "window_start", "campaign_id", "impressions", "clicks", "ctr", "is_final"
            ).collect()
        )

    def batch(passes: HourlyPasses, b: int) -> HourlyPass | None:
        span = write_minutes(b)
        plan = passes.plan(b, watermark(b), own=True)
        GoldUpdate(
            tables,
            StepTimer(),
            b,
            w_prev=watermark(b - 1),
            watermark_ms=watermark(b),
            counts={},
            lookback_seconds=600,
            hourly=plan,
        ).pass_hours(span)
        passes.done(b, watermark(b), span, plan)
        return plan

    run = HourlyPasses(2, behind=None, final_ms=NEVER)
    passed = []
    for b in range(1, 6):
        before = table_version(spark, tables.path(t.CTR_1H))
        if batch(run, b) is None:
            assert table_version(spark, tables.path(t.CTR_1H)) == before, f"batch {b} wrote"
        else:
            passed.append(b)
            assert hourly_table() == wanted(watermark(b)), f"after batch {b}'s pass"
    assert passed == [1, 2, 4]
    # Batch 5 wrote minutes and its pass was left to batch 6; the run ends without its stop.
    assert hourly_table() != wanted(watermark(5))
    # What the next run reads at its start: the latest end of a final hour, and the 1-minute
    # rows from there on (not all of them: the hours before are final and stay so).
    marks = read_high_water(spark, wh, "app-h", 4)
    final = [r for r in hourly_table() if r[-1]]
    end_ms = max(T0_MS + int((r[0] - T0).total_seconds() * 1000) for r in final) + 60 * MINUTE_MS
    assert marks.hours_final_ms == end_ms and end_ms <= watermark(4)
    after = [m for m, _ in held if m >= end_ms]
    assert marks.hours_behind == (min(after), max(after)) and min(held)[0] < end_ms
    rerun = HourlyPasses(2, behind=marks.hours_behind, final_ms=marks.hours_final_ms)
    batch(rerun, 7)
    assert hourly_table() == wanted(watermark(7)), "the next run's first batch caught up"
    # A run that stops between passes: its stop passes as its last batch would have.
    assert batch(rerun, 9) is None
    owed = rerun.at_stop()
    assert owed is not None and owed[:2] == (9, watermark(9))
    GoldUpdate(
        tables,
        StepTimer(),
        9,
        w_prev=owed[2].since_ms,
        watermark_ms=watermark(9),
        counts={},
        lookback_seconds=600,
        hourly=owed[2],
    ).pass_hours(None)
    assert hourly_table() == wanted(watermark(9))
    assert any(r[-1] for r in hourly_table()) and not all(r[-1] for r in hourly_table())


# The batches of the 1-minute test below: (minute after T0 of the watermark, events), an event
# being (id, type, minute after T0, user, ad); no event: a batch of none. Re-attributions (a click
# after the click a pending conversion went to, before the conversion): batch 2's moves v3 from
# a1 to a2 and empties (5, a1), which only the topic holds (batch 1 left the table to a pass);
# batch 4's moves v7 and empties (9, a1), which the table holds, in a minute its own events do
# not touch; batch 6, a pass, moves v5 and empties (7, a1), which only the topic holds. Batches of
# none between passes: 5 finalises minute 3 as the last pass left it (read from the table); 8
# finalises minutes 7 and 8, which batch 7 changed since the last pass (both recomputed).
_BATCHES: list[tuple[float, list[tuple[str, str, float, str, str]]]] = [
    (0.0, [("i1", "impression", 1.2, "u1", "a1"), ("k1", "click", 1.5, "u1", "a1")]),
    (
        1.0,
        [
            ("i2", "impression", 2.1, "u2", "a2"),
            ("v1", "conversion", 3.0, "u1", ""),
            ("k3", "click", 4.8, "u3", "a1"),
            ("v3", "conversion", 5.5, "u3", ""),
        ],
    ),
    (2.0, [("k4", "click", 5.2, "u3", "a2")]),
    (
        2.5,
        [
            ("i4", "impression", 3.4, "u2", "a2"),
            ("k2", "click", 3.5, "u2", "a2"),
            ("k8", "click", 8.0, "u5", "a1"),
            ("v7", "conversion", 9.5, "u5", ""),
        ],
    ),
    (
        3.6,
        [
            ("k7", "click", 8.05, "u5", "a2"),
            ("k5", "click", 6.9, "u4", "a1"),
            ("v5", "conversion", 7.3, "u4", ""),
        ],
    ),
    (4.5, []),
    (7.0, [("k6", "click", 7.1, "u4", "a2")]),
    (
        7.2,
        [
            ("i9", "impression", 7.5, "u2", "a2"),
            ("i6", "impression", 8.1, "u2", "a2"),
            ("v2", "conversion", 8.2, "u2", ""),
        ],
    ),
    (9.0, []),
    (9.0, [("i7", "impression", 9.5, "u1", "a1")]),
    (9.2, [("i8", "impression", 10.1, "u1", "a1")]),
    (11.0, [("i10", "impression", 11.5, "u1", "a1")]),
    (11.1, [("i11", "impression", 11.6, "u1", "a1")]),
    (11.2, [("k9", "click", 11.9, "u9", "a1"), ("v9", "conversion", 12.5, "u9", "")]),
    (11.4, [("k10", "click", 12.2, "u9", "a2")]),
    (11.5, [("i12", "impression", 12.7, "u1", "a1")]),
    (11.6, [("i13", "impression", 12.8, "u1", "a1")]),
    (13.0, []),
]


def test_batches_between_passes_publish_the_windows_a_merge_in_every_batch_publishes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two warehouses fed the same batches: one MERGEs the 1-minute table in every batch (a
    pass every batch), the other every third; its other batches publish the windows they
    computed and leave the table alone. After every batch a consumer of either topic holds the
    same windows and attributions, and after both stop the two tables are equal. Windows
    emptied by re-attributions (``_BATCHES``) are published as zero by both and reach both
    tables. Batch 2 dies after its attributions MERGE (the conversion's old ad gone from the
    table) and its minutes are made by a new generation's first batch, which still zeroes the
    window (from the file the dead one kept); after batch
    8 the run dies between passes, and the next run's first batch catches the table up from
    the tables alone. Batch 11, a data batch between passes, finalises a minute batch 10
    changed and the table lacks (not one of its own events'): it recomputes it. The
    attributions too are written by the passes alone (a batch between them commits nothing to
    that table) and equal after every pass; after batch 13 the run dies with an attribution
    only the topic holds, which the next run's first batch re-attributes (batch 14). After
    batch 17, between passes, publishes windows final that the table holds open, the run dies
    and a replay (its watermark from 0) reads batches 16 and 15 again: no window the topic
    carried final is published open again (batches 18 and 19)."""
    from pipelines.left_windows import LeftWindows
    from pipelines.published_rows import changed_records
    from pipelines.transforms import ACCEPTED
    from schemas.ad_metrics import PUBLISHED

    def at(minutes: float) -> datetime:
        return T0 + timedelta(minutes=minutes)

    def ms(minutes: float) -> int:
        return T0_MS + round(minutes * MINUTE_MS)

    class Arm:
        def __init__(self, name: str, every: int) -> None:
            self.wh = str(tmp_path / name)
            t.create_tables(spark, self.wh)
            self.tables = Tables(spark, self.wh, f"app-{name}", 1)
            self.every = every
            self.passes = HourlyPasses(every, behind=None, final_ms=NEVER)
            self.checkpoints = tmp_path / f"checkpoints-{name}"
            self.left = LeftWindows(self.checkpoints / "gen-0001")
            self.view: dict[str, tuple[int, dict[str, object]]] = {}
            self.passed: list[int] = []
            self.kept: list[int] = []  # the batches that passed by keeping (``pass_kept``)
            self.sessions = (spark.newSession(), spark.newSession())

        def restart(self, generation: int | None = None, settled: float | None = None) -> None:
            """A new run after a crash, of a new checkpoint ``generation`` if given (a replay
            instead of a restart): its marks read from the tables, and ``settled`` the latest
            watermark a batch of any generation was planned under (the offset logs')."""
            if generation is not None:
                self.left = LeftWindows(self.checkpoints / f"gen-{generation:04d}")
            marks = read_high_water(spark, self.wh, self.tables.app_id, 1)
            self.passes = HourlyPasses(
                self.every,
                behind=union(marks.minutes_behind, marks.hours_behind),
                final_ms=max(
                    marks.minutes_final_ms, marks.hours_final_ms, marks.attributions_final_ms
                ),
                conversions=marks.conversions_behind,
                settled_ms=NEVER if settled is None else ms(settled),
            )

        def batch(
            self,
            b: int,
            *,
            written: bool = True,
            replay: tuple[float, float, int] | None = None,
        ) -> None:
            """Batch ``b`` of ``_BATCHES``; or, with ``replay`` (previous watermark, watermark,
            the batch of ``_BATCHES`` whose events it reads again), a replay's batch ``b``."""
            if replay is None:
                w_prev = ms(_BATCHES[b - 1][0]) if b else 0
                w, events = _BATCHES[b]
            else:
                w_prev, w, events = ms(replay[0]), replay[1], _BATCHES[replay[2]][1]
            self.tables.versions = {}
            rows = None
            span = None
            if events:
                silver = self.tables.stamped(
                    spark.createDataFrame(
                        [
                            tuple(
                                {
                                    "event_id": i,
                                    "event_type": kind,
                                    "event_time": at(m),
                                    "user_id": u,
                                    "ad_id": ad or None,
                                    "campaign_id": "c1" if ad else None,
                                    "advertiser_id": "v1",
                                    "cost": Decimal("0.5") if kind == "impression" else None,
                                    "revenue": Decimal(2) if kind == "conversion" else None,
                                    "kafka_topic": "ad-events",
                                    "kafka_partition": 0,
                                    "kafka_offset": 100 * b + n,
                                }.get(c)
                                for c in t.schema(t.SILVER).names
                            )
                            for n, (i, kind, m, u, ad) in enumerate(events)
                        ],
                        t.schema(t.SILVER),
                    ),
                    b,
                )
                if written:  # (a re-execution finds its records written already)
                    silver.write.format("delta").mode("append").save(self.tables.path(t.SILVER))
                rows = silver.withColumn("outcome", F.lit(ACCEPTED))
                times = [ms(m) for _, _, m, _, _ in events]
                span = (min(times), max(times))
            first = not self.passes.passed
            plan = self.passes.plan(b, ms(w), own=True)
            update = GoldUpdate(
                self.tables,
                StepTimer(),
                b,
                w_prev=w_prev,
                watermark_ms=ms(w),
                counts={},
                lookback_seconds=600,
                sessions=self.sessions,
                hourly=plan,
                unpassed=self.passes.pending if plan is None or plan.kept else None,
                left_windows=self.left,
                earlier_left=self.left.everywhere() if first else None,
                pending=self.passes.attributions,
                minutes=self.passes.minutes,
            )
            before = table_version(spark, self.tables.path(t.GOLD_1M))
            attributions_before = table_version(spark, self.tables.path(t.ATTRIBUTIONS))
            if span is not None or update.due:
                update.run(rows, span)
            if plan is not None and not plan.kept:
                self.passed.append(b)
                if span is not None:
                    update.pass_hours(span)
            elif plan is None:  # but for a window a re-attribution emptied that the table holds (4)
                changed = table_version(spark, self.tables.path(t.GOLD_1M)) != before
                assert changed == (b == 4), b
                # The attributions it set are kept for the pass, not written.
                now = table_version(spark, self.tables.path(t.ATTRIBUTIONS))
                assert now == attributions_before, b
            given = update.records
            names = tuple(n for n in PUBLISHED if n not in given)
            records = [
                *(r for rs in given.values() for r in rs),
                *(changed_records(self.tables, b, names).collect() if names else []),
            ]
            self.consume(records)
            if plan is not None and plan.kept:  # after the transaction, as the sink does
                self.passed.append(b)
                self.kept.append(b)
                update.pass_kept()
            self.passes.done(b, ms(w), update.changed_minutes, plan, update.pending, update.minutes)
            # as the sink does (which, running a keeping pass beside the next batch, forgets
            # the windows it covers once it has landed: here it has)
            self.left.forget_before(min(b, self.passes.since_batch))

        def consume(self, records: list[Row]) -> None:
            for r in records:
                value = json.loads(r.v)
                if r.k not in self.view or self.view[r.k][0] <= value["batch_id"]:
                    self.view[r.k] = (value["batch_id"], value["row"])

        def stop(self) -> None:
            owed = self.passes.at_stop()
            if owed is None:
                return
            b, w, plan = owed
            GoldUpdate(
                self.tables,
                StepTimer(),
                b,
                w_prev=plan.since_ms,
                watermark_ms=w,
                counts={},
                lookback_seconds=600,
                hourly=plan,
                pending=self.passes.attributions,
                minutes=self.passes.minutes,
            ).pass_stop()
            self.passes.done(b, w, None, plan)
            self.passed.append(-1)

        def seen(self) -> dict[str, dict[str, object]]:
            return {k: row for k, (_, row) in self.view.items()}

        def table(self, name: str = t.GOLD_1M) -> list[tuple[object, ...]]:
            columns = [c for c in t.columns(name) if c not in ("generation", "batch_id")]
            return sorted(tuple(r) for r in self.tables.load(name).select(columns).collect())

        def gold(self) -> tuple[list[tuple[object, ...]], ...]:
            return self.table(), self.table(t.ATTRIBUTIONS)

    def window(arm: Arm, minute: int, ad: str) -> list[tuple[object, ...]]:
        held = arm.tables.load(t.GOLD_1M).where(
            (F.col("ad_id") == ad) & (F.col("window_start") == at(minute))
        )
        return [(r.conversions, r.revenue) for r in held.collect()]

    def key(minute: int, ad: str) -> str:
        return f"{t.GOLD_1M}|{at(minute).strftime('%Y-%m-%dT%H:%M:%S.000Z')}|{ad}"

    every, passes = Arm("every", 1), Arm("passes", 3)
    for b in range(9):
        every.batch(b)
        if b == 2:  # dies after its attributions MERGE, before the windows are published
            with monkeypatch.context() as m:

                def dies(*_: object, **__: object) -> list[Row]:
                    raise RuntimeError("killed")

                m.setattr(GoldUpdate, "_publish_minutes", dies)
                with pytest.raises(RuntimeError, match="killed"):
                    passes.batch(b)
            # Not re-executed: the next run is a new generation's, whose first batch passes.
            passes.restart(generation=2)
            passes.batch(b, written=False)
        else:
            passes.batch(b)
        assert passes.seen() == every.seen(), f"after batch {b}"
        if passes.passed[-1] == b:  # a pass leaves the table a MERGE in every batch leaves
            assert passes.gold() == every.gold(), f"after batch {b}"
    # The first batch, the re-executed one (a run's first) and every third passed; the others
    # left the table to them, batches of none too (5 finalised a window).
    assert passes.passed == [0, 2, 3, 6] and every.passed == list(range(9))
    for minute in (5, 7, 9):
        assert every.seen()[key(minute, "a1")]["conversions"] == 0, minute
        assert window(every, minute, "a1") == window(passes, minute, "a1") == [(0, 0)], minute
    assert any(r["is_final"] for r in passes.seen().values())
    assert passes.table() != every.table(), "batches 7 and 8 left the table to a pass"
    assert passes.table(t.ATTRIBUTIONS) != every.table(t.ATTRIBUTIONS), "and batch 7's v2"
    # A crash now: the next run's first batch finds what was left from the tables alone.
    passes.restart()
    assert passes.passes.final_ms == ms(7.0)
    every.batch(9)
    passes.batch(9)
    assert passes.seen() == every.seen() and passes.gold() == every.gold()
    # Batches left to a pass, then the stop, which makes them.
    every.batch(10)
    passes.batch(10)
    assert passes.seen() == every.seen() and passes.table() != every.table()
    # A data batch between passes whose watermark passes minute 10, which batch 10 changed
    # (not one of its own events' minutes): it recomputes that window, the table lacking it.
    every.batch(11)
    passes.batch(11)
    assert passes.seen() == every.seen()
    assert passes.seen()[key(10, "a1")]["is_final"]
    # Batch 13, between passes, attributes v9 to a1, all that window (12, a1) counts, and the
    # run dies. The next run's first batch re-attributes v9 from silver, where batch 14's click
    # k10 now precedes it, to a2: only the window file batch 13 kept says that the topic
    # counted v9 on a1 (the table never did), and the window is published as zero.
    # Batch 12 passes by keeping, and dies after its transaction, its attributions written,
    # its windows not: re-executed as its next run's first batch, it passes by recomputing
    # (its attributions MERGE skipped by Delta's txn ids: the dead one's stands).
    every.batch(12)
    with monkeypatch.context() as m:

        def killed(*_: object, **__: object) -> None:
            raise RuntimeError("killed")

        m.setattr(GoldUpdate, "_write_kept_minutes", killed)
        with pytest.raises(RuntimeError, match="killed"):
            passes.batch(12)
    assert passes.seen() == every.seen(), "the dead batch's transaction"
    assert passes.table(t.ATTRIBUTIONS) == every.table(t.ATTRIBUTIONS)
    assert passes.table() != every.table()
    passes.restart()
    passes.batch(12, written=False)
    assert passes.seen() == every.seen() and passes.gold() == every.gold()
    every.batch(13)
    passes.batch(13)
    assert passes.seen() == every.seen(), "after batch 13"
    assert passes.seen()[key(12, "a1")]["conversions"] == 1
    passes.restart()
    every.batch(14)
    passes.batch(14)
    assert passes.seen() == every.seen() and passes.gold() == every.gold()
    assert passes.seen()[key(12, "a1")]["conversions"] == 0
    for b in (15, 16):
        every.batch(b)
        passes.batch(b)
    # Batch 17, between passes, of none, finalises the windows of minutes 11 and 12: the topic
    # carries them final, the table of the passes does not yet. The run dies, and a replay (a
    # new generation: its watermark starts at 0) reads batch 16's events again. Its first pass
    # writes final every row at or before the latest watermark a batch was planned under
    # (13.0), as a MERGE in every batch kept them final: a window the topic carried final is
    # never published open again.
    every.batch(17)
    passes.batch(17)
    assert passes.seen() == every.seen()
    closed = {k for k, row in passes.seen().items() if row["is_final"]}
    assert {key(11, "a1"), key(12, "a1")} <= closed
    # (The replay keeps the app id, the stamp's generation and the batch ids running, so the
    # consumer's newest-batch rule holds across it; its watermark is what starts again.) The
    # reference's table holds those windows final: its replay needs no floor.
    every.restart(generation=3)
    passes.restart(generation=3, settled=13.0)
    assert passes.passes.final_ms == ms(13.0)

    def unstamped(view: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
        """A consumer's view without the stamps: a replay republishes rows with its own."""
        return {
            k: {c: v for c, v in row.items() if c not in ("generation", "batch_id")}
            for k, row in view.items()
        }

    # Batch 19 reads minute 12's i12 again under 12.5: between passes it would publish
    # window (12, a1) open; it passes, as its watermark is behind 13.0.
    for b, replay in ((18, (0.0, 0.0, 16)), (19, (0.0, 12.5, 15))):
        every.batch(b, written=False, replay=replay)
        passes.batch(b, written=False, replay=replay)
        reopened = {k for k in closed if not passes.seen()[k]["is_final"]}
        assert not reopened, f"batch {b} published final windows open again: {reopened}"
        assert unstamped(passes.seen()) == unstamped(every.seen()), f"after batch {b}"
        # A run's first batch passes (18); then every batch until its watermark reaches 13.0.
        assert passes.passed[-1] == b, f"batch {b} left its pass under 13.0"
        assert passes.gold() == every.gold(), f"after batch {b}"
    every.stop()
    passes.stop()
    assert passes.passed[-7:] == [9, 12, 12, 14, 15, 18, 19], passes.passed
    assert passes.kept == [3, 6, 12, 15] and every.kept == []
    assert passes.gold() == every.gold()
    published = {k for k in passes.seen() if k.startswith(t.GOLD_1M)}
    assert len(published) == len(passes.table())
