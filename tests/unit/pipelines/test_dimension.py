"""The dimension versions a running job reads (pipelines/dimension.py), on a real Delta table."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from pipelines.dimension import DimSnapshots, _history, dim_snapshot, upsert_dim_ads
from pipelines.tables import DIM_ADS


def cached(frame: DataFrame) -> bool:
    """Whether Spark's cache manager holds the frame (asked of the JVM, not Python's flag)."""
    return frame.storageLevel != StorageLevel.NONE


def test_a_running_job_keeps_the_versions_it_used_last_and_reads_an_older_one_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path)
    for price in range(1, 6):  # five versions, each with its own price for ad-1
        upsert_dim_ads(spark, warehouse, [("ad-1", "c-1", "a-1", Decimal(price), Decimal(price))])
    # (version, commit time), oldest first; version 0 is the empty table
    history = sorted((v, ms) for v, ms in _history(spark, f"{warehouse}/{DIM_ADS}") if v > 0)
    snapshots = DimSnapshots(spark, warehouse, kept=3)

    def cpm(frame_and_version: tuple[object, int]) -> tuple[Decimal, int]:
        frame, version = frame_and_version
        (row,) = frame.collect()  # type: ignore[attr-defined]
        return row.cpm, version

    used = []
    for version, ms in history:
        frame, got = snapshots.at(ms)
        assert got == version and cached(frame)
        assert cpm((frame, got)) == cpm(dim_snapshot(spark, warehouse, ms))
        used.append(frame)
    assert [cached(frame) for frame in used] == [False, False, True, True, True]

    # Asked for the first version again (batches do not, but a caller may): read again, pinned.
    first_version, first_ms = history[0]
    frame, got = snapshots.at(first_ms)
    assert (got, cached(frame)) == (first_version, True)
    assert cpm((frame, got)) == (Decimal(1), first_version)
    assert [cached(frame) for frame in used[2:]] == [False, True, True]  # the oldest released
