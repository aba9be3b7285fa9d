"""Reconcile's recomputation decides each record bronze holds as the batch that read it did."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from pyspark.sql import SparkSession

from app.tools.reconcile import recompute
from pipelines import tables as t
from pipelines.delta_writes import Tables
from pipelines.dimension import upsert_dim_ads
from pipelines.ledger import write_ledger
from schemas import ad_event as c
from tests.builders import event, kafka_rows


def test_an_event_refused_as_future_stays_refused_once_its_time_has_come(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The quality gate refuses an event time more than an hour ahead of its batch's own
    time. Reconciled after that time has come (today, against an event of 2026-11-20), the
    record is refused all the same, as its batch decided; the one beside it is accepted."""
    warehouse = str(tmp_path / "warehouse")
    t.create_tables(spark, warehouse)
    version, _ = upsert_dim_ads(
        spark, warehouse, [("ad-1", "cmp-1", "adv-1", Decimal(1), Decimal(1))]
    )
    tables = Tables(spark, warehouse, "gen-1", 1)
    values = [
        event("ahead", event_time="2026-11-20T12:00:00.000Z"),  # two hours ahead of its batch
        event("on-time", event_time="2026-11-20T10:00:00.000Z"),
    ]
    bronze = tables.stamped(kafka_rows(spark, values, partitions=1), 0)
    bronze.select(*t.columns(t.BRONZE)).write.format("delta").mode("append").save(
        tables.path(t.BRONZE)
    )
    batch_ms = int(datetime(2026, 11, 20, 10, 0, 30, tzinfo=UTC).timestamp() * 1000)
    write_ledger(
        tables,
        0,
        dim_version=version,
        ranges={("t", 0): (0, 1, 2)},
        counts={"read": 2, c.QUALITY_EVENT_TIME_IN_FUTURE: 1, "accepted": 1},
        transactional_id=None,
        kafka_outcome="nothing-to-publish",
        millis={"batch_timestamp": batch_ms, "watermark": 0, "started_at": 0, "finished_at": 0},
        fresh=True,
    )
    expected = recompute(
        spark, warehouse, max_bytes=4096, lookback_seconds=600, session_gap_seconds=1800
    )
    quarantined = expected[t.QUARANTINE].collect()
    assert [(r.kafka_offset, r.reason) for r in quarantined] == [
        (0, c.QUALITY_EVENT_TIME_IN_FUTURE)
    ]
    assert [r.event_id for r in expected[t.SILVER].collect()] == ["on-time"]
