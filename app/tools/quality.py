"""Data-quality suites (Great Expectations 1.x) for every table, and ``adattr quality``.

The suites are code, versioned with the schemas. Each table is read with Spark, a few derived
columns are added there (exact decimal and cross-table checks are computed by Spark, where the
types are exact, and handed to GX as booleans), and the frame is validated by GX's pandas engine
in a file Data Context under ``<data_dir>/gx`` (an ignored folder), which also writes Data Docs.
No network is used and GX's usage statistics are off (``GX_ANALYTICS_ENABLED=false``).

The same rules, where a plain DataFrame filter expresses them per record, run inside the job
before anything reaches silver (``schemas/ad_event.py``: the ``quality_*`` reasons); this module
is the after-the-fact check of whole tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from schemas import ad_event as c


@dataclass(frozen=True)
class Rule:
    """One expectation: a GX expectation class name and its arguments."""

    kind: str
    kwargs: dict[str, Any]
    why: str


@dataclass
class Suite:
    table: str
    frame: Callable[[SparkSession, str, int], DataFrame]
    rules: list[Rule] = field(default_factory=list)


def _load(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    return spark.read.format("delta").load(f"{warehouse}/{name}")


def _seconds_between(later: str, earlier: str) -> Any:
    return F.expr(f"unix_millis({later}) - unix_millis({earlier})") / 1000


def _silver(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    dim_ids = _load(spark, warehouse, t.DIM_ADS).select("ad_id", F.lit(True).alias("_in_dim"))
    return (
        _load(spark, warehouse, t.SILVER)
        .join(dim_ids, "ad_id", "left")
        .select(
            "event_id",
            "event_type",
            ((F.col("event_type") == "conversion") | F.col("_in_dim").isNotNull()).alias(
                "ad_in_dim_ads"
            ),
            _seconds_between("event_time", "current_timestamp()").alias("seconds_ahead_of_now"),
            *[F.col(n).cast("double").alias(n) for n in ("cost", "cpm", "cpc", "revenue")],
        )
    )


def _gold_1m(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    spend = (
        _load(spark, warehouse, t.SILVER)
        .where(F.col("event_type").isin("impression", "click"))
        .groupBy(F.window("event_time", "1 minute").start.alias("window_start"), "ad_id")
        .agg(F.sum("cost").alias("_silver_spend"))
    )
    return (
        _load(spark, warehouse, t.GOLD_1M)
        .join(spend, ["window_start", "ad_id"], "left")
        .select(
            F.col("window_start").cast("string").alias("window_start"),
            "ad_id",
            _seconds_between("window_end", "window_start").alias("window_seconds"),
            "impressions",
            "clicks",
            "conversions",
            F.col("spend").cast("double").alias("spend"),
            F.col("revenue").cast("double").alias("revenue"),
            # Exact: decimal arithmetic in Spark, the verdict to GX.
            (F.coalesce("_silver_spend", F.lit(0)) == F.col("spend")).alias(
                "spend_is_price_arithmetic"
            ),
        )
    )


def _ctr(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    return _load(spark, warehouse, t.CTR_1H).select(
        F.col("window_start").cast("string").alias("window_start"),
        "campaign_id",
        _seconds_between("window_end", "window_start").alias("window_seconds"),
        "impressions",
        "clicks",
        "ctr",
    )


def _attributions(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    a = _load(spark, warehouse, t.ATTRIBUTIONS)
    gap = _seconds_between("conversion_time", "click_time")
    return a.select(
        "conversion_id",
        "status",
        F.coalesce((gap > 0) & (gap <= lookback), F.col("click_time").isNull()).alias(
            "click_before_conversion_within_lookback"
        ),
        ((F.col("status") == "attributed") == F.col("click_id").isNotNull()).alias(
            "status_matches_click_id"
        ),
    )


def _quarantine(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    return _load(spark, warehouse, t.QUARANTINE).select(
        "reason", F.col("raw_value").isNotNull().alias("has_raw_value")
    )


def _sessions(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    return _load(spark, warehouse, t.SESSIONS).select(
        "user_id",
        F.col("session_start").cast("string").alias("session_start"),
        _seconds_between("session_end", "session_start").alias("session_seconds"),
        (F.col("events") == F.col("impressions") + F.col("clicks") + F.col("conversions")).alias(
            "events_add_up"
        ),
    )


def _reconciliation(spark: SparkSession, warehouse: str, lookback: int) -> DataFrame:
    """Cross-table: the sums in gold equal the counts in silver (and the attributions)."""
    silver = _load(spark, warehouse, t.SILVER).agg(
        F.count(F.when(F.col("event_type") == "impression", 1)).alias("impressions"),
        F.count(F.when(F.col("event_type") == "click", 1)).alias("clicks"),
        F.coalesce(F.sum("cost"), F.lit(0)).cast("decimal(38,9)").alias("spend"),
    )
    attributed = (
        _load(spark, warehouse, t.ATTRIBUTIONS)
        .where(F.col("status") == "attributed")
        .agg(
            F.count("*").alias("conversions"),
            F.coalesce(F.sum("revenue"), F.lit(0)).cast("decimal(38,6)").alias("revenue"),
        )
    )
    gold = _load(spark, warehouse, t.GOLD_1M).agg(
        *[F.coalesce(F.sum(n), F.lit(0)).alias(n) for n in ("impressions", "clicks")],
        F.coalesce(F.sum("spend"), F.lit(0)).cast("decimal(38,9)").alias("spend"),
        F.coalesce(F.sum("conversions"), F.lit(0)).alias("conversions"),
        F.coalesce(F.sum("revenue"), F.lit(0)).cast("decimal(38,6)").alias("revenue"),
    )
    g, s, a = (frame.collect()[0] for frame in (gold, silver, attributed))  # one row each
    rows = [
        ("impressions", str(g["impressions"]), str(s["impressions"])),
        ("clicks", str(g["clicks"]), str(s["clicks"])),
        ("spend", str(g["spend"]), str(s["spend"])),
        ("conversions", str(g["conversions"]), str(a["conversions"])),
        ("revenue", str(g["revenue"]), str(a["revenue"])),
    ]
    return spark.createDataFrame(rows, "measure string, in_gold string, in_silver string")


def _rule(kind: str, why: str, **kwargs: Any) -> Rule:
    return Rule(kind, kwargs, why)


def suites() -> list[Suite]:
    non_negative = [
        _rule("ExpectColumnValuesToBeBetween", f"{n} is never negative", column=n, min_value=0)
        for n in ("cost", "cpm", "cpc", "revenue")
    ]
    return [
        Suite(
            t.SILVER,
            _silver,
            [
                _rule("ExpectColumnValuesToNotBeNull", "every event has an id", column="event_id"),
                _rule("ExpectColumnValuesToBeUnique", "one row per event", column="event_id"),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "only the contract's event types",
                    column="event_type",
                    value_set=list(c.contract().event_types),
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "impressions and clicks name an ad of dim_ads",
                    column="ad_in_dim_ads",
                    value_set=[True],
                ),
                _rule(
                    "ExpectColumnValuesToBeBetween",
                    f"event_time at most {c.FUTURE_TOLERANCE_S}s ahead of now",
                    column="seconds_ahead_of_now",
                    max_value=c.FUTURE_TOLERANCE_S,
                ),
                *non_negative,
            ],
        ),
        Suite(
            t.GOLD_1M,
            _gold_1m,
            [
                _rule(
                    "ExpectCompoundColumnsToBeUnique",
                    "one row per window and ad",
                    column_list=["window_start", "ad_id"],
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "a window is one minute long",
                    column="window_seconds",
                    value_set=[60],
                ),
                *[
                    _rule("ExpectColumnValuesToBeBetween", f"{n} >= 0", column=n, min_value=0)
                    for n in ("impressions", "clicks", "spend", "conversions", "revenue")
                ],
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "spend = impressions x cpm / 1000 + clicks x cpc of the window's events",
                    column="spend_is_price_arithmetic",
                    value_set=[True],
                ),
            ],
        ),
        Suite(
            t.CTR_1H,
            _ctr,
            [
                _rule(
                    "ExpectCompoundColumnsToBeUnique",
                    "one row per window and campaign",
                    column_list=["window_start", "campaign_id"],
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "a window is one hour long",
                    column="window_seconds",
                    value_set=[3600],
                ),
                _rule(
                    "ExpectColumnValuesToBeBetween",
                    "ctr is a share (null without impressions)",
                    column="ctr",
                    min_value=0,
                    max_value=1,
                ),
            ],
        ),
        Suite(
            t.ATTRIBUTIONS,
            _attributions,
            [
                _rule(
                    "ExpectColumnValuesToBeUnique", "one row per conversion", column="conversion_id"
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "the click is before the conversion, within the lookback",
                    column="click_before_conversion_within_lookback",
                    value_set=[True],
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "status is attributed exactly when there is a click",
                    column="status_matches_click_id",
                    value_set=[True],
                ),
            ],
        ),
        Suite(
            t.QUARANTINE,
            _quarantine,
            [
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "a known reason code",
                    column="reason",
                    value_set=list(c.REASONS),
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "the raw bytes are kept",
                    column="has_raw_value",
                    value_set=[True],
                ),
            ],
        ),
        Suite(
            t.SESSIONS,
            _sessions,
            [
                _rule(
                    "ExpectCompoundColumnsToBeUnique",
                    "one row per user session",
                    column_list=["user_id", "session_start"],
                ),
                _rule(
                    "ExpectColumnValuesToBeBetween",
                    "a session ends after it starts",
                    column="session_seconds",
                    min_value=0,
                    strict_min=True,
                ),
                _rule(
                    "ExpectColumnValuesToBeInSet",
                    "events = impressions + clicks + conversions",
                    column="events_add_up",
                    value_set=[True],
                ),
            ],
        ),
        Suite(
            "reconciliation",
            _reconciliation,
            [
                _rule(
                    "ExpectColumnPairValuesToBeEqual",
                    "the sums in gold equal the counts in silver and the attributions",
                    column_A="in_gold",
                    column_B="in_silver",
                )
            ],
        ),
    ]


@dataclass
class Failure:
    table: str
    expectation: str
    why: str
    unexpected: Any
    examples: list[Any]


@dataclass
class Report:
    checked: int
    failures: list[Failure]
    docs: Path | None


def run_quality(
    spark: SparkSession, warehouse: str, gx_root: Path, *, lookback_seconds: int
) -> Report:
    """Validates every table; writes Data Docs under ``gx_root``; returns what failed."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no usage statistics leave
    import great_expectations as gx

    gx_root.mkdir(parents=True, exist_ok=True)
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(gx_root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # a CLI, not a notebook
    source = context.data_sources.add_or_update_pandas("adattr")
    definitions = []
    frames = {}
    checked = 0
    for suite_def in suites():
        name = suite_def.table
        frames[name] = suite_def.frame(spark, warehouse, lookback_seconds).toPandas()
        try:
            asset = source.get_asset(name)
        except LookupError:
            asset = source.add_dataframe_asset(name=name)
        try:
            batch = asset.get_batch_definition("all")
        except KeyError:
            batch = asset.add_batch_definition_whole_dataframe("all")
        suite = gx.ExpectationSuite(name=name)
        for rule in suite_def.rules:
            expectation = getattr(gx.expectations, rule.kind)(**rule.kwargs, meta={"why": rule.why})
            suite.add_expectation(expectation)
            checked += 1
        suite = context.suites.add_or_update(suite)
        definitions.append(
            context.validation_definitions.add_or_update(
                gx.ValidationDefinition(name=name, data=batch, suite=suite)
            )
        )
    failures: list[Failure] = []
    for definition in definitions:
        result = definition.run(batch_parameters={"dataframe": frames[definition.name]})
        for r in result.results:
            if r.success:
                continue
            config = r.expectation_config
            assert config is not None  # a result always names its expectation
            details = r.result or {}
            failures.append(
                Failure(
                    table=definition.name,
                    expectation=f"{config.type}({_subject(config.kwargs)})",
                    why=(config.meta or {}).get("why", ""),
                    unexpected=details.get("unexpected_count", details.get("observed_value")),
                    examples=list(details.get("partial_unexpected_list") or [])[:3],
                )
            )
    docs = None
    try:
        context.build_data_docs()
        index = gx_root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
        docs = index if index.exists() else None
    except Exception as exc:  # Data Docs are a view: a failure to render must not hide results
        print(f"quality: Data Docs not written: {exc}")
    return Report(checked, failures, docs)


def _subject(kwargs: dict[str, Any]) -> str:
    if "column" in kwargs:
        return str(kwargs["column"])
    if "column_list" in kwargs:
        return ",".join(kwargs["column_list"])
    return f"{kwargs.get('column_A')},{kwargs.get('column_B')}"
