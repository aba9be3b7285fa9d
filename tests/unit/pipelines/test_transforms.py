"""classify and enrich on small batch frames."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.tables import DIM_ADS, table
from pipelines.transforms import DUPLICATE, LATE, classify, enrich, parse_events
from schemas import ad_event as c
from tests.builders import event, kafka_rows

WATERMARK_MS = int(datetime(2026, 11, 20, 10, 0, 0).timestamp() * 1000)  # session TZ is UTC


@pytest.fixture(scope="module")
def dim(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            ("ad-1", "cmp-1", "adv-1", Decimal("2.500000"), Decimal("0.300000")),
            ("ad-2", "cmp-1", "adv-1", Decimal("0.001000"), Decimal("1.000001")),
        ],
        table(DIM_ADS).ddl,
    )


def _classified(
    spark: SparkSession, dim: DataFrame, values: list, first_offsets: set[int]
) -> DataFrame:  # type: ignore[type-arg]
    parsed = kafka_rows(spark, values, partitions=1).transform(parse_events(max_bytes=4096))
    firsts = parsed.where(parsed.kafka_offset.isin(*first_offsets)).select(
        "kafka_topic", "kafka_partition", "kafka_offset"
    )
    return enrich(classify(parsed, firsts, watermark_ms=WATERMARK_MS), dim)


def test_outcomes(spark: SparkSession, dim: DataFrame) -> None:
    values = [
        event("a", event_time="2026-11-20T10:00:00.001Z"),  # first sighting: accepted
        event("a", event_time="2026-11-20T10:00:00.001Z"),  # not emitted by the state: duplicate
        event("b", event_time="2026-11-20T10:00:00.000Z"),  # at the watermark: late
        event("c", event_time="2026-11-20T09:00:00.000Z"),  # behind it, even if "first": late
        event("d", event_time="2026-11-20T10:05:00.000Z", ad_id="ad-404"),  # unknown_ad
        event("e", "conversion", "2026-11-20T10:05:00.000Z"),  # conversions need no ad
        "{broken",
    ]
    rows = _classified(spark, dim, values, {0, 2, 3, 4, 5}).orderBy("kafka_offset").collect()
    assert [r.outcome for r in rows] == [
        "accepted",
        DUPLICATE,
        LATE,
        LATE,
        c.UNKNOWN_AD,
        "accepted",
        c.MALFORMED_JSON,
    ]


def test_enrichment_and_exact_cost(spark: SparkSession, dim: DataFrame) -> None:
    values = [
        event("i1", ad_id="ad-1", event_time="2026-11-20T10:01:00.000Z"),
        event("k1", "click", ad_id="ad-2", event_time="2026-11-20T10:01:00.000Z"),
        event("v1", "conversion", "2026-11-20T10:01:00.000Z", advertiser_id="adv-9"),
    ]
    rows = _classified(spark, dim, values, {0, 1, 2}).orderBy("kafka_offset").collect()
    assert [(r.campaign_id, r.advertiser_id, r.cost) for r in rows] == [
        ("cmp-1", "adv-1", Decimal("0.002500000")),  # cpm 2.5 / 1000
        ("cmp-1", "adv-1", Decimal("1.000001000")),  # cpc
        (None, "adv-9", None),  # a conversion keeps its own advertiser, is not billed
    ]


def test_prior_decisions_of_another_generation_stand(spark: SparkSession, dim: DataFrame) -> None:
    """A replay re-reads records an earlier generation already decided: late stays late,
    accepted stays accepted, whatever this generation's watermark says, and ``unknown_ad``
    stays quarantined though the dimension has the ad now (a replay after adding it)."""
    values = [
        event("a", event_time="2026-11-20T09:00:00.000Z"),  # behind the watermark, was accepted
        event("b", event_time="2026-11-20T10:30:00.000Z"),  # ahead of it, was late
        event("c", event_time="2026-11-20T10:30:00.000Z"),  # no earlier decision
        event("d", event_time="2026-11-20T10:30:00.000Z", ad_id="ad-1"),  # was unknown_ad
    ]
    parsed = kafka_rows(spark, values, partitions=1).transform(parse_events(max_bytes=4096))
    firsts = parsed.select("kafka_topic", "kafka_partition", "kafka_offset")
    prior = spark.createDataFrame(
        [("t", 0, 0, "accepted"), ("t", 0, 1, LATE), ("t", 0, 3, c.UNKNOWN_AD)],
        "kafka_topic string, kafka_partition int, kafka_offset long, prior_outcome string",
    )
    rows = enrich(classify(parsed, firsts, watermark_ms=WATERMARK_MS, prior=prior), dim).orderBy(
        "kafka_offset"
    )
    assert [r.outcome for r in rows.collect()] == ["accepted", LATE, "accepted", c.UNKNOWN_AD]


def test_an_event_already_decided_is_a_duplicate_whatever_the_dedup_state(
    spark: SparkSession, dim: DataFrame
) -> None:
    """A replay's dedup state starts empty: the copy it sees first of an event an earlier
    generation accepted (or quarantined as ``unknown_ad``) at another offset must still count
    as a duplicate, while the decided record itself, read again at its own offset, keeps its
    outcome."""
    values = [
        event("kept", event_time="2026-11-20T10:30:00.000Z"),  # silver holds it, at this offset
        event("copy", event_time="2026-11-20T10:30:00.000Z"),  # silver holds it at offset 9
        event("new", event_time="2026-11-20T10:30:00.000Z"),  # never seen
        # Quarantined as unknown_ad at offset 8; the dimension has its ad now.
        event("refused", event_time="2026-11-20T10:30:00.000Z", ad_id="ad-1"),
        event("held", event_time="2026-11-20T10:30:00.000Z", ad_id="ad-1"),  # so, here
    ]
    parsed = kafka_rows(spark, values, partitions=1).transform(parse_events(max_bytes=4096))
    firsts = parsed.select("kafka_topic", "kafka_partition", "kafka_offset")  # state: all first
    stored = spark.createDataFrame(
        [
            ("kept", ("t", 0, 0), "accepted"),
            ("copy", ("t", 0, 9), "accepted"),
            ("refused", ("t", 0, 8), c.UNKNOWN_AD),
            ("held", ("t", 0, 4), c.UNKNOWN_AD),
        ],
        "event_id string, stored_at struct<kafka_topic:string,kafka_partition:int,"
        "kafka_offset:long>, stored_outcome string",
    )
    rows = enrich(classify(parsed, firsts, watermark_ms=WATERMARK_MS, stored=stored), dim)
    outcomes = {r.event_id: r.outcome for r in rows.collect()}
    assert outcomes == {
        "kept": "accepted",
        "copy": DUPLICATE,
        "new": "accepted",
        "refused": DUPLICATE,  # as the dedup state, had it seen offset 8, would have made it
        "held": c.UNKNOWN_AD,
    }


def test_the_copy_silver_holds_stays_accepted_whichever_copy_the_state_picks(
    spark: SparkSession,
) -> None:
    """A re-executed batch: its earlier attempt accepted one of an event's two copies (silver
    holds it there); this time the dedup state emits the other first. Silver's copy stays
    accepted and the other is a duplicate, so the ledger counts what silver holds."""
    values = [
        event("e", event_time="2026-11-20T10:30:00.000Z"),  # offset 0: silver holds it
        event("e", event_time="2026-11-20T10:30:00.000Z"),  # offset 1: the state's pick now
    ]
    parsed = kafka_rows(spark, values, partitions=1).transform(parse_events(max_bytes=4096))
    firsts = parsed.where("kafka_offset = 1").select(
        "kafka_topic", "kafka_partition", "kafka_offset"
    )
    stored = parsed.where("kafka_offset = 0").select(
        "event_id",
        F.struct("kafka_topic", "kafka_partition", "kafka_offset").alias("stored_at"),
        F.lit("accepted").alias("stored_outcome"),
    )
    rows = classify(parsed, firsts, watermark_ms=WATERMARK_MS, stored=stored)
    outcomes = {r.kafka_offset: r.outcome for r in rows.collect()}
    assert outcomes == {0: "accepted", 1: "duplicate"}
