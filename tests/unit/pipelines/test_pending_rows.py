"""The attribution rows kept between passes (``pipelines.pending_rows``): kept as JSON
on the driver, they come back as the rows they were, to the microsecond and the last decimal."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import tables as t
from pipelines.pending_rows import PendingRows, portable_json

T0 = datetime(2026, 11, 20, 10, 0)  # the session time zone is UTC


def test_kept_rows_come_back_as_they_were_and_a_later_row_replaces_an_earlier_one(
    spark: SparkSession,
) -> None:
    def row(cid: str, second: int, micro: int, click: str | None, batch: int) -> tuple:
        values = {
            "conversion_id": cid,
            "conversion_time": T0.replace(second=second, microsecond=micro),
            "user_id": "u1",
            "advertiser_id": "v1",
            "revenue": Decimal("123456789012.345678"),
            "click_id": click,
            "click_time": T0.replace(second=second - 1) if click else None,
            "ad_id": "a1" if click else None,
            "campaign_id": "c1" if click else None,
            "status": "attributed" if click else "unattributed",
            "is_final": batch > 1,
            "generation": 3,
            "batch_id": batch,
        }
        return tuple(values[c] for c in t.columns(t.ATTRIBUTIONS))

    def kept(*values: tuple) -> list[tuple[str, int, str]]:
        frame = spark.createDataFrame(list(values), t.schema(t.ATTRIBUTIONS))
        found = frame.select(
            "conversion_id", F.expr("unix_millis(conversion_time)"), portable_json(t.ATTRIBUTIONS)
        ).collect()
        return [(r[0], int(r[1]), r[2]) for r in found]

    pending = PendingRows(t.ATTRIBUTIONS)
    assert not pending
    first = [row("c1", 5, 123_456, "k1", 1), row("c2", 9, 999_999, None, 1)]
    pending.add(kept(*first))
    assert pending and sorted(tuple(r) for r in pending.frame(spark).collect()) == sorted(first)
    later = row("c1", 5, 123_456, "k2", 2)  # re-attributed, then final, by a later batch
    pending.add(kept(later))
    assert sorted(tuple(r) for r in pending.frame(spark).collect()) == sorted([later, first[1]])
    t0_ms = int((T0 - datetime(1970, 1, 1)).total_seconds() * 1000)
    assert pending.bounds_ms() == (t0_ms + 5_123, t0_ms + 9_999 + 1)
    pending.clear()
    assert not pending
