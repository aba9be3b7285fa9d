"""The gold derivations on small silver-shaped frames: attribution, windows, CTR, sessions."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.tools import truth
from pipelines import tables as t
from pipelines.gold import (
    SESSION_COLUMNS,
    attribute,
    campaign_ctr,
    folded_sessions,
    latest_clicks,
    recomputed_or_current,
    reopened,
    user_sessions,
    window_metrics,
)

SILVER = (
    "event_id string, event_type string, event_time timestamp, user_id string, ad_id string, "
    "campaign_id string, advertiser_id string, cost decimal(18,9), revenue decimal(18,6)"
)
T0 = datetime(2026, 11, 20, 10, 0)  # the session time zone is UTC
DAY = 86_400


def at(minutes: float, base: datetime = T0) -> datetime:
    return base + timedelta(minutes=minutes)


def click(
    event_id: str, minutes: float, *, user: str = "u1", ad: str = "ad-1", adv: str = "adv-1"
) -> tuple[Any, ...]:
    return (event_id, "click", at(minutes), user, ad, f"cmp-{ad}", adv, Decimal("0.5"), None)


def impression(event_id: str, minutes: float, *, user: str = "u1", ad: str = "ad-1") -> tuple:
    return (
        event_id,
        "impression",
        at(minutes),
        user,
        ad,
        f"cmp-{ad}",
        "adv-1",
        Decimal("0.002"),
        None,
    )


def conversion(
    event_id: str, minutes: float, *, user: str = "u1", adv: str = "adv-1", revenue: str = "10"
) -> tuple[Any, ...]:
    return (event_id, "conversion", at(minutes), user, None, None, adv, None, Decimal(revenue))


def frame(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, SILVER)


def attributed(
    spark: SparkSession, rows: list[tuple[Any, ...]], lookback: int = DAY
) -> dict[str, str | None]:
    """conversion_id -> click_id, by attributing every conversion of ``rows`` to its clicks."""
    events = frame(spark, rows)
    out = attribute(
        events.where("event_type = 'conversion'"),
        events.where("event_type = 'click'"),
        lookback_seconds=lookback,
    ).collect()
    assert len(out) == len({r.conversion_id for r in out}), "one row per conversion"
    for r in out:
        assert r.status == ("unattributed" if r.click_id is None else "attributed")
    return {r.conversion_id: r.click_id for r in out}


def test_last_click_wins(spark: SparkSession) -> None:
    rows = [click("k1", 0), click("k2", 5), click("k3", 3), conversion("v", 10)]
    assert attributed(spark, rows) == {"v": "k2"}


def test_equal_click_times_go_to_the_larger_event_id(spark: SparkSession) -> None:
    rows = [click("k-b", 5), click("k-a", 5), click("k-0", 4), conversion("v", 10)]
    assert attributed(spark, rows) == {"v": "k-b"}


def test_lookback_bounds_are_inclusive_then_exclusive(spark: SparkSession) -> None:
    hour = 3600
    at_edge = [click("k", -50), conversion("v", 10)]  # exactly one hour before
    assert attributed(spark, at_edge, lookback=hour) == {"v": "k"}
    outside = [click("k", -50 - 1 / 60_000), conversion("v", 10)]  # one millisecond more
    assert attributed(spark, outside, lookback=hour) == {"v": None}


def test_click_of_another_advertiser_or_user_does_not_count(spark: SparkSession) -> None:
    rows = [click("k1", 1, adv="adv-2"), click("k2", 2, user="u2"), conversion("v", 10)]
    assert attributed(spark, rows) == {"v": None}
    rows.append(click("k3", 0))
    assert attributed(spark, rows) == {"v": "k3"}, "an older click of the right kind still wins"


def test_click_after_or_at_the_conversion_does_not_count(spark: SparkSession) -> None:
    rows = [click("k-before", 1), click("k-at", 10), click("k-after", 11), conversion("v", 10)]
    assert attributed(spark, rows) == {"v": "k-before"}
    assert attributed(spark, rows[1:]) == {"v": None}


def test_organic_conversion_is_kept(spark: SparkSession) -> None:
    events = frame(spark, [conversion("v", 10, revenue="12.345678")])
    row = attribute(events, events.limit(0), lookback_seconds=DAY).collect()[0]
    assert row.asDict() == {
        "conversion_id": "v",
        "conversion_time": at(10),
        "user_id": "u1",
        "advertiser_id": "adv-1",
        "revenue": Decimal("12.345678"),
        "click_id": None,
        "click_time": None,
        "ad_id": None,
        "campaign_id": None,
        "status": "unattributed",
    }


def test_duplicate_click_and_duplicate_conversion_count_once(spark: SparkSession) -> None:
    rows = [click("k1", 1), click("k1", 1), click("k2", 2), click("k2", 2), conversion("v", 10)]
    rows.append(conversion("v", 10))
    assert attributed(spark, rows) == {"v": "k2"}


def test_the_latest_clicks_up_to_a_time_and_the_clicks_after_it_attribute_as_all_clicks(
    spark: SparkSession,
) -> None:
    """What the sink carries instead of reading silver's whole lookback: for conversions later
    than C, the latest click per user and advertiser at or before C (folded batch by batch,
    clicks older than C - lookback dropped) with the clicks after C attribute every conversion
    as all the clicks do. Ties in time (the larger id wins), clicks exactly at C, exactly at the
    lookback's edge, of another advertiser, and a conversion at C + 1 ms are among the cases."""
    lookback = 30 * 60
    rng = random.Random(11)
    ms = 1 / 60_000
    clicks = [
        click(f"k{i}", rng.randrange(0, 240) / 2, user=f"u{i % 3}", adv=f"adv-{i % 2}")
        for i in range(90)
    ]
    clicks += [click("tie-a", 40, user="u7"), click("tie-b", 40, user="u7")]  # tie-b wins
    clicks += [click("at-c", 60, user="u8", adv="adv-1"), click("edge", 31, user="u9")]
    conversions = [
        conversion(f"c{i}", 60 + ms + rng.randrange(0, 120), user=f"u{i % 3}", adv=f"adv-{i % 2}")
        for i in range(30)
    ]
    conversions += [
        conversion("c-tie", 65, user="u7"),
        conversion("c-at-edge", 61, user="u9"),
        conversion("c-after-c", 60 + ms, user="u8", adv="adv-1"),
    ]
    every = frame(spark, clicks)
    conv = frame(spark, conversions)

    def folded_until(c_minutes: float) -> DataFrame:
        """The latest clicks at or before C, folded in three slices as the batches do."""
        carried: DataFrame | None = None
        for lo, hi in ((-1, 20), (20, 45), (45, c_minutes)):
            piece = every.where((F.col("event_time") > at(lo)) & (F.col("event_time") <= at(hi)))
            clicks = (
                piece if carried is None else carried.unionByName(piece.select(*carried.columns))
            )
            carried = latest_clicks(clicks).where(F.col("event_time") >= at(hi - lookback / 60))
        assert carried is not None
        return carried

    carried = folded_until(60)
    later = every.where(F.col("event_time") > at(60)).select(*carried.columns)
    want = attribute(conv, every, lookback_seconds=lookback).collect()
    got = attribute(conv, carried.unionByName(later), lookback_seconds=lookback).collect()
    assert sorted(got) == sorted(want)
    by_id = {r.conversion_id: r.click_id for r in got}
    assert by_id["c-tie"] == "tie-b"
    assert by_id["c-at-edge"] == "edge"  # 30 minutes before it: within the lookback
    assert by_id["c-after-c"] == "at-c"  # the click exactly at C, carried
    assert sum(r.click_id is not None for r in got) > 20  # most conversions attributed
    # Of the per-key latest clicks at or before C, only those a later conversion can reach.
    assert carried.where(F.col("event_time") < at(30)).isEmpty()
    assert [r.event_id for r in carried.where("user_id = 'u7'").collect()] == ["tie-b"]


