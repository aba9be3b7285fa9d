"""``adattr reconcile``: every derived table recomputed from ``bronze_ad_events`` in one batch
job, with the streaming job's own transforms, and diffed with what the stream wrote.

The stream decides incrementally, batch by batch; this decides everything at once, from the raw
bytes. The two can only agree if no batch was lost, doubled or half-applied. What a batch job
cannot know by itself comes from the ledger, per bronze row (``generation``, ``batch_id``): the
watermark of the batch that read it (lateness), its timestamp (the quality gate's "not in the
future") and the ``dim_ads`` version it used (prices). Duplicates: of an event's on-time copies,
the first read wins; which copy that is within one batch is arbitrary in the stream, so silver is
compared without Kafka coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.gold import (
    ATTRIBUTION_COLUMNS,
    attribute,
    campaign_ctr,
    user_sessions,
    window_metrics,
)
from pipelines.transforms import ACCEPTED, LATE, classify, enrich, parse_events
from schemas import ad_event as c

PROVENANCE = ("generation", "batch_id")


@dataclass(frozen=True)
class TableDiff:
    table: str
    rows: int  # rows the stream wrote (compared part)
    missing: int  # recomputed but not in the stream's table
    unexpected: int  # in the stream's table but not recomputed
    examples: list[str]

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.unexpected == 0


def recompute(
    spark: SparkSession,
    warehouse: str,
    *,
    max_bytes: int,
    lookback_seconds: int,
    session_gap_seconds: int,
) -> dict[str, DataFrame]:
    """The tables as the stream should have written them, from bronze and the ledger."""

    def load(name: str) -> DataFrame:
        return spark.read.format("delta").load(f"{warehouse}/{name}")

    ledger = load(t.LEDGER)
    batches = ledger.select(
        "generation",
        "batch_id",
        F.col("batch_timestamp").alias("_batch_timestamp"),
        F.expr("unix_millis(watermark)").alias("_watermark_ms"),
        "dim_version",
    ).dropDuplicates(["generation", "batch_id"])
    final_watermark = ledger.agg(F.max("watermark")).first()
    # Each record is parsed as its batch parsed it: an event time ahead of the batch's own time
    # is refused (the quality gate), whatever the clock says now.
    parsed = (
        load(t.BRONZE)
        .join(F.broadcast(batches), list(PROVENANCE))
        .transform(parse_events(max_bytes=max_bytes, now=F.col("_batch_timestamp")))
    )
    valid_on_time = parsed.where(
        F.col("reject_reason").isNull()
        & (F.col("event_time") > F.timestamp_millis(F.col("_watermark_ms")))
    )
    order = Window.partitionBy("event_id").orderBy(
        *PROVENANCE, "kafka_topic", "kafka_partition", "kafka_offset"
    )
    firsts = (
        valid_on_time.withColumn("_n", F.row_number().over(order))
        .where(F.col("_n") == 1)
        .select("kafka_topic", "kafka_partition", "kafka_offset")
    )
    classified = classify(parsed, firsts, watermark_ms=F.col("_watermark_ms"))
    versions = [int(r.dim_version) for r in batches.select("dim_version").distinct().collect()]
    enriched = None
    for version in versions:
        dim = (
            spark.read.format("delta")
            .option("versionAsOf", version)
            .load(f"{warehouse}/{t.DIM_ADS}")
        )
        part = enrich(classified.where(F.col("dim_version") == version), dim)
        enriched = part if enriched is None else enriched.unionByName(part)
    assert enriched is not None, "bronze rows without ledger rows"
    enriched = enriched.persist()
    silver = enriched.where(F.col("outcome") == ACCEPTED)
    attributions = attribute(
        silver.where(F.col("event_type") == "conversion"),
        silver.where(F.col("event_type") == "click"),
        lookback_seconds=lookback_seconds,
    ).persist()
    gold = window_metrics(silver, attributions).persist()
    sessions = user_sessions(silver, gap_seconds=session_gap_seconds)
    if final_watermark is not None and final_watermark[0] is not None:
        sessions = sessions.where(F.col("session_end") <= F.lit(final_watermark[0]))
    return {
        t.QUARANTINE: enriched.where(F.col("outcome").isin(*c.REASONS)).select(
            "kafka_topic", "kafka_partition", "kafka_offset", F.col("outcome").alias("reason")
        ),
        t.LATE: enriched.where(F.col("outcome") == LATE).select(
            "kafka_topic", "kafka_partition", "kafka_offset"
        ),
        t.SILVER: silver.select(*_silver_values()),
        t.ATTRIBUTIONS: attributions.select(*ATTRIBUTION_COLUMNS),
        t.GOLD_1M: gold,
        t.CTR_1H: campaign_ctr(gold),
        t.SESSIONS: sessions,
    }


def _silver_values() -> list[str]:
    coordinates = {"kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp"}
    return [c for c in t.columns(t.SILVER) if c not in coordinates and c not in PROVENANCE]


def _streamed(spark: SparkSession, warehouse: str, name: str, like: DataFrame) -> DataFrame:
    df = spark.read.format("delta").load(f"{warehouse}/{name}")
    if name == t.GOLD_1M:
        # A window emptied by a re-attribution stays as a zero row (published as a change).
        df = df.where("impressions + clicks + conversions > 0")
    return df.select(*like.columns)


def reconcile(
    spark: SparkSession,
    warehouse: str,
    *,
    max_bytes: int,
    lookback_seconds: int,
    session_gap_seconds: int,
) -> list[TableDiff]:
    expected = recompute(
        spark,
        warehouse,
        max_bytes=max_bytes,
        lookback_seconds=lookback_seconds,
        session_gap_seconds=session_gap_seconds,
    )
    return [
        table_diff(name, want, _streamed(spark, warehouse, name, want))
        for name, want in expected.items()
    ]


def table_diff(name: str, want: DataFrame, got: DataFrame) -> TableDiff:
    """The multiset difference both ways (what ``exceptAll`` gives), from one shuffle: every
    distinct row with how many more times the recomputation has it than the stream's table
    (negative: fewer). Null equals null, as in ``exceptAll``."""
    columns = want.columns
    net = (
        want.withColumn("_side", F.lit(1))
        .unionAll(got.withColumn("_side", F.lit(-1)))
        .groupBy(*columns)
        .agg(F.sum("_side").alias("_net"), F.count_if(F.col("_side") < 0).alias("_got"))
        .persist()
    )
    try:
        totals = net.agg(
            F.sum("_got").alias("rows"),
            F.sum(F.greatest("_net", F.lit(0))).alias("missing"),
            F.sum(F.greatest(-F.col("_net"), F.lit(0))).alias("unexpected"),
        ).first()
        assert totals is not None
        rows, missing, unexpected = (int(x or 0) for x in totals)
        # Up to two rows of each kind, read only when there are some.
        examples = [
            f"{kind} { {c: r[c] for c in columns} }"
            for kind, n, which in (
                ("missing", missing, "_net > 0"),
                ("unexpected", unexpected, "_net < 0"),
            )
            if n
            for r in net.where(which).limit(2).collect()
        ]
    finally:
        net.unpersist()
    return TableDiff(name, rows, missing, unexpected, examples)
