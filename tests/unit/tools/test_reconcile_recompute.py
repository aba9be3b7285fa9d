"""Reconcile's recomputation decides each record bronze holds as the batch that read it did."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.tools.reconcile import recompute
from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.dimension import upsert_dim_ads
from pipelines.ledger import write_ledger
from schemas import ad_event as c
from tests.builders import event, kafka_rows

FUTURE = c.QUALITY_EVENT_TIME_IN_FUTURE


def test_an_event_refused_as_future_stays_refused_once_its_time_has_come(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The quality gate refuses an event time more than an hour ahead of its batch's own
    time. Reconciled after that time has come (today, against an event of 2026-11-20), the
    record is refused all the same, as its batch decided; the one beside it is accepted. And
    a batch of the year 2999 accepted an event half an hour ahead of it, which today's clock
    would refuse: its batch's time, not the clock, decides."""
    warehouse = str(tmp_path / "warehouse")
    t.create_tables(spark, warehouse)
    version, _ = upsert_dim_ads(
        spark, warehouse, [("ad-1", "cmp-1", "adv-1", Decimal(1), Decimal(1))]
    )
    tables = Tables(spark, warehouse, "gen-1", 1)
    values = [
        event("ahead", event_time="2026-11-20T12:00:00.000Z"),  # two hours ahead of its batch
        event("on-time", event_time="2026-11-20T10:00:00.000Z"),
        event("2999", event_time="2999-01-01T10:30:00.000Z"),  # half an hour ahead of its batch
    ]
    rows = kafka_rows(spark, values, partitions=1)
    for batch_id, offsets, at, counts in (
        (0, (0, 1), datetime(2026, 11, 20, 10, 0, 30, tzinfo=UTC), {"accepted": 1, FUTURE: 1}),
        (1, (2, 2), datetime(2999, 1, 1, 10, 0, 0, tzinfo=UTC), {"accepted": 1}),
    ):
        bronze = tables.stamped(rows.where(F.col("kafka_offset").between(*offsets)), batch_id)
        bronze.select(*t.columns(t.BRONZE)).write.format("delta").mode("append").save(
            tables.path(t.BRONZE)
        )
        write_ledger(
            tables,
            batch_id,
            dim_version=version,
            ranges={("t", 0): (*offsets, offsets[1] - offsets[0] + 1)},
            counts={"read": sum(counts.values()), **counts},
            transactional_id=None,
            kafka_outcome="nothing-to-publish",
            millis={
                "batch_timestamp": int(at.timestamp() * 1000),
                "watermark": 0,
                "started_at": 0,
                "finished_at": 0,
            },
            fresh=True,
        )
    expected = recompute(
        spark, warehouse, max_bytes=4096, lookback_seconds=600, session_gap_seconds=1800
    )
    quarantined = expected[t.QUARANTINE].collect()
    assert [(r.kafka_offset, r.reason) for r in quarantined] == [
        (0, c.QUALITY_EVENT_TIME_IN_FUTURE)
    ]
    assert sorted(r.event_id for r in expected[t.SILVER].collect()) == ["2999", "on-time"]