def test_out_of_order_click_reattributes_a_pending_conversion(spark: SparkSession) -> None:
    """The sink's incremental protocol, batch by batch, in arrival order: the conversion and an
    older click first, then the click that precedes the conversion more closely, then a click
    after it. Every step re-attributes only the new conversions and the pending ones that a new
    click reopens; the end state equals attributing everything in event-time order at once."""
    arrivals = [
        [conversion("v1", 10), click("k-old", 2), conversion("v2", 30, adv="adv-2")],
        [click("k-late", 8), click("k-other", 9, adv="adv-2")],
        [click("k-after", 12)],
    ]
    state: dict[str, str | None] = {}
    seen: list[tuple[Any, ...]] = []
    for batch in arrivals:
        seen += batch
        new = frame(spark, batch)
        pending = frame(spark, [r for r in seen if r[0] in state])  # nothing is final yet
        affected = new.where("event_type = 'conversion'").unionByName(
            reopened(pending, new.where("event_type = 'click'"), lookback_seconds=DAY)
        )
        everything = frame(spark, seen)
        for r in attribute(
            affected, everything.where("event_type = 'click'"), lookback_seconds=DAY
        ).collect():
            state[r.conversion_id] = r.click_id
        if batch is arrivals[1]:
            assert state == {"v1": "k-late", "v2": "k-other"}
    assert state == attributed(spark, seen) == {"v1": "k-late", "v2": "k-other"}


