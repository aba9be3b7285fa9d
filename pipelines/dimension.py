"""The ``dim_ads`` dimension: upserts from validated rows, and the snapshot a batch uses.

A micro-batch uses the newest ``dim_ads`` version committed at or before the batch's own
timestamp (from Spark's offset log), so a re-executed batch sees exactly the same dimension as
its first execution, and a dimension change is picked up by the batches that start after it.
"""

from __future__ import annotations

from collections import OrderedDict
from decimal import Decimal

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.tables import DIM_ADS, create_tables, latest_snapshot, table


class DimensionMissingError(RuntimeError):
    pass


def upsert_dim_ads(
    spark: SparkSession, warehouse: str, rows: list[tuple[str, str, str, Decimal, Decimal]]
) -> tuple[int, int]:
    """MERGEs rows into dim_ads by ad_id; returns (new Delta version, rows in the table)."""
    from delta.tables import DeltaTable

    create_tables(spark, warehouse, (DIM_ADS,))
    path = f"{warehouse}/{DIM_ADS}"
    source = spark.createDataFrame(rows, table(DIM_ADS).ddl)
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.ad_id = s.ad_id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    version = DeltaTable.forPath(spark, path).history(1).select("version").first()
    return int(version[0]) if version else 0, spark.read.format("delta").load(path).count()


def _require(spark: SparkSession, path: str) -> None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        raise DimensionMissingError(
            f"{path} does not exist: load the ad dimension first with `adattr dim load FILE.csv`"
        )


def _history(spark: SparkSession, path: str) -> list[tuple[int, int]]:
    """(version, commit time in epoch millis) of every dim_ads version."""
    from delta.tables import DeltaTable

    rows = (
        DeltaTable.forPath(spark, path)
        .history()
        .select("version", F.expr("unix_millis(timestamp)").alias("ms"))
        .collect()
    )
    return [(int(r.version), int(r.ms)) for r in rows]


def _in_force(history: list[tuple[int, int]], as_of_ms: int) -> int:
    in_force = [v for v, ms in history if ms <= as_of_ms]
    # A batch older than the table itself (a replay of old data) uses the first version.
    return max(in_force) if in_force else min(v for v, _ in history)


def dim_snapshot(spark: SparkSession, warehouse: str, as_of_ms: int) -> tuple[DataFrame, int]:
    """The dim_ads version in force at ``as_of_ms`` (epoch millis) and its rows."""
    path = f"{warehouse}/{DIM_ADS}"
    _require(spark, path)
    version = _in_force(_history(spark, path), as_of_ms)
    return spark.read.format("delta").option("versionAsOf", version).load(path), version


class DimSnapshots:
    """``dim_snapshot`` for a running job, at the cost of a log listing per batch: the history
    is read again only when dim_ads has a newer version than last seen, and the rows of the
    last ``kept`` versions it read (a small table each) are read once and kept in memory; an
    older one is released, so a job that runs for weeks beside daily dimension loads holds a
    few versions, not every one. Same answers as ``dim_snapshot``."""

    def __init__(self, spark: SparkSession, warehouse: str, kept: int = 3) -> None:
        self.spark = spark
        self.path = f"{warehouse}/{DIM_ADS}"
        self.kept = kept
        self._latest = -1
        self._history: list[tuple[int, int]] = []
        self._frames: OrderedDict[int, DataFrame] = OrderedDict()  # oldest first

    def require(self) -> None:
        """Raises ``DimensionMissingError`` (saying how to load it) when dim_ads does not
        exist."""
        _require(self.spark, self.path)

    def at(self, as_of_ms: int) -> tuple[DataFrame, int]:
        if self._latest < 0:
            self.require()
        latest = int(latest_snapshot(self.spark, self.path).version())
        if latest != self._latest:
            self._history, self._latest = _history(self.spark, self.path), latest
        version = _in_force(self._history, as_of_ms)
        if version not in self._frames:
            # Cached in the JVM, read at once: every batch's join reads the cache. (Rows collected
            # to Python and made a DataFrame again were a Python RDD, which started Python
            # workers in every batch's first job.) Evicted or lost with an executor, the cache is
            # read again from the same pinned version.
            rows = self.spark.read.format("delta").option("versionAsOf", version).load(self.path)
            rows.persist(StorageLevel.MEMORY_AND_DISK).count()
            self._frames[version] = rows
            while len(self._frames) > self.kept:
                # Every batch that used it has finished (batches run one at a time, and their
                # threads end with them). Batches ask in the order of their timestamps, so an
                # evicted version is not asked for again; were it, it is read again, pinned.
                self._frames.popitem(last=False)[1].unpersist()
        return self._frames[version], version
