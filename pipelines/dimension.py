"""The ``dim_ads`` dimension: upserts from validated rows, and the snapshot a batch uses.

A micro-batch uses the newest ``dim_ads`` version committed at or before the batch's own
timestamp (from Spark's offset log), so a re-executed batch sees exactly the same dimension as
its first execution, and a dimension change is picked up by the batches that start after it.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.tables import DIM_ADS, create_tables, table


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


def dim_snapshot(spark: SparkSession, warehouse: str, as_of_ms: int) -> tuple[DataFrame, int]:
    """The dim_ads version in force at ``as_of_ms`` (epoch millis) and its rows."""
    from delta.tables import DeltaTable

    path = f"{warehouse}/{DIM_ADS}"
    if not DeltaTable.isDeltaTable(spark, path):
        raise DimensionMissingError(
            f"{path} does not exist: load the ad dimension first with `adattr dim load FILE.csv`"
        )
    history = (
        DeltaTable.forPath(spark, path)
        .history()
        .select("version", F.expr("unix_millis(timestamp)").alias("ms"))
        .collect()
    )
    in_force = [h.version for h in history if h.ms <= as_of_ms]
    # A batch older than the table itself (a replay of old data) uses the first version.
    version = max(in_force) if in_force else min(h.version for h in history)
    return spark.read.format("delta").option("versionAsOf", version).load(path), int(version)
