"""Compares the Delta tables with a generator truth file, and summarises results."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t

ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def _load(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    return spark.read.format("delta").load(f"{warehouse}/{name}")


def _iso(column: str) -> Column:
    return F.date_format(column, ISO).alias(column)


def _money(value: Any) -> str | None:
    return None if value is None else str(Decimal(value).quantize(Decimal("0.000001")))


def _ctr(value: float | None) -> float | None:
    return None if value is None else round(value, 12)


def windows_of(truth: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (w["window_start"], w["ad_id"]): (
            w["impressions"],
            w["clicks"],
            Decimal(w["spend"]),
            w["conversions"],
            _money(w["revenue"]),
        )
        for w in truth["windows"]
    }


def attributions_of(truth: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {
        a["conversion_id"]: (
            a["conversion_time"],
            a["user_id"],
            a["advertiser_id"],
            _money(a["revenue"]),
            a["click_id"],
            a["click_time"],
            a["ad_id"],
            a["campaign_id"],
            a["status"],
        )
        for a in truth["attributions"]
    }


def ctr_of(truth: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (h["window_start"], h["campaign_id"]): (h["impressions"], h["clicks"], _ctr(h["ctr"]))
        for h in truth["ctr_1h"]
    }


def sessions_of(truth: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (s["user_id"], s["session_start"]): (
            s["session_end"],
            s["events"],
            s["impressions"],
            s["clicks"],
            s["conversions"],
            _money(s["revenue"]),
        )
        for s in truth["sessions"]
    }


def observed(spark: SparkSession, warehouse: str) -> dict[str, Any]:
    """What the tables say, in the truth file's shape."""
    gold = _load(spark, warehouse, t.GOLD_1M).select(
        _iso("window_start"), "ad_id", "impressions", "clicks", "spend", "conversions", "revenue"
    )
    attributions = _load(spark, warehouse, t.ATTRIBUTIONS).select(
        "conversion_id",
        _iso("conversion_time"),
        "user_id",
        "advertiser_id",
        "revenue",
        "click_id",
        _iso("click_time"),
        "ad_id",
        "campaign_id",
        "status",
    )
    ctr = _load(spark, warehouse, t.CTR_1H).select(
        _iso("window_start"), "campaign_id", "impressions", "clicks", "ctr"
    )
    sessions = _load(spark, warehouse, t.SESSIONS).select(
        "user_id",
        _iso("session_start"),
        _iso("session_end"),
        "events",
        "impressions",
        "clicks",
        "conversions",
        "revenue",
    )
    quarantine = _load(spark, warehouse, t.QUARANTINE).groupBy("reason").count().collect()
    records = _load(spark, warehouse, t.BRONZE).count()
    late = _load(spark, warehouse, t.LATE).count()
    accepted = _load(spark, warehouse, t.SILVER).count()
    return {
        "records": records,
        "quarantine": {r.reason: r["count"] for r in quarantine},
        # What no table keeps: every record read that is in none of them (the ledger's per-
        # generation counts would count a replay's re-read duplicates again).
        "duplicates": records - sum(r["count"] for r in quarantine) - late - accepted,
        "late": late,
        "accepted": accepted,
        "windows": {
            (r.window_start, r.ad_id): (
                r.impressions,
                r.clicks,
                Decimal(r.spend),
                r.conversions,
                _money(r.revenue),
            )
            for r in gold.collect()
            # A window emptied by a re-attribution stays as a zero row (so the change is
            # published); it holds nothing, like a window that never existed.
            if (r.impressions, r.clicks, r.conversions) != (0, 0, 0)
        },
        "attributions": {
            r.conversion_id: (
                r.conversion_time,
                r.user_id,
                r.advertiser_id,
                _money(r.revenue),
                r.click_id,
                r.click_time,
                r.ad_id,
                r.campaign_id,
                r.status,
            )
            for r in attributions.collect()
        },
        "ctr_1h": {
            (r.window_start, r.campaign_id): (r.impressions, r.clicks, _ctr(r.ctr))
            for r in ctr.collect()
        },
        "sessions": {
            (r.user_id, r.session_start): (
                r.session_end,
                r.events,
                r.impressions,
                r.clicks,
                r.conversions,
                _money(r.revenue),
            )
            for r in sessions.collect()
        },
    }


KEYED: dict[str, tuple[Callable[[dict[str, Any]], dict[Any, tuple[Any, ...]]], str]] = {
    "windows": (windows_of, "(impressions, clicks, spend, conversions, revenue)"),
    "attributions": (
        attributions_of,
        "(conversion_time, user, advertiser, revenue, click_id, click_time, ad, campaign, status)",
    ),
    "ctr_1h": (ctr_of, "(impressions, clicks, ctr)"),
    "sessions": (sessions_of, "(session_end, events, impressions, clicks, conversions, revenue)"),
}


def diff(truth: dict[str, Any], seen: dict[str, Any]) -> list[str]:
    """Every difference, one line each (empty when the tables match the truth exactly)."""
    problems = []
    for name in ("records", "duplicates", "late", "accepted"):
        if truth[name] != seen[name]:
            problems.append(f"{name}: expected {truth[name]}, tables have {seen[name]}")
    for reason in sorted(set(truth["quarantine"]) | set(seen["quarantine"])):
        want, got = truth["quarantine"].get(reason, 0), seen["quarantine"].get(reason, 0)
        if want != got:
            problems.append(f"quarantine[{reason}]: expected {want}, tables have {got}")
    for name, (expected_of, fields) in KEYED.items():
        expected = expected_of(truth)
        for key in sorted(set(expected) | set(seen[name]), key=str):
            want, got = expected.get(key), seen[name].get(key)
            if want != got:
                problems.append(f"{name} {key}: expected {fields} {want}, tables have {got}")
    return problems


def campaign_summary(spark: SparkSession, warehouse: str) -> list[tuple[Any, ...]]:
    """Per campaign: impressions, clicks, spend, attributed conversions, revenue, and the
    conversions still provisional (not final)."""
    pending = (
        _load(spark, warehouse, t.ATTRIBUTIONS)
        .where(~F.col("is_final") & (F.col("status") == "attributed"))
        .groupBy("campaign_id")
        .agg(F.count("*").alias("pending"))
    )
    rows = (
        _load(spark, warehouse, t.GOLD_1M)
        .groupBy("campaign_id")
        .agg(
            F.sum("impressions").alias("impressions"),
            F.sum("clicks").alias("clicks"),
            F.sum("spend").alias("spend"),
            F.sum("conversions").alias("conversions"),
            F.sum("revenue").alias("revenue"),
        )
        .join(pending, "campaign_id", "left")
        .orderBy("campaign_id")
        .collect()
    )
    return [
        (
            r.campaign_id,
            int(r.impressions),
            int(r.clicks),
            Decimal(r.spend),
            int(r.conversions),
            Decimal(r.revenue),
            int(r.pending or 0),
        )
        for r in rows
    ]