def test_window_metrics_counts_conversions_in_the_conversion_minute(spark: SparkSession) -> None:
    silver = frame(
        spark,
        [
            impression("i1", 1.0, ad="ad-2"),
            impression("i2", 1.99, ad="ad-2"),
            click("k1", 1.5, ad="ad-2"),
            impression("i3", 2.0, ad="ad-2"),
            conversion("v1", 3.1),
        ],
    )
    attributions = attribute(
        silver.where("event_type = 'conversion'"),
        silver.where("event_type = 'click'"),
        lookback_seconds=DAY,
    )
    rows = {(r.window_start, r.ad_id): r for r in window_metrics(silver, attributions).collect()}
    assert sorted(rows) == [(at(1), "ad-2"), (at(2), "ad-2"), (at(3), "ad-2")]
    first, second, third = (rows[(at(m), "ad-2")] for m in (1, 2, 3))
    assert (first.window_end, first.impressions, first.clicks, first.spend) == (
        at(2),
        2,
        1,
        Decimal("0.504000000"),
    )
    assert (first.conversions, first.revenue) == (0, Decimal("0"))
    assert (second.impressions, second.clicks, second.conversions) == (1, 0, 0)
    # The conversion minute has no ad event: the window exists for the conversion alone.
    assert (third.impressions, third.clicks, third.spend) == (0, 0, Decimal("0"))
    assert (third.conversions, third.revenue, third.campaign_id) == (1, Decimal("10"), "cmp-ad-2")


def test_each_minute_lies_in_twelve_sliding_hours(spark: SparkSession) -> None:
    silver = frame(spark, [impression("i1", 7.5), *[impression(f"j{i}", 8) for i in range(3)]])
    silver = silver.unionByName(frame(spark, [click("k1", 8)]))
    no_conversions = attribute(silver.limit(0), silver.limit(0), lookback_seconds=DAY)
    ctr = campaign_ctr(window_metrics(silver, no_conversions)).orderBy("window_start").collect()
    starts = [r.window_start for r in ctr]
    assert starts == [at(-50 + 5 * i) for i in range(12)], "windows from 09:10 to 10:05"
    assert all(r.window_end - r.window_start == timedelta(hours=1) for r in ctr)
    assert {(r.impressions, r.clicks, r.ctr) for r in ctr} == {(4, 1, 0.25)}


@pytest.mark.parametrize("base", [T0, datetime(1970, 1, 1)], ids=["2026", "around-1970"])
def test_sliding_hours_equal_the_sums_of_their_minutes(spark: SparkSession, base: datetime) -> None:
    """campaign_ctr sums minutes per 5-minute slide before copying them into windows; the
    windows must be those of summing each minute into its 12 windows (the truth file's rule),
    slide boundaries and minutes without impressions or clicks included, times before the
    epoch too (negative epoch milliseconds), with the table's column types."""
    rng = random.Random(5)
    rows = [
        (at(m, base), f"cmp-{ad % 3}", rng.choice([0, 0, 1, 4]), rng.choice([0, 1]))
        for m in rng.sample(range(-70, 70), 90)
        for ad in rng.sample(range(12), 4)
    ]
    minutes = spark.createDataFrame(
        rows, "window_start timestamp, campaign_id string, impressions long, clicks long"
    )
    hours = campaign_ctr(minutes)
    table = {f.name: f.dataType for f in t.schema(t.CTR_1H).fields}
    assert {f.name: f.dataType for f in hours.schema.fields} == {f: table[f] for f in hours.columns}
    got = sorted(tuple(r) for r in hours.drop("window_end").collect())
    want = sorted(
        (utc(h["window_start"]), h["campaign_id"], h["impressions"], h["clicks"], h["ctr"])
        for h in truth.campaign_ctr(
            [
                {
                    "window_start": truth.iso(m.replace(tzinfo=UTC)),
                    "campaign_id": c,
                    "impressions": i,
                    "clicks": k,
                }
                for m, c, i, k in rows
            ]
        )
    )
    assert len(want) > 3 * 12, "the windows of several hours and campaigns"
    assert got == want


