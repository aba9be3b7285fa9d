"""Compares the Delta tables with a generator truth file, and summarises results."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t

ISO = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def _load(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    return spark.read.format("delta").load(f"{warehouse}/{name}")


def observed(spark: SparkSession, warehouse: str, app_id: str) -> dict[str, Any]:
    """What the tables say, in the truth file's shape."""
    gold = (
        _load(spark, warehouse, t.GOLD_1M)
        .select(
            F.date_format("window_start", ISO).alias("window_start"),
            "ad_id",
            "impressions",
            "clicks",
            "spend",
        )
        .collect()
    )
    quarantine = _load(spark, warehouse, t.QUARANTINE).groupBy("reason").count().collect()
    ledger = (
        _load(spark, warehouse, t.LEDGER)
        .where(F.col("app_id") == app_id)
        .select(F.explode("counts"))
        .groupBy("key")
        .agg(F.sum("value").alias("n"))
        .collect()
    )
    counts = {r.key: int(r.n) for r in ledger}
    return {
        "records": _load(spark, warehouse, t.BRONZE).count(),
        "quarantine": {r.reason: r["count"] for r in quarantine},
        "duplicates": counts.get("duplicate", 0),
        "late": _load(spark, warehouse, t.LATE).count(),
        "accepted": _load(spark, warehouse, t.SILVER).count(),
        "windows": {
            (r.window_start, r.ad_id): (r.impressions, r.clicks, Decimal(r.spend)) for r in gold
        },
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
    expected = {
        (w["window_start"], w["ad_id"]): (w["impressions"], w["clicks"], Decimal(w["spend"]))
        for w in truth["windows"]
    }
    for key in sorted(set(expected) | set(seen["windows"])):
        want, got = expected.get(key), seen["windows"].get(key)
        if want != got:
            problems.append(
                f"window {key[0]} {key[1]}: expected (impressions, clicks, spend) {want}, "
                f"tables have {got}"
            )
    return problems


def campaign_summary(spark: SparkSession, warehouse: str) -> list[tuple[str, int, int, Decimal]]:
    rows = (
        _load(spark, warehouse, t.GOLD_1M)
        .groupBy("campaign_id")
        .agg(
            F.sum("impressions").alias("impressions"),
            F.sum("clicks").alias("clicks"),
            F.sum("spend").alias("spend"),
        )
        .orderBy("campaign_id")
        .collect()
    )
    return [(r.campaign_id, int(r.impressions), int(r.clicks), Decimal(r.spend)) for r in rows]
