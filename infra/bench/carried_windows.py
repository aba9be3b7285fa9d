"""What a batch's changed gold values cost when the open windows are carried in the JVM instead
of recomputed from Delta and MERGEd (issue 13's next design, measured before it is built): the
1-minute windows and the 5-minute slides of the sliding hours that the watermark has not closed
yet, kept as cached frames from batch to batch; a batch of BATCH new events (bench-like: 1%
conversions, attributed from carried latest clicks) folds into them and pulls its changed
minutes and hours to the driver, which is what a batch would publish. No Delta, no Kafka: the
job's Spark session and settings, synthetic rows, ROUNDS batches after WARM warm-ups; prints each
step's median and range and the carried state's size, then checks the carried frames against the
same windows recomputed from every event at once. ``--lean`` folds each frame by one aggregation
over a union; ``--one-pull`` pulls the changed minutes and hours by one job (README, "The open
windows carried in the JVM").

    .venv/bin/python infra/bench/carried_windows.py --batch 1000 --rounds 20

Run it alone (nothing else on the machine): its figures are seconds of a 2-core machine's CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from app.runtime.settings import Settings
from app.runtime.spark import build_spark
from pipelines import tables as t
from pipelines.gold import ATTRIBUTED, CTR_SLIDE, WINDOW, attribute, window_metrics
from pipelines.gold_writes import HOUR_MS, MINUTE_MS
from pipelines.timing import StepTimer

WATERMARK_MS = 10 * MINUTE_MS
MINUTE_VALUES = ("impressions", "clicks", "spend", "conversions", "revenue")


def _events(spark: SparkSession, n: int, first: int, step_ms: int, args: Any) -> DataFrame:
    """``n`` silver-shaped events from event number ``first`` on, ``step_ms`` apart: 1% are
    conversions, 10% clicks, the rest impressions, over ``args.users`` users and ``args.ads``
    ads (10 per campaign, 10 campaigns per advertiser)."""
    i = F.col("id") + F.lit(first)
    kind = (
        F.when(F.pmod(i, F.lit(100)) == 99, "conversion")
        .when(F.pmod(i, F.lit(10)) == 3, "click")
        .otherwise("impression")
    )
    ad = F.pmod(F.hash(i, F.lit(7)), F.lit(args.ads))
    user = F.pmod(F.hash(i, F.lit(11)), F.lit(args.users))
    return spark.range(n).select(
        F.concat(F.lit("e-"), i.cast("string")).alias("event_id"),
        kind.alias("event_type"),
        F.timestamp_millis(F.lit(args.base) + i * step_ms).alias("event_time"),
        F.concat(F.lit("u-"), user.cast("string")).alias("user_id"),
        F.concat(F.lit("ad-"), ad.cast("string")).alias("ad_id"),
        F.concat(F.lit("cmp-"), (ad / 10).cast("long").cast("string")).alias("campaign_id"),
        F.concat(F.lit("adv-"), (ad / 100).cast("long").cast("string")).alias("advertiser_id"),
        F.when(kind == "impression", F.lit(0.002))
        .when(kind == "click", F.lit(0.25))
        .otherwise(F.lit(0))
        .cast("decimal(18,9)")
        .alias("cost"),
        F.when(kind == "conversion", F.lit(12.5)).cast("decimal(18,6)").alias("revenue"),
    )


class Carried:
    """The open 1-minute windows (``minutes``) and the 5-minute slides of the open sliding hours
    (``slides``), each a cached frame cut from its lineage every batch."""

    def __init__(self, spark: SparkSession, *, one_pull: bool = False) -> None:
        self.one_pull = one_pull
        # gold_ad_metrics_1m's columns, less those the sink stamps on a written row.
        stamped = {"is_final", "generation", "batch_id"}
        self.minutes = spark.createDataFrame(
            [], StructType([f for f in t.schema(t.GOLD_1M).fields if f.name not in stamped])
        )
        self.slides = spark.createDataFrame(
            [], "slide_start timestamp, campaign_id string, impressions long, clicks long"
        )

    def _keep(self, minutes: DataFrame, slides: DataFrame, watermark_ms: int) -> None:
        """The folded frames become the carried ones, less what the watermark closed (a gold
        pass writes that final)."""
        wm = F.timestamp_millis(F.lit(watermark_ms))
        old_minutes, old_slides = self.minutes, self.slides
        self.minutes = minutes.drop("_changed").where(F.col("window_end") > wm)
        self.slides = slides.where(
            F.col("slide_start") + F.expr("INTERVAL 5 MINUTES") > wm - F.expr("INTERVAL 1 HOUR")
        )
        for frame in (old_minutes, old_slides):
            frame.unpersist()

    def fold(
        self,
        events: DataFrame,
        clicks: DataFrame,
        watermark_ms: int,
        lookback_s: int,
        timer: StepTimer,
    ) -> tuple[list[Any], list[Any]]:
        """Folds one batch's events in; returns the changed minutes and hours (driver rows)."""
        attributed = _attributed(events, clicks, lookback_s)
        delta = window_metrics(events, attributed).persist(StorageLevel.MEMORY_AND_DISK)
        if not self.one_pull:
            delta.count()
            timer.mark("batch's window deltas (attribution included)")
        keys = ["window_start", "ad_id"]
        old = self.minutes.alias("o")
        summed = (
            old.join(delta.alias("d"), keys, "full")
            .select(
                *keys,
                F.coalesce("o.window_end", "d.window_end").alias("window_end"),
                F.coalesce("o.campaign_id", "d.campaign_id").alias("campaign_id"),
                F.coalesce("o.advertiser_id", "d.advertiser_id").alias("advertiser_id"),
                *(
                    (F.coalesce(f"o.{c}", F.lit(0)) + F.coalesce(f"d.{c}", F.lit(0)))
                    .cast(self.minutes.schema[c].dataType)
                    .alias(c)
                    for c in MINUTE_VALUES
                ),
                F.col("d.ad_id").isNotNull().alias("_changed"),
            )
            .select(*self.minutes.columns, "_changed")
        )
        new_minutes = summed.localCheckpoint(eager=True)
        changed = new_minutes.where("_changed").drop("_changed")
        changed_minutes = [] if self.one_pull else changed.collect()
        timer.mark("minutes folded" + ("" if self.one_pull else ", changed ones pulled"))
        slide = F.window("window_start", CTR_SLIDE).start
        slide_delta = (
            delta.where((F.col("impressions") > 0) | (F.col("clicks") > 0))
            .groupBy(slide.alias("slide_start"), "campaign_id")
            .agg(F.sum("impressions").alias("impressions"), F.sum("clicks").alias("clicks"))
        )
        o, d = self.slides.alias("o"), slide_delta.alias("d")
        new_slides = (
            o.join(d, ["slide_start", "campaign_id"], "full")
            .select(
                "slide_start",
                "campaign_id",
                (F.coalesce("o.impressions", F.lit(0)) + F.coalesce("d.impressions", F.lit(0)))
                .cast("long")
                .alias("impressions"),
                (F.coalesce("o.clicks", F.lit(0)) + F.coalesce("d.clicks", F.lit(0)))
                .cast("long")
                .alias("clicks"),
            )
            .localCheckpoint(eager=True)
        )
        # The hours holding a changed slide, each summed over its 12 slides.
        touched = slide_delta.select("slide_start", "campaign_id")
        hours_of = _hour_starts()
        hours = (
            touched.select(hours_of.alias("window_start"), "campaign_id")
            .distinct()
            .join(new_slides.alias("s"), "campaign_id")
            .where(
                (F.col("s.slide_start") >= F.col("window_start"))
                & (F.col("s.slide_start") < F.col("window_start") + F.expr("INTERVAL 1 HOUR"))
            )
            .groupBy("window_start", "campaign_id")
            .agg(F.sum("s.impressions").alias("impressions"), F.sum("s.clicks").alias("clicks"))
        )
        if self.one_pull:  # both as the (key, value) strings a batch publishes, in one job
            timer.mark("slides folded")
            pulled = (
                _as_record(changed, "window_start", "ad_id")
                .unionByName(_as_record(hours, "window_start", "campaign_id"))
                .collect()
            )
            changed_minutes = [r for r in pulled if r.table == "minute"]
            changed_hours = [r for r in pulled if r.table == "hour"]
            timer.mark("changed minutes and hours pulled, one job")
        else:
            changed_hours = hours.collect()
            timer.mark("slides folded, changed hours pulled")
        self._keep(new_minutes, new_slides, watermark_ms)
        delta.unpersist()
        return changed_minutes, changed_hours