def utc(iso: str) -> datetime:
    """A truth file's time as the session (UTC) reads it back: naive."""
    return datetime.fromisoformat(iso).replace(tzinfo=None)


def test_ctr_is_null_without_impressions(spark: SparkSession) -> None:
    silver = frame(spark, [click("k1", 0)])
    no_conversions = attribute(silver.limit(0), silver.limit(0), lookback_seconds=DAY)
    ctr = campaign_ctr(window_metrics(silver, no_conversions)).collect()
    assert len(ctr) == 12
    assert {(r.impressions, r.clicks, r.ctr) for r in ctr} == {(0, 1, None)}


def test_sessions_split_by_the_gap(spark: SparkSession) -> None:
    """Spark's session_window rule: an event at most ``gap`` after the previous one (an event
    exactly at the session end included) extends the session; one millisecond more starts a
    new one. The truth file implements the same rule."""
    gap = 30 * 60
    ms = 1 / 60_000
    events = frame(
        spark,
        [
            impression("a", 0),
            click("b", 29),
            conversion("c", 59, revenue="7.5"),  # exactly the gap after b: same session
            impression("d", 89 + ms),  # the gap and 1 ms after c: a new session
            impression("e", 0, user="u2"),
        ],
    )
    rows = user_sessions(events, gap_seconds=gap).orderBy("user_id", "session_start").collect()
    fields = ("user_id", "session_start", "session_end", "events", "impressions", "clicks")
    got = [tuple(r[f] for f in (*fields, "conversions", "revenue")) for r in rows]
    assert got == [
        ("u1", at(0), at(89), 3, 1, 1, 1, Decimal("7.5")),
        ("u1", at(89 + ms), at(119 + ms), 1, 1, 0, 0, Decimal("0")),
        ("u2", at(0), at(30), 1, 1, 0, 0, Decimal("0")),
    ]


@pytest.mark.parametrize("gap_minutes", [1, 30])
def test_session_end_is_last_event_plus_gap(spark: SparkSession, gap_minutes: int) -> None:
    events = frame(spark, [impression("a", 0), impression("b", 0.5)])
    (row,) = user_sessions(events, gap_seconds=gap_minutes * 60).collect()
    assert row.session_end == at(0.5 + gap_minutes)


def test_a_filter_on_session_bounds_applies_to_whole_sessions(spark: SparkSession) -> None:
    """The sink keeps only the sessions that end in a range. Spark pushes a filter on the
    session window column below the aggregation (dropping single events before sessions
    merge); the bounds here are aggregates, so the filter sees whole sessions."""
    events = frame(spark, [impression("a", 0), impression("b", 4), impression("c", 8)])
    sessions = user_sessions(events, gap_seconds=300)
    ending_early = sessions.where(sessions.session_end <= at(6)).collect()
    assert ending_early == []
    (whole,) = sessions.where(sessions.session_end <= at(13)).collect()
    assert (whole.session_start, whole.session_end, whole.events) == (at(0), at(13), 3)


