"""The sliding-hour table brought up to date by a pass every few batches, by a run's first batch
and at its stop (``pipelines.hourly_pass``): which batch passes, and on real Delta tables that
a pass leaves what a pass in every batch would have left, after a crash between passes too."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.delta_writes import Tables, table_version
from pipelines.gold import campaign_ctr
from pipelines.gold_writes import GoldUpdate
from pipelines.high_water import NEVER, read_high_water
from pipelines.hourly_pass import HourlyPass, HourlyPasses
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
    assert passes.plan(12, 1_400, own=True) == HourlyPass(1_200, None)
    passes.done(12, 1_400, (2_000, 2_100), HourlyPass(1_200, None))
    # The stop passes when a batch since the last pass accepted events or moved the
    # watermark, as the last batch would have; not when the table is up to date.
    assert passes.at_stop() is None
    passes.done(13, 1_400, None, passes.plan(13, 1_400, own=True))
    assert passes.at_stop() is None
    passes.done(14, 1_500, None, passes.plan(14, 1_500, own=True))
    owed = passes.at_stop()
    assert owed == (14, 1_500, HourlyPass(1_400, None))
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
        plans.append(plan is not None)
        passes.done(b, w, (w + 1, w + 500), plan)
    assert plans == [True, True, True, False, False, True]


def test_every_batch_passes_when_every_is_one_and_a_run_without_batches_owes_nothing() -> None:
    passes = HourlyPasses(1, behind=None, final_ms=NEVER)
    assert passes.at_stop() is None
    for b in range(3):
        plan = passes.plan(b, 1_000 * (b + 1), own=True)
        assert plan == HourlyPass(1_000 * b if b else 0, None)
        passes.done(b, 1_000 * (b + 1), (5_000, 6_000), plan)
    assert passes.at_stop() is None


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