class LeanCarried(Carried):
    """The same frames, each batch folded by one aggregation over a union (the carried rows and
    the batch's contributions) instead of two aggregates and a full join per frame."""

    def fold(
        self,
        events: DataFrame,
        clicks: DataFrame,
        watermark_ms: int,
        lookback_s: int,
        timer: StepTimer,
    ) -> tuple[list[Any], list[Any]]:
        attributed = _attributed(events, clicks, lookback_s, broadcast=True)
        zero, dec9, dec6 = F.lit(0).cast("long"), "decimal(24,9)", "decimal(24,6)"
        minute = F.window("event_time", WINDOW)
        ad_events = events.where(F.col("event_type").isin("impression", "click")).select(
            minute.start.alias("window_start"),
            minute.end.alias("window_end"),
            "ad_id",
            "campaign_id",
            "advertiser_id",
            (F.col("event_type") == "impression").cast("long").alias("impressions"),
            (F.col("event_type") == "click").cast("long").alias("clicks"),
            F.col("cost").cast(dec9).alias("spend"),
            zero.alias("conversions"),
            F.lit(0).cast(dec6).alias("revenue"),
        )
        conv_minute = F.window("conversion_time", WINDOW)
        converted = attributed.select(
            conv_minute.start.alias("window_start"),
            conv_minute.end.alias("window_end"),
            "ad_id",
            "campaign_id",
            "advertiser_id",
            zero.alias("impressions"),
            zero.alias("clicks"),
            F.lit(0).cast(dec9).alias("spend"),
            F.lit(1).cast("long").alias("conversions"),
            F.col("revenue").cast(dec6).alias("revenue"),
        )
        contributions = ad_events.unionByName(converted).withColumn("_changed", F.lit(True))
        carried = self.minutes.withColumn("_changed", F.lit(False))
        new_minutes = (
            carried.unionByName(contributions)
            .groupBy("window_start", "ad_id")
            .agg(
                F.max("window_end").alias("window_end"),
                # the ad's own campaign and advertiser (an event's, else its conversion's)
                F.max("campaign_id").alias("campaign_id"),
                F.max("advertiser_id").alias("advertiser_id"),
                *(F.sum(c).cast(self.minutes.schema[c].dataType).alias(c) for c in MINUTE_VALUES),
                F.max("_changed").alias("_changed"),
            )
            .select(*self.minutes.columns, "_changed")
            .localCheckpoint(eager=True)
        )
        timer.mark("minutes folded")
        slide_rows = ad_events.select(
            F.window("window_start", CTR_SLIDE).start.alias("slide_start"),
            "campaign_id",
            "impressions",
            "clicks",
        )
        new_slides = (
            self.slides.unionByName(slide_rows)
            .groupBy("slide_start", "campaign_id")
            .agg(
                F.sum("impressions").cast("long").alias("impressions"),
                F.sum("clicks").cast("long").alias("clicks"),
            )
            .localCheckpoint(eager=True)
        )
        timer.mark("slides folded")
        hour_starts = _hour_starts()
        touched_hours = slide_rows.select(
            hour_starts.alias("window_start"), "campaign_id"
        ).distinct()
        hours = (
            new_slides.join(
                F.broadcast(touched_hours.select("campaign_id").distinct()),
                "campaign_id",
                "left_semi",
            )
            .select(hour_starts.alias("window_start"), "campaign_id", "impressions", "clicks")
            .join(F.broadcast(touched_hours), ["window_start", "campaign_id"], "left_semi")
            .groupBy("window_start", "campaign_id")
            .agg(F.sum("impressions").alias("impressions"), F.sum("clicks").alias("clicks"))
        )
        changed = new_minutes.where("_changed").drop("_changed")
        pulled = (
            _as_record(changed, "window_start", "ad_id")
            .unionByName(_as_record(hours, "window_start", "campaign_id"))
            .collect()
        )
        timer.mark("changed minutes and hours pulled, one job")
        self._keep(new_minutes, new_slides, watermark_ms)
        return (
            [r for r in pulled if r.table == "minute"],
            [r for r in pulled if r.table == "hour"],
        )