def test_folding_events_into_sessions_gives_the_sessions_of_all_events(
    spark: SparkSession,
) -> None:
    """The open sessions the sink carries: sessions of some events, with more events folded
    in, batch after batch, are the sessions of all of them. The cases: an event that extends
    a session forwards, one before its start, one bridging two sessions into one, one exactly at
    a session's end (Spark's rule: same session) and one a millisecond past it (a new one)."""
    gap = 5 * 60
    ms = 1 / 60_000
    batches = [
        [impression("a", 0), click("b", 3), impression("c", 17), impression("x", 0, user="u2")],
        # d exactly at the end of a-b's session; e before its start
        [impression("d", 8), conversion("e", -4, revenue="2.5")],
        # g joins d's session and c's (which starts exactly at g's end); h 1 ms past c's end
        [impression("g", 12), conversion("h", 22 + ms, revenue="1.25")],
    ]
    rng = random.Random(7)  # and many events of a few users, in a random order
    shuffled = [
        impression(f"r{i}", rng.randrange(0, 600) / 10, user=f"v{i % 4}") for i in range(120)
    ]
    batches += [shuffled[i::3] for i in range(3)]
    folded: DataFrame | None = None
    seen: list[tuple[Any, ...]] = []
    for batch in batches:
        folded = folded_sessions(folded, frame(spark, batch), gap_seconds=gap)
        seen += batch
        want = user_sessions(frame(spark, seen), gap_seconds=gap)
        assert sorted(folded.collect()) == sorted(want.collect())
        folded = spark.createDataFrame(folded.collect(), folded.schema)  # cut the plan
    assert folded is not None and folded.columns == list(SESSION_COLUMNS)
    u1 = folded.where("user_id = 'u1'").orderBy("session_start").collect()
    assert [(r.session_start, r.session_end, r.events, r.revenue) for r in u1] == [
        (at(-4), at(22), 6, Decimal("2.500000")),
        (at(22 + ms), at(27 + ms), 1, Decimal("1.250000")),
    ]


WINDOWS = "window_start timestamp, ad_id string, clicks long, is_final boolean"


def test_a_merge_source_takes_the_recomputed_row_else_the_current_one(
    spark: SparkSession,
) -> None:
    """The rows a gold MERGE sets: recomputed where there is a recomputed row; else the table's
    row as it is (due to be finalised), or zeroed where the recomputation covered its window
    and no longer produces it."""
    recomputed = spark.createDataFrame(
        [(at(1), "ad-1", 5, False), (at(2), "ad-1", 7, False)], WINDOWS
    ).drop("is_final")
    current = spark.createDataFrame(
        [(at(0), "ad-1", 3, False), (at(1), "ad-1", 4, False), (at(1), "ad-2", 9, False)],
        WINDOWS,
    )
    got = recomputed_or_current(
        recomputed,
        current,
        keys=("window_start", "ad_id"),
        values=("clicks",),
        emptied=F.col("window_start") >= at(1),  # the recomputation covered minutes 1 and 2
        zeros={"clicks": F.lit(0).cast("long")},
    )
    assert sorted(tuple(r) for r in got.collect()) == [
        (at(0), "ad-1", 3),  # not recomputed, outside the span: as it is
        (at(1), "ad-1", 5),  # recomputed wins
        (at(1), "ad-2", 0),  # in the span, no longer produced: zero
        (at(2), "ad-1", 7),  # new
    ]


def test_a_merge_source_from_one_side_only(spark: SparkSession) -> None:
    rows = spark.createDataFrame([(at(0), "ad-1", 3, False)], WINDOWS)
    keys, values = ("window_start", "ad_id"), ("clicks",)
    for recomputed, current in ((rows, None), (None, rows)):
        got = recomputed_or_current(recomputed, current, keys=keys, values=values)
        assert [tuple(r) for r in got.collect()] == [(at(0), "ad-1", 3)]
        assert got.columns == ["window_start", "ad_id", "clicks"]


def test_a_merge_source_flags_its_recomputed_rows(spark: SparkSession) -> None:
    """With ``flag``, each row says whether it was recomputed: what the attributions MERGE counts
    (its conversions (re)attributed and their span) from its cached source, in one job."""
    keys, values = ("window_start", "ad_id"), ("clicks",)
    recomputed = spark.createDataFrame([(at(1), "ad-1", 5, False)], WINDOWS).drop("is_final")
    current = spark.createDataFrame([(at(0), "ad-1", 3, False), (at(1), "ad-1", 4, False)], WINDOWS)
    both = recomputed_or_current(recomputed, current, keys=keys, values=values, flag="_recomputed")
    assert sorted(tuple(r) for r in both.collect()) == [
        (at(0), "ad-1", 3, False),
        (at(1), "ad-1", 5, True),
    ]
    for one, alone, expected in ((recomputed, None, True), (None, current, False)):
        got = recomputed_or_current(one, alone, keys=keys, values=values, flag="_recomputed")
        assert got.columns == ["window_start", "ad_id", "clicks", "_recomputed"]
        assert {r._recomputed for r in got.collect()} == {expected}
