"""The gold tables as pure functions of silver: ``DataFrame -> DataFrame``, no I/O.

Every gold table is *derived* from ``silver_ad_events`` (one row per accepted event) and, for the
conversion columns, from ``gold_attributions``. The streaming sink feeds these functions the
slice of silver a micro-batch can have changed and MERGEs the result; a batch recomputation (a
test, a reconcile) feeds them all of silver and must get the same rows. Because nothing here is
incremented, a replayed or re-executed batch recomputes the same values instead of adding twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.transforms import AD_EVENT_TYPES
from schemas.ad_metrics import ATTRIBUTIONS, PUBLISHED

WINDOW = "1 minute"
CTR_WINDOW = "1 hour"
CTR_SLIDE = "5 minutes"
ATTRIBUTED = "attributed"
UNATTRIBUTED = "unattributed"

# What attribute() returns: the published attribution row (schemas/ad_metrics.py) before the
# sink adds is_final.
_KEY, _VALUES = PUBLISHED[ATTRIBUTIONS]
ATTRIBUTION_COLUMNS = (*_KEY, *[c for c in _VALUES if c != "is_final"])


def _seconds(n: int) -> Column:
    return F.expr(f"INTERVAL {int(n)} SECONDS")


def attribute(conversions: DataFrame, clicks: DataFrame, *, lookback_seconds: int) -> DataFrame:
    """Last-click attribution: one row per conversion ``event_id``.

    A conversion goes to the latest click by the same user on an ad of the same advertiser with
    ``conversion_time - lookback <= click_time < conversion_time``; equal click times go to the
    larger click ``event_id``, so the answer never depends on arrival order. No such click:
    ``unattributed`` (organic), with null click columns. Both inputs are silver-shaped; a
    repeated ``event_id`` on either side counts once.
    """
    conv = conversions.select(
        F.col("event_id").alias("conversion_id"),
        F.col("event_time").alias("conversion_time"),
        "user_id",
        "advertiser_id",
        "revenue",
    ).dropDuplicates(["conversion_id"])
    clk = clicks.select(
        F.col("event_id").alias("click_id"),
        F.col("event_time").alias("click_time"),
        F.col("user_id").alias("_click_user"),
        F.col("advertiser_id").alias("_click_advertiser"),
        "ad_id",
        "campaign_id",
    ).dropDuplicates(["click_id"])
    qualifies = (
        (F.col("user_id") == F.col("_click_user"))
        & (F.col("advertiser_id") == F.col("_click_advertiser"))
        & (F.col("click_time") < F.col("conversion_time"))
        & (F.col("click_time") >= F.col("conversion_time") - _seconds(lookback_seconds))
    )
    # max() over a struct orders by its fields left to right: latest time, then larger id. A
    # conversion with no qualifying click has only an all-null struct, so click_id stays null.
    best = (
        conv.join(clk, qualifies, "left")
        .groupBy("conversion_id", "conversion_time", "user_id", "advertiser_id", "revenue")
        .agg(F.max(F.struct("click_time", "click_id", "ad_id", "campaign_id")).alias("c"))
    )
    return best.select(
        "conversion_id",
        "conversion_time",
        "user_id",
        "advertiser_id",
        "revenue",
        "c.click_id",
        "c.click_time",
        "c.ad_id",
        "c.campaign_id",
        F.when(F.col("c.click_id").isNull(), F.lit(UNATTRIBUTED))
        .otherwise(F.lit(ATTRIBUTED))
        .alias("status"),
    )


CLICK_COLUMNS = ("event_id", "event_time", "user_id", "advertiser_id", "ad_id", "campaign_id")


def latest_clicks(clicks: DataFrame) -> DataFrame:
    """Of silver-shaped ``clicks``, the one ``attribute`` prefers per user and advertiser: the
    latest, and of equal times the larger ``event_id`` (the same order as ``attribute``'s). Its
    ``CLICK_COLUMNS``, so the result is silver-shaped too and can be folded again: the latest
    of some clicks and of more clicks is the latest of all of them."""
    best = clicks.groupBy("user_id", "advertiser_id").agg(
        F.max(F.struct("event_time", "event_id", "ad_id", "campaign_id")).alias("c")
    )
    return best.select(
        "c.event_id", "c.event_time", "user_id", "advertiser_id", "c.ad_id", "c.campaign_id"
    )


def reopened(pending: DataFrame, new_clicks: DataFrame, *, lookback_seconds: int) -> DataFrame:
    """Of the pending (not yet final) conversions, those a newly accepted click now precedes
    within the lookback: the same user and advertiser, ``click < conversion <= click +
    lookback``. Re-attributing these (with the batch's new conversions) is all an out-of-order
    click can change. Both inputs are silver-shaped."""
    clicks = new_clicks.select(
        F.col("user_id").alias("_u"),
        F.col("advertiser_id").alias("_a"),
        F.col("event_time").alias("_t"),
    )
    return pending.join(
        clicks,
        (F.col("user_id") == F.col("_u"))
        & (F.col("advertiser_id") == F.col("_a"))
        & (F.col("_t") < F.col("event_time"))
        & (F.col("event_time") <= F.col("_t") + _seconds(lookback_seconds)),
        "left_semi",
    )


def window_metrics(silver: DataFrame, attributions: DataFrame) -> DataFrame:
    """1-minute tumbling event-time windows per ad: impressions, clicks and exact spend from
    silver; attributed conversions and their revenue in the window of the *conversion* time, on
    the attributed ad. A window with only conversions has zero impressions, clicks and spend."""
    ad_events = (
        silver.where(F.col("event_type").isin(*AD_EVENT_TYPES))
        .groupBy(F.window("event_time", WINDOW).alias("w"), "ad_id")
        .agg(
            F.max("campaign_id").alias("_campaign"),
            F.max("advertiser_id").alias("_advertiser"),
            F.count(F.when(F.col("event_type") == "impression", 1)).alias("impressions"),
            F.count(F.when(F.col("event_type") == "click", 1)).alias("clicks"),
            F.sum("cost").cast("decimal(24,9)").alias("spend"),
        )
    )
    converted = (
        attributions.where(F.col("status") == ATTRIBUTED)
        .groupBy(F.window("conversion_time", WINDOW).alias("w"), "ad_id")
        .agg(
            F.max("campaign_id").alias("_conv_campaign"),
            F.max("advertiser_id").alias("_conv_advertiser"),
            F.count("*").alias("conversions"),
            F.sum("revenue").cast("decimal(24,6)").alias("revenue"),
        )
    )
    zero = F.lit(0).cast("long")
    return ad_events.join(converted, ["w", "ad_id"], "full").select(
        F.col("w.start").alias("window_start"),
        F.col("w.end").alias("window_end"),
        "ad_id",
        F.coalesce("_campaign", "_conv_campaign").alias("campaign_id"),
        F.coalesce("_advertiser", "_conv_advertiser").alias("advertiser_id"),
        F.coalesce("impressions", zero).alias("impressions"),
        F.coalesce("clicks", zero).alias("clicks"),
        F.coalesce("spend", F.lit(0).cast("decimal(24,9)")).alias("spend"),
        F.coalesce("conversions", zero).alias("conversions"),
        F.coalesce("revenue", F.lit(0).cast("decimal(24,6)")).alias("revenue"),
    )


def campaign_ctr(metrics_1m: DataFrame) -> DataFrame:
    """Sliding 1-hour windows every 5 minutes per campaign, summed from the 1-minute windows
    (each minute lies in exactly 12 of them): impressions, clicks and ``ctr`` = clicks /
    impressions, null when there were no impressions. Minutes with only conversions add no
    window.

    The minutes are summed per campaign and 5-minute slide first: a slide's minutes all lie in
    the same 12 windows (windows and slides both start on 5-minute boundaries, so a minute is
    in a window exactly when its slide is), so each slide, not each ad's minute, is what gets
    copied into its 12 windows: an hour of 1,000 ads' minutes is 60,000 rows to copy 12 times
    each, its slides of 100 campaigns 1,200."""
    ad_minutes = metrics_1m.where((F.col("impressions") > 0) | (F.col("clicks") > 0))
    slides = ad_minutes.groupBy(F.window("window_start", CTR_SLIDE).alias("s"), "campaign_id").agg(
        F.sum("impressions").alias("impressions"), F.sum("clicks").alias("clicks")
    )
    return (
        slides.groupBy(F.window("s.start", CTR_WINDOW, CTR_SLIDE).alias("w"), "campaign_id")
        .agg(
            F.sum("impressions").cast("long").alias("impressions"),
            F.sum("clicks").cast("long").alias("clicks"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "campaign_id",
            "impressions",
            "clicks",
            F.when(F.col("impressions") > 0, F.col("clicks") / F.col("impressions")).alias("ctr"),
        )
    )


SESSION_COLUMNS = (
    "session_start",
    "session_end",
    "user_id",
    "events",
    "impressions",
    "clicks",
    "conversions",
    "revenue",
)


def user_sessions(events: DataFrame, *, gap_seconds: int) -> DataFrame:
    """Session windows per user (Spark's ``session_window``): an event at most ``gap`` after
    the previous one extends the session, which ends ``gap`` after its last event. Counts per
    event type, and the revenue of its conversions (0 when none)."""
    kind = F.col("event_type")
    # start and end come from aggregates (first event, last event + gap), equal to the session
    # window's own bounds: a filter on the window column itself would be pushed below the
    # aggregation by Spark's optimizer and drop single events *before* sessions are merged.
    return (
        events.groupBy("user_id", F.session_window("event_time", f"{gap_seconds} seconds"))
        .agg(
            F.min("event_time").alias("session_start"),
            (F.max("event_time") + F.expr(f"INTERVAL {int(gap_seconds)} SECONDS")).alias(
                "session_end"
            ),
            F.count("*").alias("events"),
            F.count(F.when(kind == "impression", 1)).alias("impressions"),
            F.count(F.when(kind == "click", 1)).alias("clicks"),
            F.count(F.when(kind == "conversion", 1)).alias("conversions"),
            F.coalesce(F.sum("revenue"), F.lit(0)).cast("decimal(24,6)").alias("revenue"),
        )
        .select(*SESSION_COLUMNS)
    )


def folded_sessions(
    sessions: DataFrame | None, events: DataFrame, *, gap_seconds: int
) -> DataFrame:
    """``sessions`` (``user_sessions`` rows of some events) with more ``events`` added: the
    rows ``user_sessions`` returns for both sets of events together, without their events.

    A session is an interval ``[start, end)`` and an event one of length ``gap``. Sorted by start
    within a user, a piece joins the session before it when it starts at or before the latest
    end so far (Spark's rule: an event exactly at a session's end extends it), so an event can
    extend a session either way or join two into one. Counts and revenue add up (revenue is
    never negative in silver, so a partial sum fits wherever the whole does)."""
    kind = F.col("event_type")
    pieces = events.select(
        F.col("event_time").alias("session_start"),
        (F.col("event_time") + _seconds(gap_seconds)).alias("session_end"),
        "user_id",
        F.lit(1).cast("long").alias("events"),
        (kind == "impression").cast("long").alias("impressions"),
        (kind == "click").cast("long").alias("clicks"),
        (kind == "conversion").cast("long").alias("conversions"),
        F.coalesce(F.col("revenue"), F.lit(0)).cast("decimal(24,6)").alias("revenue"),
    )
    if sessions is not None:
        pieces = sessions.select(*SESSION_COLUMNS).unionByName(pieces)
    ordered = Window.partitionBy("user_id").orderBy("session_start", "session_end")
    reach = F.max("session_end").over(ordered.rowsBetween(Window.unboundedPreceding, -1))
    opens = (reach.isNull() | (F.col("session_start") > reach)).cast("long")
    return (
        pieces.withColumn("_opens", opens)
        .withColumn(
            "_session",
            F.sum("_opens").over(ordered.rowsBetween(Window.unboundedPreceding, 0)),
        )
        .groupBy("user_id", "_session")
        .agg(
            F.min("session_start").alias("session_start"),
            F.max("session_end").alias("session_end"),
            *[F.sum(c).cast("long").alias(c) for c in SESSION_COLUMNS[3:7]],
            F.sum("revenue").cast("decimal(24,6)").alias("revenue"),
        )
        .select(*SESSION_COLUMNS)
    )


def recomputed_or_current(
    recomputed: DataFrame | None,
    current: DataFrame | None,
    *,
    keys: tuple[str, ...],
    values: tuple[str, ...],
    emptied: Column | None = None,
    zeros: dict[str, Column] | None = None,
    flag: str | None = None,
) -> DataFrame:
    """One row per key, the rows a gold MERGE sets: the ``recomputed`` row where there is one,
    else the table's ``current`` row (one due to be finalised), with ``zeros`` in place of
    its columns where ``emptied`` (over its columns) holds: a window the recomputation no
    longer produces. Either side may be None, not both. ``flag``: the name of a boolean
    column to add, true on the recomputed rows."""
    if current is None or recomputed is None:
        either = current if recomputed is None else recomputed
        assert either is not None, "a MERGE source needs recomputed or current rows"
        rows = either.select(*keys, *values)
        return rows if flag is None else rows.withColumn(flag, F.lit(recomputed is not None))
    x = current.select(
        *[F.col(c).alias(f"_x_{c}") for c in (*keys, *values)],
        (F.lit(False) if emptied is None else emptied).alias("_x_emptied"),
    )
    r = recomputed.select(*keys, *values).withColumn("_r", F.lit(True))
    joined = r.join(x, [r[k] == x[f"_x_{k}"] for k in keys], "full_outer")
    here = F.col("_r").isNotNull()
    columns = [F.when(here, F.col(k)).otherwise(F.col(f"_x_{k}")).alias(k) for k in keys]
    for v in values:
        fallback = F.col(f"_x_{v}")
        if zeros and v in zeros:
            fallback = F.when(F.col("_x_emptied"), zeros[v]).otherwise(fallback)
        columns.append(F.when(here, F.col(v)).otherwise(fallback).alias(v))
    if flag is not None:
        columns.append(here.alias(flag))
    return joined.select(*columns)


def merged(
    table: DataFrame, source: DataFrame, *, keys: tuple[str, ...], final: str = "is_final"
) -> DataFrame:
    """The rows of ``table`` as a keyed MERGE of ``source`` leaves them that updates every
    column of a matched row unless it is ``final`` and inserts the rest (the attributions
    MERGE): a reader that needs the table after that MERGE reads it so instead, before the
    MERGE has run (the attribution rows kept between passes: ``pipelines.pending_rows``)
    or while it runs. The same whether ``table`` was read before the MERGE committed or after
    (run again, it changes nothing), provided the query reads one snapshot: ``table`` appears in
    it once."""
    columns = table.columns
    s = source.select(*[F.col(c).alias(f"_s_{c}") for c in columns]).withColumn("_s", F.lit(True))
    x = table.withColumn("_t", F.lit(True))
    joined = x.join(s, [x[k] == s[f"_s_{k}"] for k in keys], "full_outer")
    # MERGE's condition NOT t.final: a null is no match, and the table's row stays.
    updated = F.col("_s").isNotNull() & F.coalesce(~F.col(final), F.lit(False))
    table_row = F.col("_t").isNotNull() & ~updated
    return joined.select(
        *[F.when(table_row, F.col(c)).otherwise(F.col(f"_s_{c}")).alias(c) for c in columns]
    )