def _attributed(
    events: DataFrame, clicks: DataFrame, lookback_s: int, *, broadcast: bool = False
) -> DataFrame:
    """The batch's conversions that a carried click precedes, attributed as the job does."""
    conversions = events.where(F.col("event_type") == "conversion")
    users = conversions.select("user_id").distinct()
    return attribute(
        conversions,
        clicks.join(F.broadcast(users) if broadcast else users, "user_id", "left_semi"),
        lookback_seconds=lookback_s,
    ).where(F.col("status") == ATTRIBUTED)


def _hour_starts() -> Column:
    """The starts of the 12 sliding hours holding the 5-minute slide at ``slide_start``."""
    return F.explode(
        F.sequence(
            F.col("slide_start") - F.expr("INTERVAL 55 MINUTES"),
            F.col("slide_start"),
            F.expr("INTERVAL 5 MINUTES"),
        )
    )


def _as_record(frame: DataFrame, *keys: str) -> DataFrame:
    table = "minute" if "ad_id" in keys else "hour"
    return frame.select(
        F.lit(table).alias("table"),
        F.to_json(F.struct(*keys)).alias("k"),
        F.to_json(F.struct(*frame.columns)).alias("v"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1000, help="events per batch")
    parser.add_argument("--step-ms", type=int, default=20, help="event time between events")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--ads", type=int, default=1000)
    parser.add_argument("--warm", type=int, default=40, help="batches before the measured ones")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--lean", action="store_true", help="each frame by one union aggregate")
    parser.add_argument(
        "--one-pull", action="store_true", help="no job of its own for the deltas; one pull"
    )
    args = parser.parse_args()
    args.base = 1_700_000_000_000 // HOUR_MS * HOUR_MS
    root = Path(tempfile.mkdtemp(prefix="adattr-carried-windows-"))
    settings = replace(
        Settings.from_env(os.environ), warehouse=str(root / "warehouse"), data_dir=root
    )
    spark = build_spark(settings, "adattr-bench-carried-windows")
    lookback = settings.attribution_lookback_seconds
    # The carried latest clicks (pipelines.click_state), as the job caches them: one per user
    # and advertiser, from a long history of clicks.
    history = args.users * 10
    clicks = (
        _events(spark, history, -history, 1, args)
        .where(F.col("event_type") == "click")
        .select("event_id", "event_time", "user_id", "advertiser_id", "ad_id", "campaign_id")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    print(f"carried clicks: {clicks.count():,}")
    carried = (LeanCarried if args.lean else Carried)(spark, one_pull=args.one_pull)
    took: list[dict[str, float]] = []
    total: list[float] = []
    sizes: list[tuple[int, int, int, int]] = []
    for b in range(args.warm + args.rounds):
        first = b * args.batch
        events = _events(spark, args.batch, first, args.step_ms, args).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        events.count()
        watermark = args.base + (first + args.batch - 1) * args.step_ms - WATERMARK_MS
        started = time.monotonic()
        timer = StepTimer()
        minutes, hours = carried.fold(events, clicks, watermark, lookback, timer)
        events.unpersist()
        if b >= args.warm:
            took.append(timer.steps)
            total.append(time.monotonic() - started)
            sizes.append(
                (len(minutes), len(hours), carried.minutes.count(), carried.slides.count())
            )
    for step in took[0]:
        _line(step, [s[step] for s in took])
    _line("the batch's fold in all", total)
    _check(spark, carried, clicks, (args.warm + args.rounds) * args.batch, lookback, args)
    last = sizes[-1]
    print(
        f"last batch: {last[0]:,} changed minutes, {last[1]:,} changed hours; carried "
        f"{last[2]:,} open minutes, {last[3]:,} slides ({args.batch:,} events a batch, "
        f"{args.batch * args.step_ms / 1000:.0f} s of event time)"
    )
    return 0


def _check(
    spark: SparkSession, carried: Carried, clicks: DataFrame, n: int, lookback: int, args: Any
) -> None:
    """The carried frames against the same windows recomputed from every event at once (the
    figures are only worth having if the fold is exact)."""
    events = _events(spark, n, 0, args.step_ms, args)
    conversions = events.where(F.col("event_type") == "conversion")
    attributed = attribute(conversions, clicks, lookback_seconds=lookback).where(
        F.col("status") == ATTRIBUTED
    )
    every = window_metrics(events, attributed)
    minutes = every.join(
        carried.minutes.select("window_start", "ad_id"), ["window_start", "ad_id"], "left_semi"
    )
    slides = (
        every.where((F.col("impressions") > 0) | (F.col("clicks") > 0))
        .groupBy(F.window("window_start", CTR_SLIDE).start.alias("slide_start"), "campaign_id")
        .agg(
            F.sum("impressions").cast("long").alias("impressions"),
            F.sum("clicks").cast("long").alias("clicks"),
        )
    )
    for name, mine, truth in (
        ("minutes", carried.minutes, minutes.select(*carried.minutes.columns)),
        (
            "slides",
            carried.slides.where((F.col("impressions") > 0) | (F.col("clicks") > 0)),
            slides.join(
                carried.slides.select("slide_start", "campaign_id"),
                ["slide_start", "campaign_id"],
                "left_semi",
            ),
        ),
    ):
        extra, missing = mine.exceptAll(truth).count(), truth.exceptAll(mine).count()
        print(
            f"check: carried {name} equal to a recomputation: {extra == missing == 0} "
            f"({mine.count():,} rows; {extra} not in it, {missing} missing)"
        )


def _line(step: str, xs: list[float]) -> None:
    print(f"  {step}: median {statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})")


if __name__ == "__main__":
    raise SystemExit(main())
